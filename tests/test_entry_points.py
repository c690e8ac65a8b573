"""The library entry points ``replay.run`` and ``calibrate.fit_traces``: the numbers the
commands print and write, from one call each, on a synthetic cluster whose parameters are known."""
from __future__ import annotations

import pandas as pd
import pytest

import calibrate
import replay
from calibrate.errors import RunSpecError
from replay.config import EngineOptions, RecordOptions, ReplayConfig
from replay.core.result_columns import steps_frame
from replay.cost.cost_model import RooflineCostModel
from replay.errors import ConfigError, ReplayError
from replay.simulate import replay_frame
from schemas.calibration import Calibration
from schemas.cost_params import CostParams
from schemas.kinds import REPLAY_RESULT, REQUEST_TRACE, STEP_TRACE
from schemas.specs import get_gpu, get_model
from traces.io import read_trace, write_trace
from traces.synth import synth_requests

from helpers import invoke_servecal, write_calibration

#: The synthetic cluster (``servecal demo``'s parameters, no noise).
TRUTH = CostParams(eta_compute=0.55, n_half_tokens=64.0, eta_mem=0.80, overlap=0.0, t_step_s=4e-4, t_seq_s=2e-5)
HARDWARE = ("--model", "llama-3.1-8b", "--gpu", "h100-80gb")


def _cost_model(params: CostParams | None = None) -> RooflineCostModel:
    return RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb"), params or CostParams())


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """A request log (measured latencies) and the step trace of the same run of the cluster."""
    out = tmp_path_factory.mktemp("measured")
    trace = synth_requests(40, 4.0, "lognormal:mean=512,sigma=0.6", "lognormal:mean=64,sigma=0.5", seed=3)
    cfg = ReplayConfig(EngineOptions(max_num_seqs=16, max_num_batched_tokens=2048), record=RecordOptions(steps=True))
    res, engine = replay_frame(trace, _cost_model(TRUTH), cfg)
    trace = trace.assign(queue_wait_s=res["pred_queue_wait_s"], ttft_s=res["pred_ttft_s"], tpot_s=res["pred_tpot_s"],
                         e2e_s=res["pred_e2e_s"])
    write_trace(trace, REQUEST_TRACE, out / "requests.parquet")
    write_trace(steps_frame(engine), STEP_TRACE, out / "steps.parquet")
    return out


def test_fit_traces_is_calibrate_fit_on_a_step_trace(measured, tmp_path):
    """The library's calibration is the command's, to the last digit, and recovers the cluster."""
    steps = str(measured / "steps.parquet")
    res = invoke_servecal("calibrate", "fit", steps, *HARDWARE, "-o", tmp_path / "cli.json")
    assert res.exit_code == 0, res.output
    fitted = calibrate.fit_traces([steps], _cost_model())
    cli = Calibration.read(tmp_path / "cli.json")
    fitted.calibration.write(tmp_path / "lib.json")
    lib = Calibration.read(tmp_path / "lib.json")
    assert {n: p.value for n, p in lib.params.items()} == {n: p.value for n, p in cli.params.items()}
    assert (lib.source, lib.fit["variant"]) == (cli.source, cli.fit["variant"])
    assert fitted.loaded.kind == STEP_TRACE and fitted.dropped == {}
    for name in ("eta_compute", "eta_mem", "t_step_s"):
        assert lib.params[name].value == pytest.approx(TRUTH[name], rel=1e-3)


def test_fit_traces_is_calibrate_fit_on_a_request_log(measured, tmp_path):
    """A request log as a file and as a frame: the command's parameters and engine settings."""
    log = str(measured / "requests.parquet")
    held = {n: TRUTH[n] for n in ("n_half_tokens", "eta_mem", "t_seq_s")}
    options = ("--max-num-seqs", "16", "--max-num-batched-tokens", "2048", "--variants", "max",
               "--free", "eta_compute,t_step_s", "--jobs", "1",
               *(f"--fix={n}={v!r}" for n, v in held.items()))
    res = invoke_servecal("calibrate", "fit", log, *HARDWARE, *options, "-o", tmp_path / "cli.json")
    assert res.exit_code == 0, res.output
    cli = Calibration.read(tmp_path / "cli.json")
    config = ReplayConfig.from_options(max_num_seqs=16, max_num_batched_tokens=2048)
    kwargs = dict(variants=("max",), free=("eta_compute", "t_step_s"), fixed=held, jobs=1)
    from_file = calibrate.fit_traces([log], _cost_model(), config, **kwargs)
    from_frame = calibrate.fit_traces([read_trace(log)[1]], _cost_model(), config, **kwargs)
    for fitted in (from_file, from_frame):
        values = {n: p.value for n, p in fitted.calibration.params.items()}
        assert values == pytest.approx({n: p.value for n, p in cli.params.items()}, rel=1e-9)
    assert from_file.calibration.engine == cli.engine


def test_run_is_replay_on_a_file_and_a_frame(measured, tmp_path):
    """``replay.run`` returns the rows ``replay -o`` writes, from a file or its frame."""
    cal = tmp_path / "cal.json"
    write_calibration(_cost_model(TRUTH), cal)
    log = measured / "requests.parquet"
    res = invoke_servecal("replay", log, "--calibration", cal, "--max-num-seqs", "16", "--no-band",
                          "-o", tmp_path / "pred.parquet")
    assert res.exit_code == 0, res.output
    kind, written, _ = read_trace(tmp_path / "pred.parquet")
    assert kind == REPLAY_RESULT
    for trace in (log, read_trace(log)[1]):
        result = replay.run(trace, cal, max_num_seqs=16)
        pred = [c for c in result if c.startswith("pred_")]
        pd.testing.assert_frame_equal(result[pred], written[pred], check_dtype=False)
    # the replay of the cluster's own parameters reproduces its measured latencies
    result = replay.run(log, Calibration.read(cal), ReplayConfig.from_options(max_num_seqs=16))
    assert result["pred_ttft_s"].to_numpy() == pytest.approx(result["ttft_s"].to_numpy(), rel=1e-9)


def test_run_and_fit_traces_errors(measured, tmp_path):
    """Settings twice, a step trace replayed, nothing or several step traces to fit."""
    cal = tmp_path / "cal.json"
    write_calibration(_cost_model(TRUTH), cal)
    with pytest.raises(ConfigError, match="not both"):
        replay.run(measured / "requests.parquet", cal, ReplayConfig(), max_num_seqs=4)
    with pytest.raises(ConfigError, match="--max-num-seqs"):
        replay.run(measured / "requests.parquet", cal, max_num_seqs=0)
    with pytest.raises(ReplayError, match=r"steps\.parquet: is a step_trace/1"):
        replay.run(measured / "steps.parquet", cal)
    steps = str(measured / "steps.parquet")
    with pytest.raises(RunSpecError, match="give one step trace"):
        calibrate.fit_traces([steps, steps], _cost_model())
    with pytest.raises(RunSpecError, match="no trace"):
        calibrate.fit_traces([], _cost_model())
