"""``calibrate advise``: the design arithmetic by hand, the candidates, and the command end to end on a
small synthetic calibration (its errors: one message, no traceback)."""
import numpy as np
import pytest
from click.testing import CliRunner

from calibrate.advise_candidates import FittedLoad, WhatIfError, candidates, parse_what_if
from calibrate.advise_design import conditioned_shrink, information_nats, main_direction, terms_moved

BASE = FittedLoad(800.0, 150.0, 2.0, 10.0, {"max_num_seqs": 32, "max_num_batched_tokens": 512})


def test_information_grows_with_the_spread_between_the_points_and_falls_with_the_noise():
    y = np.log(np.array([[1.0, 2.0], [1.1, 2.2], [0.9, 1.8], [1.05, 2.1]]))
    wide = np.log(np.array([[1.0, 2.0], [1.5, 3.0], [0.6, 1.2], [1.2, 2.4]]))
    noise = np.array([0.02, 0.02])
    assert information_nats(wide, noise) > information_nats(y, noise) > information_nats(y, noise * 10) > 0
    assert information_nats(np.zeros((4, 2)), noise) == pytest.approx(0.0)


def test_a_candidate_that_moves_with_the_what_if_narrows_it_and_one_that_does_not_leaves_it():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(10, 1))
    with_it = np.hstack([w, 2 * w])
    across = np.hstack([rng.normal(size=(10, 1)), rng.normal(size=(10, 1))])
    across -= across.mean(axis=0)
    across -= w @ np.linalg.lstsq(w - w.mean(), across, rcond=None)[0]  # no correlation with the what-if
    tiny = np.array([1e-3, 1e-3])
    assert conditioned_shrink(with_it, tiny, w)[0] < 0.01
    assert conditioned_shrink(across, tiny, w)[0] == pytest.approx(1.0, abs=1e-6)
    assert conditioned_shrink(with_it, np.array([100.0, 100.0]), w)[0] > 0.99  # lost in the noise


def test_the_terms_are_the_parameters_that_follow_the_main_direction():
    eta = np.array([0.5, 0.4, 0.6, 0.45, 0.55])
    y = np.log(np.column_stack([1 / eta, 2 / eta]))
    score = main_direction(y, np.array([0.01, 0.01]))
    terms = terms_moved({"eta_compute": eta, "t_step_s": np.array([1, 1, 1, 1, 1.0]),
                         "t_seq_s": np.array([1, 1, 1, 2, 2.0])}, score)
    assert [n for n, _ in terms] == ["eta_compute"] and abs(terms[0][1]) > 0.99


def test_the_candidates_span_loads_mixes_and_engine_limits_within_the_budget():
    runs = candidates(BASE, 4096, 64)
    assert {r.rate_rps for r in runs if r.rate_rps and not r.engine} >= {4.0, 8.0, 1.0}
    assert any(r.concurrency for r in runs) and any(r.engine for r in runs)
    assert any(r.prompt_tokens > 800 for r in runs) and any(r.output_tokens > 150 for r in runs)
    assert all(r.prompt_tokens + r.output_tokens <= 4096 for r in runs)
    small = candidates(BASE, 4096, 4)
    assert len(small) == 4 and len({(r.concurrency is None, bool(r.engine)) for r in small}) >= 3


def test_the_candidates_run_under_the_what_ifs_engine_settings_but_the_one_they_vary():
    asked = parse_what_if("rate=3,max_num_batched_tokens=2048", BASE, 4096).engine
    runs = candidates(BASE, 4096, 64, asked)
    varied = [r for r in runs if dict(r.engine).get("max_num_batched_tokens") != 2048]
    assert [dict(r.engine) for r in varied] == [{"max_num_batched_tokens": 8192}]  # 4x the what-if's, not the fit's
    quarter = [r for r in runs if "max_num_seqs" in dict(r.engine)]
    assert [r.engine for r in quarter] == [(("max_num_seqs", 8), ("max_num_batched_tokens", 2048))]
    assert all("max_num_batched_tokens" in dict(r.engine) for r in runs)
    fitted = [r.engine for r in candidates(BASE, 4096, 64) if r.engine]  # no what-if: the varied ones alone
    assert fitted == [(("max_num_batched_tokens", 2048),), (("max_num_seqs", 8),)]


def test_a_what_if_takes_the_fitted_mix_for_what_it_does_not_say():
    w = parse_what_if("concurrency=16,max_num_seqs=8", BASE, 4096)
    assert (w.concurrency, w.rate_rps, w.prompt_tokens, w.output_tokens, w.engine) == (16, None, 800, 150,
                                                                                       (("max_num_seqs", 8),))
    assert parse_what_if(None, BASE, 4096).rate_rps == 4.0
    for bad, said in (("rate=x", "rate=x"), ("speed=2", "speed=2"), ("rate=1,concurrency=2", "not both"),
                      ("prompt_tokens=5000", "max_model_len"), ("concurrency=1.5", "whole number")):
        with pytest.raises(WhatIfError, match=said):
            parse_what_if(bad, BASE, 4096)


