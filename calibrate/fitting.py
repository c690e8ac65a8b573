"""The fit core shared by step fits and request fits: one least-squares driver over the
cost parameters (:data:`schemas.cost_params.PARAMS`: names, bounds and scales declared
once), one result type, one loop over the variants of the model.

:mod:`calibrate.identify` judges what the data identify (one covariance estimate, one
identifiability rule); :mod:`calibrate.summary` prints a fit and turns it into a
calibration. :mod:`calibrate.step_fit` and :mod:`calibrate.request_fit` only supply the
residuals.
"""
from __future__ import annotations

import math
import warnings as _warnings
from dataclasses import dataclass, field
from typing import Callable

import lmfit
import numpy as np

from schemas.text import wrap_error
from schemas.cost_params import PARAMS, VARIANTS, CostParams, format_param

from .errors import FitError
from .identify import assess, flat_range


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




def inert_params(cost_model, names) -> dict:
    """Parameters among ``names`` that do not change this model's step time (their term is
    off for this hardware: an all-reduce at TP 1, an all-to-all without experts): name -> why.
    The front end's and the KV migration's parameters are not step-time parameters and never listed."""
    out = {}
    base = cost_model.coefficients
    for n in names:
        spec = PARAMS[n]
        if n.startswith(("t_frontend", "t_stream", "t_kv_migrate")):
            continue
        d = spec.default
        # halfway to the farther bound (a default at a bound, such as eta_link's 1, probes the other side)
        farther = spec.upper if spec.upper - d >= d - spec.lower else spec.lower
        probe = spec.upper if math.isnan(d) else (d + farther) / 2
        if cost_model.with_params(cost_model.params.replace(**{n: probe})).coefficients == base:
            out[n] = "no effect on this hardware and model"
    return out


def unseen_params(residual: Callable[[CostParams], np.ndarray], cost_model, names) -> dict:
    """Parameters among ``names`` that do not change ``residual`` at all, from the model's
    value to the middle of either side of their range (the data never exercise their term:
    no prefill chunk with KV history in a decode-only log): name -> why, with the range of
    values that fit the data equally. Two residual evaluations each (more for those found)."""
    p0 = cost_model.params
    base = residual(p0)
    out = {}
    for n in names:
        spec = PARAMS[n]
        if math.isnan(p0[n]):
            continue
        probes = {(spec.lower + p0[n]) / 2, (p0[n] + spec.upper) / 2} - {p0[n]}
        if probes and all(np.array_equal(residual(p0.replace(**{n: v})), base) for v in probes):
            lo, hi = flat_range(lambda x: residual(p0.replace(**{k: v * PARAMS[k].fit_scale for k, v in x.items()})),
                                 {n: p0[n] / spec.fit_scale}, n, base)
            out[n] = (f"no effect on these data: any value in [{format_param(n, lo)}, {format_param(n, hi)}] "
                      "fits them equally")
    return out


