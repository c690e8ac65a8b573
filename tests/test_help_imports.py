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
sys.argv = [{prog!r}, *{args!r}]
code = _invoke({spec!r})
print(json.dumps({{"code": code, "heavy": [m for m in {heavy!r} if m in sys.modules]}}))
"""


def _help_imports(spec: str, prog: str, args: list[str]) -> dict:
    src = _PROBE.format(spec=spec, prog=prog, args=args, heavy=HEAVY)
    res = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("spec, prog, args", [
    ("calibrate.umbrella:traces_cli", "traces", ["--help"]),
    ("calibrate.umbrella:traces_cli", "traces", ["import", "--help"]),
    ("calibrate.umbrella:traces_cli", "traces", ["import", "csv", "--help"]),
    ("calibrate.umbrella:traces_cli", "traces", ["describe", "--help"]),
    ("replay.cli:main", "replay", ["--help"]),
    ("calibrate.umbrella:main", "servecal", ["--help"]),
    ("calibrate.umbrella:main", "servecal", ["replay", "--help"]),
    ("calibrate.umbrella:main", "servecal", ["plan", "--help"]),
    ("calibrate.cli:main", "calibrate", ["--help"]),
    ("calibrate.cli:main", "calibrate", ["fit", "--help"]),
    ("calibrate.cli:main", "calibrate", ["validate", "--help"]),
])
def test_help_imports_nothing_heavy(spec, prog, args):
    out = _help_imports(spec, prog, args)
    assert out["code"] == 0
    assert out["heavy"] == [], f"{prog} {' '.join(args)} imported {out['heavy']}"


def test_lazy_commands_short_help_matches_the_commands():
    """``servecal --help`` names ``calibrate`` and ``demo`` without importing them: the one-line
    help it shows is the commands' own."""
    import importlib

    from calibrate.umbrella import main

    for name, (target, short) in main.lazy.items():
        module, _, attr = target.partition(":")
        cmd = getattr(importlib.import_module(module), attr)
        assert cmd.help.strip().splitlines()[0] == short, name
