"""Output people read: replay's console tables within 100 columns (``--wide`` for every column),
errors relative only above a 1 ms floor, progress bars only on a terminal (``--quiet`` silences
them). The other commands' output, errors and help: ``test_messages_width.py``."""
import io

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from replay.cli import progress
from replay.analysis.compare import REL_ERR_FLOOR_S, broken_tolerances, compare, err_cell, format_table
from replay.cost.cost_model import RooflineCostModel
from replay.config import EngineOptions, ReplayConfig
from replay.simulate import replay_frame
from replay.text import WIDTH, render_table, wrap
from schemas.cost_params import CostParams
from schemas.specs import get_gpu, get_model
from schemas.tables import REQUEST_TRACE
from traces.synth import synth_requests

COST = RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb"),
                         CostParams(eta_compute=0.5, eta_mem=0.8, t_step_s=1e-4))


def widest(text: str) -> int:
    return max(map(len, text.splitlines()), default=0)


@pytest.fixture
def files(tmp_path, monkeypatch):
    """A measured trace (queue waits of 0 among them) and its calibration, under short names in tmp_path."""
    from helpers import write_calibration
    from traces.io import write_trace

    monkeypatch.chdir(tmp_path)
    df = synth_requests(300, 20.0, "lognormal:mean=800,sigma=0.8", "lognormal:mean=150,sigma=0.8", seed=1)
    truth = RooflineCostModel(COST.model, COST.gpu, CostParams(eta_compute=0.4, eta_mem=0.7, t_step_s=2e-4))
    meas, _ = replay_frame(df, truth, ReplayConfig(EngineOptions(max_num_seqs=32)))
    df = df.assign(queue_wait_s=0.0, ttft_s=meas["pred_ttft_s"], tpot_s=meas["pred_tpot_s"], e2e_s=meas["pred_e2e_s"])
    write_trace(df, REQUEST_TRACE, "t.parquet")
    write_calibration(COST, "cal.json")
    return "t.parquet", "cal.json"


def invoke(*args):
    from replay.cli import main

    return CliRunner().invoke(main, list(map(str, args)))


# -- the comparison table -------------------------------------------------------------------------

def test_a_measured_queue_wait_of_zero_gets_an_absolute_error():
    res = pd.DataFrame({"request_id": ["a", "b"], "arrival_time_s": [0.0, 1.0], "num_prompt_tokens": [10, 10],
                        "num_output_tokens": [5, 5], "pred_status": ["ok", "ok"],
                        "queue_wait_s": [0.0, 0.0], "pred_queue_wait_s": [740.2726, 740.2726],
                        "ttft_s": [0.100, 0.200], "pred_ttft_s": [0.110, 0.220]})
    t = compare(res).set_index("metric")
    assert np.isnan(t.loc["queue_wait", "rel_err_p50"])
    assert t.loc["queue_wait", "abs_err_p50"] == pytest.approx(740.2726)
    assert t.loc["ttft", "rel_err_p50"] == pytest.approx(0.1)
    for wide in (False, True):
        text = format_table(compare(res), wide=wide)
        assert "+740272.6 ms" in text and "%" in text  # the TTFT row keeps its relative error
        assert "1 ms" in text  # the floor is stated
    assert REL_ERR_FLOOR_S == 1e-3


@pytest.mark.parametrize("meas, pred, cell", [(0.0, 0.7402726, "+740.3 ms"), (0.0009, 0.0004, "-0.5 ms"),
                                               (0.001, 0.0011, "+10.0%"), (29.616, 29.099, "-1.7%"),
                                               (np.nan, 1.0, "-")])
def test_err_cell(meas, pred, cell):
    assert err_cell(meas, pred) == cell


def test_tolerance_below_the_floor_is_judged_against_the_floor():
    t = pd.DataFrame([{"metric": "queue_wait", "meas_p50": 0.0, "pred_p50": 0.00005, "rel_err_p50": np.nan,
                       "mape": np.nan}])
    assert broken_tolerances(t, {"queue_wait_p50": 0.1}) == []  # 0.05 ms <= 10 % of 1 ms
    t.loc[0, "pred_p50"] = 740.0
    (msg,) = broken_tolerances(t, {"queue_wait_p50": 0.1})
    assert "of the 1 ms floor" in msg and "+740000.0 ms" in msg


def test_default_table_fits_100_columns_and_wide_has_every_column():
    n = 1_000_000
    res = pd.DataFrame({"request_id": ["a", "b"], "arrival_time_s": [0.0, 1.0], "num_prompt_tokens": [10, 10],
                        "num_output_tokens": [5, 5], "pred_status": ["ok", "ok"],
                        "queue_wait_s": [0.0, 0.0], "pred_queue_wait_s": [98765.4, 99999.9],
                        "ttft_s": [98765.4, 3.0], "pred_ttft_s": [0.001, 99999.9],
                        "tpot_s": [0.03, 0.04], "pred_tpot_s": [0.031, 0.039],
                        "e2e_s": [99999.9, 5.0], "pred_e2e_s": [0.01, 99999.9]})
    table = compare(res).assign(n=n)
    text = format_table(table)
    assert widest(text) <= WIDTH, text
    assert text.splitlines()[0].split()[:8] == ["metric", "n", "meas_p50", "pred_p50", "err_p50", "meas_p90",
                                                "pred_p90", "err_p90"]  # bias and ks go when values are huge
    normal = format_table(compare(res.assign(ttft_s=[0.1, 0.2], e2e_s=[1.0, 2.0], pred_e2e_s=[1.1, 2.1],
                                             pred_ttft_s=[0.1, 0.3], pred_queue_wait_s=[0.0, 0.1])))
    assert normal.splitlines()[0].split() == ["metric", "n", "meas_p50", "pred_p50", "err_p50", "meas_p90",
                                              "pred_p90", "err_p90", "bias", "ks"]
    wide = format_table(table, wide=True)
    head = wide.splitlines()[0].split()
    assert {"meas_mean_ms", "err_p99", "mape", "wass_ms"} <= set(head)
    assert widest(wide) > WIDTH