def fit_variants(residual: Callable[[CostParams], np.ndarray], cost_model, variants, candidates, fixed: dict | None,
                 not_seen: dict, result_of, residuals: tuple, rel_step: float, assess_step: float,
                 robust: bool = False, data_cov: np.ndarray | None = None, starts=(), **kw) -> list[FitResult]:
    """Fit ``residual`` once per variant of :data:`VARIANTS`; best (lowest score) first.

    A parameter the data cannot tell apart from another one, or that has no effect on them,
    is held at its declared value (:data:`schemas.cost_params.PARAMS`) and the others are
    refitted, when that fits the data as well (sum of squares within 5 %): the calibration
    then carries the declared point of a flat valley, not an arbitrary one; the file says so.
    One that is only poorly constrained keeps its value and is reported NOT IDENTIFIED with its
    interval; one at a bound of its range is a result, not a failure.

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
        variant, each also with its knee as the same knee in the step's tokens on a replica of
        several GPUs, :func:`knee_starts`; later ones start from the first one's optimum).
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
    maybe = [n for n in candidates if n not in (fixed or {}) and n != "overlap" and n not in not_seen]
    unseen = unseen_params(residual, cost_model, [n for n in maybe if n not in inert_params(cost_model, maybe)])
    for v in sorted(variants, key=lambda v: VARIANTS[v] is None):
        hold = dict(fixed or {})
        why = {k: "given" for k in hold}
        if VARIANTS[v] is not None:
            hold["overlap"], why["overlap"] = VARIANTS[v], f"variant {v}"
        why.update(inert_params(cost_model, [n for n in candidates if n not in hold]))
        for n, reason in not_seen.items():
            why.setdefault(n, reason)
        for n, reason in unseen.items():  # held: a free parameter without effect stalls the solver
            why.setdefault(n, _held_why(reason))
        free = {n: start_of[n] for n in PARAMS if n in candidates and n not in why}
        for n in PARAMS:
            if n not in free and n not in hold:
                hold[n] = start_of[n]
                why.setdefault(n, "not in the model's terms")
        if not free:
            held = "; ".join(f"{n}: {why[n]}" for n in candidates if n in why)
            raise FitError(wrap_error(f"no parameter left to fit ({held}); free another with --free or drop a --fix"))
        require_rows(residuals[0], len(free), residuals[1])
        previous = [{k: f.params[k].value for k in free} for f in fits]
        if VARIANTS[v] is None and previous:  # the blend from the nested variants' optima only
            free, previous = previous[0], previous[1:]
        extra = [{**free, **{k: x for k, x in st.items() if k in free}}
                 for st in knee_starts(starts, cost_model)] if not fits else previous
        best, info = least_squares(residual, free, hold, rel_step=rel_step, starts=extra, **kw)
        params, corr, warns = assess(best, residual, list(free), hold, assess_step, fixed_reason=why, robust=robust,
                                     data_cov=data_cov)
        warns = [_held_warning(n, r, start_of[n]) for n, r in unseen.items() if why.get(n) == _held_why(r)] + warns
        for _ in range(len(free)):  # hold what the data cannot identify at its declared value, refit the rest
            unknown = [n for n in free if not params[n].identifiable
                       and params[n].bound.startswith(("cannot be told apart", "no effect"))]
            if not unknown or len(unknown) == len(free):
                break
            trial_hold, trial_why = {**hold, **{n: start_of[n] for n in unknown}}, dict(why)
            for n in unknown:
                trial_why[n] = _held_why(params[n].bound)
            trial_free = {n: params[n].value for n in free if n not in unknown}
            trial, more = least_squares(residual, trial_free, trial_hold, rel_step=rel_step, **kw)
            info = {"n_evals": info["n_evals"] + more["n_evals"]}
            if trial.chisqr > 1.05 * best.chisqr + 1e-12:
                break  # the declared values are not in the valley: the data disagree, keep the fitted ones
            held = [_held_warning(n, params[n].bound, start_of[n]) for n in unknown]
            kept = [w for w in warns if "held at" in w] + held
            best, hold, why, free = trial, trial_hold, trial_why, trial_free
            params, corr, warns = assess(best, residual, list(free), hold, assess_step, fixed_reason=why, robust=robust,
                                         data_cov=data_cov)
            warns = kept + warns
        fits.append(result_of(v, params, corr, warns, best, info))
    fits.sort(key=lambda r: r.score)
    return fits


def knee_starts(starts, cost_model) -> list[dict]:
    """``starts``, then on a replica of ``G = tp x dp > 1`` GPUs each one with an ``n_half_tokens``
    again divided by ``G``.

    The knee is per GPU (:class:`replay.cost.cost_terms.DenseCompute`): a start's ``n_half_tokens``
    of 100 is a knee at ``100 G`` tokens a step. The second copy starts at a knee of 100 tokens a
    step, as the starts did before the knee was per GPU, so a fit tries both whatever the replica's
    size and keeps the best in sample (:func:`least_squares`). Started from the first set alone, the
    fits of InferenceMAX's gpt-oss-120b at TP 2 and DeepSeek-R1 at TP 8 stopped at other optima than
    they had from the second.
    """
    g = cost_model.tp * cost_model.dp
    starts = list(starts)
    if g == 1:
        return starts
    return starts + [{**st, "n_half_tokens": st["n_half_tokens"] / g} for st in starts if "n_half_tokens" in st]


def _held_why(reason: str) -> str:
    """Why a parameter the data cannot identify was held (stored in the calibration)."""
    return f"NOT IDENTIFIED ({reason}); held at its declared value"


def _held_warning(name: str, reason: str, value: float) -> str:
    """The warning that a parameter was held at its declared ``value``."""
    return f"{name}: not identified by these data ({reason}); held at {format_param(name, value)}"


def least_squares(residual: Callable[[CostParams], np.ndarray], free: dict, fixed: dict,
                  rel_step: float, starts: list[dict] | None = None, max_nfev: int | None = None,
                  loss: str = "linear", runner=None,
                  tol: float = 1e-10) -> tuple[lmfit.minimizer.MinimizerResult, dict]:
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
    free parameter of order 1 (docs/CASES.md BR-18). Trust region reflective with bounds.
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


def require_rows(n_rows: int, n_free: int, what: str) -> None:
    """Raise :class:`FitError` unless there are more residuals than free parameters."""
    if n_rows <= n_free:
        raise FitError(f"{n_rows} {what}; need more than {n_free} to fit {n_free} parameter(s)")
