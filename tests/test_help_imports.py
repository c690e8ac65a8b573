"""``--help`` stays quick: the command-line modules import no numpy, pandas, pyarrow (nor scipy,
matplotlib, lmfit, the engine) before a command runs (issue 12 item 6: --help under 0.5 s).

Checked on what is imported, in a fresh interpreter, not on a timing.
"""
import json
import subprocess
import sys

import pytest

HEAVY = ("numpy", "pandas", "pyarrow", "scipy", "matplotlib", "lmfit", "replay.core.engine")

_PROBE = """
import json, sys
from traces.console import _invoke
from {module} import {loader}
sys.argv = [{prog!r}, *{args!r}]
code = _invoke({loader})
print(json.dumps({{"code": code, "heavy": [m for m in {heavy!r} if m in sys.modules]}}))
"""


def _help_imports(entry: str, prog: str, args: list[str]) -> dict:
    """Run a console script's command (``entry``: ``module:loader``, the function its entry passes
    to :func:`traces.console.run`) with ``args`` in a fresh interpreter; its code and heavy imports."""
    module, _, loader = entry.partition(":")
    src = _PROBE.format(module=module, loader=loader, prog=prog, args=args, heavy=HEAVY)
    res = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("entry, prog, args", [
    ("calibrate.console:_traces", "traces", ["--help"]),
    ("calibrate.console:_traces", "traces", ["import", "--help"]),
    ("calibrate.console:_traces", "traces", ["import", "csv", "--help"]),
    ("calibrate.console:_traces", "traces", ["describe", "--help"]),
    ("replay.console:_command", "replay", ["--help"]),
    ("calibrate.console:_servecal", "servecal", ["--help"]),
    ("calibrate.console:_servecal", "servecal", ["replay", "--help"]),
    ("calibrate.console:_servecal", "servecal", ["plan", "--help"]),
    ("calibrate.console:_calibrate", "calibrate", ["--help"]),
    ("calibrate.console:_calibrate", "calibrate", ["fit", "--help"]),
    ("calibrate.console:_calibrate", "calibrate", ["validate", "--help"]),
])
def test_help_imports_nothing_heavy(entry, prog, args):
    out = _help_imports(entry, prog, args)
    assert out["code"] == 0
    assert out["heavy"] == [], f"{prog} {' '.join(args)} imported {out['heavy']}"


def test_lazy_commands_short_help_matches_the_commands():
    """``servecal --help`` names ``calibrate`` and ``demo`` without importing them: the one-line
    help it shows is the commands' own."""
    from calibrate.umbrella import main

    for name, (load, short) in main.lazy.items():
        cmd = load()
        assert cmd.help.strip().splitlines()[0] == short, name
