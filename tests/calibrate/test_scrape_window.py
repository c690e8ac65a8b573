"""A window of Prometheus scrapes fitted as its histograms observe it (issue #32): every arrival up to
the window's end replayed (those held at its start at 0), and only the requests the replay finishes
inside it (TTFT: first token out) matched; hand-counted workloads and a hand-worked replay."""
import json

import numpy as np
import pandas as pd
import pytest

from calibrate.run_errors import Run
from helpers import LinearStepCost, invoke_servecal, run
from replay.config import ReplayConfig
from traces import aggregate_workload
from traces.aggregate_workload import level_workload
from traces.io import write_trace
from traces.scrape_window import OBSERVED_UNTIL, observed

LENGTHS = [("num_prompt_tokens", "mean", np.nan, 100), ("num_output_tokens", "mean", np.nan, 10)]


def _window(finished: int, counts: list, held: list, kind: str = "poisson_rate") -> tuple[pd.DataFrame, dict]:
    """One level of ``finished`` requests with its ``arrival_counts`` and ``requests_held``."""
    base = {"level": 0, "level_kind": kind, "level_value": 1.0, "num_requests": finished}
    rows = [{**base, "metric": "e2e_s", "statistic": "mean", "quantile_pct": np.nan, "value_s": 3.0,
             "value_tokens": np.nan}]
    rows += [{**base, "metric": m, "statistic": s, "quantile_pct": q, "value_s": np.nan, "value_tokens": v}
             for m, s, q, v in LENGTHS]
    return pd.DataFrame(rows), {"arrival_counts": json.dumps({"0": counts}), "requests_held": json.dumps({"0": held})}


def test_a_window_replays_every_arrival_and_ends_where_its_scrapes_end():
    """3 held at the first scrape (2 running, 1 waiting), 4 arriving in 15-30 s and 6 in 30-45 s,
    none in 0-15 s; 2 + 1 held at the last scrape (45 s), so 3 + 10 - 3 = 10 finished. The
    workload: 3 + 4 + 6 = 13 requests, 3 at 0; time 0 is the first interval with an arrival
    (15 s), so the window ends 45 - 15 = 30 s into it."""
    frame, meta = _window(10, [[0, 15, 0], [15, 30, 4], [30, 45, 6]], [[0, 2, 1], [15, 4, 0], [30, 5, 2], [45, 2, 1]])
    _, trace, replay_meta = level_workload(frame, 0, meta, "agg.parquet")
    t = trace["arrival_time_s"].to_numpy()
    assert len(trace) == 13 and np.sum(t == 0) == 3
    assert np.sum((t > 0) & (t <= 15)) == 4 and np.sum((t > 15) & (t <= 30)) == 6
    assert float(replay_meta[OBSERVED_UNTIL]) == 30.0


def test_a_window_drained_at_its_end_observed_every_request_and_a_level_without_gauges_its_finished():
    counts = [[0, 15, 4], [15, 30, 6]]
    frame, meta = _window(11, counts, [[0, 1, 0], [15, 3, 3], [30, 0, 0]])
    _, trace, replay_meta = level_workload(frame, 0, meta, "agg.parquet")
    assert len(trace) == 1 + 10 and OBSERVED_UNTIL not in replay_meta  # nothing held at 30 s: all counted
    _, trace, replay_meta = level_workload(frame, 0, {"arrival_counts": meta["arrival_counts"]}, "agg.parquet")
    assert len(trace) == 11 and OBSERVED_UNTIL not in replay_meta  # an import before requests_held: as before


def test_more_arrivals_than_replayed_end_the_window_at_the_last_replayed_one(monkeypatch):
    monkeypatch.setattr(aggregate_workload, "MAX_REQUESTS", 5)
    frame, meta = _window(8, [[0, 15, 4], [15, 30, 6]], [[0, 0, 0], [15, 3, 0], [30, 2, 0]])
    _, trace, replay_meta = level_workload(frame, 0, meta, "agg.parquet")
    t = trace["arrival_time_s"].to_numpy()
    assert len(trace) == 5 and np.sum(t <= 15) == 4  # the first 5 of the 10 arrivals
    assert float(replay_meta[OBSERVED_UNTIL]) == pytest.approx(t.max(), abs=1e-6) and t.max() > 15


