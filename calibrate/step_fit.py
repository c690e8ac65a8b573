"""Calibration from a step trace: least squares of measured step durations on the cost model."""
from __future__ import annotations

import numpy as np
import pandas as pd

from replay.cost.cost_model import FRONTEND_PARAMS, HANDOFF_PARAMS, RooflineCostModel
from schemas.cost_params import PARAMS, CostParams
from schemas.metrics import step_kind
from schemas.step_record import feature_arrays

from .confidence import covariance_points, spread_points
from .errors import FitError
from .fitting import FitResult, fit_variants, least_squares
from .identify import identification

#: Extra start points of the step fit (the first start is the declared defaults).
_STARTS = ({"eta_compute": 0.3, "eta_mem": 0.5, "n_half_tokens": 200.0},
           {"eta_compute": 0.8, "eta_mem": 0.95, "n_half_tokens": 20.0})


class StepData:
    """The usable rows of a step trace: features, durations and residual weights.

    Attributes
    ----------
    features : dict name -> int64 array, shape (n,)
        The step record's features (:func:`schemas.step_record.feature_arrays`; the keywords
        of ``step_time_s``).
    duration_s : float64 array, shape (n,)
    kind : str array, shape (n,): ``prefill_only``, ``decode_only`` or ``mixed`` (:func:`schemas.metrics.step_kind`).
    weights : float64 array, shape (n,)
        With ``balance_kinds``, a kind with more rows than the median kind is down-weighted
        to count as the median one (``sqrt(n_median / n_kind)`` per row; a profiling grid's
        thousands of mixed shapes do not drown the rest), else ones.
    dropped : dict reason -> rows (``missing``, ``non-positive``, below 1 ns, ``empty``)
    """

    def __init__(self, steps: pd.DataFrame, balance_kinds: bool = True):
        dur = steps["step_duration_s"].to_numpy(float)
        x = feature_arrays(steps)
        pre, dec = x["num_prefill_tokens"], x["num_decode_seqs"]
        tokens = pre + dec
        self.dropped = {k: v for k, v in {
            "missing": int(np.sum(~np.isfinite(dur))),
            "non-positive": int(np.sum(np.isfinite(dur) & (dur <= 0))),
            "below 1 ns (no forward pass is that short)": int(np.sum(np.isfinite(dur) & (dur > 0) & (dur < 1e-9))),
            "empty": int(np.sum(np.isfinite(dur) & (dur >= 1e-9) & (tokens <= 0)))}.items() if v}
        keep = np.isfinite(dur) & (dur >= 1e-9) & (tokens > 0)
        # a prefill has at least one chunk and none without prefill tokens; decodes feed at least one position each
        x["num_prefill_seqs"] = np.where(pre > 0, np.maximum(x["num_prefill_seqs"], 1), 0)
        x["num_decode_tokens"] = np.where(dec > 0, np.maximum(x["num_decode_tokens"], dec), 0)
        self.features = {name: v[keep] for name, v in x.items()}
        self.duration_s = dur[keep]
        self.kind = step_kind(pre[keep], dec[keep])
        self.weights = np.ones_like(self.duration_s)
        if balance_kinds and self.duration_s.size:
            _, inv, counts = np.unique(self.kind, return_inverse=True, return_counts=True)
            self.weights = np.sqrt(np.minimum(1.0, np.median(counts) / counts))[inv]

    def subset(self, idx: np.ndarray) -> "StepData":
        """The rows ``idx`` (a bootstrap resample), same weights rule."""
        out = object.__new__(StepData)
        out.features = {name: f[idx] for name, f in self.features.items()}
        out.duration_s, out.kind, out.weights = self.duration_s[idx], self.kind[idx], self.weights[idx]
        out.dropped = self.dropped
        return out


class _StepResidual:
    """Weighted log residuals ``w log(pred / meas)`` of the step durations (relative errors
    for small ones; unbiased under multiplicative noise, unlike ``(pred - meas) / meas``)."""

    def __init__(self, data: StepData, cost_model: RooflineCostModel):
        self.data, self.cost_model = data, cost_model

    def predict(self, p: CostParams) -> np.ndarray:
        return self.cost_model.with_params(p).step_time_s(**self.data.features)

    def __call__(self, p: CostParams) -> np.ndarray:
        d = self.data
        with np.errstate(divide="ignore"):
            return d.weights * np.log(np.maximum(self.predict(p), 1e-300) / d.duration_s)


