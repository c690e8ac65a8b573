"""The fit-result core shared by step fits and request fits.

One least-squares driver over the cost parameters (:data:`schemas.cost_params.PARAMS`:
names, bounds and scales declared once), one covariance estimate, one identifiability
rule, one result type and one printer. :mod:`calibrate.step_fit` and
:mod:`calibrate.request_fit` only supply the residuals.
"""
from __future__ import annotations

import math
import warnings as _warnings
from dataclasses import dataclass, field
from typing import Callable

import lmfit
import numpy as np

from schemas.calibration import Calibration, FittedParam
from schemas.cost_params import PARAMS, CostParams

from .errors import FitError

#: A free parameter is identified when its standard error is at most this fraction of its value.
MAX_REL_STDERR = 0.5
#: Correlations above this (in absolute value) are named as the reason a parameter is not identified.
CORRELATED = 0.95


@dataclass
class FitResult:
    """Outcome of one fit (one variant of the cost model), step or request.

    Attributes
    ----------
    variant : str
        Which variant was fitted, e.g. ``overlap=max``.
    params : dict[str, FittedParam]
        Every parameter of the cost model: fitted ones with stderr and identifiability,
        fixed ones with ``vary=False`` and why (``bound``).
    correlations : dict[str, float]
        ``"a,b"`` -> correlation of the free parameters' estimates.
    score : float
        What variants are ranked by (lower is better): the step fit's balanced median
        |relative residual|, the request fit's sum of squared quantile errors.
    stats : dict
        Fit statistics for the calibration file and the printer (R^2, residual
        percentiles, per-metric quantile errors, rows, replays, ...).
    warnings : list[str]
    report : str
        lmfit's report (printed with ``--verbose``).
    """

    variant: str
    params: dict
    correlations: dict
    score: float
    stats: dict = field(default_factory=dict)
    warnings: list = field(default_factory=list)
    report: str = ""

    def values(self) -> dict:
        """Every parameter's value, natural units."""
        return {k: p.value for k, p in self.params.items()}

    def cost_params(self) -> CostParams:
        """The values as :class:`~schemas.cost_params.CostParams`."""
        return CostParams(**self.values())


#: How compute and memory combine: the seed's max, the sum, or a fitted blend (``overlap``).
VARIANTS = {"max": 0.0, "sum": 1.0, "blend": None}


def inert_params(cost_model, names) -> dict:
    """Parameters among ``names`` that do not change this model's step time (their term is
    off for this hardware: an all-reduce at TP 1, an all-to-all without experts): name -> why.
    The front end's parameters are not step-time parameters and never listed."""
    out = {}
    base = cost_model.coefficients
    for n in names:
        spec = PARAMS[n]
        if n.startswith(("t_frontend", "t_stream")):
            continue
        probe = spec.upper if math.isnan(spec.default) else (spec.default + spec.upper) / 2
        if cost_model.with_params(cost_model.params.replace(**{n: probe})).coefficients == base:
            out[n] = "no effect on this hardware and model"
    return out


