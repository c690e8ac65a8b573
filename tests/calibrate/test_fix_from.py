"""A TP run's link, calibrated on top of a TP-1 calibration (``calibrate fit --fix-from``).

On its own a TP run cannot tell the link's bandwidth from the GPU's compute efficiency (both
cost time per token); with the GPU terms held at a calibration of the same GPU, the link's
efficiency is identified. Tested on a synthetic TP-2 log of a known cluster (3 % step noise).
"""
import json

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from calibrate.cli import main as calibrate_main
from calibrate.demo import NoisyCostModel
from replay.config import EngineOptions, ReplayConfig
from replay.cost.cost_model import RooflineCostModel
from replay.simulate import replay_frame
from schemas.calibration import Calibration, FittedParam
from schemas.cost_params import CostParams
from schemas.kinds import REQUEST_TRACE
from schemas.specs import get_gpu, get_model
from traces.io import write_trace
from traces.synth import synth_requests

GPU = get_gpu("rtx-pro-6000")  # PCIe 5: the link matters at TP 2
MODEL = get_model("llama-3.1-8b")
TRUTH = dict(eta_compute=0.6, n_half_tokens=64.0, eta_mem=0.8, t_step_s=4e-4, t_seq_s=2e-5, eta_link=0.3)
ENGINE = ["--max-num-seqs", "64", "--max-num-batched-tokens", "2048"]


