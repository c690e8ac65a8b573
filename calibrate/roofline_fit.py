"""Nonlinear least squares of step durations on the roofline (lmfit).

The fitted quantities are dimensionless efficiencies and a launch latency in natural
units, and the residuals are relative errors, so the answer does not depend on whether
the log was in s, ms or µs (shared/cases BR-18), and the solver never sees parameters of
order 1e-15 s/FLOP.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import lmfit
import numpy as np

from .errors import FitError

#: Bounds of the fitted parameters (efficiencies strictly positive: the model stays finite).
#: ``t_launch_frac`` is the launch latency as a fraction of the median per-launch duration of
#: the data, so every parameter is of order 1 whatever the log's time unit (BR-18).
BOUNDS = {"eta_compute": (1e-3, 1.0), "eta_mem": (1e-3, 1.0), "t_launch_frac": (0.0, 1.0)}


@dataclass
class RooflineData:
    """Per-step quantities the roofline needs, arrays of shape (n_steps,).

    Attributes
    ----------
    flops : FLOPs of the step.
    bytes_ : bytes read from memory (weights + KV) of the step.
    n_launch : kernel launches (1 per step for the per-step launch latency).
    duration_s : measured duration, seconds.
    fixed_s : known time added to every prediction (e.g. all-reduce), seconds.
    peak_flops : float, FLOP/s of the hardware the step ran on (all GPUs of the replica).
    bandwidth_bytes_per_s : float, memory bandwidth (all GPUs of the replica).
    """

    flops: np.ndarray
    bytes_: np.ndarray
    n_launch: np.ndarray
    duration_s: np.ndarray
    peak_flops: float
    bandwidth_bytes_per_s: float
    fixed_s: np.ndarray | None = None
    group: np.ndarray | None = None

    def weights(self) -> np.ndarray:
        """Residual weights: a group larger than the median group is down-weighted to count
        as the median group (``sqrt(n_median / n_g)`` per row); smaller groups keep weight 1
        per row, so a sparse group is never amplified. All ones without groups."""
        if self.group is None:
            return np.ones_like(self.duration_s)
        _, inv, counts = np.unique(self.group, return_inverse=True, return_counts=True)
        return np.sqrt(np.minimum(1.0, np.median(counts) / counts))[inv]

    def balanced_p50(self, abs_rel: np.ndarray) -> float:
        """Mean over groups of the median |relative residual| (the plain median without groups)."""
        if self.group is None:
            return float(np.median(abs_rel))
        return float(np.mean([np.median(abs_rel[self.group == g]) for g in np.unique(self.group)]))


@dataclass
class FitResult:
    """Outcome of one roofline fit.

    Attributes
    ----------
    form : "max" or "sum"
    values, stderr : dict of parameter -> value / standard error, natural units
        (``eta_compute``, ``eta_mem`` fractions; ``t_launch_s`` seconds). stderr is None
        when it cannot be estimated.
    identifiable : dict of parameter -> bool
    bounds : dict of parameter -> str or None, what is known of an unidentified parameter
    correlations : dict "a,b" -> correlation coefficient
    r2 : float, coefficient of determination of the durations
    rel_residual_pct : dict "p50"/"p90"/"p99" -> percentile of |relative residual|
    rel_residual_p50_by_group : dict group -> median |relative residual|
    score : float, mean over groups of the median |relative residual| (forms are ranked by it)
    n_rows, n_dropped : int
    n_compute_bound : int, steps whose compute term dominates at the fitted values
    report : str, lmfit's fit report
    success : bool
    """

    form: str
    values: dict
    stderr: dict
    identifiable: dict
    bounds: dict
    correlations: dict
    r2: float
    rel_residual_pct: dict
    n_rows: int
    n_compute_bound: int
    report: str
    success: bool
    warnings: list = field(default_factory=list)
    predicted_s: np.ndarray | None = None
    rel_residual_p50_by_group: dict = field(default_factory=dict)
    score: float = float("nan")


def predict_s(d: RooflineData, eta_compute: float, eta_mem: float, t_launch_s: float, form: str) -> np.ndarray:
    """Roofline durations, seconds: ``n_launch * t_launch + max|sum(F/(eta_c*peak), B/(eta_m*bw)) + fixed``."""
    c = d.flops / (eta_compute * d.peak_flops)
    m = d.bytes_ / (eta_mem * d.bandwidth_bytes_per_s)
    body = np.maximum(c, m) if form == "max" else c + m
    out = d.n_launch * t_launch_s + body
    return out + d.fixed_s if d.fixed_s is not None else out


def fit_roofline(d: RooflineData, form: str = "max", loss: str = "soft_l1",
                 fixed: dict | None = None, start: dict | None = None, weighting: str = "relative",
                 method: str = "least_squares") -> FitResult:
    """Fit ``eta_compute``, ``eta_mem`` and ``t_launch_s`` to measured step durations.

    Parameters
    ----------
    d : RooflineData
    form : {"max", "sum"}
    loss : scipy ``least_squares`` loss (``linear``, ``soft_l1``, ``huber``, ...); robust by default.
    fixed : dict, optional
        Parameters held at a value (e.g. ``{"eta_mem": 1.0}``).
    start : dict, optional
        Starting values.
    weighting : {"relative", "uniform"}
        Residuals ``(pred - meas) / meas`` (every step weighs the same in relative terms)
        or ``(pred - meas) / mean(meas)`` (ordinary least squares, scaled to order 1).
    method : {"least_squares", "leastsq"}
        lmfit back-end (``leastsq`` supports only the linear loss).

    Returns
    -------
    FitResult

    Raises
    ------
    FitError
        Fewer usable rows than free parameters, or a solver failure.

    Notes
    -----
    Residual of row i: ``w_i (pred_i - meas_i) / meas_i`` (or ``/ mean(meas)``); both are
    free of the log's time unit. With ``d.group`` set, groups larger than the median group
    (e.g. the mixed shapes of a profiling grid) are down-weighted to count as the median
    one, so no kind of step outweighs the others (see :meth:`RooflineData.weights`). The fit is deterministic. A parameter is declared
    unidentifiable when no step is on its side of the roofline at the fitted values (form
    "max"), and then only a bound is reported: with no compute-bound step,
    ``eta_compute >= max_i c_i(1) / m_i`` keeps every step memory-bound.
    """
    fixed = dict(fixed or {})
    t_ref = float(np.median(d.duration_s / np.maximum(d.n_launch, 1)))
    start = {"eta_compute": 0.5, "eta_mem": 0.8, "t_launch_s": 0.01 * t_ref, **(start or {})}
    params = lmfit.Parameters()
    for name, (lo, hi) in BOUNDS.items():
        key = "t_launch_s" if name == "t_launch_frac" else name
        scale = 1.0 / t_ref if name == "t_launch_frac" else 1.0
        val = fixed.get(key, start[key]) * scale
        params.add(name, value=min(max(val, lo + 1e-9), hi), min=lo, max=hi, vary=key not in fixed)
    nvary = sum(p.vary for p in params.values())
    if d.duration_s.size < nvary + 1:
        raise FitError(f"{d.duration_s.size} usable step(s); need at least {nvary + 1} to fit {nvary} parameter(s)")
    meas = d.duration_s
    if weighting not in ("relative", "uniform"):
        raise ValueError(f"weighting must be 'relative' or 'uniform', not {weighting!r}")
    scale = (meas if weighting == "relative" else np.full_like(meas, meas.mean())) / d.weights()

    def residual(p):
        v = p.valuesdict()
        pred = predict_s(d, v["eta_compute"], v["eta_mem"], v["t_launch_frac"] * t_ref, form)
        return (pred - meas) / scale

    mini = lmfit.Minimizer(residual, params)
    if method == "least_squares":
        res = mini.minimize(method="least_squares", loss=loss, x_scale="jac", ftol=1e-12, xtol=1e-12, gtol=1e-12)
    elif method == "leastsq" and loss == "linear":
        res = mini.minimize(method="leastsq")
    else:
        raise ValueError(f"method {method!r} with loss {loss!r} is not supported")
    v = res.params.valuesdict()
    values = {"eta_compute": v["eta_compute"], "eta_mem": v["eta_mem"], "t_launch_s": v["t_launch_frac"] * t_ref}
    pred = predict_s(d, values["eta_compute"], values["eta_mem"], values["t_launch_s"], form)
    rel = (pred - meas) / meas
    ss_res = float(np.sum((pred - meas) ** 2))
    ss_tot = float(np.sum((meas - meas.mean()) ** 2))
    c = d.flops / (values["eta_compute"] * d.peak_flops)
    m = d.bytes_ / (values["eta_mem"] * d.bandwidth_bytes_per_s)
    n_cb = int(np.sum(c > m))

    stderr, ident, bounds, warnings = {}, {}, {}, []
    names = {"eta_compute": "eta_compute", "eta_mem": "eta_mem", "t_launch_frac": "t_launch_s"}
    for pname, key in names.items():
        p = res.params[pname]
        scale = t_ref if pname == "t_launch_frac" else 1.0
        if not p.vary:
            stderr[key], ident[key], bounds[key] = 0.0, True, "fixed"
            continue
        se = p.stderr
        if se is None and ss_res == 0.0:
            se = 0.0  # perfect fit: zero uncertainty (BR-20)
        stderr[key] = None if se is None else float(se) * scale
        ident[key], bounds[key] = True, None
    if form == "max":
        if not fixed.get("eta_compute") and n_cb == 0:
            lb = float(np.max(d.flops / (d.peak_flops * m)))
            ident["eta_compute"], stderr["eta_compute"] = False, None
            bounds["eta_compute"] = f">= {lb:.3g}"
            warnings.append("eta_compute: no compute-bound step in the data; only a lower bound "
                            f"(>= {lb:.3g}) is known. Add steps with large prefills to pin it down.")
        if "eta_mem" not in fixed and n_cb == meas.size:
            lb = float(np.max(d.bytes_ / (d.bandwidth_bytes_per_s * c)))
            ident["eta_mem"], stderr["eta_mem"] = False, None
            bounds["eta_mem"] = f">= {lb:.3g}"
            warnings.append("eta_mem: no memory-bound step in the data; only a lower bound "
                            f"(>= {lb:.3g}) is known. Add decode-only steps to pin it down.")
    if "t_launch_s" not in fixed and values["t_launch_s"] < 1e-9 * t_ref:
        se = stderr.get("t_launch_s")
        values["t_launch_s"] = 0.0
        ident["t_launch_s"], stderr["t_launch_s"] = False, None
        bounds["t_launch_s"] = f"<= {1.96 * se:.3g} s" if se else "at its lower bound 0"
        warnings.append("t_launch_s: fitted at its lower bound 0; the data only bound it "
                        f"({bounds['t_launch_s']}, 95 %): the per-step constant is not resolved.")
    for key in values:
        se = stderr.get(key)
        if ident.get(key) and bounds.get(key) != "fixed" and (se is None or (values[key] and se > 0.5 * abs(values[key]))):
            ident[key] = False
            bounds[key] = bounds.get(key) or "poorly constrained"
            warnings.append(f"{key}: the data barely constrain it (stderr {se if se is not None else 'n/a'} "
                            f"vs value {values[key]:.3g}).")
        if ident.get(key) and bounds.get(key) != "fixed":
            lo, hi = BOUNDS[key if key != "t_launch_s" else "t_launch_frac"]
            raw = values[key] / (t_ref if key == "t_launch_s" else 1)
            if np.isclose(raw, hi) or (lo > 0 and np.isclose(raw, lo)):
                warnings.append(f"{key}: fitted value {values[key]:.3g} sits on its bound.")
    corr = {}
    for a, pa_ in res.params.items():
        for b, cval in (pa_.correl or {}).items():
            if a < b:
                corr[f"{names[a]},{names[b]}"] = float(cval)
    return FitResult(
        form=form, values=values, stderr=stderr, identifiable=ident, bounds=bounds, correlations=corr,
        r2=1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan"),
        rel_residual_pct={f"p{q}": float(np.percentile(np.abs(rel), q)) for q in (50, 90, 99)},
        n_rows=int(meas.size), n_compute_bound=n_cb, report=lmfit.fit_report(res), success=bool(res.success),
        warnings=warnings, predicted_s=pred, score=d.balanced_p50(np.abs(rel)),
        rel_residual_p50_by_group={} if d.group is None else
        {str(g): float(np.median(np.abs(rel[d.group == g]))) for g in np.unique(d.group)},
    )
