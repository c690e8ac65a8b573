"""Fitting step traces: shared/cases BR-18, BR-20, BR-21, identifiability, interval coverage."""
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from calibrate.step_fit import StepData, bootstrap_ci95, fit_steps
from replay.cost.cost_model import RooflineCostModel
from replay.cost.cost_terms import SEED_TERMS
from schemas.cost_params import CostParams
from schemas.specs import GpuSpec, get_gpu, get_model

#: The seed's three parameters only: the other terms' parameters held at 0.
SEED_FIX = {"n_half_tokens": 0.0, "t_seq_s": 0.0}


def _seed_model(**params):
    return RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb"), CostParams(**params), terms=SEED_TERMS)


def _steps(cm, pre, dec, ctx, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    dur = cm.step_time_s(pre, dec, ctx) * (rng.lognormal(0, noise, len(pre)) if noise else 1.0)
    return pd.DataFrame({"num_prefill_tokens": pre, "num_decode_seqs": dec, "decode_context_tokens": ctx,
                         "num_prefill_seqs": (np.asarray(pre) > 0).astype(int), "step_duration_s": dur})


def _random_shapes(rng, n):
    pre = rng.choice([0, 0, 256, 1024, 2048], n)
    dec = rng.integers(0, 128, n)
    dec[(pre == 0) & (dec == 0)] = 1
    return pre, dec, dec * rng.integers(100, 4000, n)


def test_br18_same_efficiencies_at_any_time_scale():
    """A GPU 1000x faster (steps in microseconds, not milliseconds) gives the same efficiencies
    and a 1000x smaller per-step constant: the solver works at any magnitude (BR-18)."""
    rng = np.random.default_rng(3)
    pre, dec, ctx = _random_shapes(rng, 200)
    slow = _seed_model(eta_compute=0.5, eta_mem=0.75, t_step_s=5e-3)
    g = slow.gpu
    fast = replace(slow, gpu=GpuSpec(name="fast", peak_flops=g.peak_flops * 1e3,
                                     mem_bandwidth_bytes_per_s=g.mem_bandwidth_bytes_per_s * 1e3,
                                     mem_bytes=g.mem_bytes),
                   params=slow.params.replace(t_step_s=5e-6))
    for cm, t_step in ((slow, 5e-3), (fast, 5e-6)):
        fit = fit_steps(_steps(cm, pre, dec, ctx), cm, ("max",), fixed=SEED_FIX)[0][0]
        assert fit.params["eta_compute"].value == pytest.approx(0.5, rel=1e-6)
        assert fit.params["eta_mem"].value == pytest.approx(0.75, rel=1e-6)
        assert fit.params["t_step_s"].value == pytest.approx(t_step, rel=1e-6)


def test_br21_bad_rows_dropped_with_reasons_and_fit_unchanged():
    truth = _seed_model(eta_compute=0.5, eta_mem=0.75, t_step_s=5e-5)
    steps = _steps(truth, np.array([0, 0, 512, 2048, 0, 1024, 0, 0, 0]), np.array([8, 64, 0, 0, 128, 0, 8, 8, 8]),
                   np.array([8000, 64000, 0, 0, 256000, 0, 8000, 8000, 8000]))
    steps.loc[6:, "step_duration_s"] = [np.nan, 0.0, -0.001]
    fits, dropped = fit_steps(steps, truth, ("max",), fixed=SEED_FIX)
    assert dropped == {"missing": 1, "non-positive": 2}
    assert fits[0].stats["n_rows"] == 6
    assert fits[0].params["eta_compute"].value == pytest.approx(0.5, rel=1e-4)
    assert fits[0].params["eta_mem"].value == pytest.approx(0.75, rel=1e-4)
    assert fits[0].params["t_step_s"].value == pytest.approx(5e-5, rel=1e-3)


@pytest.mark.parametrize("f", [0.0, 1e-4, 1e-3])
def test_br20_stderr_matches_weighted_least_squares(f):
    """Prefill-only compute-bound steps: t = a + b N, a = t_step, b = 2P / (eta_c peak). The
    fit's standard errors equal the textbook ones of the linearised log residuals
    (weighted least squares with weights 1/t), computed here independently; an exact fit
    has zero uncertainty, not an unknown one (BR-20)."""
    truth = _seed_model(eta_compute=0.5, eta_mem=1.0, t_step_s=1e-2)
    n = np.array([4096, 8192, 12288, 16384])
    steps = _steps(truth, n, np.zeros(4, int), np.zeros(4, int))
    steps["step_duration_s"] *= np.exp(f * np.array([1.0, -2.0, 1.0, 0.5]))
    fit = fit_steps(steps, truth, ("max",), loss="linear", fixed={**SEED_FIX, "eta_mem": 1.0})[0][0]
    y = steps["step_duration_s"].to_numpy()
    per_token = 2 * truth.model.num_active_params / truth.gpu.peak_flops
    # WLS of y on [1, N] with weights 1/y^2 (the log residuals, linearised); eta = per_token / b.
    # Covariance: White's heteroscedasticity-consistent sandwich with the n / (n - p) factor (HC1):
    # (J^T J)^-1 J^T diag(r^2) J (J^T J)^-1 n / (n - 2), J = X / pred, r = log(pred / y)
    x = np.column_stack([np.ones(4), n])
    w = 1 / y ** 2
    beta = np.linalg.solve(x.T @ (w[:, None] * x), x.T @ (w * y))
    pred = x @ beta
    jac, r = x / pred[:, None], np.log(pred / y)
    inv = np.linalg.inv(jac.T @ jac)
    cov = inv @ (jac * (r ** 2)[:, None]).T @ jac @ inv * 4 / 2
    a, b = beta
    assert fit.params["t_step_s"].value == pytest.approx(a, rel=1e-3, abs=1e-9)
    assert fit.params["eta_compute"].value == pytest.approx(per_token / b, rel=1e-4)
    se_eta = np.sqrt(cov[1, 1]) * per_token / b ** 2
    assert fit.params["t_step_s"].stderr == pytest.approx(np.sqrt(cov[0, 0]), rel=0.05, abs=1e-12)
    assert fit.params["eta_compute"].stderr == pytest.approx(se_eta, rel=0.05, abs=1e-12)
    if f == 0:
        assert fit.params["eta_compute"].stderr == 0.0 and fit.params["eta_compute"].identifiable


def test_a_parameter_without_effect_gets_the_range_that_fits_not_a_value():
    """Decode-only steps never reach the compute roof (form max): eta_compute has no effect,
    and the fit says which values fit equally instead of returning one as if known."""
    truth = _seed_model(eta_compute=0.5, eta_mem=0.8, t_step_s=2e-4)
    b = np.arange(1, 65)
    fit = fit_steps(_steps(truth, np.zeros_like(b), b, b * 1000), truth, ("max",), fixed=SEED_FIX)[0][0]
    p = fit.params["eta_compute"]
    assert not p.vary and p.stderr is None and p.value == 0.5  # held at its declared value, and said so
    assert "no effect on these data: any value in [" in p.bound and "held at its declared value" in p.bound
    lo = float(p.bound.split("[")[1].split(",")[0])
    assert lo < 0.5 and "1] fits them equally" in p.bound
    assert any(w.startswith("eta_compute: not identified") for w in fit.warnings)
    assert fit.params["eta_mem"].value == pytest.approx(0.8, rel=1e-4) and fit.params["eta_mem"].identifiable


def test_confounded_parameters_are_named_together():
    """In the sum form the small-GEMM constant 2 P n_half / (eta peak) is a per-step constant
    exactly like t_step: the two cannot be told apart, and the fit says so by name."""
    truth = RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb"),
                              CostParams(eta_compute=0.5, eta_mem=0.8, t_step_s=2e-4, n_half_tokens=50, overlap=1.0))
    rng = np.random.default_rng(1)
    fit = fit_steps(_steps(truth, *_random_shapes(rng, 300), noise=0.01), truth, ("sum",), fixed={"t_seq_s": 0.0})[0][0]
    confounded = [n for n in ("n_half_tokens", "t_step_s") if not fit.params[n].vary]
    assert len(confounded) == 1 and fit.params[{"n_half_tokens": "t_step_s", "t_step_s": "n_half_tokens"}[
        confounded[0]]].identifiable
    other = {"n_half_tokens": "t_step_s", "t_step_s": "n_half_tokens"}[confounded[0]]
    assert f"cannot be told apart from {other}" in fit.params[confounded[0]].bound


