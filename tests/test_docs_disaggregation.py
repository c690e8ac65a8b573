"""The DistServe long-run recipe of docs/disaggregation.md runs as written, on the real files, and
prints the tables and the figure the page shows (issue #34)."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

from click.testing import CliRunner

from calibrate.umbrella import main as servecal

PAGE = Path(__file__).parents[1] / "docs" / "disaggregation.md"
HEADING = "## DistServe's long run, measured and predicted\n"


def _section() -> str:
    text = PAGE.read_text()
    return text[text.index(HEADING):]


def test_the_long_run_recipe_prints_the_page_s_tables(real_data_dir, tmp_path, monkeypatch):
    section = _section()
    commands = [c.strip() for c in re.search(r"```bash\n(.*?)```", section, re.S).group(1)
                .replace("\\\n", " ").splitlines() if c.strip()]
    tables = re.findall(r"```text\n(.*?)```", section, re.S)
    assert len(commands) == 7 and len(tables) == 2
    assert "(img/distserve_long_waits.png)" in section and (PAGE.parent / "img" / "distserve_long_waits.png").exists()
    monkeypatch.chdir(tmp_path)
    outputs = []
    for cmd in commands:
        res = CliRunner().invoke(servecal, shlex.split(cmd.replace("$D", str(real_data_dir))))
        assert res.exit_code == 0, (cmd, res.output)
        outputs.append(res.output)
    for table, output in zip(tables, outputs[-2:]):  # each replay's MEASURED vs PREDICTED, row by row
        for line in table.strip().splitlines():
            assert line in output.splitlines(), (line, output)
    assert "inside their 95 % band: 6 of 6 measured p50/p90 statistics" in outputs[-1]
    assert "graded poor" in outputs[-1]
    assert (tmp_path / "long_files" / "disagg_waits.png").exists()