def fit_variants(residual: Callable[[CostParams], np.ndarray], cost_model, variants, candidates, fixed: dict | None,
                 not_seen: dict, result_of, residuals: tuple, rel_step: float, assess_step: float,
                 robust: bool = False, data_cov: np.ndarray | None = None, starts=(), **kw) -> list[FitResult]:
    """Fit ``residual`` once per variant of :data:`VARIANTS`; best (lowest score) first.

    A parameter the data cannot tell apart from another one, or that has no effect on them,
    is held at its declared value (:data:`schemas.cost_params.PARAMS`) and the others are
    refitted, when that fits the data as well (sum of squares within 5 %): the calibration
    then carries the declared point of a flat valley, not an arbitrary one; the file says so. One that is only poorly constrained keeps its value and is reported NOT
    IDENTIFIED with its interval; one at a bound of its range is a result, not a failure.

    Parameters
    ----------
    residual : CostParams -> residual array.
    cost_model : RooflineCostModel
        Its values are the first start and the values of the parameters held.
    variants : names of :data:`VARIANTS`; ``blend`` is fitted last, from the optima of
        ``max`` and ``sum`` when they were fitted (it nests both, so it can only do better).
    candidates : parameters the fit may free (those with an effect, not held).
    fixed : parameter -> value held (``--fix``).
    not_seen : parameter -> why it is held (what the data cannot see).
    result_of : callable ``(variant, params, correlations, warnings, lmfit result, info) -> FitResult``.
    residuals : (count, what they are): the fit needs more residuals than free parameters.
    rel_step, starts, kw : of :func:`least_squares` (``starts``: extra start points of the first
        variant; later ones start from the first one's optimum).
    assess_step, robust, data_cov : of :func:`assess`.

    Raises
    ------
    FitError
        An unknown variant, or no more residuals than free parameters.
    """
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise FitError(f"unknown variant {', '.join(unknown)}; expected {', '.join(VARIANTS)}")
    p0 = cost_model.params
    start_of = {n: p0[n] if not math.isnan(p0[n]) else cost_model.tp_link.latency_s for n in PARAMS}
    fits = []
    for v in sorted(variants, key=lambda v: VARIANTS[v] is None):
        hold = dict(fixed or {})
        why = {k: "given" for k in hold}
        if VARIANTS[v] is not None:
            hold["overlap"], why["overlap"] = VARIANTS[v], f"variant {v}"
        why.update(inert_params(cost_model, [n for n in candidates if n not in hold]))
        for n, reason in not_seen.items():
            why.setdefault(n, reason)
        free = {n: start_of[n] for n in PARAMS if n in candidates and n not in why}
        for n in PARAMS:
            if n not in free and n not in hold:
                hold[n] = start_of[n]
                why.setdefault(n, "not in the model's terms")
        require_rows(residuals[0], len(free), residuals[1])
        previous = [{k: f.params[k].value for k in free} for f in fits]
        if VARIANTS[v] is None and previous:  # the blend from the nested variants' optima only
            free, previous = previous[0], previous[1:]
        extra = [{**free, **{k: x for k, x in st.items() if k in free}} for st in starts] if not fits else previous
        best, info = least_squares(residual, free, hold, rel_step=rel_step, starts=extra, **kw)
        params, corr, warns = assess(best, residual, list(free), hold, assess_step, fixed_reason=why, robust=robust,
                                     data_cov=data_cov)
        for _ in range(len(free)):  # hold what the data cannot identify at its declared value, refit the rest
            unknown = [n for n in free if not params[n].identifiable
                       and params[n].bound.startswith(("cannot be told apart", "no effect"))]
            if not unknown or len(unknown) == len(free):
                break
            trial_hold, trial_why = {**hold, **{n: start_of[n] for n in unknown}}, dict(why)
            for n in unknown:
                trial_why[n] = f"NOT IDENTIFIED ({params[n].bound}); held at its declared value"
            trial_free = {n: params[n].value for n in free if n not in unknown}
            trial, more = least_squares(residual, trial_free, trial_hold, rel_step=rel_step, **kw)
            info = {"n_evals": info["n_evals"] + more["n_evals"]}
            if trial.chisqr > 1.05 * best.chisqr + 1e-12:
                break  # the declared values are not in the valley: the data disagree, keep the fitted ones
            held = [f"{n}: not identified by these data ({params[n].bound}); held at {fmt(n, start_of[n])}"
                    for n in unknown]
            kept = [w for w in warns if "held at" in w] + held
            best, hold, why, free = trial, trial_hold, trial_why, trial_free
            params, corr, warns = assess(best, residual, list(free), hold, assess_step, fixed_reason=why, robust=robust,
                                         data_cov=data_cov)
            warns = kept + warns
        fits.append(result_of(v, params, corr, warns, best, info))
    fits.sort(key=lambda r: r.score)
    return fits