def test_synthetic_step_log_with_noise_recovered_within_2pct():
    truth = _seed_model(eta_compute=0.6, eta_mem=0.85, t_step_s=3e-4)
    rng = np.random.default_rng(7)
    steps = _steps(truth, *_random_shapes(rng, 600), noise=0.02, seed=7)
    fit = fit_steps(steps, truth, ("max", "sum"), fixed=SEED_FIX)[0][0]
    assert fit.variant == "max"
    assert fit.params["eta_compute"].value == pytest.approx(0.6, rel=0.02)
    assert fit.params["eta_mem"].value == pytest.approx(0.85, rel=0.02)
    # 0.3 ms is ~2 % of a step here, the size of the noise: only its interval must cover the truth
    assert abs(fit.params["t_step_s"].value - 3e-4) < 3 * fit.params["t_step_s"].stderr


def test_all_terms_recovered_from_a_noise_free_log():
    """Every parameter of the full model is recovered exactly from exact steps of an engine run."""
    truth = RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb"),
                              CostParams(eta_compute=0.55, n_half_tokens=64, eta_mem=0.8, t_step_s=4e-4, t_seq_s=2e-5))
    rng = np.random.default_rng(2)
    pre, dec, ctx = _random_shapes(rng, 400)
    fit = fit_steps(_steps(truth, pre, dec, ctx), truth, ("max",))[0][0]
    for k in ("eta_compute", "n_half_tokens", "eta_mem", "t_step_s", "t_seq_s"):
        assert fit.params[k].value == pytest.approx(truth.params[k], rel=1e-5), k
        assert fit.params[k].identifiable, k


