"""Measured vs predicted (replay.analysis.compare) on the cases of shared/cases: BR-01, BR-03, BR-07, BR-17, BR-22."""
import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from replay.analysis.compare import MAPE_MIN_MEAS_S, broken_tolerances, compare, format_table, metric_values
from replay.analysis.metrics import from_token_times, mean_tpot_and_itl, percentile
from schemas.metrics import tpot_s


def result_frame(**cols):
    """A minimal replay result: every request completed on both sides unless told otherwise."""
    n = len(next(iter(cols.values())))
    base = {"request_id": [f"r{i}" for i in range(n)], "arrival_time_s": np.arange(n, dtype=float),
            "num_prompt_tokens": np.full(n, 100), "num_output_tokens": np.full(n, 10), "pred_status": ["ok"] * n}
    return pd.DataFrame({**base, **cols})


def row(table, metric):
    rows = table[table["metric"] == metric]
    assert len(rows) == 1, table
    return rows.iloc[0]


# -- BR-22: small-sample percentiles --------------------------------------------------------------

def test_br22_three_samples_numpy_linear_on_both_sides():
    t = compare(result_frame(ttft_s=[0.010, 0.020, 0.030], pred_ttft_s=[0.011, 0.019, 0.031]))
    r = row(t, "ttft")
    assert r["meas_p99"] == pytest.approx(0.0298)  # 20 + 0.98 * 10 ms; not 20 (int index), not 30 (nearest rank)
    assert r["pred_p99"] == pytest.approx(0.03076)  # 19 + 0.98 * 12 ms
    assert r["rel_err_p99"] == pytest.approx((30.76 - 29.8) / 29.8)  # +3.22 %
    assert r["rel_err_p50"] == pytest.approx(-0.05)
    assert r["n"] == 3


@pytest.mark.parametrize("values,q,expected", [([1.0, 2.0], 95, 1.95), ([1.0], 95, 1.0), ([1.0], 99, 1.0),
                                               ([1.0, 2.0], 50, 1.5), ([10.0, 20.0, 30.0], 99, 29.8)])
def test_br22_percentile_never_leaves_the_observed_range(values, q, expected):
    assert percentile(values, q) == pytest.approx(expected)
    assert min(values) <= percentile(values, q) <= max(values)


@pytest.mark.parametrize("n", [1, 2])
def test_br22_compare_with_one_or_two_requests(n):
    meas = [1.0, 2.0][:n]
    t = compare(result_frame(e2e_s=meas, pred_e2e_s=meas), percentiles=(50, 95, 99))
    r = row(t, "e2e")
    assert r["meas_p95"] == pytest.approx(1.95 if n == 2 else 1.0)
    assert r["pred_p95"] == r["meas_p95"] and r["rel_err_p95"] == 0.0
    assert r["ks"] == 0.0 and r["wasserstein_s"] == 0.0


# -- BR-17: failed requests are not compared ------------------------------------------------------

def test_br17_failed_measured_requests_are_excluded():
    res = result_frame(ttft_s=[0.120, 0.0, 0.200, 0.160], pred_ttft_s=[0.1, 0.1, 0.2, 0.2],
                       status=["ok", "ReadTimeout", "ok", None],
                       pred_status=["ok", "not simulated: failed in trace", "ok", "ok"])
    r = row(compare(res), "ttft")
    assert r["n"] == 3
    assert r["meas_mean_s"] == pytest.approx(0.160)  # not 0.120 (failure counted as ttft 0)
    assert r["meas_p50"] == pytest.approx(0.160)  # not 0.140


def test_br17_failure_excluded_even_when_simulated_ok():
    # The measured run failed but the simulator completed it: still no measured value to face.
    res = result_frame(ttft_s=[0.120, 0.0], pred_ttft_s=[0.1, 0.05], status=["ok", "error: 500"])
    assert row(compare(res), "ttft")["n"] == 1


def test_rejected_by_the_simulator_is_excluded():
    res = result_frame(ttft_s=[0.1, 0.2], pred_ttft_s=[0.1, np.nan],
                       pred_status=["ok", "rejected: exceeds max_model_len"])
    assert row(compare(res), "ttft")["n"] == 1


def test_nullable_status_column():
    res = result_frame(ttft_s=[0.1, 0.2, 0.3], pred_ttft_s=[0.1, 0.2, 0.3],
                       status=pd.array(["ok", pd.NA, "failed"], dtype="string"))
    assert row(compare(res), "ttft")["n"] == 2


# -- BR-03: TPOT undefined for one token ----------------------------------------------------------