@pytest.fixture
def files(tmp_path, monkeypatch):
    """A measured trace and a calibration of it with three band points, under short names in tmp_path."""
    from helpers import write_calibration
    from replay.config import EngineOptions, ReplayConfig
    from replay.cost.cost_model import RooflineCostModel
    from replay.simulate import replay_frame
    from schemas.calibration import Calibration
    from schemas.cost_params import CostParams
    from schemas.specs import get_gpu, get_model
    from schemas.tables import REQUEST_TRACE
    from traces.io import write_trace
    from traces.synth import synth_requests

    monkeypatch.chdir(tmp_path)
    cost = RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb"),
                             CostParams(eta_compute=0.5, eta_mem=0.8, t_step_s=1e-4))
    df = synth_requests(60, 4.0, "lognormal:mean=600,sigma=0.5", "lognormal:mean=80,sigma=0.5", seed=1)
    meas, _ = replay_frame(df, cost, ReplayConfig(EngineOptions(max_num_seqs=32)))
    df = df.assign(queue_wait_s=0.0, ttft_s=meas["pred_ttft_s"], tpot_s=meas["pred_tpot_s"], e2e_s=meas["pred_e2e_s"])
    write_trace(df, REQUEST_TRACE, "t.parquet")
    write_calibration(cost, "bare.json")
    cal = Calibration.read("bare.json")
    cal.engine = {"max_num_seqs": 32, "max_num_batched_tokens": 512}
    cal.band_points = [{"eta_compute": 0.3, "t_step_s": 2e-4}, {"eta_compute": 0.7}, {"eta_mem": 0.7, "t_step_s": 0.0}]
    cal.source = {"path": "t.parquet", "kind": "request_trace/1"}
    cal.write("cal.json")
    return "t.parquet", "cal.json"


def invoke(*args):
    from calibrate.cli import main

    return CliRunner().invoke(main, ["advise", *map(str, args)])


def test_advise_prints_the_ranked_runs_with_their_commands_within_100_columns(files):
    res = invoke(files[1], "--budget", 3, "--jobs", 1, "--top", 2)
    assert res.exit_code == 0, res.output
    out = res.output
    assert "band now: TTFT p90" in out and "#1 " in out and "#2 " in out and "#3 " not in out
    assert "run: guidellm benchmark" in out and "what-if band after (estimate)" in out
    assert max(len(line) for line in out.splitlines()) <= 100
    asked = invoke(files[1], "--budget", 2, "--jobs", 1, "--what-if", "concurrency=8", "--format", "inference-perf")
    assert asked.exit_code == 0, asked.output
    assert "concurrency 8" in asked.output and "type: concurrent" in asked.output


def test_bad_input_is_one_message_naming_the_option(files):
    trace, cal = files
    res = invoke(cal, "--what-if", "rate=fast", "--jobs", 1)
    assert res.exit_code == 2 and "--what-if" in res.output and "Traceback" not in res.output
    from schemas.calibration import Calibration

    c = Calibration.read(cal)
    c.source = {}
    c.write("nosource.json")
    res = invoke("nosource.json", "--jobs", 1)
    assert res.exit_code == 2 and "--trace" in res.output
    c.band_points = []
    c.write("nopoints.json")
    res = invoke("nopoints.json", "--trace", trace, "--jobs", 1)
    assert res.exit_code == 1 and "band points" in res.output


def test_candidates_ranks_measured_runs_as_they_ran_leaving_out_the_fitted_one(files):
    from traces.io import read_trace, write_trace
    from schemas.tables import REQUEST_TRACE

    _, df, _ = read_trace(files[0])
    fast = df.assign(arrival_time_s=df["arrival_time_s"] / 3, request_id="f" + df["request_id"].astype(str))
    write_trace(fast, REQUEST_TRACE, "fast.parquet")
    res = invoke(files[1], "--candidates", "fast.parquet", "--candidates", files[0], "--jobs", 1)
    assert res.exit_code == 0, res.output
    assert "#1 fast.parquet: 10.7 req/s" in res.output and "#2" not in res.output
    assert "measured already" in res.output and "run: guidellm" not in res.output
    assert "the calibration was fitted on it; left out" in res.output
    res = invoke(files[1], "--candidates", files[0], "--jobs", 1)
    assert res.exit_code == 2 and "did not see" in res.output and "Traceback" not in res.output
