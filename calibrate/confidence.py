"""Confidence intervals of a request-log fit: every parameter value the data cannot reject.

A request-log fit compares replayed latency quantiles with measured ones. The replayed
quantiles are a rough function of the parameters (a step slightly slower changes which
requests share a batch), and the per-step and per-sequence CPU times and the memory
efficiency all set the decode step time, so the fit's optimum is one point of a curved
valley of points that fit as well, and the delta method's curvature at that point says
the valley is far narrower than it is (on the demo's synthetic log, 95 % intervals of
``eta_mem`` and ``t_seq_s`` that exclude the truth).

Here the goodness-of-fit test is inverted instead: the 95 % confidence set is every
parameter vector ``theta`` whose generalised squared error

    G(theta) = r(theta)^T Sigma^+ r(theta)

is at most the 95 % point of chi-square with ``rank(Sigma)`` degrees of freedom, ``r`` the
relative quantile errors and ``Sigma`` their sampling covariance (the moving-block
bootstrap of the measured requests, :meth:`calibrate.request_fit._QuantileResidual.sampling_cov`).
At the true parameters ``r`` is the sampling error of the measured quantiles, so the set
holds the truth with probability 0.95 whatever point of the valley the optimizer stopped
at; a parameter's interval is the set's extent along it, a projection, so it covers at
least as often (Casella & Berger, Statistical Inference, 2nd ed., section 9.2.1, inverting
a test; the projection: section 9.2.3). The extent is found by line searches from the
optimum along the directions in which, to first order, one parameter moves and the
others follow it at the least cost (``A^-1 e_i`` with ``A = J^T Sigma^+ J``), and along the
sloppiest direction of ``A``: an inner approximation of the set's projection.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from schemas.calibration import FittedParam
from schemas.cost_params import PARAMS, CostParams

from .identify import CORRELATED, MAX_REL_STDERR
from .summary import fmt

#: Multiples of the quadratic model's boundary distance tried along each direction.
STEPS = (0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 8.0)


def confidence_set_intervals(residual: Callable[[CostParams], np.ndarray], params: dict, data_cov: np.ndarray,
                             rel_step: float = 0.05, level: float = 0.95) -> tuple[dict, list, dict]:
    """95 % intervals of the free parameters of a request-log fit, from the confidence set.

    Parameters
    ----------
    residual : CostParams -> relative quantile errors (the fit's).
    params : dict name -> FittedParam, the fit's (free ones have ``vary``).
    data_cov : array (n, n), the residuals' sampling covariance.
    rel_step : finite-difference step of the Jacobian, relative to each fit scale.
    level : confidence level.

    Returns
    -------
    params : dict name -> FittedParam, the free ones with ``ci95`` the set's extent,
        ``identifiable`` when that extent is within +-1.96 x :data:`MAX_REL_STDERR` of
        the value, else NOT IDENTIFIED with the parameter it moves with named;
    warnings : list of str, one per parameter NOT IDENTIFIED;
    stats : ``{"threshold": ..., "g_optimum": ..., "dof": ..., "n_evals": ...}``.

    Notes
    -----
    When the optimum itself fails the test (``G`` above the threshold: the model misses the
    data by more than their sampling error), the set is empty; the intervals are then those
    of ``G <= G(optimum) + chi2_1(level)``, the profile-likelihood rule, and the stats say so.
    """
    from scipy.stats import chi2

    free = [n for n, p in params.items() if p.vary]
    fixed = {n: p.value for n, p in params.items() if not p.vary}
    scale = np.array([PARAMS[n].fit_scale for n in free])
    lo_b = np.array([PARAMS[n].lower for n in free]) / scale
    hi_b = np.array([PARAMS[n].upper for n in free]) / scale
    x0 = np.array([params[n].value for n in free]) / scale
    w, v = np.linalg.eigh(data_cov)
    keep = w > 1e-9 * max(w.max(), 1e-300)
    cov_pinv = (v[:, keep] / w[keep]) @ v[:, keep].T
    dof = int(keep.sum())
    n_evals = [0]

    def g(x):
        n_evals[0] += 1
        r = residual(CostParams(**fixed, **{n: float(x[i] * scale[i]) for i, n in enumerate(free)}))
        return float(r @ cov_pinv @ r), r

    g0, r0 = g(x0)
    threshold = float(chi2.ppf(level, dof))
    rule = "goodness of fit"
    if g0 > threshold:
        threshold, rule = g0 + float(chi2.ppf(level, 1)), "profile (optimum fails the test)"
    cols = []
    for i in range(len(free)):
        h = rel_step * max(1.0, abs(x0[i]))
        up, down = min(x0[i] + h, hi_b[i]), max(x0[i] - h, lo_b[i])
        fu = g(_at(x0, i, up))[1] if up != x0[i] else r0
        fd = g(_at(x0, i, down))[1] if down != x0[i] else r0
        cols.append((fu - fd) / (up - down) if up != down else np.zeros_like(r0))
    jac = np.column_stack(cols)
    a_inv = np.linalg.pinv(jac.T @ cov_pinv @ jac)
    rise = threshold - g0
    directions = []
    for i in range(len(free)):
        if a_inv[i, i] > 0:
            directions.append(a_inv[:, i] * math.sqrt(rise / a_inv[i, i]))
    ew, ev = np.linalg.eigh(jac.T @ cov_pinv @ jac)
    sloppy = ev[:, 0] * math.sqrt(rise / max(ew[0], 1e-12 * max(ew[-1], 1e-300)))
    directions.append(sloppy)
    sqrt_w = np.linalg.cholesky(cov_pinv + 1e-12 * np.eye(len(r0)) * max(np.trace(cov_pinv), 1e-300))
    accepted = [x0]
    for k, d in enumerate(directions):
        held = k if k < len(free) else None  # the parameter this direction moves; the others follow it
        for sign in (1.0, -1.0):
            x, t_prev, misses = x0, 0.0, 0
            for t in STEPS:
                trial = np.clip(x + sign * (t - t_prev) * d, lo_b, hi_b)
                if np.allclose(trial, x):
                    break  # at a bound: no further
                gt, rt = g(trial)
                if gt > threshold and held is not None:  # curved valley: the others re-fit, Gauss-Newton
                    trial = _follow(trial, rt, jac, sqrt_w, held, lo_b, hi_b)
                    gt, rt = g(trial)
                if gt <= threshold:
                    accepted.append(trial)
                    x, t_prev, misses = trial, t, 0
                else:
                    misses += 1
                    if misses == 2:
                        break
    pts = np.array(accepted) * scale
    corr = a_inv / np.sqrt(np.outer(np.diag(a_inv), np.diag(a_inv)).clip(1e-300))
    out, warns = dict(params), []
    for i, n in enumerate(free):
        p = params[n]
        lo, hi = float(pts[:, i].min()), float(pts[:, i].max())
        half = (hi - lo) / 2
        ok = half <= 1.96 * MAX_REL_STDERR * abs(p.value) and np.all(np.isfinite(pts[:, i]))
        if ok:
            out[n] = FittedParam(p.value, p.stderr, True, None, True, (lo, hi))
            continue
        others = [(abs(corr[i, k]), free[k], corr[i, k]) for k in range(len(free)) if k != i]
        best = max(others) if others else None
        mates = f"; moves with {best[1]} (r={best[2]:+.2f})" if best and best[0] > CORRELATED else ""
        why = f"the data allow any value in [{fmt(n, lo)}, {fmt(n, hi)}]{mates}"
        out[n] = FittedParam(p.value, p.stderr, False, why, True, (lo, hi))
        warns.append(f"{n}: NOT IDENTIFIED, {why}")
    return out, warns, {"threshold": threshold, "g_optimum": g0, "dof": dof, "rule": rule, "n_evals": n_evals[0]}


def _follow(x: np.ndarray, r: np.ndarray, jac: np.ndarray, sqrt_w: np.ndarray, held: int, lo_b, hi_b) -> np.ndarray:
    """One Gauss-Newton step of every parameter but ``held`` from ``x`` (residuals ``r``,
    the optimum's Jacobian ``jac``, weights ``sqrt_w^T sqrt_w = Sigma^+``): the point of the
    valley beside ``x``."""
    others = [j for j in range(jac.shape[1]) if j != held]
    a, b = sqrt_w.T @ jac[:, others], sqrt_w.T @ r
    step = np.linalg.lstsq(a, -b, rcond=None)[0]
    y = x.copy()
    y[others] += step
    return np.clip(y, lo_b, hi_b)


def _at(x: np.ndarray, i: int, value: float) -> np.ndarray:
    y = x.copy()
    y[i] = value
    return y