@pytest.fixture(scope="module")
def tp2_log(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fix_from")
    cfg = ReplayConfig(engine=EngineOptions(max_num_seqs=64, max_num_batched_tokens=2048))
    trace = synth_requests(500, 8.0, "lognormal:mean=800,sigma=0.8", "lognormal:mean=200,sigma=0.7", seed=3)
    truth = RooflineCostModel(MODEL, GPU, CostParams(**TRUTH), tp=2)
    measured, _ = replay_frame(trace, NoisyCostModel(truth, 0.03, np.random.default_rng(3)), cfg)
    log = tmp / "tp2.parquet"
    write_trace(trace.assign(ttft_s=measured["pred_ttft_s"], tpot_s=measured["pred_tpot_s"]), REQUEST_TRACE, log)
    # a TP-1 calibration of the same GPU: the GPU and host terms at the truth, the link at its default
    gpu_terms = {k: FittedParam(v) for k, v in TRUTH.items() if k != "eta_link"}
    Calibration(MODEL, GPU, 1, gpu_terms).write(tmp / "tp1.json")
    return tmp


def test_the_link_is_identified_on_top_of_a_tp1_calibration(tp2_log):
    out = tp2_log / "tp2.json"
    res = CliRunner().invoke(calibrate_main, ["fit", str(tp2_log / "tp2.parquet"), "--model", "llama-3.1-8b",
                                              "--gpu", "rtx-pro-6000", "--tp", "2", *ENGINE,
                                              "--fix-from", str(tp2_log / "tp1.json"), "--free", "eta_link",
                                              "-o", str(out)])
    assert res.exit_code == 0, res.output
    params = json.loads(out.read_text())["params"]
    link = params["eta_link"]
    assert link["vary"] and link["identifiable"]
    assert link["ci95"][0] <= 0.3 <= link["ci95"][1] and abs(link["value"] - 0.3) < 0.06
    for name in ("eta_compute", "n_half_tokens", "eta_mem", "t_step_s", "t_seq_s"):  # held where the TP-1 fit put them
        assert not params[name]["vary"] and params[name]["value"] == TRUTH[name]
        assert params[name]["bound"] == f"from {tp2_log / 'tp1.json'}"  # said, in the file and the summary
        assert params[name]["identifiable"]  # as the TP-1 calibration had it (FittedParam's default)
    assert "".join(f"fixed (from {tp2_log / 'tp1.json'}):".split()) in "".join(res.output.split())


def test_fix_from_needs_free_and_the_same_gpu(tp2_log):
    base = ["fit", str(tp2_log / "tp2.parquet"), "--model", "llama-3.1-8b", "--tp", "2", *ENGINE,
            "--fix-from", str(tp2_log / "tp1.json"), "-o", str(tp2_log / "x.json")]
    res = CliRunner().invoke(calibrate_main, [*base, "--gpu", "rtx-pro-6000"])
    assert res.exit_code == 2 and "name the ones to fit with --free" in res.output
    res = CliRunner().invoke(calibrate_main, [*base, "--gpu", "h100-80gb", "--free", "eta_link"])
    flat = "".join(res.output.split())
    assert res.exit_code == 2 and "noth100-80gb" in flat and "efficienciesdonotcarryovertoanotherGPU" in flat
    res = CliRunner().invoke(calibrate_main, [*base[:-2], "-o", str(tp2_log / "tp1.json"), "--gpu", "rtx-pro-6000",
                                              "--free", "eta_link"])
    assert res.exit_code == 2 and "thesamefileastheinput" in "".join(res.output.split())
    assert not (tp2_log / "x.json").exists()


def test_a_freed_parameter_starts_at_the_calibrations_value(tp2_log, tmp_path):
    """--fix-from CAL --free X: X starts from CAL's value, and one the data cannot see (eta_link
    on a TP-1 log) keeps CAL's value, not the declared default (it came back as 1)."""
    cal = json.loads((tp2_log / "tp1.json").read_text())
    cal["params"]["eta_link"] = {"value": 0.27, "vary": True}
    cal["params"]["t_seq_s"].update(identifiable=False, bound="the data allow any value in [0 s, 30 us]")
    (tmp_path / "with_link.json").write_text(json.dumps(cal))
    tp1_log = tmp_path / "tp1.parquet"
    cfg = ReplayConfig(engine=EngineOptions(max_num_seqs=64, max_num_batched_tokens=2048))
    trace = synth_requests(300, 6.0, "lognormal:mean=800,sigma=0.8", "lognormal:mean=200,sigma=0.7", seed=4)
    truth = RooflineCostModel(MODEL, GPU, CostParams(**TRUTH))
    measured, _ = replay_frame(trace, NoisyCostModel(truth, 0.03, np.random.default_rng(4)), cfg)
    write_trace(trace.assign(ttft_s=measured["pred_ttft_s"], tpot_s=measured["pred_tpot_s"]), REQUEST_TRACE, tp1_log)
    out = tmp_path / "back.json"
    res = CliRunner().invoke(calibrate_main, ["fit", str(tp1_log), "--model", "llama-3.1-8b", "--gpu", "rtx-pro-6000",
                                              *ENGINE, "--fix-from", str(tmp_path / "with_link.json"),
                                              "--free", "eta_link,t_step_s", "-o", str(out)])
    assert res.exit_code == 0, res.output
    params = json.loads(out.read_text())["params"]
    assert params["eta_link"]["value"] == 0.27  # no effect at TP 1: held where CAL had it
    # a value CAL could not identify is held, and said so (it came out "identifiable")
    assert not params["t_seq_s"]["identifiable"] and params["t_seq_s"]["bound"].endswith("NOT IDENTIFIED there")


def test_fix_from_compares_the_gpus_numbers_not_their_names(tp2_log, tmp_path):
    spec = {"name": "rtx-pro-6000", "peak_flops": 2 * GPU.peak_flops, "mem_bandwidth_bytes_per_s":
            GPU.mem_bandwidth_bytes_per_s, "mem_bytes": GPU.mem_bytes, "tp_link": "pcie5"}
    (tmp_path / "fast.json").write_text(json.dumps(spec))
    (tmp_path / "renamed.json").write_text(json.dumps({**spec, "name": "my card", "peak_flops": GPU.peak_flops}))
    # the GPUs are compared before the fit: its first 40 requests are log enough for the fit to pass
    small = tmp_path / "tp2_first40.parquet"
    write_trace(pd.read_parquet(tp2_log / "tp2.parquet").head(40), REQUEST_TRACE, small)
    base = ["fit", str(small), "--model", "llama-3.1-8b", "--tp", "2", *ENGINE, "--jobs", "1",
            "--fix-from", str(tp2_log / "tp1.json"), "--free", "eta_link", "--variants", "blend"]
    res = CliRunner().invoke(calibrate_main, [*base, "--gpu-spec", str(tmp_path / "fast.json"),
                                              "-o", str(tmp_path / "a.json")])
    assert res.exit_code == 2 and "efficienciesdonotcarryovertoanotherGPU" in "".join(res.output.split())
    res = CliRunner().invoke(calibrate_main, [*base, "--gpu-spec", str(tmp_path / "renamed.json"),
                                              "-o", str(tmp_path / "b.json")])
    assert res.exit_code == 0, res.output
