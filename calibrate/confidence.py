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
bootstrap of the measured requests, :meth:`calibrate.run_errors.QuantileResidual.sampling_cov`).
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
from dataclasses import replace
from typing import Callable

import numpy as np

from schemas.cost_params import PARAMS, CostParams, FittedParam

from .identify import CORRELATED, identification

#: Multiples of the quadratic model's boundary distance tried along each direction.
STEPS = (0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 8.0)
#: Halvings of :data:`STEPS` tried while a walk has found no point inside the set.
MAX_HALVINGS = 6
#: Bisections that move a walk's last point toward the set's boundary.
BISECTIONS = 2


def confidence_set_intervals(residual: Callable[[CostParams], np.ndarray], params: dict, data_cov: np.ndarray,
                             rel_step: float = 0.05, level: float = 0.95, runner=None,
                             also_walk: tuple = ()) -> tuple[dict, list, dict]:
    """95 % intervals of the free parameters of a request-log fit, from the confidence set.

    Parameters
    ----------
    residual : CostParams -> relative quantile errors (the fit's; picklable with ``runner``).
    params : dict name -> FittedParam, the fit's (free ones have ``vary``).
    data_cov : array (n, n), the residuals' sampling covariance.
    rel_step : finite-difference step of the Jacobian, relative to each fit scale.
    level : confidence level.
    runner : ``runner(fn, shared, items)`` running the Jacobian's columns and the line
        searches elsewhere (:func:`calibrate.request_fit.start_runner`); default: here.
    also_walk : names of parameters the fit held (``vary`` False) because the data could not
        identify them: the set is traced along them too, so that its points (``stats["points"]``)
        span what the data allow of them; they stay held, with ``ci95`` that extent.

    Returns
    -------
    params : dict name -> FittedParam, the free ones with ``ci95`` the set's extent,
        ``identifiable`` when that extent passes :func:`calibrate.identify.identification`
        (within +-1.96 x :data:`~calibrate.identify.MAX_REL_STDERR` of the value, the value
        not at its edge, the lower end of the range excluded), else NOT IDENTIFIED with the
        reason and the parameter it moves with named (at a bound of its range: the one side
        the data give; when no point of the set but the optimum was found along it: ``ci95`` None);
    warnings : list of str, one per parameter NOT IDENTIFIED;
    stats : ``{"threshold", "g_optimum", "dof", "rule", "n_evals", "points"}``; ``points`` is a
        list of dicts name -> value (natural units) of the traced parameters: the farthest
        point of the set each line search reached, the points a prediction band is replayed at
        (:func:`replay.analysis.bands.band_cost_models`).

    Notes
    -----
    Without a usable covariance (no variation under resampling: a handful of requests or
    identical latencies) nothing is computed: every free parameter is NOT IDENTIFIED, with no
    interval, and the stats say why. When the optimum itself fails the test (``G`` above the
    threshold: the model misses the data by more than their sampling error), the set is empty;
    the intervals are then those of ``G <= G(optimum) + chi2_1(level)``, the profile-likelihood
    rule, and the stats say so.
    """
    from scipy.stats import chi2

    run = runner or (lambda fn, shared, items: [fn(shared, item) for item in items])
    free = [n for n, p in params.items() if p.vary]
    if not free or not np.all(np.isfinite(data_cov)) or not np.any(data_cov):
        reason = "the measured quantiles do not vary under resampling (too few requests, or identical latencies)"
        why = f"no interval: {reason}"
        out = {n: FittedParam(p.value, None, False, why, True, None) if p.vary else p for n, p in params.items()}
        return out, [f"{n}: NOT IDENTIFIED, {why}" for n in free], {"rule": f"not computed: {reason}", "n_evals": 0,
                                                                      "points": []}
    held = [n for n in also_walk if n in params and not params[n].vary]
    walked = free + held
    prob = _SetProblem(residual, walked, {n: p.value for n, p in params.items() if not p.vary and n not in held},
                       data_cov)
    x0 = np.array([params[n].value for n in walked]) / prob.scale
    g0, r0 = prob.g(x0)
    threshold = float(chi2.ppf(level, prob.dof))
    rule = "goodness of fit"
    if g0 > threshold:
        threshold, rule = g0 + float(chi2.ppf(level, 1)), "profile (optimum fails the test)"
    prob.x0, prob.r0, prob.threshold, prob.rel_step = x0, r0, threshold, rel_step
    jac = np.column_stack(run(_column, prob, range(len(walked))))
    fisher = jac.T @ prob.cov_pinv @ jac
    a_inv = np.linalg.pinv(fisher)
    rise = threshold - g0
    walks = [(a_inv[:, i] * math.sqrt(rise / a_inv[i, i]), i) if a_inv[i, i] > 0 and np.any(jac[:, i]) else
             (_at(np.zeros_like(x0), i, (prob.hi[i] - prob.lo[i]) / STEPS[-1]), i)  # no effect: along it alone
             for i in range(len(walked))]
    ew, ev = np.linalg.eigh(fisher)
    walks.append((ev[:, 0] * math.sqrt(rise / max(ew[0], 1e-12 * max(ew[-1], 1e-300))), None))
    prob.jac = jac
    found = run(_walk, prob, [(d, k, sign) for d, k in walks for sign in (1.0, -1.0)])
    accepted = [x0, *[x for pts, _ in found for x in pts]]
    n_evals = 1 + 2 * len(walked) + sum(n for _, n in found)
    pts = np.array(accepted) * prob.scale
    ends = np.unique(np.array([inside[-1] for inside, _ in found if inside]).reshape(-1, len(walked)) * prob.scale,
                     axis=0)
    points = [dict(zip(walked, map(float, x))) for x in ends]
    corr = a_inv / np.sqrt(np.outer(np.diag(a_inv), np.diag(a_inv)).clip(1e-300))
    out, warns = dict(params), []
    for i, n in enumerate(held):  # held, with the extent the data allow
        lo, hi = float(pts[:, len(free) + i].min()), float(pts[:, len(free) + i].max())
        out[n] = replace(params[n], ci95=(lo, hi) if hi > lo else None)
    for i, n in enumerate(free):
        p = params[n]
        lo, hi = float(pts[:, i].min()), float(pts[:, i].max())
        # no walk left the optimum along it: nothing shows the set is narrow
        kind, why = identification(n, p.value, (lo, hi), "its confidence set could not be traced (every step from "
                                                         "the optimum left it)")
        if kind is None:
            out[n] = FittedParam(p.value, p.stderr, True, None, True, (lo, hi))
            continue
        others = [(abs(corr[i, k]), free[k], corr[i, k]) for k in range(len(free)) if k != i]
        best = max(others) if others else None
        if kind in ("wide", "range") and best and best[0] > CORRELATED:
            why += f"; moves with {best[1]} (r={best[2]:+.2f})"
        out[n] = FittedParam(p.value, p.stderr, False, why, True, (lo, hi) if hi > lo else None)
        warns.append(f"{n}: NOT IDENTIFIED, {why}")
    return out, warns, {"threshold": threshold, "g_optimum": g0, "dof": prob.dof, "rule": rule, "n_evals": n_evals,
                        "points": points}


