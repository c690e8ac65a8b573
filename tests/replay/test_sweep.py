"""Parameter sweeps (``replay --sweep``) and the parallel multi-start of the request-log fit."""
import sys
import types

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from replay.analysis.compare import scheduler_table
from replay.cost.cost_model import RooflineCostModel
from schemas.cost_params import CostParams
from replay.errors import ConfigError
from replay.config import ClosedLoopOptions, EngineOptions, ReplayConfig, SchedulingOptions
from replay.simulate import replay_frame
from replay.sweep import (MAX_POINTS, SweepContext, evaluate_point, format_sweep_table, parse_sweep, parse_sweeps,
                          run_sweep, sweep_points)
from schemas.specs import get_gpu, get_model
from schemas.tables import REQUEST_TRACE, STEP_TRACE
from traces.synth import synth_requests

COST = RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("a100-80gb"),
                         CostParams(eta_compute=0.6, eta_mem=0.8, t_step_s=2e-4))
TRACE = synth_requests(120, 6.0, "lognormal:mean=600,sigma=0.8", "lognormal:mean=120,sigma=0.8", seed=3)


# -- parsing ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, name, values", [
    ("rate-scale=0.5:3:0.25", "rate-scale", [0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0]),
    ("rate-scale=0.1:0.35:0.1", "rate-scale", [0.1, 0.2, 0.3]),      # 0.35 is off the grid
    ("rate-scale=0.1:0.3:0.1", "rate-scale", [0.1, 0.2, 0.3]),       # decimal: 0.3 is on it
    ("rate-scale=2", "rate-scale", [2.0]),
    ("max-num-seqs=16:64:16", "max-num-seqs", [16, 32, 48, 64]),
    ("max-num-batched-tokens=512,2048, 8192", "max-num-batched-tokens", [512, 2048, 8192]),
    ("replicas=1:4:1", "replicas", [1, 2, 3, 4]),
    ("concurrency=1,8,64", "concurrency", [1, 8, 64]),
    ("scheduler=fcfs,chunked,disagg", "scheduler", ["fcfs", "chunked", "disagg"]),
])
def test_parse_sweep(text, name, values):
    got_name, got = parse_sweep(text)
    assert got_name == name and got == values
    assert all(type(v) is type(values[0]) for v in got)


@pytest.mark.parametrize("text, needle", [
    ("temperature=1,2", "unknown option 'temperature'; sweepable: rate-scale"),
    ("rate-scale", "give values"),
    ("rate-scale=", "give values"),
    ("rate-scale=fast", "'fast' is not a number"),
    ("rate-scale=0,1", "0 is out of range (must be > 0)"),
    ("rate-scale=1:0.5:0.1", "needs step > 0 and stop >= start"),
    ("rate-scale=0.5:1:0", "needs step > 0"),
    ("rate-scale=1:2", "expected start:stop:step"),
    ("max-num-seqs=1.5", "1.5 is not an integer"),
    ("max-num-seqs=0:4:1", "0 is out of range (must be >= 1)"),
    ("max-num-seqs=16,16", "16 given more than once"),
    ("scheduler=fcfs,nope", "--sweep scheduler: --scheduler nope: unknown"),
    ("replicas=1:100000:1", f"at most {MAX_POINTS}"),
    ("rate-scale=inf", "out of range"),
])
def test_bad_sweeps_name_the_problem(text, needle):
    with pytest.raises(ConfigError, match=None) as exc:
        parse_sweep(text)
    assert needle in str(exc.value)


def test_points_are_the_cartesian_product_last_varying_fastest():
    sweeps = parse_sweeps(["rate-scale=1,2", "scheduler=fcfs,chunked,sjf"])
    points = sweep_points(sweeps)
    assert len(points) == 6
    assert points[:4] == [{"rate-scale": 1.0, "scheduler": "fcfs"}, {"rate-scale": 1.0, "scheduler": "chunked"},
                          {"rate-scale": 1.0, "scheduler": "sjf"}, {"rate-scale": 2.0, "scheduler": "fcfs"}]
    with pytest.raises(ConfigError, match="given twice"):
        parse_sweeps(["rate-scale=1", "rate-scale=2"])
    with pytest.raises(ConfigError, match="points; at most"):
        parse_sweeps(["max-num-seqs=1:200:1", "max-num-batched-tokens=1:200:1"])