@pytest.mark.parametrize("text", ["{", '{"0": []}', '{"0": [[0, -1, 0]]}', '{"0": [[15, 1, 0], [0, 1, 0]]}',
                                  '{"0": [[0, 1]]}'])
def test_bad_requests_held_are_one_error_naming_the_file_and_key(tmp_path, text):
    frame, meta = _window(10, [[0, 15, 4], [15, 30, 6]], [])
    path = tmp_path / "agg.parquet"
    write_trace(frame, "aggregate_targets/1", path, {**meta, "requests_held": text})
    res = invoke_servecal("calibrate", "fit", path, "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "-o",
                          tmp_path / "cal.json")
    said = " ".join(res.output.split())
    assert res.exit_code != 0 and "Traceback" not in res.output
    assert f"{path}: metadata requests_held, level 0" in said and "[[time_s, running, waiting], ...]" in said


def _columns(base_s: float) -> tuple[pd.DataFrame, dict]:
    """Three requests on one sequence slot, every step ``base_s``: (trace, predicted columns)."""
    reqs = [("1", 0.0, 16, 2), ("2", 0.0, 16, 3), ("3", 0.1, 16, 1)]
    done, _ = run(reqs, LinearStepCost(base_s, 0.0), max_num_seqs=1)
    trace = pd.DataFrame(reqs, columns=["request_id", "arrival_time_s", "num_prompt_tokens", "num_output_tokens"])
    r = [done[k] for k, *_ in reqs]
    return trace, {"pred_ttft_s": np.array([x.first_token_time_s - x.arrival_time_s for x in r]),
                   "pred_e2e_s": np.array([x.last_token_time_s - x.arrival_time_s for x in r])}


def test_the_requests_matched_are_those_the_replay_finishes_inside_the_window():
    """Steps of 0.1 s, one request at a time, in arrival order: request 1 (2 tokens) has its first
    token at 0.1 s and ends at 0.2 s; request 2 (3 tokens) at 0.3 and 0.5 s; request 3 (1
    token, arriving at 0.1 s) at 0.6 s. A window ending at 0.45 s counted the E2E of request 1
    alone and the TTFT of requests 1 and 2. With steps of 0.05 s they end at 0.1, 0.25 and 0.3 s:
    all three inside."""
    trace, columns = _columns(0.1)
    assert columns["pred_e2e_s"] == pytest.approx([0.2, 0.5, 0.5])
    window = Run("agg#0", trace, ReplayConfig(), {OBSERVED_UNTIL: "0.45"}, targets={})
    assert np.isnan(window.predicted(columns, "e2e_s")).tolist() == [False, True, True]
    assert window.predicted(columns, "e2e_s")[0] == pytest.approx(0.2)
    assert np.nan_to_num(window.predicted(columns, "ttft_s")) == pytest.approx([0.1, 0.3, 0.0])
    assert observed(trace["arrival_time_s"], columns, "tpot_s", 0.45).tolist() == [True, False, False]
    trace, faster = _columns(0.05)
    assert window.predicted(faster, "e2e_s") == pytest.approx([0.1, 0.25, 0.2])  # the set moves with the speed
    drained = Run("agg#0", trace, ReplayConfig(), {}, targets={})  # no window end: every request
    assert drained.predicted(columns, "e2e_s") == pytest.approx([0.2, 0.5, 0.5])


def test_a_fit_on_a_window_that_ended_busy_says_what_it_assumed_of_the_unfinished():
    from calibrate.aggregate_runs import not_identified

    trace, _ = _columns(0.1)
    busy = Run("agg#0", trace, ReplayConfig(), {OBSERVED_UNTIL: "0.45"}, targets={"ttft_s": ([50.0], [0.1])})
    drained = Run("agg#1", trace, ReplayConfig(), {}, targets={"ttft_s": ([50.0], [0.1])})
    said = " ".join(not_identified([busy, drained]))
    assert "agg#0: windows of scrapes whose server still held requests at their end" in said
    assert "the finished ones' lengths" in said and "agg#1:" not in said
