"""What a least-squares optimum says about each parameter: its standard error, its
correlations, and whether the data identify it (one rule for step and request fits)."""
from __future__ import annotations

import math
from typing import Callable

import lmfit
import numpy as np

from schemas.cost_params import PARAMS, CostParams, FittedParam, format_param


#: A free parameter is identified when its standard error is at most this fraction of its value.
MAX_REL_STDERR = 0.5
#: Correlations above this (in absolute value) are named as the reason a parameter is not identified.
CORRELATED = 0.95
#: A value nearer than this share of its interval's width to an end of the interval is at its edge.
EDGE_SHARE = 0.05


def identification(name: str, value: float, ci95: tuple | None,
                   no_interval: str = "no interval could be traced") -> tuple[str | None, str | None]:
    """The one rule for calling a fitted parameter identified, whatever traced its interval
    (the delta method, a bootstrap, a request fit's confidence set).

    Parameters
    ----------
    name : a parameter of :data:`schemas.cost_params.PARAMS`.
    value : the fitted value, natural units.
    ci95 : (low, high) its 95 % interval, natural units; None when none was traced.
    no_interval : why there is no interval, said when ``ci95`` is None, not finite or of no width.

    Returns
    -------
    (kind, why) : ``(None, None)`` when identified, else the rule ``kind`` that failed and the
        reason in words (stored as the parameter's ``bound``; ``"the data give <= X"`` in it is
        what the summary prints as the interval):

        * ``"bound"``: the value at an end of its declared range (the data give one side);
        * ``"none"``: no interval (``no_interval``);
        * ``"range"``: the interval reaches the lower end of the range, the value an
          identified parameter must exclude (``t_step_s`` in ``[0, ...]``: the data cannot
          tell the term from none; an efficiency down to its floor); the upper end (an
          efficiency of 1) may be reached, the value then still pinned on both sides;
        * ``"edge"``: the value outside the interval or within :data:`EDGE_SHARE` of its
          width from an end (the interval was traced on one side only);
        * ``"wide"``: a half-width over ``1.96`` x :data:`MAX_REL_STDERR` of the value.
    """
    spec = PARAMS[name]
    tol = 1e-6 * (spec.upper - spec.lower)
    lo, hi = ci95 if ci95 is not None else (math.nan, math.nan)
    traced = math.isfinite(lo) and math.isfinite(hi) and hi > lo
    if value - spec.lower <= tol or spec.upper - value <= tol:
        low = value - spec.lower <= tol
        side = (f"<= {format_param(name, hi)}" if low else f">= {format_param(name, lo)}") if traced else "nothing more"
        return "bound", f"at its {'lower' if low else 'upper'} bound; the data give {side}"
    if not traced:
        return "none", no_interval
    shown = f"[{format_param(name, lo)}, {format_param(name, hi)}]"
    if lo - spec.lower <= tol:
        return "range", (f"its 95 % interval {shown} reaches {format_param(name, spec.lower)}, the lower end of "
                         f"its range; the data give <= {format_param(name, hi)}")
    if min(value - lo, hi - value) < EDGE_SHARE * (hi - lo):
        return "edge", f"its value {format_param(name, value)} is at the edge of its 95 % interval {shown}"
    if (hi - lo) / 2 > 1.96 * MAX_REL_STDERR * abs(value):
        return "wide", f"the data allow any value in {shown}"
    return None, None