# -- evaluation ---------------------------------------------------------------------------------------

def test_a_point_is_the_replay_with_its_options():
    ctx = SweepContext(TRACE, {}, COST, ReplayConfig(scheduling=SchedulingOptions(slo_ttft_s=0.2)))
    row = evaluate_point(ctx, {"rate-scale": 2.0, "max-num-seqs": 8})
    res, _ = replay_frame(TRACE.assign(arrival_time_s=TRACE["arrival_time_s"] / 2), COST,
                          ReplayConfig(EngineOptions(max_num_seqs=8), SchedulingOptions(slo_ttft_s=0.2)))
    expected = scheduler_table({"": res}, 0.2, None).iloc[0]
    assert row["rate_scale"] == 2.0 and row["max_num_seqs"] == 8
    for col in ("n_ok", "ttft_p99_s", "tpot_p50_s", "e2e_p90_s", "goodput_rps"):
        assert row[col] == expected[col]
    # throughput: completed requests over first arrival .. last completion
    end = (res["arrival_time_s"] + res["pred_e2e_s"]).max()
    assert row["throughput_rps"] == pytest.approx(len(res) / (end - res["arrival_time_s"].min()), rel=1e-12)


def test_more_load_more_latency():
    table = run_sweep(SweepContext(TRACE, {}, COST, ReplayConfig()), parse_sweeps(["rate-scale=0.5,4"]), jobs=1)
    assert "goodput_rps" not in table  # no SLO: it would equal the throughput
    assert table["ttft_p90_s"].iloc[1] > table["ttft_p90_s"].iloc[0]
    assert table["throughput_rps"].iloc[1] > table["throughput_rps"].iloc[0]


def test_closed_loop_sweep_over_concurrency():
    trace = TRACE.assign(arrival_time_s=0.0)
    table = run_sweep(SweepContext(trace, {}, COST, ReplayConfig()), parse_sweeps(["concurrency=1,16"]), jobs=1)
    assert table["throughput_rps"].iloc[1] > 4 * table["throughput_rps"].iloc[0]
    assert (table["queue_wait_p99_s"] >= 0).all()
    with pytest.raises(ConfigError, match="does not use arrival times"):
        run_sweep(SweepContext(trace, {}, COST, ReplayConfig(closed_loop=ClosedLoopOptions(4))),
                  parse_sweeps(["rate-scale=1,2"]))
    with pytest.raises(ConfigError, match="--prefill-replicas and --decode-replicas"):
        run_sweep(SweepContext(trace, {}, COST, ReplayConfig()), parse_sweeps(["scheduler=chunked,disagg",
                                                                                "replicas=1,2"]))


def test_parallel_equals_serial():
    ctx = SweepContext(TRACE, {}, COST, ReplayConfig(scheduling=SchedulingOptions(slo_ttft_s=0.3, slo_tpot_s=0.05)))
    sweeps = parse_sweeps(["rate-scale=1:3:1", "scheduler=fcfs,chunked", "replicas=1,2"])
    serial = run_sweep(ctx, sweeps, jobs=1)
    parallel = run_sweep(ctx, sweeps, jobs=2)
    assert len(serial) == 12
    pd.testing.assert_frame_equal(serial, parallel, check_exact=True)


class _FakeRay(types.ModuleType):
    """Just enough of Ray's API, run in this process."""

    def __init__(self):
        super().__init__("ray")
        self.initialized, self.calls = False, []

    def is_initialized(self):
        return self.initialized

    def init(self, address=None, **kwargs):
        self.initialized = True
        self.calls.append(("init", address))

    def shutdown(self):
        self.initialized = False
        self.calls.append(("shutdown",))

    def put(self, value):
        self.calls.append(("put",))
        return ("ref", value)

    def get(self, refs):
        return list(refs)

    def remote(self, fn):
        return types.SimpleNamespace(remote=lambda ref, *args: fn(ref[1], *args))


def test_ray_runs_the_same_points(monkeypatch):
    fake = _FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    ctx = SweepContext(TRACE, {}, COST, ReplayConfig())
    sweeps = parse_sweeps(["scheduler=fcfs,chunked"])
    table = run_sweep(ctx, sweeps, ray_address="ray://head:10001")
    pd.testing.assert_frame_equal(table, run_sweep(ctx, sweeps, jobs=1), check_exact=True)
    assert fake.calls == [("init", "ray://head:10001"), ("put",), ("shutdown",)]  # the trace goes once