@pytest.mark.slow
def test_recovery_and_95pct_interval_coverage_over_100_seeds():
    truth = dict(eta_compute=0.6, eta_mem=0.85, t_step_s=1e-3)
    cm = _seed_model(**truth)
    covered = {k: 0 for k in truth}
    rel_err = {k: [] for k in truth}
    for seed in range(100):
        rng = np.random.default_rng(seed)
        fit = fit_steps(_steps(cm, *_random_shapes(rng, 600), noise=0.01, seed=seed), cm, ("max",),
                        fixed=SEED_FIX)[0][0]
        for k, v in truth.items():
            p = fit.params[k]
            rel_err[k].append(abs(p.value - v) / v)
            covered[k] += p.stderr is not None and abs(p.value - v) <= 1.96 * p.stderr
    for k in truth:
        assert covered[k] >= 90, (k, covered[k])
        assert np.median(rel_err[k]) < 0.02, (k, np.median(rel_err[k]))
    assert max(rel_err["eta_compute"]) < 0.02 and max(rel_err["eta_mem"]) < 0.02


def test_bootstrap_intervals_cover_truth_and_are_deterministic():
    truth = dict(eta_compute=0.6, eta_mem=0.85, t_step_s=1e-3)
    cm = _seed_model(**truth)
    covered = {k: 0 for k in truth}
    for seed in range(10):
        rng = np.random.default_rng(seed)
        steps = _steps(cm, *_random_shapes(rng, 200), noise=0.01, seed=seed)
        fit = fit_steps(steps, cm, ("max",), fixed=SEED_FIX)[0][0]
        ci = bootstrap_ci95(StepData(steps), cm, fit, num_samples=100, seed=seed)
        if seed == 0:
            assert ci == bootstrap_ci95(StepData(steps), cm, fit, num_samples=100, seed=seed)
        for k, v in truth.items():
            lo, hi = ci[k]
            covered[k] += lo <= v <= hi
            assert hi - lo < 0.2 * v
    # 95 % intervals: at least 8 of 10 cover (P(fewer) < 1 % for a calibrated interval)
    assert all(c >= 8 for c in covered.values()), covered


def test_implausible_durations_are_dropped_with_their_reason_not_fitted():
    truth = _seed_model(eta_compute=0.5, eta_mem=0.75, t_step_s=5e-5)
    steps = _steps(truth, np.array([0, 0, 512, 2048, 0, 1024, 0]), np.array([8, 64, 0, 0, 128, 0, 8]),
                   np.array([8000, 64000, 0, 0, 256000, 0, 8000]))
    steps.loc[6, "step_duration_s"] = 1e-300
    fits, dropped = fit_steps(steps, truth, ("max",), fixed=SEED_FIX)
    assert dropped == {"below 1 ns (no forward pass is that short)": 1}
    assert fits[0].params["eta_mem"].value == pytest.approx(0.75, rel=1e-4)