class _SetProblem:
    """The confidence set's test statistic ``G`` over scaled parameters (picklable: its
    Jacobian columns and line searches may run in worker processes)."""

    def __init__(self, residual, free, fixed, data_cov):
        self.residual, self.free, self.fixed = residual, free, fixed
        self.scale = np.array([PARAMS[n].fit_scale for n in free])
        self.lo = np.array([PARAMS[n].lower for n in free]) / self.scale
        self.hi = np.array([PARAMS[n].upper for n in free]) / self.scale
        w, v = np.linalg.eigh(data_cov)
        keep = w > 1e-9 * max(w.max(), 1e-300)
        self.cov_pinv = (v[:, keep] / w[keep]) @ v[:, keep].T
        self.dof = int(keep.sum())
        # sqrt_w^T sqrt_w = Sigma^+ (a hair of ridge: Cholesky needs it positive definite)
        ridge = 1e-12 * max(np.trace(self.cov_pinv), 1e-300) * np.eye(len(w))
        self.sqrt_w = np.linalg.cholesky(self.cov_pinv + ridge).T

    def g(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        r = self.residual(CostParams(**self.fixed, **{n: float(x[i] * self.scale[i]) for i, n in enumerate(self.free)}))
        return float(r @ self.cov_pinv @ r), r


def _column(prob: _SetProblem, i: int) -> np.ndarray:
    """Central-difference column ``i`` of the residuals' Jacobian at the optimum (one-sided at a bound)."""
    x0 = prob.x0
    h = prob.rel_step * max(1.0, abs(x0[i]))
    up, down = min(x0[i] + h, prob.hi[i]), max(x0[i] - h, prob.lo[i])
    if up == down:
        return np.zeros_like(prob.r0)
    fu = prob.g(_at(x0, i, up))[1] if up != x0[i] else prob.r0
    fd = prob.g(_at(x0, i, down))[1] if down != x0[i] else prob.r0
    return (fu - fd) / (up - down)


def _walk(prob: _SetProblem, item) -> tuple[list, int]:
    """From the optimum along ``sign * d`` at :data:`STEPS` multiples: the points inside the
    set, and the evaluations spent. When a step leaves the set, the parameters other than
    ``held`` (the one the direction moves) take one Gauss-Newton step back into the valley
    (it is curved: the straight line leaves it); two misses in a row end the walk. While no
    point is inside, a miss halves the whole ladder instead (at most :data:`MAX_HALVINGS`
    times): where the quantiles respond abruptly the quadratic model's distance overshoots.
    The walk's last point is then moved toward the set's boundary by :data:`BISECTIONS`
    bisections between it and the first step that left the set (a band replayed at the
    walks' ends is only as wide as they reach)."""
    d, held, sign = item
    x, t_prev, misses, inside, n, t_miss = prob.x0, 0.0, 0, [], 0, None
    ladder, halvings, k = STEPS, 0, 0
    while k < len(ladder):
        t = ladder[k]
        trial = np.clip(x + sign * (t - t_prev) * d, prob.lo, prob.hi)
        if np.allclose(trial, x):
            break  # at a bound: no further
        ok, trial, used = _try(prob, trial, held)
        n += used
        if ok:
            inside.append(trial)
            x, t_prev, misses, t_miss = trial, t, 0, None
        elif not inside and halvings < MAX_HALVINGS:
            halvings += 1
            ladder, k = tuple(s / 2 ** halvings for s in STEPS), 0
            continue
        else:
            misses += 1
            t_miss = t if t_miss is None else t_miss
            if misses == 2:
                break
        k += 1
    for _ in range(BISECTIONS if inside and t_miss is not None else 0):
        t = (t_prev + t_miss) / 2
        ok, trial, used = _try(prob, np.clip(x + sign * (t - t_prev) * d, prob.lo, prob.hi), held)
        n += used
        if ok:
            inside.append(trial)
            x, t_prev = trial, t
        else:
            t_miss = t
    return inside, n


def _try(prob: _SetProblem, trial: np.ndarray, held) -> tuple[bool, np.ndarray, int]:
    """Whether ``trial`` (or, when it is outside and ``held`` is set, its Gauss-Newton
    follower, :func:`_follow`) is inside the set; the point; the evaluations spent."""
    gt, rt = prob.g(trial)
    if gt > prob.threshold and held is not None:
        trial = _follow(trial, rt, prob.jac, prob.sqrt_w, held, prob.lo, prob.hi)
        gt, _ = prob.g(trial)
        return gt <= prob.threshold, trial, 2
    return gt <= prob.threshold, trial, 1


def _follow(x: np.ndarray, r: np.ndarray, jac: np.ndarray, sqrt_w: np.ndarray, held: int, lo_b, hi_b) -> np.ndarray:
    """One Gauss-Newton step of every parameter but ``held`` from ``x`` (residuals ``r``,
    the optimum's Jacobian ``jac``, weights ``sqrt_w^T sqrt_w = Sigma^+``): the point of the
    valley beside ``x``."""
    others = [j for j in range(jac.shape[1]) if j != held]
    a, b = sqrt_w @ jac[:, others], sqrt_w @ r
    step = np.linalg.lstsq(a, -b, rcond=None)[0]
    y = x.copy()
    y[others] += step
    return np.clip(y, lo_b, hi_b)


def _at(x: np.ndarray, i: int, value: float) -> np.ndarray:
    y = x.copy()
    y[i] = value
    return y


def covariance_points(params: dict, correlations: dict, level: float = 0.95) -> list[dict]:
    """Points on the boundary of the delta method's confidence ellipsoid of a step fit: the
    optimum plus and minus each principal semi-axis, scaled to the ``level`` point of
    chi-square with as many degrees of freedom as parameters (clipped to each range).

    Parameters
    ----------
    params : dict name -> FittedParam; the free ones with a ``stderr`` span the ellipsoid.
    correlations : ``"a,b"`` -> correlation of the estimates (:class:`calibrate.fitting.FitResult`).
    level : confidence level.

    Returns
    -------
    list of dicts name -> value (natural units), ``2 k`` points for ``k`` parameters with a
    standard error; empty when none has one.

    Notes
    -----
    The ellipsoid ``(theta - theta0)^T C^-1 (theta - theta0) <= chi2_k(level)`` is the
    large-sample confidence set of a least-squares fit (Seber & Wild, Nonlinear Regression,
    1989, section 5.2); its principal axes are the eigenvectors of ``C``. The replayed
    prediction at these points (:func:`replay.analysis.bands.band_cost_models`) is the sigma-point
    propagation of the unscented transform (Julier & Uhlmann, Proc. IEEE 92(3), 2004).
    """
    from scipy.stats import chi2

    names = [n for n, p in params.items() if p.vary and p.stderr is not None and np.isfinite(p.stderr)
             and p.stderr > 0]
    if not names:
        return []
    sd = np.array([params[n].stderr for n in names])
    corr = np.eye(len(names))
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            if i != j:
                corr[i, j] = correlations.get(f"{a},{b}", correlations.get(f"{b},{a}", 0.0))
    w, v = np.linalg.eigh(corr * np.outer(sd, sd))
    radius = math.sqrt(chi2.ppf(level, len(names)))
    x0 = np.array([params[n].value for n in names])
    lo = np.array([PARAMS[n].lower for n in names])
    hi = np.array([PARAMS[n].upper for n in names])
    points = []
    for k in range(len(names)):
        axis = radius * math.sqrt(max(w[k], 0.0)) * v[:, k]
        for sign in (1.0, -1.0):
            points.append(dict(zip(names, map(float, np.clip(x0 + sign * axis, lo, hi)))))
    return points


#: Most points a calibration carries for its bands: with the calibration's own values, a band
#: costs at most ten replays (issue #18: a band within 10x one replay).
MAX_BAND_POINTS = 9


def spread_points(points: list[dict], center: dict, max_points: int = MAX_BAND_POINTS) -> list[dict]:
    """At most ``max_points`` of ``points``, the most spread: greedy farthest-point sampling
    (Gonzalez, Theor. Comput. Sci. 38, 1985) in units of each parameter's fit scale
    (:data:`schemas.cost_params.PARAMS`), from ``center`` (the calibration's values), first the
    point farthest from it. Every point when there are no more than ``max_points``.
    """
    if len(points) <= max_points:
        return list(points)
    names = sorted({n for p in points for n in p})
    scale = np.array([PARAMS[n].fit_scale for n in names])
    x = np.array([[p.get(n, center[n]) for n in names] for p in points]) / scale
    dist = np.linalg.norm(x - np.array([center[n] for n in names]) / scale, axis=1)
    chosen = [int(np.argmax(dist))]
    while len(chosen) < max_points:
        dist = np.minimum(dist, np.linalg.norm(x - x[chosen[-1]], axis=1))
        chosen.append(int(np.argmax(dist)))
    return [points[i] for i in sorted(chosen)]