def least_squares(residual: Callable[[CostParams], np.ndarray], free: dict, fixed: dict,
                  rel_step: float, starts: list[dict] | None = None, max_nfev: int | None = None,
                  loss: str = "linear", runner=None, tol: float = 1e-10) -> tuple[lmfit.minimizer.MinimizerResult, dict]:
    """Minimise ``sum(residual(params)^2)`` over the ``free`` parameters.

    Parameters
    ----------
    residual : callable
        ``CostParams -> 1-d array`` of residuals (dimensionless).
    free : dict
        Free parameter -> start value (natural units); bounds from :data:`PARAMS`.
    fixed : dict
        Parameter -> value held fixed.
    rel_step : float
        Finite-difference step, relative to each parameter's fit scale (5 % for replayed
        quantiles, which are piecewise constant below that; small for smooth step fits).
    starts : list of dict, optional
        More start points (free parameter -> value); the best polished one wins.
    loss : str
        scipy ``least_squares`` loss (``linear``, ``soft_l1``, ...).
    tol : float
        ``ftol``, ``xtol`` and ``gtol`` of scipy's ``least_squares``.
    runner : callable, optional
        ``runner(fn, shared, items) -> [fn(shared, item) for item in items]`` running the
        starts elsewhere (:func:`calibrate.request_fit.start_runner`); default: here, in order.

    Returns
    -------
    The best lmfit result, and ``{"n_evals": ...}``.

    Notes
    -----
    lmfit works on ``value / fit_scale`` (:class:`~schemas.cost_params.ParamSpec`), every
    free parameter of order 1 (shared/cases BR-18). Trust region reflective with bounds.
    """
    problem = _Problem(residual, free, fixed, rel_step, max_nfev, loss, tol)
    items = [free] + list(starts or [])
    results = runner(polish, problem, items) if runner else [polish(problem, s) for s in items]
    best = min(results, key=lambda r: r[0].chisqr)
    return best[0], {"n_evals": sum(n for _, n in results)}


class _Problem:
    """A picklable least-squares problem (the starts may run in other processes)."""

    def __init__(self, residual, free, fixed, rel_step, max_nfev, loss, tol):
        self.residual, self.free, self.fixed = residual, dict(free), dict(fixed)
        self.rel_step, self.max_nfev, self.loss, self.tol = rel_step, max_nfev, loss, tol

    def params_of(self, scaled: dict) -> CostParams:
        return CostParams(**self.fixed, **{k: v * PARAMS[k].fit_scale for k, v in scaled.items()})

    def __call__(self, p: lmfit.Parameters) -> np.ndarray:
        return self.residual(self.params_of(p.valuesdict()))



