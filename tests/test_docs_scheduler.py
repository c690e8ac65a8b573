"""The custom-scheduler example of docs/scheduler.md ("Your own scheduler") runs as written."""
import re
from pathlib import Path

import pandas as pd
from click.testing import CliRunner

from replay.cli import main as replay_main
from helpers import write_calibration
from schemas.specs import get_gpu, get_model
from schemas.tables import REQUEST_TRACE, to_table, write_table
from replay.cost.cost_model import RooflineCostModel
from schemas.cost_params import CostParams

DOCS = Path(__file__).parents[1] / "docs"


def _example():
    text = (DOCS / "scheduler.md").read_text()
    section = text[text.index("# Your own scheduler\n"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    commands = re.search(r"```bash\n(.*?)```", section, re.S).group(1).strip().splitlines()
    # $E, the measured engine's limits, is set in docs/disaggregation.md, which the page points to
    assert "$E" in section and "[What if](disaggregation.md)" in section
    what_if = (DOCS / "disaggregation.md").read_text()
    engine_limits = re.search(r'^E="([^"]*)"', what_if, re.M).group(1)
    return code, [c.replace("$E", engine_limits) for c in commands]


def test_the_custom_scheduler_example_is_short_and_runs(tmp_path, monkeypatch):
    code, commands = _example()
    assert len(code.strip().splitlines()) < 40
    (tmp_path / "my_policies.py").write_text(code)
    df = pd.DataFrame({"request_id": [f"r{i}" for i in range(6)], "arrival_time_s": [0.0, 0.0, 0.0, 0.01, 0.02, 0.03],
                       "num_prompt_tokens": [300, 50, 800, 20, 100, 60], "num_output_tokens": [40, 5, 12, 80, 3, 9],
                       "ttft_s": 0.05, "e2e_s": 1.0})
    write_table(to_table(REQUEST_TRACE, df), tmp_path / "llama.parquet")
    write_calibration(RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb"),
                                        CostParams(eta_compute=0.5, eta_mem=0.8, t_step_s=1e-4)), tmp_path / "cal.json")
    monkeypatch.chdir(tmp_path)
    for cmd in commands:  # as written on the page
        res = CliRunner().invoke(replay_main, cmd.split()[1:])
        assert res.exit_code == 0, res.output
    res = CliRunner().invoke(replay_main, commands[0].split()[1:] + ["--max-num-seqs", "1", "-o", "pred.parquet"])
    assert res.exit_code == 0, res.output
    pred = pd.read_parquet(tmp_path / "pred.parquet").set_index("request_id")
    start = pred["arrival_time_s"] + pred["pred_queue_wait_s"]
    # One request at a time: r0, r1, r2 wait at t=0 and r1 (5 outputs) goes first; while it
    # runs (> 30 ms) r3, r4, r5 arrive; then fewest outputs first: r4 (3), r5 (9), r2 (12), r0 (40), r3 (80).
    assert list(start.sort_values().index) == ["r1", "r4", "r5", "r2", "r0", "r3"]
