"""``servecal plan`` on aggregates (issue #32 item 2): a production scrape's busiest window is the
workload, synthesized from its length statistics as ``calibrate fit`` replays it."""
from pathlib import Path

import pandas as pd
import pytest

from replay.cost.cost_model import RooflineCostModel
from schemas.cost_params import CostParams
from schemas.specs import get_gpu, get_model
from schemas.tables import AGGREGATE_TARGETS
from traces.aggregate_workload import busiest_level, level_workload
from traces.errors import TraceError
from traces.io import read_trace, write_trace

from helpers import flat, invoke_servecal, write_calibration

SCRAPES = Path(__file__).resolve().parents[1] / "data" / "vllm_metrics_scrapes.txt"


def _levels(*loads) -> pd.DataFrame:
    """An aggregate of one row of mean TTFT and mean lengths per ``(kind, value)`` level."""
    rows = []
    for k, (kind, value) in enumerate(loads):
        base = {"level": k, "level_kind": kind, "level_value": float(value), "num_requests": 40,
                "statistic": "mean", "quantile_pct": None}
        rows += [{**base, "metric": "ttft_s", "value_s": 0.2, "value_tokens": None},
                 {**base, "metric": "num_prompt_tokens", "value_s": None, "value_tokens": 500.0},
                 {**base, "metric": "num_output_tokens", "value_s": None, "value_tokens": 100.0}]
    return pd.DataFrame(rows)


def test_the_busiest_level_is_the_open_loop_one_of_highest_rate():
    frame = _levels(("poisson_rate", 1.0), ("concurrency", 64), ("constant_rate", 3.0), ("poisson_rate", 2.0))
    assert busiest_level(frame, "agg.parquet") == 2
    with pytest.raises(TraceError, match=r"agg\.parquet: no level at an arrival rate \(levels: concurrency\)"):
        busiest_level(_levels(("concurrency", 8), ("concurrency", 64)), "agg.parquet")


def _calibration(tmp_path) -> Path:
    path = tmp_path / "cal.json"
    write_calibration(RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb"),
                                        CostParams(eta_compute=0.5, eta_mem=0.8, t_step_s=2e-4)), path)
    return path


def test_plan_replays_the_busiest_window_of_a_scrape(tmp_path):
    agg = tmp_path / "prod.parquet"
    res = invoke_servecal("traces", "import", "prometheus", SCRAPES, "--window-s", "30", "-o", agg)
    assert res.exit_code == 0, res.output
    frame = pd.read_parquet(agg)
    rates = frame.drop_duplicates("level").set_index("level")["level_value"]
    assert rates.idxmax() == 1  # the second window is the busier one
    _, expected, _ = level_workload(frame, 1, read_trace(agg)[2], agg)  # every arrival of the window
    res = invoke_servecal("plan", agg, "--calibration", _calibration(tmp_path), "--slo", "ttft_p90=2s",
                          "--replicas", "1:2", "--confidence", "point")
    assert res.exit_code == 0, res.output
    assert f"the plan replays the busiest, #1 at {rates[1]:.3g} req/s: {len(expected)} requests" in \
        flat(res.output), res.output
    # planned at the level's own rate, not the few synthesized arrivals' (1.82 req/s here)
    assert f"plan: {len(expected)} requests of {agg} at {rates[1]:.3g} req/s" in flat(res.output), res.output


def test_plan_of_closed_loop_levels_only_is_one_error(tmp_path):
    agg = tmp_path / "conc.parquet"
    write_trace(_levels(("concurrency", 8), ("concurrency", 64)), AGGREGATE_TARGETS, agg)
    res = invoke_servecal("plan", agg, "--calibration", _calibration(tmp_path), "--slo", "ttft_p90=2s")
    assert res.exit_code == 1, res.output
    assert res.output.count("Error:") == 1, res.output
    assert "conc.parquet: no level at an arrival rate (levels: concurrency)" in flat(res.output), res.output


def test_plan_of_one_chosen_window_and_of_a_level_it_has_not(tmp_path):
    agg = tmp_path / "prod.parquet"
    assert invoke_servecal("traces", "import", "prometheus", SCRAPES, "--window-s", "30", "-o", agg).exit_code == 0
    cal = _calibration(tmp_path)
    res = invoke_servecal("plan", f"{agg}#0", "--calibration", cal, "--slo", "ttft_p90=2s", "--confidence", "point")
    assert res.exit_code == 0, res.output
    # the window's 28 finished and 7 held at its end (none at its start): every arrival of it replayed
    assert "the plan replays #0 at 1.17 req/s: 35 requests" in flat(res.output), res.output
    res = invoke_servecal("plan", f"{agg}#5", "--calibration", cal, "--slo", "ttft_p90=2s")
    assert res.exit_code == 1 and "prod.parquet#5: no such level (the file has 0, 1)" in flat(res.output)
    conc = tmp_path / "conc.parquet"
    write_trace(_levels(("poisson_rate", 2.0), ("concurrency", 8)), AGGREGATE_TARGETS, conc)
    res = invoke_servecal("plan", f"{conc}#1", "--calibration", cal, "--slo", "ttft_p90=2s")
    assert res.exit_code == 1 and "conc.parquet#1: a closed loop of clients" in flat(res.output), res.output


def test_a_plan_judges_all_of_a_window_s_traffic_not_what_its_histograms_counted(tmp_path):
    from replay.cli.plan import _busiest_window
    from traces.scrape_window import OBSERVED_UNTIL

    agg = tmp_path / "prod.parquet"
    assert invoke_servecal("traces", "import", "prometheus", SCRAPES, "--window-s", "30", "-o", agg).exit_code == 0
    _, frame, meta = read_trace(agg)
    # the window ended with 7 requests held: its replay is scored on those finished by its end ...
    assert OBSERVED_UNTIL in level_workload(frame, 0, meta, agg)[2]
    # ... but a plan's statistics (and its band's) are of every request it serves, at any rate
    workload, plan_meta, _ = _busiest_window(agg, frame, meta, 0)
    assert OBSERVED_UNTIL not in plan_meta and len(workload) == 35