def test_without_ray_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ConfigError, match=r"pip install 'servecal\[ray\]'"):
        run_sweep(SweepContext(TRACE, {}, COST, ReplayConfig()), parse_sweeps(["rate-scale=1"]), ray_address="auto")


def test_format_sweep_table():
    table = run_sweep(SweepContext(TRACE, {}, COST, ReplayConfig(scheduling=SchedulingOptions(slo_ttft_s=0.2))),
                      parse_sweeps(["rate-scale=0.5,1", "max-num-seqs=4"]), jobs=1)
    lines = format_sweep_table(table, ["rate-scale", "max-num-seqs"], wide=True).splitlines()
    assert lines[0].split() == ["rate_scale", "max_num_seqs", "n_ok", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms",
                                "tpot_p50_ms", "tpot_p90_ms", "tpot_p99_ms", "e2e_p50_ms", "e2e_p90_ms",
                                "e2e_p99_ms", "goodput_rps", "throughput_rps"]
    first = lines[1].split()
    assert first[:3] == ["0.5", "4", "120"]
    assert float(first[3]) == pytest.approx(table["ttft_p50_s"].iloc[0] * 1e3, abs=0.05)


# -- command line ----------------------------------------------------------------------------------------

def _cli_files(tmp_path):
    from helpers import write_calibration
    from schemas.tables import REQUEST_TRACE
    from traces.io import write_trace

    trace, cal = tmp_path / "t.parquet", tmp_path / "cal.json"
    write_trace(TRACE, REQUEST_TRACE, trace)
    p = COST.params
    write_calibration(COST.with_params(p), cal)
    return trace, cal


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_cli_sweep_prints_and_writes_the_table(tmp_path, suffix):
    from replay.cli import main

    trace, cal = _cli_files(tmp_path)
    out = tmp_path / f"sweep{suffix}"
    res = CliRunner().invoke(main, [str(trace), "--calibration", str(cal), "--sweep", "rate-scale=1,2",
                                    "--sweep", "scheduler=fcfs,chunked", "--slo-ttft-s", "0.3", "--jobs", "1",
                                    "--sweep-out", str(out)])
    assert res.exit_code == 0, res.output
    assert "sweeping 4 points (2 rate-scale x 2 scheduler) on 120 requests" in res.output
    assert "goodput" in res.output and f"wrote {out}" in res.output
    written = pd.read_csv(out) if suffix == ".csv" else pd.read_parquet(out)
    expected = run_sweep(SweepContext(TRACE, {}, COST, ReplayConfig(scheduling=SchedulingOptions(slo_ttft_s=0.3))),
                         parse_sweeps(["rate-scale=1,2", "scheduler=fcfs,chunked"]), jobs=1)
    assert list(written.columns) == list(expected.columns)
    np.testing.assert_allclose(written["e2e_p99_s"], expected["e2e_p99_s"], rtol=1e-12)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left behind


@pytest.mark.parametrize("args, needle", [
    (("--jobs", "2"), "--jobs: only --sweep uses these"),
    (("--sweep-out", "x.csv"), "--sweep-out: only --sweep uses these"),
    (("--sweep", "rate-scale=1,2", "-o", "pred.parquet"), "cannot be combined with -o"),
    (("--sweep", "rate-scale=1,2", "--compare-schedulers", "fcfs,chunked"), "cannot be combined with --compare"),
    (("--sweep", "rate-scale=1,2", "--sweep-out", "x.json"), "give a .parquet or .csv file"),
    (("--sweep", "max-num-seqs=4,8", "--max-num-seqs", "16"), "--max-num-seqs: swept by --sweep"),
    (("--sweep", "rate-scale=1,2", "--concurrency", "4"), "does not use arrival times"),
    (("--sweep", "rate-scale=1,2", "--ray-address", "auto", "--jobs", "2"), "--jobs: with --ray-address"),
    (("--sweep", "qps=1,2"), "unknown option 'qps'"),
])
def test_cli_bad_sweep_options_exit_2(tmp_path, args, needle):
    from replay.cli import main

    trace, cal = _cli_files(tmp_path)
    res = CliRunner().invoke(main, [str(trace), "--calibration", str(cal), *args])
    assert res.exit_code == 2, res.output
    assert needle in res.output and "Traceback" not in res.output