def test_br03_one_token_tpot_is_excluded_not_zero():
    # C: 1 token (an importer wrote TPOT 0.0); D: 10 tokens, TTFT 0.5, E2E 0.9.
    assert np.isnan(tpot_s(0.400, 0.400, 1))
    assert tpot_s(0.500, 0.900, 10) == pytest.approx(0.4 / 9)  # not /10, not /chunks
    res = result_frame(num_output_tokens=[1, 10], tpot_s=[0.0, 0.4 / 9], pred_tpot_s=[np.nan, 0.05])
    r = row(compare(res), "tpot")
    assert r["n"] == 1
    assert r["meas_mean_s"] == pytest.approx(0.04444, abs=1e-5)  # not 0.02222 (C counted as 0)
    # even if both sides wrote 0 for the 1-token request, it is not a TPOT sample
    res = result_frame(num_output_tokens=[1, 10], tpot_s=[0.0, 0.4 / 9], pred_tpot_s=[0.0, 0.05])
    assert row(compare(res), "tpot")["n"] == 1


def test_br03_chunked_stream_gives_chunk_gaps_that_cannot_be_paired():
    # D streamed 10 tokens in 3 chunks: measured gaps are per chunk (2), predicted per token (9).
    res = result_frame(num_output_tokens=[1, 10], token_times_s=[[0.4], [0.5, 0.7, 0.9]],
                       pred_token_times_s=[[0.4], list(0.5 + np.arange(10) * 0.4 / 9)])
    m, p, paired = metric_values(res, "itl")
    assert m == pytest.approx([0.2, 0.2]) and p.size == 9 and not paired
    r = row(compare(res), "itl")
    assert np.isnan(r["mape"]) and r["n_mape"] == 0  # no gap faces another
    assert r["pred_mean_s"] == pytest.approx(0.4 / 9)
    assert r["bias_s"] == pytest.approx(0.4 / 9 - 0.2)


# -- BR-01 / BR-07: ITL never includes TTFT; N - 1 gaps ---------------------------------------------

def test_br01_br07_itl_row_pools_gaps_without_ttft():
    meas = [0.500, 0.520, 0.540, 0.560]  # BR-01, relative to arrival
    pred = [0.100, 0.120, 0.140, 0.190]  # BR-07: decode steps 0.020, 0.020, 0.050
    res = result_frame(num_output_tokens=[4], token_times_s=[meas], pred_token_times_s=[pred],
                       ttft_s=[0.5], pred_ttft_s=[0.1], e2e_s=[0.56], pred_e2e_s=[0.19])
    m, p, paired = metric_values(res, "itl")
    assert m == pytest.approx([0.02, 0.02, 0.02]) and p == pytest.approx([0.02, 0.02, 0.05]) and paired
    r = row(compare(res), "itl")
    assert r["n"] == 3  # N - 1, not N
    assert r["meas_mean_s"] == pytest.approx(0.020)  # not 0.140 (TTFT leaked in)
    assert r["pred_mean_s"] == pytest.approx(0.030)  # not 0.035 (phantom entry)
    assert r["meas_p99"] < 0.5
    # the invariant TTFT + sum(ITL) = E2E, on both sides
    for times in (meas, pred):
        d = from_token_times(0.0, times)
        assert d["ttft_s"] + d["itl_s"].sum() == pytest.approx(d["e2e_s"], abs=1e-9)


def test_mean_tpot_and_mean_itl_are_reported_apart():
    # A: 2 tokens, one 100 ms gap; B: 5 tokens, four 10 ms gaps.
    a, b = [1.0, 1.1], [1.0, 1.01, 1.02, 1.03, 1.04]
    res = result_frame(num_output_tokens=[2, 5], token_times_s=[a, b], pred_token_times_s=[a, b],
                       tpot_s=[0.1, 0.01], pred_tpot_s=[0.1, 0.01])
    t = compare(res)
    mean_tpot, mean_itl = mean_tpot_and_itl([a, b])
    assert row(t, "tpot")["meas_mean_s"] == pytest.approx(mean_tpot) == pytest.approx(0.055)
    assert row(t, "itl")["meas_mean_s"] == pytest.approx(mean_itl) == pytest.approx(0.028)
    text = format_table(t, wide=True)
    assert "mean TPOT" in text and "mean ITL" in text
    assert "tpot row: each request once" in format_table(t)


def test_no_itl_row_without_token_times_on_both_sides():
    res = result_frame(ttft_s=[0.1], pred_ttft_s=[0.1], token_times_s=[[0.1, 0.2]])
    assert "itl" not in set(compare(res)["metric"])
    res = result_frame(ttft_s=[0.1], pred_ttft_s=[0.1], token_times_s=[None], pred_token_times_s=[[0.1, 0.2]])
    assert "itl" not in set(compare(res)["metric"])


# -- MAPE -------------------------------------------------------------------------------------------

