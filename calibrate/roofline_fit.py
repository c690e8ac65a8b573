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
BOUNDS = {"eta_compute": (1e-3, 1.0), "eta_mem": (1e-3, 1.0), "t_launch_ms": (0.0, 100.0)}


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


def predict_s(d: RooflineData, eta_compute: float, eta_mem: float, t_launch_s: float, form: str) -> np.ndarray:
    """Roofline durations, seconds: ``n_launch * t_launch + max|sum(F/(eta_c*peak), B/(eta_m*bw)) + fixed``."""
    c = d.flops / (eta_compute * d.peak_flops)
    m = d.bytes_ / (eta_mem * d.bandwidth_bytes_per_s)
    body = np.maximum(c, m) if form == "max" else c + m
    out = d.n_launch * t_launch_s + body
    return out + d.fixed_s if d.fixed_s is not None else out


def fit_roofline(d: RooflineData, form: str = "max", loss: str = "soft_l1",
                 fixed: dict | None = None, start: dict | None = None) -> FitResult:
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

    Returns
    -------
    FitResult

    Raises
    ------
    FitError
        Fewer usable rows than free parameters, or a solver failure.

    Notes
    -----
    Residual of row i: ``(pred_i - meas_i) / meas_i``. With bounds, lmfit's
    ``least_squares`` back-end is used; the fit is deterministic. A parameter is declared
    unidentifiable when no step is on its side of the roofline at the fitted values (form
    "max"), and then only a bound is reported: with no compute-bound step,
    ``eta_compute >= max_i c_i(1) / m_i`` keeps every step memory-bound.
    """
    fixed = dict(fixed or {})
    start = {"eta_compute": 0.5, "eta_mem": 0.8, "t_launch_s": 1e-4, **(start or {})}
    params = lmfit.Parameters()
    for name, (lo, hi) in BOUNDS.items():
        key = "t_launch_s" if name == "t_launch_ms" else name
        scale = 1e3 if name == "t_launch_ms" else 1.0
        val = fixed.get(key, start[key]) * scale
        params.add(name, value=min(max(val, lo + 1e-9), hi), min=lo, max=hi, vary=key not in fixed)
    nvary = sum(p.vary for p in params.values())
    if d.duration_s.size < nvary + 1:
        raise FitError(f"{d.duration_s.size} usable step(s); need at least {nvary + 1} to fit {nvary} parameter(s)")
    meas = d.duration_s

    def residual(p):
        v = p.valuesdict()
        pred = predict_s(d, v["eta_compute"], v["eta_mem"], v["t_launch_ms"] * 1e-3, form)
        return (pred - meas) / meas

    mini = lmfit.Minimizer(residual, params)
    res = mini.minimize(method="least_squares", loss=loss, x_scale="jac")
    v = res.params.valuesdict()
    values = {"eta_compute": v["eta_compute"], "eta_mem": v["eta_mem"], "t_launch_s": v["t_launch_ms"] * 1e-3}
    pred = predict_s(d, values["eta_compute"], values["eta_mem"], values["t_launch_s"], form)
    rel = (pred - meas) / meas
    ss_res = float(np.sum((pred - meas) ** 2))
    ss_tot = float(np.sum((meas - meas.mean()) ** 2))
    c = d.flops / (values["eta_compute"] * d.peak_flops)
    m = d.bytes_ / (values["eta_mem"] * d.bandwidth_bytes_per_s)
    n_cb = int(np.sum(c > m))

    stderr, ident, bounds, warnings = {}, {}, {}, []
    names = {"eta_compute": "eta_compute", "eta_mem": "eta_mem", "t_launch_ms": "t_launch_s"}
    for pname, key in names.items():
        p = res.params[pname]
        scale = 1e-3 if pname == "t_launch_ms" else 1.0
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
    for key in values:
        se = stderr.get(key)
        if ident.get(key) and bounds.get(key) != "fixed" and (se is None or (values[key] and se > 0.5 * abs(values[key]))):
            ident[key] = False
            bounds[key] = bounds.get(key) or "poorly constrained"
            warnings.append(f"{key}: the data barely constrain it (stderr {se if se is not None else 'n/a'} "
                            f"vs value {values[key]:.3g}).")
        if BOUNDS.get(key if key != "t_launch_s" else "t_launch_ms") and ident.get(key):
            lo, hi = BOUNDS[key if key != "t_launch_s" else "t_launch_ms"]
            raw = values[key] * (1e3 if key == "t_launch_s" else 1)
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
        warnings=warnings, predicted_s=pred,
    )
