"""Calibration from a step trace: fit the roofline to measured step durations."""
from __future__ import annotations

import numpy as np
import pandas as pd

from replay.cost_model import CostParams, RooflineCostModel
from schemas.calibration import Calibration, FittedParam
from schemas.specs import GpuSpec, ModelSpec

from .errors import FitError
from .roofline_fit import FitResult, RooflineData, fit_roofline


def step_kind(num_prefill_tokens, num_decode_seqs) -> np.ndarray:
    """``prefill``, ``decode`` or ``mixed`` for each step (arrays of counts)."""
    pre, dec = np.asarray(num_prefill_tokens) > 0, np.asarray(num_decode_seqs) > 0
    return np.where(pre & dec, "mixed", np.where(pre, "prefill", "decode"))


def step_data(steps: pd.DataFrame, cost_model: RooflineCostModel, balance_kinds: bool = True) -> tuple[RooflineData, dict]:
    """Per-step FLOPs, bytes and durations of a step trace, dropping unusable rows.

    With ``balance_kinds`` the prefill-only, decode-only and mixed steps weigh the same in
    the fit (a profiling grid gives far more mixed shapes than a serving engine runs).

    Returns the data and a dict reason -> number of dropped rows (``missing``,
    ``non-positive``); rows with no tokens are dropped as ``empty``.
    """
    dur = steps["step_duration_s"].to_numpy(float)
    tokens = (steps["num_prefill_tokens"] + steps["num_decode_seqs"]).to_numpy(float)
    ctx = steps["decode_context_tokens"].to_numpy(float)
    if "prefill_context_tokens" in steps:
        ctx = ctx + steps["prefill_context_tokens"].fillna(0).to_numpy(float)
    dropped = {"missing": int(np.sum(~np.isfinite(dur))),
               "non-positive": int(np.sum(np.isfinite(dur) & (dur <= 0))),
               "empty": int(np.sum(np.isfinite(dur) & (dur > 0) & (tokens <= 0)))}
    keep = np.isfinite(dur) & (dur > 0) & (tokens > 0)
    kind = step_kind(steps["num_prefill_tokens"].to_numpy(), steps["num_decode_seqs"].to_numpy())[keep]
    tokens, ctx, dur = tokens[keep], ctx[keep], dur[keep]
    data = RooflineData(flops=cost_model.flops(tokens), bytes_=cost_model.bytes_read(ctx),
                        n_launch=np.ones_like(dur), duration_s=dur, peak_flops=cost_model.peak_flops,
                        bandwidth_bytes_per_s=cost_model.bandwidth_bytes_per_s,
                        fixed_s=cost_model.allreduce_s(tokens) if cost_model.tp > 1 else None,
                        group=kind if balance_kinds else None)
    return data, {k: v for k, v in dropped.items() if v}


def fit_steps(steps: pd.DataFrame, model: ModelSpec, gpu: GpuSpec, tp: int = 1, forms=("max",),
              loss: str = "soft_l1", fixed: dict | None = None, balance_kinds: bool = True) -> tuple[list[FitResult], dict]:
    """Fit each roofline form in ``forms`` to a step trace.

    Returns the fits (best first: lowest mean over step kinds of the median |relative
    residual|) and the dropped-row counts.

    Raises
    ------
    FitError
        No usable rows, or too few for the free parameters.
    """
    data, dropped = step_data(steps, RooflineCostModel(model, gpu, CostParams(), tp), balance_kinds)
    if data.duration_s.size == 0:
        raise FitError("no usable step rows (all missing, non-positive or empty)")
    fits = [fit_roofline(data, form=f, loss=loss, fixed=fixed) for f in forms]
    fits.sort(key=lambda r: r.score)
    return fits, dropped


def calibration_from_fit(fits: list[FitResult], model: ModelSpec, gpu: GpuSpec, tp: int, source: dict,
                         dropped: dict) -> Calibration:
    """The calibration file contents of the best fit (``fits[0]``), with every form's statistics."""
    best = fits[0]
    params = {}
    for k in ("eta_compute", "eta_mem", "t_launch_s"):
        params[k] = FittedParam(value=best.values[k], stderr=best.stderr.get(k), identifiable=best.identifiable[k],
                                bound=best.bounds.get(k) if best.bounds.get(k) != "fixed" else None,
                                vary=best.bounds.get(k) != "fixed")
    params["t_cpu_s"] = FittedParam(value=0.0, stderr=None, identifiable=False, vary=False,
                                    bound="not separable from t_launch_s in a step trace (both per step)")
    fit = {
        "method": "lmfit least_squares, relative residuals",
        "n_rows": best.n_rows, "dropped_rows": dropped, "r2": best.r2,
        "rel_residual_pct": best.rel_residual_pct, "rel_residual_p50_by_kind": best.rel_residual_p50_by_group,
        "correlations": best.correlations,
        "n_compute_bound": best.n_compute_bound, "warnings": best.warnings,
        "forms": {f.form: {"values": f.values, "r2": f.r2, "score": f.score, "rel_residual_pct": f.rel_residual_pct,
                           "rel_residual_p50_by_kind": f.rel_residual_p50_by_group} for f in fits},
    }
    return Calibration(model=model, gpu=gpu, tp=tp, form=best.form, params=params, fit=fit, source=source)



def bootstrap_ci95(steps: pd.DataFrame, model: ModelSpec, gpu: GpuSpec, tp: int, form: str, loss: str = "soft_l1",
                   balance_kinds: bool = True, num_samples: int = 200, seed: int = 0) -> dict:
    """95 % percentile-bootstrap intervals of the fitted parameters, resampling steps.

    Each of ``num_samples`` resamples (rows drawn with replacement, ``numpy.random.default_rng(seed)``)
    is refitted with the same form and loss; the interval is the 2.5th-97.5th percentile of
    the refitted values (Efron & Tibshirani, *An Introduction to the Bootstrap*, 1993, ch. 13).

    Returns
    -------
    dict parameter -> (low, high), natural units.
    """
    rng = np.random.default_rng(seed)
    data, _ = step_data(steps, RooflineCostModel(model, gpu, CostParams(), tp), balance_kinds)
    n = data.duration_s.size
    draws = {k: [] for k in ("eta_compute", "eta_mem", "t_launch_s")}
    for _ in range(num_samples):
        idx = rng.integers(0, n, n)
        sub = RooflineData(data.flops[idx], data.bytes_[idx], data.n_launch[idx], data.duration_s[idx],
                           data.peak_flops, data.bandwidth_bytes_per_s,
                           None if data.fixed_s is None else data.fixed_s[idx],
                           None if data.group is None else data.group[idx])
        r = fit_roofline(sub, form=form, loss=loss)
        for k in draws:
            draws[k].append(r.values[k])
    return {k: (float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))) for k, v in draws.items()}


def set_ci95(cal: Calibration, method: str, bootstrap: dict | None = None) -> None:
    """Store 95 % intervals in ``cal.params``: from the bootstrap, or ``value +/- 1.96 stderr``."""
    for k, p in cal.params.items():
        if not p.vary or not p.identifiable:  # only a bound is known (FittedParam.bound)
            continue
        if method == "bootstrap" and bootstrap and k in bootstrap:
            p.ci95 = bootstrap[k]
        elif p.stderr is not None:  # clipped to the parameter's range: efficiencies in (0, 1], times >= 0
            hi = 1.0 if k.startswith("eta_") else float("inf")
            p.ci95 = (max(0.0, p.value - 1.96 * p.stderr), min(hi, p.value + 1.96 * p.stderr))
    cal.fit["ci_method"] = method
