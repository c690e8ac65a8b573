"""Bands that hold the truth when the simulator is wrong (issue #36 item 6).

The synthetic cluster has a cost the simulator's model does not: each step pays a CPU time per
running request that grows with the batch (``K_S * B`` per request, ``K_S * B^2`` per step: the
scheduler's and sampler's per-request work over a batch, as in vLLM's Python loop). A request log
at one load is fitted by the simulator's model; what-ifs at 2x and 4x that load are replayed with
their bands and compared with what the true cluster does there. No parameter value reproduces the
missing term, so the parameters' band alone misses (the power check); the band with the model's
held-out error, widened with the distance from the fitted load, must hold the truth at its
stated rate over seeds.
"""
import numpy as np
import pytest

from calibrate.request_fit import fit_requests
from calibrate.run_errors import Run
from replay.analysis.bands import BandBasis, BandJob, predict_with_band, prediction_row
from replay.config import EngineOptions, ReplayConfig
from replay.cost.cost_model import RooflineCostModel
from replay.simulate import replay_frame
from schemas.cost_params import CostParams
from schemas.specs import get_gpu, get_model
from traces.synth import synth_requests

TRUTH = CostParams(eta_compute=0.55, n_half_tokens=64.0, eta_mem=0.80, t_step_s=4e-4, t_seq_s=2e-5)
#: The missing term: seconds per step per running decode request, per running decode request. Sized so
#: that the simulator misses 2x the load by ~2-5 % and 4x by ~8-17 % (TPOT, E2E), as issue #36 measured on
#: a stock-vLLM H100 sweep fitted at one load (6 % at 2x, 14-18 % at 4x).
K_S = 0.8e-6
FREE = ("eta_mem", "t_step_s", "t_seq_s")
SEEDS = range(20)
#: The fitted load (requests/s) and the what-ifs' multiples of it.
RATE_RPS, REQUESTS = 4.0, 160
WHAT_IFS = (1.5, 2.0, 4.0)
#: The what-ifs whose coverage is counted (issue #36: 2x and 4x the fitted load).
COUNTED = (2.0, 4.0)
PROMPTS, OUTPUTS = "lognormal:mean=600,sigma=0.7", "lognormal:mean=160,sigma=0.7"
CHECKED = tuple(f"{m}_p{q}_s" for m in ("ttft", "tpot", "e2e") for q in (50, 90))
CFG = ReplayConfig(engine=EngineOptions(max_num_seqs=64, max_num_batched_tokens=2048))


def _model(params=None):
    return RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb"), params or CostParams())


class MissingTermCostModel:
    """The true cluster: the simulator's cost model plus ``K_S * B^2`` seconds a step for ``B``
    running decode requests, and 3 % lognormal noise per step."""

    def __init__(self, rng: np.random.Generator):
        self.base, self.rng = _model(TRUTH), rng
        self.model, self.gpu, self.tp = self.base.model, self.base.gpu, self.base.tp

    def step_time_s(self, num_prefill_tokens, num_decode_seqs, *args) -> float:
        t = self.base.step_time_s(num_prefill_tokens, num_decode_seqs, *args) + K_S * num_decode_seqs ** 2
        return t * float(self.rng.lognormal(0.0, 0.03))


def _trace(rate, seed):
    return synth_requests(REQUESTS, rate, PROMPTS, OUTPUTS, seed=seed)


@pytest.fixture(scope="module")
def cases():
    """Per seed and what-if: the truth's statistics, the band (all parts) and the parameters' band alone."""
    out = []
    for seed in SEEDS:
        trace = _trace(RATE_RPS, seed)
        measured, _ = replay_frame(trace, MissingTermCostModel(np.random.default_rng(seed)), CFG)
        trace = trace.assign(ttft_s=measured["pred_ttft_s"], tpot_s=measured["pred_tpot_s"],
                             e2e_s=measured["pred_e2e_s"])
        fit = fit_requests([Run(f"seed {seed}", trace, CFG, {})], _model(), ("max",), free=FREE, jobs=1)[0]
        basis = BandBasis(fit.stats["model_error"], fit.stats["holdout"])
        for scale in WHAT_IFS:
            what_if = _trace(RATE_RPS * scale, 1000 + seed)
            truth, _ = replay_frame(what_if, MissingTermCostModel(np.random.default_rng(seed + 77)), CFG)
            job = BandJob(what_if, {}, _model(fit.cost_params()), CFG, fit.stats["band_points"], basis)
            band = predict_with_band(job)
            params_only = predict_with_band(BandJob(what_if, {}, job.cost_model, CFG, job.points))
            out.append((seed, scale, prediction_row(truth), band, params_only))
    return out


def test_bands_hold_the_truth_of_a_wrong_model_over_seeds(cases):
    """20 seeds x 2 what-ifs (2x, 4x) x p50/p90 TTFT, TPOT, E2E: at least 90 % inside."""
    held = [band.holds(s, truth[s]) for _, scale, truth, band, _ in cases if scale in COUNTED for s in CHECKED]
    assert sum(held) >= 0.9 * len(held), (sum(held), len(held))


def test_the_parameters_band_alone_misses_them(cases):
    """The power check: the band of the parameters' uncertainty and the percentiles' sampling noise
    alone (what the model error adds is what makes the test above pass)."""
    held = [alone.holds(s, truth[s]) for _, scale, truth, _, alone in cases if scale in COUNTED for s in CHECKED]
    assert sum(held) <= 0.75 * len(held), (sum(held), len(held))


def test_the_band_at_4x_is_wider_than_at_1_5x_and_says_how_far_it_is(cases):
    by = {(seed, scale): band for seed, scale, _, band, _ in cases}
    for seed in SEEDS:
        near, far = by[(seed, 1.5)], by[(seed, 4.0)]
        assert far.distance > near.distance
        for s in CHECKED:
            assert far.half_width(s) > near.half_width(s), (seed, s)
        assert any("the largest fitted" in n and "outside the load the calibration saw" in n for n in far.warnings)