def polish(problem: _Problem, start: dict):
    """One start of :func:`least_squares`: lmfit ``least_squares`` from ``start``; the
    result and the residual evaluations it took (module level: picklable for workers).

    The result holds the best point evaluated: when the evaluation budget runs out lmfit
    stops wherever it was (a finite-difference probe, say), not at its best point."""
    params = lmfit.Parameters()
    for name in problem.free:
        spec = PARAMS[name]
        lo, hi = spec.lower / spec.fit_scale, spec.upper / spec.fit_scale
        params.add(name, value=min(max(start[name] / spec.fit_scale, lo), hi), min=lo, max=hi)
    count, best = [0], [math.inf, None]

    def fcn(p):
        count[0] += 1
        r = problem(p)
        cost = float(np.sum(r ** 2))
        if cost < best[0]:
            best[0], best[1] = cost, p.valuesdict()
        return r

    with _warnings.catch_warnings():
        _warnings.simplefilter("ignore", RuntimeWarning)
        try:
            r = lmfit.Minimizer(fcn, params).minimize(
                method="least_squares", loss=problem.loss, x_scale="jac", diff_step=problem.rel_step,
                max_nfev=problem.max_nfev, ftol=problem.tol, xtol=problem.tol, gtol=problem.tol)
        except ValueError as exc:  # scipy: residuals or Jacobian not finite
            raise FitError(f"the fit failed: {exc}; the data hold values no cost model reaches") from None
    if best[1] is not None and problem.loss == "linear" and best[0] < r.chisqr:
        for name, value in best[1].items():
            r.params[name].value = value
        r.chisqr = best[0]
    return r, count[0]


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
    uncertainty, shared/cases BR-20). Otherwise it is NOT IDENTIFIED and the reason says
    which other parameter it cannot be told apart from (|r| > :data:`CORRELATED`), or that
    it sits at a bound of its range (then the data give only a bound: value + 1.96 se).
    """
    scaled = {n: result.params[n].value for n in free}
    spec = {n: PARAMS[n] for n in free}
    values = {n: scaled[n] * spec[n].fit_scale for n in free}

    def f(x: dict) -> np.ndarray:
        return residual(CostParams(**fixed, **{k: v * PARAMS[k].fit_scale for k, v in x.items()}))

    f0 = f(scaled)
    rss = float(np.sum(f0 ** 2))
    cols = []
    for n in free:
        lo, hi = spec[n].lower / spec[n].fit_scale, spec[n].upper / spec[n].fit_scale
        h = rel_step * max(1.0, abs(scaled[n]))  # as scipy's finite differences: relative, at least rel_step
        up, down = min(scaled[n] + h, hi), max(scaled[n] - h, lo)
        fu = f({**scaled, n: up}) if up != scaled[n] else f0
        fd = f({**scaled, n: down}) if down != scaled[n] else f0
        cols.append((fu - fd) / (up - down) if up != down else np.zeros_like(f0))
    jac = np.column_stack(cols) if cols else np.zeros((f0.size, 0))
    active, partner_of = _separable(jac, list(free))
    idx = [free.index(n) for n in active]
    ja = jac[:, idx]
    dof = max(f0.size - len(active), 1)
    se, correlations = {n: None for n in free}, {}
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
            se[n] = float(d[i]) * spec[n].fit_scale
            for k, m in enumerate(active):
                if i < k and d[i] * d[k] > 0:
                    correlations[f"{n},{m}"] = float(cov[i, k] / (d[i] * d[k]))
    for n, (m, r) in partner_of.items():
        if m is not None:
            correlations[",".join(sorted((n, m)))] = r
    params, warns = {}, []
    for n in free:
        v, s = values[n], se[n]
        width = spec[n].upper - spec[n].lower
        at_lo, at_hi = v - spec[n].lower <= 1e-6 * width, spec[n].upper - v <= 1e-6 * width
        v = spec[n].lower if at_lo else spec[n].upper if at_hi else v  # lmfit stops a hair inside
        if n in partner_of:
            m, r = partner_of[n]
            if m is not None:
                why = f"cannot be told apart from {m} (r={r:+.2f})"
            else:
                lo, hi = _flat_range(f, scaled, n, f0)
                why = f"no effect on these data: any value in [{fmt(n, lo)}, {fmt(n, hi)}] fits them equally"
            params[n] = FittedParam(v, None, False, why)
        elif rss == 0.0 and data_cov is None:
            params[n] = FittedParam(v, 0.0, True)
            continue
        elif at_lo or at_hi:
            bound = (f"<= {fmt(n, v + 1.96 * s)}" if at_lo else f">= {fmt(n, v - 1.96 * s)}") if s else "nothing more"
            params[n] = FittedParam(v, s, False, f"at its {'lower' if at_lo else 'upper'} bound; the data give {bound}")
        elif s is None or not math.isfinite(s) or s > MAX_REL_STDERR * abs(v):
            partner = _most_correlated(n, correlations)
            why = f"cannot be told apart from {partner[0]} (r={partner[1]:+.2f})" if partner else \
                f"poorly constrained (stderr {s:.2g})"
            params[n] = FittedParam(v, s, False, why)
        else:
            params[n] = FittedParam(v, s, True)
            continue
        warns.append(f"{n}: NOT IDENTIFIED, {params[n].bound}")
    for n, v in fixed.items():
        params[n] = FittedParam(v, None, True, (fixed_reason or {}).get(n, "held fixed"), vary=False)
    return {n: params[n] for n in PARAMS if n in params}, correlations, warns


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


def _flat_range(f, scaled: dict, name: str, f0: np.ndarray, points: int = 24) -> tuple[float, float]:
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


def param_cells(name: str, p: FittedParam) -> tuple[str, str, str]:
    """A parameter as printed: value with unit, its 95 % interval (or what bound the data
    give), and its state (``identified``, ``NOT IDENTIFIED`` or ``fixed``)."""
    unit, scale = _unit(PARAMS[name].unit, p.value)
    val = f"{p.value / scale:.4g}{unit}"
    if not p.vary:
        return val, "", "fixed"
    if not p.identifiable:
        bound = p.bound.split("the data give ")[-1] if p.bound and "the data give " in p.bound else ""
        return val, bound if bound != "nothing more" else "", "NOT IDENTIFIED"
    ci = p.ci95 or ((p.value - 1.96 * p.stderr, p.value + 1.96 * p.stderr) if p.stderr is not None else None)
    return val, f"[{ci[0] / scale:.3g}, {ci[1] / scale:.3g}]" if ci else "", "identified"


def summary_lines(fit: FitResult) -> list[str]:
    """The fit in words: a line per fitted parameter (value, 95 % interval, identified or
    NOT IDENTIFIED with the reason on the next line), then the fixed ones by reason; no
    line over 100 characters."""
    lines, fixed = [], {}
    for n, p in fit.params.items():
        v, ci, state = param_cells(n, p)
        if state == "fixed" and (p.bound or "").startswith("NOT IDENTIFIED ("):
            lines.append(f"  {n:24s} {v:>14s} {'':>22s}  NOT IDENTIFIED, held")
            lines.append(f"      {p.bound[len('NOT IDENTIFIED ('):].split('); held')[0]}"[:100])
            continue
        if state == "fixed":
            fixed.setdefault(p.bound or "held fixed", []).append(f"{n}={v.replace(' ', '')}")
            continue
        lines.append(f"  {n:24s} {v:>14s} {ci:>22s}  {state}")
        if state == "NOT IDENTIFIED" and p.bound:
            lines.append(f"      {p.bound}"[:100])
    for why, names in fixed.items():
        lines.append(f"  fixed ({why}): {', '.join(names)}"[:100])
    return lines


def fmt(name: str, value: float) -> str:
    """``value`` of parameter ``name`` with its unit, 3 significant digits (``0.489 ms``)."""
    unit, scale = _unit(PARAMS[name].unit, value)
    return f"{value / scale:.3g}{unit}"


def _unit(unit: str, value: float) -> tuple[str, float]:
    """A printed unit and its scale: seconds as ms or us where that reads better."""
    if unit != "s":
        return (f" {unit}" if unit else ""), 1.0
    if abs(value) >= 0.1 or value == 0:
        return " s", 1.0
    return (" ms", 1e-3) if abs(value) >= 1e-4 else (" us", 1e-6)


def to_calibration(fit: FitResult, cost_model, method: str, source: dict, engine: dict | None = None,
                   variants: list | None = None) -> Calibration:
    """The calibration file contents of ``fit`` for ``cost_model``'s hardware and terms."""
    stats = dict(fit.stats)
    stats.update({"method": method, "variant": fit.variant, "score": fit.score,
                  "correlations": fit.correlations, "warnings": fit.warnings})
    if variants:
        stats["variants"] = {v.variant: {"score": v.score, "values": v.values()} for v in variants}
    return Calibration(model=cost_model.model, gpu=cost_model.gpu, tp=cost_model.tp, params=dict(fit.params),
                       terms=list(cost_model.terms), dp=cost_model.dp, expert_parallel=cost_model.expert_parallel,
                       engine=dict(engine or {}), fit=stats, source=source)


def require_rows(n_rows: int, n_free: int, what: str) -> None:
    """Raise :class:`FitError` unless there are more residuals than free parameters."""
    if n_rows <= n_free:
        raise FitError(f"{n_rows} {what}; need more than {n_free} to fit {n_free} parameter(s)")