def assess(result: lmfit.minimizer.MinimizerResult, residual: Callable[[CostParams], np.ndarray],
           free: list, fixed: dict, rel_step: float, fixed_reason: dict | None = None,
           robust: bool = False, data_cov: np.ndarray | None = None) -> tuple[dict, dict, list]:
    """Values, standard errors, correlations and identifiability of a least-squares optimum.

    Parameters
    ----------
    result : lmfit result of :func:`least_squares`.
    residual : the same residual function.
    free : names of the fitted parameters.
    fixed : parameter -> value held fixed; ``fixed_reason`` says why (printed).
    rel_step : finite-difference step of the Jacobian, relative to the fit scale.
    robust : bool
        Heteroscedasticity-robust (sandwich, HC1) covariance, for many residuals of unequal
        variance (weighted step kinds); else the classic ``s^2 (J^T J)^-1``.
    data_cov : array (n_residuals, n_residuals), optional
        Covariance of the residuals from the sampling of the data (a bootstrap of measured
        quantiles): then ``(J^T J)^-1 J^T data_cov J (J^T J)^-1``, the delta method. Use it
        when the residuals are few and fitted almost exactly, so that their spread says
        nothing of how much the data could have varied.

    Returns
    -------
    params : dict[str, FittedParam] (free and fixed)
    correlations : dict ``"a,b"`` -> r
    warnings : list[str]

    Notes
    -----
    The one identifiability rule: ``cov = s^2 (J^T J)^-1`` from a central-difference
    Jacobian at the optimum (one-sided at a bound), ``s^2 = RSS / (n - p)``; with
    ``robust``, ``(J^T J)^-1 J^T diag(r^2) J (J^T J)^-1 n / (n - p)`` (White 1980, HC1). A free
    parameter is identified when its standard error is finite and at most
    :data:`MAX_REL_STDERR` of its value, or when the fit is exact (zero residuals: zero
    uncertainty, docs/CASES.md BR-20), and its interval ``value +- 1.96 se`` (clipped to its
    range) passes :func:`identification`. Otherwise it is NOT IDENTIFIED and the reason says
    which other parameter it cannot be told apart from (|r| > :data:`CORRELATED`), or that
    it sits at a bound of its range (then the data give only a bound: value + 1.96 se), or
    why the interval does not identify it.
    """
    scaled = {n: result.params[n].value for n in free}
    spec = {n: PARAMS[n] for n in free}

    def f(x: dict) -> np.ndarray:
        return residual(CostParams(**fixed, **{k: v * PARAMS[k].fit_scale for k, v in x.items()}))

    f0 = f(scaled)
    rss = float(np.sum(f0 ** 2))
    jac = _jacobian(f, scaled, free, rel_step, f0)
    active, partner_of = _separable(jac, list(free))
    se, correlations = _standard_errors(jac, free, active, f0, rss, robust, data_cov)
    for n, (m, r) in partner_of.items():
        if m is not None:
            correlations[",".join(sorted((n, m)))] = r
    params, warns = {}, []
    for n in free:
        v = scaled[n] * spec[n].fit_scale
        width = spec[n].upper - spec[n].lower
        at_lo, at_hi = v - spec[n].lower <= 1e-6 * width, spec[n].upper - v <= 1e-6 * width
        v = spec[n].lower if at_lo else spec[n].upper if at_hi else v  # lmfit stops a hair inside
        if n in partner_of:
            m, r = partner_of[n]
            if m is not None:
                why = f"cannot be told apart from {m} (r={r:+.2f})"
            else:
                lo, hi = flat_range(f, scaled, n, f0)
                why = (f"no effect on these data: any value in [{format_param(n, lo)}, {format_param(n, hi)}] "
                       "fits them equally")
            params[n] = FittedParam(v, None, False, why)
        elif rss == 0.0 and data_cov is None:  # an exact fit: no uncertainty (docs/CASES.md BR-20)
            params[n] = FittedParam(v, 0.0, True)
        else:
            params[n] = _judged(n, v, se[n], correlations)
        if not params[n].identifiable:
            warns.append(f"{n}: NOT IDENTIFIED, {params[n].bound}")
    for n, v in fixed.items():
        params[n] = FittedParam(v, None, True, (fixed_reason or {}).get(n, "held fixed"), vary=False)
    return {n: params[n] for n in PARAMS if n in params}, correlations, warns


def _jacobian(f, scaled: dict, free: list, rel_step: float, f0: np.ndarray) -> np.ndarray:
    """The central-difference Jacobian of the residuals ``f`` at ``scaled`` (fit-scaled values of the
    ``free`` parameters; one-sided at a bound), one column per parameter."""
    cols = []
    for n in free:
        spec = PARAMS[n]
        lo, hi = spec.lower / spec.fit_scale, spec.upper / spec.fit_scale
        h = rel_step * max(1.0, abs(scaled[n]))  # as scipy's finite differences: relative, at least rel_step
        up, down = min(scaled[n] + h, hi), max(scaled[n] - h, lo)
        fu = f({**scaled, n: up}) if up != scaled[n] else f0
        fd = f({**scaled, n: down}) if down != scaled[n] else f0
        cols.append((fu - fd) / (up - down) if up != down else np.zeros_like(f0))
    return np.column_stack(cols) if cols else np.zeros((f0.size, 0))


