"""The model's out-of-sample error, measured inside a request-log calibration's own data.

A band that holds what a new run will measure needs the error of the calibrated model on data its
fit did not see (:mod:`replay.analysis.band_parts`). The calibration's own data give it: the fit is
repeated without a part of them and that part predicted. With several runs, each run is left out in
turn (leave one run out); with one run, its first blocks in time are fitted and the next block
predicted (forward chaining, as a time series is cross-validated: Hyndman & Athanasopoulos,
"Forecasting: Principles and Practice", 3rd ed., section 5.10). Each held-out part
gives the relative error of its p50 and p90 of TTFT, TPOT and E2E, and its distance from what the
refit saw (:func:`replay.analysis.band_parts.distance`).

A refit starts where the calibration's fit starts (the cost model's declared values, not the
optimum, which has seen the held-out part), in the calibration's variant, frees what the
calibration freed and holds what it held; one start, the fit's evaluation budget.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from replay.analysis.band_parts import distance, feature_range, load_features
from replay.analysis.metrics import statistics
from replay.simulate import replay_frame
from schemas.cost_params import PARAMS, CostParams

from .fitting import least_squares
from .run_errors import QuantileResidual

#: Percentiles whose held-out errors are kept.
HOLDOUT_PCTS = (50, 90)
#: Metrics whose held-out errors are kept (when measured).
HOLDOUT_METRICS = ("ttft_s", "tpot_s", "e2e_s")
#: Blocks a single run is cut into in time (forward chaining: :func:`splits`).
TIME_BLOCKS = 3
#: Fewer scored requests a block than this: no split (a block's percentiles would be noise).
MIN_BLOCK_REQUESTS = 20


def run_features(run, cost_model, result=None) -> dict:
    """:func:`replay.analysis.band_parts.load_features` of ``run``'s scored requests replayed with
    ``cost_model`` (``result``: that replay when already run)."""
    if result is None:
        result, _ = replay_frame(run.trace, cost_model, run.config, run.metadata)
    return load_features(run.scored_rows(result))


def splits(runs) -> list[tuple[list, list]]:
    """``(runs fitted, runs predicted)`` pairs: leave one run out with several runs; with one run of
    measured requests, forward chaining in time (its scored requests in arrival order cut into
    :data:`TIME_BLOCKS` blocks; the first k blocks fitted, block k + 1 predicted, for every k), as a
    later window of a deployment is predicted from its past; none for one run of aggregate targets
    (no requests to split) or of fewer than :data:`MIN_BLOCK_REQUESTS` requests a block."""
    if len(runs) >= 2:
        return [([r for j, r in enumerate(runs) if j != i], [run]) for i, run in enumerate(runs)]
    run = runs[0]
    scored = np.ones(len(run.trace), bool) if run.scored is None else np.asarray(run.scored, bool)
    idx = np.flatnonzero(scored)
    if run.targets is not None or idx.size < MIN_BLOCK_REQUESTS * TIME_BLOCKS:
        return []
    idx = idx[np.argsort(run.trace["arrival_time_s"].to_numpy(float)[idx], kind="stable")]
    blocks = np.array_split(idx, TIME_BLOCKS)

    def part(rows, name):
        mask = np.zeros(len(run.trace), bool)
        mask[rows] = True
        return replace(run, name=f"{run.name} ({name})", scored=mask)

    return [([part(np.concatenate(blocks[:k]), f"blocks 1-{k} of {TIME_BLOCKS}")],
             [part(blocks[k], f"block {k + 1} of {TIME_BLOCKS}")]) for k in range(1, TIME_BLOCKS)]


def _refit_and_predict(shared, split) -> tuple[list[dict], int]:
    """One split: the refit on its fitted runs, the relative errors of its held-out runs and the
    replays it took (module level: picklable for a worker)."""

    cost_model, free, hold, metrics, quantiles, max_nfev = shared
    fitted, held = split
    residual = QuantileResidual(fitted, cost_model, metrics, quantiles)
    result, info = least_squares(residual, free, hold, rel_step=0.05, max_nfev=max_nfev)
    values = {k: p.value * PARAMS[k].fit_scale for k, p in result.params.items()}
    cm = cost_model.with_params(CostParams(**hold, **values))
    fitted_range = feature_range([run_features(r, cm) for r in fitted])
    out = []
    for run in held:
        res, _ = replay_frame(run.trace, cm, run.config, run.metadata)
        d, _ = distance(run_features(run, cm, res), fitted_range)
        for m in HOLDOUT_METRICS:
            if not run.measures(m):
                continue
            pcts, meas = run.measured(m, HOLDOUT_PCTS)
            pred = run.predicted(res, m)
            pred = pred[np.isfinite(pred)]
            if not pred.size:
                continue
            q = statistics(pred, pcts)
            for pct, p, x in zip(pcts, q, meas):
                if np.isfinite(p) and np.isfinite(x) and x > 0:
                    out.append({"part": run.name, "metric": m, "pct": None if np.isnan(pct) else float(pct),
                                "rel_err": round(float((p - x) / x), 6), "distance": round(float(d), 4)})
    return out, (info["n_evals"] + 1) * len(fitted) + len(held)


def holdout(runs, cost_model, best, metrics, quantiles, max_nfev: int, runner=None) -> dict:
    """The held-out errors of the fit ``best`` of ``runs`` (prepared, as ``fit_requests`` fits them).

    Parameters
    ----------
    runs : list of calibrate.run_errors.Run
    cost_model : RooflineCostModel
        At the values the fit started from.
    best : calibrate.fitting.FitResult
        The calibration's fit: its variant's free and held parameters are the refits'.
    metrics, quantiles : what the fit matched (the refits match the same).
    max_nfev : residual evaluations of a refit.
    runner : callable, optional
        ``runner(fn, shared, items)`` (:func:`calibrate.request_fit.start_runner`): the splits in parallel.

    Returns
    -------
    dict
        ``method`` (words), ``errors`` (a list of ``{"part", "metric", "pct", "rel_err", "distance"}``,
        :attr:`schemas.calibration.Calibration.holdout`), ``fitted_range`` (the load every run of the
        calibration spans, replayed at the fit's values, :func:`replay.analysis.band_parts.feature_range`)
        and ``n_replays`` (the refits' and predictions' replays).
    """
    p0 = cost_model.params
    free = {n: (p0[n] if not np.isnan(p0[n]) else cost_model.tp_link.latency_s) for n, p in best.params.items()
            if p.vary}
    hold = {n: v for n, v in best.values().items() if n not in free}
    todo = splits(runs)
    fitted = cost_model.with_params(best.cost_params())
    shared = (cost_model, free, hold, metrics, quantiles, max_nfev)
    if not todo or not free:
        per_split = []
    elif runner is not None and len(todo) > 1:
        per_split = runner(_refit_and_predict, shared, todo)
    else:
        per_split = [_refit_and_predict(shared, s) for s in todo]
    method = ("none: one run of aggregate targets, or too few requests to split" if not todo else
              "leave one run out" if len(runs) >= 2 else
              f"forward chaining in time: the run cut into {TIME_BLOCKS} blocks, each predicted from those before")
    return {"method": method, "errors": [e for errs, _ in per_split for e in errs],
            "fitted_range": feature_range([run_features(r, fitted) for r in runs]),
            "n_replays": sum(n for _, n in per_split) + len(runs)}