def fit_steps(steps: pd.DataFrame, cost_model: RooflineCostModel, variants=("max", "sum", "blend"),
              loss: str = "soft_l1", fixed: dict | None = None, balance_kinds: bool = True,
              data: StepData | None = None) -> tuple[list[FitResult], dict]:
    """Fit the cost model's parameters to a step trace, once per overlap variant.

    Parameters
    ----------
    steps : step_trace/1 frame.
    cost_model : RooflineCostModel
        Hardware, model and terms; its parameter values are the starts and the values of
        parameters that stay fixed.
    variants : names of :data:`schemas.cost_params.VARIANTS` (``max``/``sum`` fix ``overlap`` at 0/1,
        ``blend`` fits it).
    loss : scipy ``least_squares`` loss; robust ``soft_l1`` by default.
    fixed : parameter -> value held fixed.

    Returns
    -------
    fits : list of FitResult, best (lowest score) first
    dropped : dict reason -> rows left out

    Raises
    ------
    FitError
        No usable rows, or too few for the free parameters.

    Notes
    -----
    Residual of row i: ``w_i log(pred_i / meas_i)``, free of the log's time unit (docs/CASES.md
    BR-18) and unbiased when the noise is multiplicative (a step 3 % slow and one 3 % fast
    weigh the same; ``(pred - meas) / meas`` would pull every time ``1.5 sigma^2`` low). The
    score is the mean over step kinds of the median |relative residual|. Uncertainty and
    identifiability: :func:`calibrate.identify.assess`.
    """
    data = data or StepData(steps, balance_kinds)
    if data.duration_s.size == 0:
        raise FitError("no usable step rows (all missing, non-positive or empty)")
    residual = _StepResidual(data, cost_model)
    not_seen = {n: "outside the engine: a step trace does not see it" for n in FRONTEND_PARAMS}
    not_seen.update({n: "between instances: a step trace does not see it" for n in HANDOFF_PARAMS})

    def result_of(variant, params, corr, warns, best, info):
        return _result(variant, params, corr, warns, residual, data, best, info)

    fits = fit_variants(residual, cost_model, variants, cost_model.free_params, fixed, not_seen, result_of,
                        (data.duration_s.size, "usable step rows"), rel_step=1e-4, assess_step=1e-3, robust=True,
                        starts=_STARTS, loss=loss, tol=1e-8)
    return fits, data.dropped


def _result(variant, params, corr, warns, residual, data, best, info) -> FitResult:
    import lmfit

    pred = residual.predict(CostParams(**{k: p.value for k, p in params.items()}))
    meas = data.duration_s
    rel = np.abs(pred - meas) / meas
    ss_tot = float(np.sum((meas - meas.mean()) ** 2))
    by_kind = {str(k): float(np.median(rel[data.kind == k])) for k in np.unique(data.kind)}
    stats = {"n_rows": int(meas.size), "dropped_rows": data.dropped, "n_evals": info["n_evals"],
             "r2": 1.0 - float(np.sum((pred - meas) ** 2)) / ss_tot if ss_tot > 0 else float("nan"),
             "rel_residual_pct": {f"p{q}": float(np.percentile(rel, q)) for q in (50, 90, 99)},
             "rel_residual_p50_by_kind": by_kind}
    return FitResult(variant=variant, params=params, correlations=corr, score=float(np.mean(list(by_kind.values()))),
                     stats=stats, warnings=warns, report=lmfit.fit_report(best))


def bootstrap_ci95(data: StepData, cost_model: RooflineCostModel, fit: FitResult, loss: str = "soft_l1",
                   num_samples: int = 200, seed: int = 0) -> dict:
    """95 % percentile-bootstrap intervals of the free parameters, resampling steps.

    Each of ``num_samples`` resamples (rows drawn with replacement,
    ``numpy.random.default_rng(seed)``) is refitted from ``fit``'s values with the same
    variant and loss; the interval is the 2.5th-97.5th percentile of the refitted values
    (Efron & Tibshirani, *An Introduction to the Bootstrap*, 1993, ch. 13).

    Returns
    -------
    dict parameter -> (low, high), natural units.
    """
    rng = np.random.default_rng(seed)
    n = data.duration_s.size
    free = [k for k, p in fit.params.items() if p.vary]
    hold = {k: p.value for k, p in fit.params.items() if not p.vary}
    cm = cost_model.with_params(fit.cost_params())
    draws = {k: [] for k in free}
    for _ in range(num_samples):
        sub = _StepResidual(data.subset(rng.integers(0, n, n)), cm)
        r, _ = least_squares(sub, {k: fit.params[k].value for k in free}, hold, rel_step=1e-4, loss=loss)
        for k in free:
            draws[k].append(r.params[k].value * PARAMS[k].fit_scale)
    return {k: (float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))) for k, v in draws.items()}


def set_ci95(fit: FitResult, method: str, bootstrap: dict | None = None) -> None:
    """Store 95 % intervals in ``fit.params``: from the bootstrap, or ``value +/- 1.96 stderr``
    clipped to the parameter's declared range, and the points a prediction band is replayed
    at (``stats["band_points"]``, :func:`calibrate.confidence.covariance_points`); a fit that
    computed its own intervals (a request-log fit's confidence set) keeps them and its points.
    A bootstrap interval is judged again by :func:`calibrate.identify.identification` (it may
    reach 0 or leave the value at its edge where the standard error did not): a parameter it
    does not identify becomes NOT IDENTIFIED, with a warning."""
    if fit.stats.get("ci_method") == "confidence set":
        return
    fit.stats["band_points"] = spread_points(covariance_points(fit.params, fit.correlations), fit.values())
    for k, p in fit.params.items():
        if not p.vary or not p.identifiable:  # only a bound is known (FittedParam.bound)
            continue
        spec = PARAMS[k]
        if method == "bootstrap" and bootstrap and k in bootstrap:
            p.ci95 = bootstrap[k]
            kind, why = identification(k, p.value, p.ci95, "the bootstrap fits traced no interval (every resample "
                                                            "gave the same value)")
            if kind is not None and p.stderr != 0.0:  # (an exact fit: no uncertainty)
                p.identifiable, p.bound = False, why
                fit.warnings.append(f"{k}: NOT IDENTIFIED, {why}")
        elif p.stderr is not None:
            p.ci95 = (max(spec.lower, p.value - 1.96 * p.stderr), min(spec.upper, p.value + 1.96 * p.stderr))
    fit.stats["ci_method"] = method