def _standard_errors(jac: np.ndarray, free: list, active: list, f0: np.ndarray, rss: float, robust: bool,
                     data_cov: np.ndarray | None) -> tuple[dict, dict]:
    """The standard errors of the ``free`` parameters (None but for the ``active``, separable ones) and
    the correlations of the active ones, ``"a,b"`` -> r, from the covariance :func:`assess` describes."""
    ja = jac[:, [free.index(n) for n in active]]
    dof = max(f0.size - len(active), 1)
    se: dict = {n: None for n in free}
    correlations: dict = {}
    if active:
        inv = np.linalg.inv(ja.T @ ja)
        if data_cov is not None:
            cov = inv @ ja.T @ data_cov @ ja @ inv
        elif robust:
            cov = inv @ ((ja * (f0 ** 2)[:, None]).T @ ja) @ inv * f0.size / dof
        else:
            cov = rss / dof * inv
        d = np.sqrt(np.clip(np.diag(cov), 0, None))
        for i, n in enumerate(active):
            se[n] = float(d[i]) * PARAMS[n].fit_scale
            for k, m in enumerate(active):
                if i < k and d[i] * d[k] > 0:
                    correlations[f"{n},{m}"] = float(cov[i, k] / (d[i] * d[k]))
    return se, correlations


def _judged(n: str, v: float, s: float | None, correlations: dict) -> FittedParam:
    """Parameter ``n`` at value ``v`` with standard error ``s``: identified when its interval passes
    :func:`identification`, else NOT IDENTIFIED with the reason (the parameter it is most correlated
    with, when its interval is wide)."""
    spec = PARAMS[n]
    ci = (max(spec.lower, v - 1.96 * s), min(spec.upper, v + 1.96 * s)) if s is not None else None
    kind, why = identification(n, v, ci, f"no interval: the covariance at the optimum is singular (stderr {s})")
    if kind is None:
        return FittedParam(v, s, True)
    partner = _most_correlated(n, correlations) if kind == "wide" else None
    if partner:  # the reason fit_variants holds it at its declared value and refits the others
        why = f"cannot be told apart from {partner[0]} (r={partner[1]:+.2f})"
    return FittedParam(v, s, False, why)


def _most_correlated(name: str, correlations: dict) -> tuple[str, float] | None:
    """The parameter most correlated with ``name``, if above :data:`CORRELATED`."""
    best = None
    for key, r in correlations.items():
        a, b = key.split(",")
        if name in (a, b) and abs(r) > CORRELATED and (best is None or abs(r) > abs(best[1])):
            best = (b if a == name else a, r)
    return best


def _separable(jac: np.ndarray, names: list) -> tuple[list, dict]:
    """The parameters whose effects on the residuals can be told apart, and for each of the
    others the one it is confounded with.

    While ``J^T J`` (columns scaled to unit norm) is singular, the eigenvector of its
    smallest eigenvalue says which parameters move together without changing the residuals:
    the one with the largest share is set aside, named with the next largest (and the
    correlation ``-sign`` of their shares, +-1), or with None when it moves alone (no effect).

    Returns
    -------
    active : list of names, in order; ``partner_of`` : dict name -> (partner or None, r)
    """
    active, partner_of = list(names), {}
    while active:
        cols = jac[:, [names.index(n) for n in active]]
        norms = np.linalg.norm(cols, axis=0)
        if np.all(norms > 0) and np.all(np.isfinite(cols)):
            w, v = np.linalg.eigh((cols / norms).T @ (cols / norms))
            if w[0] > 1e-10 * max(w[-1], 1e-300):
                break
            vec = v[:, 0]
        else:  # a column without effect (or not finite): it moves alone
            vec = np.where(np.isfinite(norms) & (norms > 0), 0.0, 1.0)
        order = np.argsort(-np.abs(vec))
        drop = active[order[0]]
        second = order[1] if len(order) > 1 and abs(vec[order[1]]) > 0.1 else None
        partner_of[drop] = (active[second], float(-np.sign(vec[order[0]] * vec[second]))) if second is not None \
            else (None, 0.0)
        active.remove(drop)
    return active, partner_of


def flat_range(f, scaled: dict, name: str, f0: np.ndarray, points: int = 24) -> tuple[float, float]:
    """The range of ``name`` (natural units) around its value over which the residuals do
    not change at all: what little the data say of a parameter without effect on them."""
    spec = PARAMS[name]
    lo, hi = spec.lower / spec.fit_scale, spec.upper / spec.fit_scale
    grid = np.unique(np.concatenate([np.linspace(lo, hi, points), [scaled[name]]]))
    same = [bool(np.array_equal(f({**scaled, name: g}), f0)) if g != scaled[name] else True for g in grid]
    k = int(np.searchsorted(grid, scaled[name]))
    a = b = k
    while a > 0 and same[a - 1]:
        a -= 1
    while b < len(grid) - 1 and same[b + 1]:
        b += 1
    return grid[a] * spec.fit_scale, grid[b] * spec.fit_scale