def test_cli_ray_address_without_ray_is_a_usage_error(tmp_path, monkeypatch):
    from replay.cli import main

    monkeypatch.setitem(sys.modules, "ray", None)
    trace, cal = _cli_files(tmp_path)
    res = CliRunner().invoke(main, [str(trace), "--calibration", str(cal), "--sweep", "rate-scale=1",
                                    "--ray-address", "auto"])
    assert res.exit_code == 2, res.output
    assert "pip install 'servecal[ray]'" in res.output


# -- the request-log fit's multi-start in parallel ---------------------------------------------------------

def _measured_request_log():
    truth = COST.with_params(CostParams(eta_compute=0.5, eta_mem=0.7, t_step_s=1e-3))
    trace = synth_requests(40, 4.0, "lognormal:mean=800,sigma=0.6", "lognormal:mean=60,sigma=0.6", seed=5)
    cfg = ReplayConfig(EngineOptions(max_num_seqs=16, max_num_batched_tokens=2048))
    measured, _ = replay_frame(trace, truth, cfg)
    return trace.assign(ttft_s=measured["pred_ttft_s"], tpot_s=measured["pred_tpot_s"]), cfg


def _same_fit(a, b):
    a, b = a[0], b[0]
    assert a.values() == b.values()
    assert {k: p.stderr for k, p in a.params.items()} == {k: p.stderr for k, p in b.params.items()}
    assert (a.score, a.stats["n_replays"]) == (b.score, b.stats["n_replays"])
    assert a.stats["residual_by_run"] == b.stats["residual_by_run"]


def _fit(trace, cfg, **kw):
    from calibrate.request_fit import fit_requests
    from calibrate.run_errors import Run

    return fit_requests([Run("log", trace, cfg, {})], COST, variants=("max",), max_nfev=8, **kw)


def test_request_fit_parallel_starts_equal_serial():
    trace, cfg = _measured_request_log()
    _same_fit(_fit(trace, cfg, jobs=1), _fit(trace, cfg, jobs=2))


def test_request_fit_on_ray_equals_serial(monkeypatch):
    fake = _FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    trace, cfg = _measured_request_log()
    _same_fit(_fit(trace, cfg, jobs=1), _fit(trace, cfg, ray_address="ray://head:10001"))
    calls = fake.calls  # one connection for the whole fit; each variant's problem goes to the store once
    assert calls[0] == ("init", "ray://head:10001") and calls[-1] == ("shutdown",)
    assert set(calls[1:-1]) == {("put",)}


def test_calibrate_fit_ray_address_errors(tmp_path, monkeypatch):
    """Without Ray the message says how to install it; a step trace (no replays) refuses it."""
    from calibrate.cli import main as calibrate
    from traces.io import write_trace

    trace, _ = _measured_request_log()
    write_trace(trace, REQUEST_TRACE, str(tmp_path / "log.parquet"))
    monkeypatch.setitem(sys.modules, "ray", None)
    res = CliRunner().invoke(calibrate, ["fit", str(tmp_path / "log.parquet"), "--model", "llama-3.1-8b",
                                         "--gpu", "h100-80gb", "--ray-address", "auto", "-o", str(tmp_path / "c.json")])
    assert res.exit_code == 2, res.output
    assert "pip install 'servecal[ray]'" in res.output
    steps = pd.DataFrame({"replica_id": [0], "step_start_time_s": [0.0], "step_duration_s": [0.01],
                          "num_prefill_tokens": [512], "num_prefill_seqs": [1], "num_decode_seqs": [0],
                          "decode_context_tokens": [0]})
    write_trace(steps, STEP_TRACE, str(tmp_path / "steps.parquet"))
    res = CliRunner().invoke(calibrate, ["fit", str(tmp_path / "steps.parquet"), "--model", "llama-3.1-8b",
                                         "--gpu", "h100-80gb", "--ray-address", "auto", "-o", str(tmp_path / "c.json")])
    assert res.exit_code == 2, res.output
    assert "--ray-address" in res.output
    assert not (tmp_path / "c.json").exists()