def test_mape_skips_measured_values_below_one_ms():
    # Queue waits of 0 and 0.5 ms would give infinite / 300 % relative errors; only 10 and 20 ms count.
    res = result_frame(queue_wait_s=[0.0, 0.0005, 0.010, 0.020], pred_queue_wait_s=[0.001, 0.002, 0.011, 0.018])
    r = row(compare(res), "queue_wait")
    assert MAPE_MIN_MEAS_S == 1e-3
    assert r["n_mape"] == 2 and r["n"] == 4
    assert r["mape"] == pytest.approx(0.1)
    assert r["bias_s"] == pytest.approx(np.mean([0.001, 0.0015, 0.001, -0.002]))


def test_mape_nan_when_every_measured_value_is_tiny():
    res = result_frame(queue_wait_s=[0.0, 0.0], pred_queue_wait_s=[0.001, 0.0])
    assert np.isnan(row(compare(res), "queue_wait")["mape"])
    assert broken_tolerances(compare(res), {"queue_wait_mape": 0.5})  # unknown error breaks a bound


def test_broken_tolerances():
    t = compare(result_frame(ttft_s=[0.1, 0.2, 0.3], pred_ttft_s=[0.11, 0.22, 0.33]))
    assert broken_tolerances(t, {"ttft_p50": 0.15, "ttft_mape": 0.15}) == []
    assert broken_tolerances(t, {"ttft_p50": 0.05}) == ["ttft_p50: |+10.0%| > 5.0%"]
    assert "has no request with both a measured and a predicted value" in broken_tolerances(t, {"e2e_p50": 0.1})[0]
    assert "unknown statistic" in broken_tolerances(t, {"ttft_p42": 0.1})[0]


# -- the CLI: exit 3 on a broken tolerance -----------------------------------------------------------

def make_cli_inputs(tmp_path, error=0.05, n=12):
    """A calibration JSON and a request trace whose measured latencies are the replay's / (1 - error).

    Returns (trace path, calibration path, replay options); the replay under those options
    predicts every measured value with relative error ``-error`` (pred = meas * (1 - error)).
    """
    from replay.cost.cost_model import cost_model_from_calibration
    from replay.config import EngineOptions, ReplayConfig, SchedulingOptions
    from replay.simulate import replay_frame
    from schemas.calibration import Calibration, FittedParam
    from schemas.specs import get_gpu, get_model
    from schemas.tables import REQUEST_TRACE
    from traces.io import write_trace

    values = {"eta_compute": 0.5, "eta_mem": 0.9, "t_step_s": 1.1e-3}
    cal = Calibration(model=get_model("llama-3.1-8b"), gpu=get_gpu("h100-80gb"), tp=1,
                      params={k: FittedParam(v, stderr=v / 100) for k, v in values.items()})
    cal_path = tmp_path / "cal.json"
    cal.write(cal_path)
    rng = np.random.default_rng(5)
    trace = pd.DataFrame({"request_id": [f"q{i}" for i in range(n)],
                          "arrival_time_s": np.cumsum(rng.exponential(0.05, n)),
                          "num_prompt_tokens": rng.integers(50, 2000, n),
                          "num_output_tokens": rng.integers(2, 40, n)})
    opts = ["--scheduler", "chunked", "--max-num-batched-tokens", "512", "--num-gpu-blocks", "4096"]
    cfg = ReplayConfig(EngineOptions(max_num_batched_tokens=512, num_gpu_blocks=4096), SchedulingOptions("chunked"))
    pred, _ = replay_frame(trace, cost_model_from_calibration(cal), cfg)
    assert (pred["pred_status"] == "ok").all()
    for col in ("ttft_s", "tpot_s", "e2e_s"):
        trace[col] = pred[f"pred_{col}"] / (1 - error)
    trace_path = tmp_path / "trace.parquet"
    write_trace(trace, REQUEST_TRACE, trace_path)
    return trace_path, cal_path, opts


def test_cli_tolerance_exit_codes(tmp_path):
    from replay.cli import main

    trace, cal, opts = make_cli_inputs(tmp_path, error=0.05)
    base = [str(trace), "--calibration", str(cal), *opts]
    ok = CliRunner().invoke(main, base + ["--tolerance", "ttft_p50=0.1,tpot_p90=0.1,e2e_mape=0.1"])
    assert ok.exit_code == 0, ok.output
    assert "tolerance broken" not in ok.output
    broken = CliRunner().invoke(main, base + ["--tolerance", "ttft_p50=0.1,e2e_p99=0.02"])
    assert broken.exit_code == 3, broken.output
    assert [ln for ln in broken.output.splitlines() if ln.startswith("tolerance broken")] == \
        ["tolerance broken: e2e_p99: |-5.0%| > 2.0%"]
    # without --tolerance nothing is checked
    assert CliRunner().invoke(main, base).exit_code == 0
