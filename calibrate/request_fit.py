"""Calibration from request logs: simulation in the loop, on one or several logs at once.

Most users have request logs (TTFT, E2E), not step timings. The cost model's parameters
are then fitted by replaying every log, each under its own engine settings, with candidate
parameters and matching the quantiles of the predicted latencies to the measured ones.
Logs of one deployment at different loads or limits are what tell the terms apart.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import replace
from functools import partial

import numpy as np

from replay.analysis.metrics import stat_label
from replay.cost.cost_model import RooflineCostModel
from replay.config import RecordOptions, ReplayConfig
from replay.errors import ConfigError
from replay.simulate import replay_frame
from replay.parallel import worker_pool
from replay.ray_tasks import map_on_ray, ray_session
from schemas.cost_params import PARAMS, REQUEST_FIT_FREE, CostParams
from schemas.status import OK, REJECTED
from schemas.text import wrap_error

from .confidence import confidence_set_intervals, spread_points
from .discrepancy import model_error
from .errors import FitError
from .fitting import FitResult, fit_variants
from .holdout import holdout
from .run_errors import QuantileResidual, Run

#: Quantiles matched by default (p10..p90).
QUANTILES = (10, 20, 30, 40, 50, 60, 70, 80, 90)
#: Parameters a request fit frees by default (others stay at their values unless freed).
DEFAULT_FREE = REQUEST_FIT_FREE
#: Extra start points (the first start is the cost model's values).
_STARTS = ({"eta_compute": 0.3, "eta_mem": 0.5, "t_step_s": 2e-4, "n_half_tokens": 100.0, "t_kv_migrate_s": 1e-3},
           {"eta_compute": 0.8, "eta_mem": 0.95, "t_step_s": 3e-3, "n_half_tokens": 10.0, "t_kv_migrate_s": 2e-2})


#: Below this many requests in all the runs a fit's starts run in this process by default: a
#: replay then takes milliseconds and a pool's start (a Python with numpy, pandas, lmfit and the
#: engine imported per worker, ~3 s of CPU each) costs more than the starts it spreads.
SMALL_FIT_REQUESTS = 200


@contextmanager
def start_runner(jobs: int | None, ray_address: str | None, n_starts: int, n_requests: int | None = None):
    """The runner of :func:`calibrate.fitting.least_squares` for the whole fit: the starts in
    one pool of ``jobs`` processes (:func:`replay.parallel.worker_pool`; default the CPU count,
    or one below :data:`SMALL_FIT_REQUESTS` requests) kept for every variant, on a Ray cluster,
    or here (None) with one job."""
    if ray_address is not None:
        with ray_session(ray_address):
            yield lambda fn, shared, items: map_on_ray(fn, shared, items, ray_address)
        return
    if jobs is None and n_requests is not None and n_requests < SMALL_FIT_REQUESTS:
        jobs = 1
    workers = min((os.cpu_count() or 1) if jobs is None else jobs, n_starts)
    if workers <= 1:
        yield None
        return
    with worker_pool(workers) as mapper:  # workers that ignore Ctrl-C: the parent reports it (exit 130)
        yield lambda fn, shared, items: mapper(partial(fn, shared), items)


def fit_requests(runs: list[Run], cost_model: RooflineCostModel, variants=("max", "sum", "blend"),
                 metrics=("ttft_s", "tpot_s"), quantiles=QUANTILES, free=DEFAULT_FREE, fixed: dict | None = None,
                 jobs: int | None = None, ray_address: str | None = None,
                 max_nfev: int | None = None) -> list[FitResult]:
    """Fit the cost model to measured request latencies of one or several runs.

    Parameters
    ----------
    runs : list of Run
        Logs of one deployment (same model, GPU, parallelism), each with its engine settings.
    cost_model : RooflineCostModel
        Hardware, model and terms; its values are the first start and the values of the
        parameters that stay fixed.
    variants : names of :data:`schemas.cost_params.VARIANTS` (how compute and memory combine).
    metrics : measured columns matched (those a run lacks are skipped for that run).
    quantiles : percentiles matched, numpy linear method on both sides.
    free : parameters fitted when they have an effect (:func:`calibrate.fitting.inert_params`).
    fixed : parameter -> value held fixed.
    jobs, ray_address : where the starts run (:func:`start_runner`); the result does not depend on it.
    max_nfev : residual evaluations per start (default 10 per free parameter, plus 10).

    Returns
    -------
    list of FitResult, best (lowest sum of squared quantile errors) first.

    Raises
    ------
    FitError
        A run with no measured metric, no simulable request, or fewer quantiles than parameters.
    replay.errors.ConfigError
        ``ray_address`` given and Ray not installed; impossible engine settings.

    Notes
    -----
    Residuals: ``(q_pred - q_meas) / max(q_meas, 1 ms)`` for every run, metric and quantile.
    Each start is polished with lmfit's ``least_squares`` (finite differences with a 5 %
    step: the replayed quantiles are piecewise constant below that); the best wins.
    The model's out-of-sample error (``stats["holdout"]``) is measured by refits without a run,
    or on a run's earlier time blocks only, :func:`calibrate.holdout.holdout`.
    Uncertainty and identifiability: :func:`calibrate.identify.assess`, the delta method
    with the Jacobian at the optimum and the sampling covariance of the measured quantiles
    from a moving-block bootstrap over requests (:meth:`QuantileResidual.sampling_cov`),
    decides which parameters are held at their declared values; the best fit's intervals
    are then the extents of the confidence set
    (:func:`calibrate.confidence.confidence_set_intervals`), which hold the truth wherever in
    its valley the optimizer stopped.
    """
    runs = [_prepared(r, cost_model, metrics) for r in runs]
    residual = QuantileResidual(runs, cost_model, metrics, quantiles)
    n_res = sum(len(pcts) for meas in residual.meas for pcts, _ in meas.values())
    not_seen = {n: "not fitted from request logs (give --free to fit it)" for n in PARAMS
                if n not in free and n != "overlap"}

    def result_of(v, params, corr, warns, best, info):
        import lmfit

        errs = residual.errors(CostParams(**{k: p.value for k, p in params.items()}))
        by_run = {run.name: {m: dict(zip(map(stat_label, meas[m][0]), np.round(e, 4).tolist()))
                             for m, e in run_errs.items()} for run, run_errs, meas in zip(runs, errs, residual.meas)}
        cost = float(sum(np.sum(e ** 2) for run_errs in errs for e in run_errs.values()))
        n_free = sum(p.vary for p in params.values())
        stats = {"n_requests": int(sum(len(r.trace) for r in runs)), "n_runs": len(runs),
                 "n_replays": (info["n_evals"] + 2 * n_free + 2) * len(runs), "cost": cost,
                 "residual_by_run": by_run,
                 "runs": {r.name: {"n_requests": len(r.trace), "engine": engine_settings(r.config)} for r in runs}}
        return FitResult(variant=v, params=params, correlations=corr, score=cost, stats=stats,
                         warnings=[*[r.note for r in runs if r.note], *warns], report=lmfit.fit_report(best))

    data_cov = residual.sampling_cov()
    with start_runner(jobs, ray_address, 1 + len(_STARTS), sum(len(r.trace) for r in runs)) as runner:
        fits = fit_variants(residual, cost_model, variants, [n for n in cost_model.free_params if n in free or
                                                             n == "overlap"], fixed, not_seen, result_of,
                            (n_res, "quantile residuals"), rel_step=0.05, assess_step=0.05,
                            data_cov=data_cov, starts=_STARTS, max_nfev=max_nfev or 10 * (len(free) + 1),
                            runner=runner)
        best = fits[0]
        unknown_held = tuple(n for n, p in best.params.items() if not p.vary and (p.bound or "").startswith(
            "NOT IDENTIFIED ("))  # traced too: the band of a what-if spans what the data allow of them
        best.params, warns, best.stats["confidence_set"] = confidence_set_intervals(residual, best.params, data_cov,
                                                                                    runner=runner,
                                                                                    also_walk=unknown_held)
        best.stats["band_points"] = spread_points(best.stats["confidence_set"].pop("points"), best.values())
        best.stats["holdout"] = holdout(runs, cost_model, best, metrics, quantiles, max_nfev or 10 * (len(free) + 1),
                                        runner)
        best.stats["n_replays"] += best.stats["holdout"]["n_replays"]
    best.stats["model_error"] = model_error(runs, cost_model.with_params(best.cost_params()), quantiles)
    delta = tuple(f"{n}: NOT IDENTIFIED" for n, p in best.params.items() if p.vary)
    best.warnings = [w for w in best.warnings if not w.startswith(delta)] + warns
    best.stats["ci_method"] = "confidence set" if best.stats["confidence_set"]["n_evals"] else "stderr"
    return fits


def _prepared(run: Run, cost_model: RooflineCostModel, metrics) -> Run:
    """``run`` ready for the fit: no token times or steps recorded, requests the engine
    rejects whatever the parameters (longer than ``max_model_len`` or the KV cache) left
    out, with a note saying how many.

    Raises
    ------
    FitError
        No measured metric in the run, every request rejected (or failed in the trace), or
        engine settings recorded in the file that cannot run (a KV cache without a block).
    """
    if not any(run.measures(m) for m in metrics):
        raise FitError(f"{run.name}: no measured {' or '.join(metrics)}; a request-log fit needs measured latencies")
    cfg = replace(run.config, record=RecordOptions())
    try:
        res, _ = replay_frame(run.trace, cost_model, cfg, run.metadata)
    except ConfigError as exc:
        if not (run.metadata or {}).get("engine_settings"):
            raise
        raise FitError(wrap_error(f"{run.name}: {exc} (the file records the engine settings "
                                  f"{run.metadata['engine_settings']}; an option given on the command line "
                                  "overrides them)")) from None
    rejected = res["pred_status"].str.startswith(REJECTED).to_numpy()
    if not (res["pred_status"] == OK).any():
        reasons = ", ".join(f"{n} {r}" for r, n in res["pred_status"].value_counts().items())
        raise FitError(f"{run.name}: no request can be simulated with these options ({reasons}); "
                       "check --max-model-len, --num-gpu-blocks and --gpu-memory-utilization")
    note = (f"{run.name}: {int(rejected.sum())} request(s) rejected by the engine (too long for "
            "max_model_len or the KV cache) are left out of the fit") if rejected.any() else None
    if not rejected.any():
        return replace(run, config=cfg, note=None)
    return replace(run, trace=run.trace[~rejected].reset_index(drop=True), config=cfg, note=note,
                   scored=None if run.scored is None else run.scored[~rejected])


def engine_settings(cfg: ReplayConfig) -> dict:
    """The engine settings of ``cfg`` a calibration records (``recorded`` in
    :data:`schemas.engine_settings.SETTINGS`), for ``replay`` to reuse: limits, cache and
    scheduler, not output switches."""
    from schemas.engine_settings import SETTINGS

    options = cfg.options()
    return {s.name: options[s.name] for s in SETTINGS.values() if s.recorded and s.name in options}
