"""Calibration from request logs: simulation in the loop.

Most users have request logs (TTFT, E2E), not step timings. The roofline's parameters are
then fitted by replaying the trace with candidate parameters and matching the quantiles
of the predicted latencies to the measured ones.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from functools import partial

import lmfit
import numpy as np
import pandas as pd

from replay.cost_model import CostParams, RooflineCostModel
from replay.simulate import ReplayConfig, replay_frame
from replay.sweep import map_on_ray
from schemas.calibration import Calibration, FittedParam
from schemas.specs import GpuSpec, ModelSpec

from .errors import FitError

#: Quantiles matched by default (p10..p90).
QUANTILES = (10, 20, 30, 40, 50, 60, 70, 80, 90)
#: (name, lower, upper) of the fitted parameters; the per-step constant in milliseconds so
#: every parameter is of order 1 (BR-18).
_PARAMS = (("eta_compute", 0.02, 1.0), ("eta_mem", 0.02, 1.0), ("t_launch_ms", 0.0, 50.0))
#: Multi-start points (eta_compute, eta_mem, t_launch_ms); the best is polished.
_STARTS = ((0.5, 0.8, 1.0), (0.3, 0.5, 0.2), (0.8, 0.95, 3.0))


@dataclass
class RequestFitResult:
    """Outcome of a simulation-in-the-loop fit.

    Attributes
    ----------
    values, stderr : dict parameter -> value / standard error (natural units; stderr None
        when not estimable). ``t_launch_s`` holds the whole per-step constant (launch and
        CPU overhead cannot be told apart from request latencies).
    identifiable, bounds : dict parameter -> bool / str
    residual_by_metric : dict metric -> {quantile: relative error} at the optimum
    n_replays : int, number of replays the fit took
    cost : float, sum of squared relative quantile errors at the optimum
    """

    form: str
    values: dict
    stderr: dict
    identifiable: dict
    bounds: dict
    correlations: dict
    residual_by_metric: dict
    n_requests: int
    n_replays: int
    cost: float
    report: str
    warnings: list = field(default_factory=list)


class _QuantileResidual:
    """Relative errors of the predicted latency quantiles for candidate parameters (one replay per call).

    A picklable callable, so the multi-starts can run in other processes; ``n_calls``
    counts the replays made through this instance.
    """

    def __init__(self, trace, model, gpu, tp, cfg, form, metrics, quantiles, meas):
        self.trace, self.model, self.gpu, self.tp, self.cfg = trace, model, gpu, tp, cfg
        self.form, self.metrics, self.quantiles, self.meas = form, metrics, quantiles, meas
        self.n_calls = 0

    def __call__(self, p):
        self.n_calls += 1
        v = p.valuesdict()
        cm = RooflineCostModel(self.model, self.gpu,
                               CostParams(v["eta_compute"], v["eta_mem"], v["t_launch_ms"] * 1e-3, 0.0, self.form), self.tp)
        res, _ = replay_frame(self.trace, cm, self.cfg)
        out = []
        for m in self.metrics:
            pv = res[f"pred_{m}"].to_numpy(float)
            pv = pv[np.isfinite(pv)]
            q = np.percentile(pv, self.quantiles) if pv.size else np.full(len(self.quantiles), 1e9)
            out.append((q - self.meas[m]) / self.meas[m])
        return np.concatenate(out)


def _polish(residual: _QuantileResidual, start) -> tuple[lmfit.minimizer.MinimizerResult, int]:
    """One multi-start: lmfit ``least_squares`` from ``start``; the result and the replays it took."""
    params = lmfit.Parameters()
    for (name, lo, hi), s in zip(_PARAMS, start):
        params.add(name, value=s, min=lo, max=hi)
    before = residual.n_calls
    r = lmfit.Minimizer(residual, params).minimize(method="least_squares", diff_step=0.02, x_scale="jac",
                                                    max_nfev=60)
    return r, residual.n_calls - before


def fit_requests(trace: pd.DataFrame, model: ModelSpec, gpu: GpuSpec, tp: int, cfg: ReplayConfig,
                 form: str = "max", metrics=("ttft_s", "tpot_s"), quantiles=QUANTILES,
                 jobs: int | None = None, ray_address: str | None = None) -> RequestFitResult:
    """Fit ``eta_compute``, ``eta_mem`` and the per-step constant to measured request latencies.

    Parameters
    ----------
    trace : pandas.DataFrame
        A request trace with measured ``metrics`` columns (seconds).
    model, gpu, tp : the replica the trace was measured on.
    cfg : ReplayConfig
        The engine settings of the measured run (scheduler, max_num_seqs, ...).
    form : {"max", "sum"}
    metrics : measured columns to match.
    quantiles : percentiles matched, numpy linear method on both sides.
    jobs : int, optional
        Processes polishing the starts at once (default ``os.cpu_count()``; 1: one after
        the other here). The result does not depend on it.
    ray_address : str, optional
        Polish the starts as tasks of the Ray cluster at this address instead (``auto``,
        ``ray://host:10001``; :func:`replay.sweep.map_on_ray`); the same result.

    Returns
    -------
    RequestFitResult

    Raises
    ------
    FitError
        No measured values of a metric, or fewer quantiles than parameters.
    replay.errors.ConfigError
        ``ray_address`` given and Ray not installed.

    Notes
    -----
    Residuals: ``(q_pred - q_meas) / q_meas`` for every metric and quantile. Each start of
    :data:`_STARTS` is polished with lmfit's ``least_squares`` (trust region reflective,
    bounds, finite differences with a 2 % step, since the replayed quantiles are piecewise
    smooth in the parameters); the best start wins. The starts are independent, so they run
    in parallel processes (spawn). Deterministic for a given input.
    Standard errors come from a central-difference Jacobian at the optimum scaled by the
    reduced chi-square (:func:`_covariance`); they ignore the discreteness of scheduling
    and are indicative.
    """
    for m in metrics:
        if m not in trace or not np.isfinite(trace[m].to_numpy(float)).any():
            raise FitError(f"the trace has no measured '{m}'; a request log fit needs {', '.join(metrics)}")
    if len(metrics) * len(quantiles) <= len(_PARAMS):
        raise FitError("too few quantiles to fit three parameters")
    cfg = replace(cfg, record_token_times=False, record_steps=False)
    trace, dropped_note = _drop_unsimulable(trace, model, gpu, tp, cfg, form)
    meas = {}
    for m in metrics:
        v = trace[m].to_numpy(float)
        meas[m] = np.percentile(v[np.isfinite(v)], quantiles)
    residual = _QuantileResidual(trace, model, gpu, tp, cfg, form, metrics, quantiles, meas)
    workers = min((os.cpu_count() or 1) if jobs is None else jobs, len(_STARTS))
    if ray_address is not None:
        polished = map_on_ray(_polish, residual, list(_STARTS), ray_address)
    elif workers <= 1:
        polished = [_polish(residual, start) for start in _STARTS]
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            polished = list(pool.map(partial(_polish, residual), _STARTS))
    best = None
    for r, _ in polished:  # in start order, as the serial loop: ties go to the earlier start
        if best is None or r.chisqr < best.chisqr:
            best = r
    before = residual.n_calls
    _covariance(best, residual)
    n_replays = sum(n for _, n in polished) + residual.n_calls - before
    result = _result(best, form, metrics, quantiles, len(trace), n_replays, residual)
    if dropped_note:
        result.warnings.insert(0, dropped_note)
    return result


def _drop_unsimulable(trace: pd.DataFrame, model: ModelSpec, gpu: GpuSpec, tp: int, cfg: ReplayConfig,
                      form: str) -> tuple[pd.DataFrame, str | None]:
    """Requests the engine rejects whatever the parameters (longer than ``max_model_len`` or
    the KV cache) cannot be fitted: drop them, say how many; refuse when none is left.

    Raises
    ------
    FitError
        If every request is rejected (or failed in the trace).
    """
    res, _ = replay_frame(trace, RooflineCostModel(model, gpu, CostParams(form=form), tp), cfg)
    rejected = res["pred_status"].str.startswith("rejected").to_numpy()
    ok = (res["pred_status"] == "ok").to_numpy()
    if not ok.any():
        reasons = ", ".join(f"{n} {r}" for r, n in res["pred_status"].value_counts().items())
        raise FitError(f"no request can be simulated with these options ({reasons}); "
                       "check --max-model-len, --num-gpu-blocks and --gpu-memory-utilization")
    if rejected.any():
        return trace[~rejected].reset_index(drop=True), f"{int(rejected.sum())} request(s) rejected by the engine " \
            "(too long for max_model_len or the KV cache) are left out of the fit"
    return trace, None


def _covariance(r, residual, rel_step: float = 0.05) -> None:
    """Standard errors and correlations from a central-difference Jacobian at the optimum.

    ``cov = s^2 (J^T J)^-1`` with ``s^2 = RSS / (n - p)``; the step is 5 % of each value
    (the replayed quantiles are piecewise constant below that), one-sided at a bound.
    Sets ``stderr`` and ``correl`` of ``r.params`` (None where J^T J is singular).
    """
    names = [n for n, *_ in _PARAMS]
    base = r.params.copy()
    f0 = residual(base)
    cols = []
    for n in names:
        p = base[n]
        h = max(abs(p.value) * rel_step, 1e-3 * (p.max - p.min))
        hi, lo = min(p.value + h, p.max), max(p.value - h, p.min)
        fh, fl = [], []
        for x, store in ((hi, fh), (lo, fl)):
            q = base.copy()
            q[n].value = x
            store.append(residual(q) if x != p.value else f0)
        cols.append((fh[0] - fl[0]) / (hi - lo))
    jac = np.column_stack(cols)
    dof = max(f0.size - len(names), 1)
    s2 = float(np.sum(f0 ** 2)) / dof
    jtj = jac.T @ jac
    if np.linalg.cond(jtj) > 1e12:
        for n in names:
            r.params[n].stderr, r.params[n].correl = None, None
        return
    cov = s2 * np.linalg.inv(jtj)
    se = np.sqrt(np.diag(cov))
    for i, n in enumerate(names):
        r.params[n].stderr = float(se[i])
        r.params[n].correl = {m: float(cov[i, j] / (se[i] * se[j])) for j, m in enumerate(names) if j != i and se[i] * se[j] > 0}


def _result(r, form, metrics, quantiles, n_requests, n_replays, residual) -> RequestFitResult:
    v = r.params.valuesdict()
    values = {"eta_compute": v["eta_compute"], "eta_mem": v["eta_mem"], "t_launch_s": v["t_launch_ms"] * 1e-3}
    names = {"eta_compute": "eta_compute", "eta_mem": "eta_mem", "t_launch_ms": "t_launch_s"}
    stderr, ident, bounds, warnings = {}, {}, {}, []
    for pname, key in names.items():
        se = r.params[pname].stderr
        scale = 1e-3 if pname == "t_launch_ms" else 1.0
        stderr[key] = None if se is None else float(se) * scale
        val = values[key]
        lo, hi = next((lo, hi) for n, lo, hi in _PARAMS if n == pname)
        at_bound = np.isclose(val / scale, lo, atol=1e-6) or np.isclose(val / scale, hi, atol=1e-6)
        ok = se is not None and np.isfinite(se) and (val == 0 or se * scale <= 0.5 * abs(val)) and not at_bound
        ident[key] = bool(ok)
        bounds[key] = None
        if not ok:
            bounds[key] = "at a bound of its range" if at_bound else "poorly constrained by the latencies"
            warnings.append(f"{key}: {bounds[key]} (value {val:.3g}); the request log does not pin it down, "
                            "a step trace or a profile would")
    res = residual(r.params)
    k = len(quantiles)
    by_metric = {m: dict(zip((f"p{q}" for q in quantiles), res[i * k:(i + 1) * k].round(4).tolist()))
                 for i, m in enumerate(metrics)}
    corr = {}
    for a, p in r.params.items():
        for b, c in (p.correl or {}).items():
            if a < b:
                corr[f"{names[a]},{names[b]}"] = float(c)
    return RequestFitResult(form=form, values=values, stderr=stderr, identifiable=ident, bounds=bounds,
                            correlations=corr, residual_by_metric=by_metric, n_requests=n_requests,
                            n_replays=n_replays + 1, cost=float(np.sum(res ** 2)), report=lmfit.fit_report(r),
                            warnings=warnings)


def calibration_from_request_fit(fits: list[RequestFitResult], model: ModelSpec, gpu: GpuSpec, tp: int,
                                 source: dict, cfg: ReplayConfig) -> Calibration:
    """The calibration file contents of the best request fit (``fits[0]``)."""
    best = fits[0]
    params = {k: FittedParam(value=best.values[k], stderr=best.stderr[k], identifiable=best.identifiable[k],
                             bound=best.bounds[k]) for k in ("eta_compute", "eta_mem", "t_launch_s")}
    params["t_cpu_s"] = FittedParam(value=0.0, stderr=None, identifiable=False, vary=False,
                                    bound="folded into t_launch_s (a per-step constant)")
    fit = {"method": "simulation in the loop: lmfit least_squares on relative quantile errors, multi-start",
           "n_requests": best.n_requests, "n_replays": sum(f.n_replays for f in fits), "cost": best.cost,
           "residual_by_metric": best.residual_by_metric, "correlations": best.correlations,
           "warnings": best.warnings, "replay_config": {k: v for k, v in vars(cfg).items()},
           "forms": {f.form: {"values": f.values, "cost": f.cost} for f in fits}}
    return Calibration(model=model, gpu=gpu, tp=tp, form=best.form, params=params, fit=fit, source=source)