def test_render_table_drops_then_shortens_to_fit():
    head = ["name", "a", "b", "c"]
    rows = [["x" * 120, "1", "2", "3"]]
    text = render_table(head, rows, 40, drop_order=("c",))
    assert widest(text) <= 40 and "c" not in text.splitlines()[0].split() and ".." in text
    assert render_table(head, rows) == render_table(head, rows, None)


def test_wrap_breaks_after_commas():
    line = "replaying 300 requests: model llama-3.1-8b, 2 replicas of 1 x h100-80gb (TP=1), 2 GPUs, " \
           "max_num_seqs=128, max_num_batched_tokens=2048"
    out = wrap(line)
    assert widest(out) <= WIDTH and " ".join(out.split()) == line
    assert out.splitlines()[1].startswith("  ")


# -- the commands, as a user runs them -------------------------------------------------------------

def test_replay_default_output_fits_100_columns(files):
    trace, cal = files
    res = invoke(trace, "--calibration", cal, "--max-num-seqs", 32, "--slo-ttft-s", 0.5, "--report", "r.html",
                 "--tolerance", "queue_wait_p50=0.5,ttft_p50=5")
    assert res.exit_code in (0, 3), res.output
    assert widest(res.output) <= WIDTH, res.output
    assert "err_p50" in res.output and "ms" in res.output
    assert "%" not in next(line for line in res.output.splitlines() if line.strip().startswith("queue_wait"))
    wide = invoke(trace, "--calibration", cal, "--max-num-seqs", 32, "--wide")
    assert wide.exit_code == 0 and "wass_ms" in wide.output and widest(wide.output) > WIDTH


def test_compare_schedulers_and_sweep_fit_100_columns(files):
    trace, cal = files
    res = invoke(trace, "--calibration", cal, "--compare-schedulers", "fcfs,chunked,static,sjf,edf,disagg",
                 "--slo-ttft-s", 0.5, "--slo-tpot-s", 0.05)
    assert res.exit_code == 0, res.output
    assert widest(res.output) <= WIDTH, res.output
    res = invoke(trace, "--calibration", cal, "--sweep", "rate-scale=0.5,1,2", "--sweep", "max-num-seqs=8,64",
                 "--sweep", "max-num-batched-tokens=512,8192", "--slo-ttft-s", 0.5, "--jobs", 1)
    assert res.exit_code == 0, res.output
    assert widest(res.output) <= WIDTH, res.output
    assert "ttft_p50" in res.output and "throughput" in res.output
    wide = invoke(trace, "--calibration", cal, "--sweep", "rate-scale=0.5,1,2", "--sweep", "max-num-seqs=8,64",
                  "--sweep", "max-num-batched-tokens=512,8192", "--slo-ttft-s", 0.5, "--jobs", 1, "--wide")
    assert "e2e_p99_ms" in wide.output and "throughput_rps" in wide.output


# -- progress on stderr ----------------------------------------------------------------------------

class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_only_on_a_terminal_and_not_when_quiet(monkeypatch):
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    monkeypatch.setattr(progress, "REDRAW_S", 0.0)
    trace = synth_requests(3000, 50.0, "lognormal:mean=300,sigma=0.5", "lognormal:mean=50,sigma=0.5", seed=0)
    term, steps = FakeTerminal(), []
    real_update = progress.Bar.update
    monkeypatch.setattr(progress.Bar, "update", lambda self, n=1: (steps.append(n), real_update(self, n)))
    with progress.reporting(enabled=True, stream=term):
        assert progress.active()
        replay_frame(trace, COST, ReplayConfig())
    assert "replaying" in term.getvalue() and "100%" in term.getvalue()
    assert sum(steps) >= 2 * len(trace) - 1024  # arrivals (by 1024) and completions both move the bar
    assert not progress.active()
    for enabled, stream in ((False, FakeTerminal()), (True, io.StringIO())):  # --quiet; not a terminal
        with progress.reporting(enabled=enabled, stream=stream):
            assert progress.bar("x", 10) is None
            replay_frame(trace, COST, ReplayConfig())
        assert stream.getvalue() == ""


def test_one_bar_at_a_time_and_sweeps_report_points(monkeypatch):
    from replay.sweep import SweepContext, parse_sweeps, run_sweep

    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    monkeypatch.setattr(progress, "REDRAW_S", 0.0)
    term = FakeTerminal()
    with progress.reporting(enabled=True, stream=term):
        outer = progress.bar("a", 2)
        assert outer is not None and progress.bar("b", 2) is None
        outer.close()
        trace = synth_requests(50, 5.0, "lognormal:mean=300,sigma=0.5", "lognormal:mean=50,sigma=0.5", seed=0)
        run_sweep(SweepContext(trace, {}, COST, ReplayConfig()), parse_sweeps(["rate-scale=1,2,3"]), jobs=1)
    assert "sweep points" in term.getvalue() and "replaying" not in term.getvalue()


def test_quiet_drops_the_timing_line(files):
    trace, cal = files
    args = (trace, "--calibration", cal, "--sweep", "rate-scale=1,2", "--jobs", 1)
    assert "points in" in invoke(*args).output
    assert "points in" not in invoke(*args, "--quiet").output
