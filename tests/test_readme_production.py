"""The README's "Getting your production log in" recipes run as written, on the real files."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

from click.testing import CliRunner

from calibrate.umbrella import main as servecal

README = Path(__file__).parents[1] / "README.md"


def test_production_recipes_run_as_written(real_data_dir, tmp_path, monkeypatch):
    text = README.read_text()
    section = text.split("## Getting your production log in", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    commands = [c.strip() for b in blocks for c in b.replace("\\\n", " ").splitlines() if c.strip()]
    assert len(commands) == 4 and all(c.startswith("traces import ") for c in commands)
    monkeypatch.chdir(tmp_path)
    for cmd in commands:
        args = shlex.split(cmd.replace("$D", str(real_data_dir)))
        res = CliRunner().invoke(servecal, args)
        assert res.exit_code == 0, (cmd, res.output)
    assert "num_gpu_blocks=2790" in res.output and "UTC-8 h (inferred)" in res.output
    for name in ("sweep.parquet", "rate076.parquet", "spans.parquet", "vllm_stats.parquet", "vllm_ts.csv"):
        assert (tmp_path / name).exists()
