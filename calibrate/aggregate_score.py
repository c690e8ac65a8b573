"""Validation on aggregates (``calibrate validate --score-on AGG``): each level's reported
statistics against the same statistics of its replay.

An aggregate has no measured requests, so a level is scored as it is fitted
(:mod:`calibrate.aggregate_runs`): its synthesized workload is replayed at its load with the
calibrated cost model, and every statistic the benchmark reported of TTFT, TPOT and E2E (means
and every percentile, the tails too: :attr:`calibrate.run_errors.Run.reported`) is computed
from the replay's completed requests (for a window of Prometheus scrapes, those its
histograms would have counted: :meth:`calibrate.run_errors.Run.predicted`; numpy's linear percentiles, as
:func:`calibrate.run_errors.statistics`) and set beside the reported one.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from replay.analysis.metrics import stat_label, statistics
from replay.config import RecordOptions
from replay.simulate import replay_frame
from schemas.status import OK
from schemas.text import wrap_error

from .errors import FitError
from .run_errors import Run

#: Metrics scored, in the table's order, with their labels.
_LABELS = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "E2E"}


def score_aggregates(runs: list[Run], cost_model) -> pd.DataFrame:
    """The reported vs predicted statistics of every aggregate run (``run.reported`` set).

    Returns
    -------
    pandas.DataFrame
        One row per run, metric and statistic: ``run``, ``metric`` (``ttft``, ``tpot``, ``e2e``),
        ``statistic`` (``mean``, ``p50``, ``p99``, ...), ``meas_s`` (reported, seconds),
        ``pred_s`` (the replay's, seconds), ``rel_err`` ((pred - meas) / meas; NaN for a
        reported 0), ``n`` (replayed requests completed). Empty for no runs.

    Raises
    ------
    FitError
        A run whose replay completes no request (its settings admit none), naming it.
    """
    rows = []
    for run in runs:
        res, _ = replay_frame(run.trace, cost_model, replace(run.config, record=RecordOptions()), run.metadata)
        done = res[res["pred_status"] == OK]
        if done.empty:
            why = ", ".join(f"{n} {r}" for r, n in res["pred_status"].value_counts().items())
            raise FitError(wrap_error(f"{run.name}: no synthesized request can be simulated with these settings "
                                      f"({why}); nothing to score"))
        for metric in _LABELS:
            if metric not in run.reported:
                continue
            pcts, meas = run.reported[metric]
            values = run.predicted(res, metric)
            values = values[np.isfinite(values)]
            pred = statistics(values, pcts)
            for pct, m, p in zip(pcts, meas, pred):
                rows.append({"run": run.name, "metric": metric.removesuffix("_s"), "statistic": stat_label(pct),
                             "meas_s": float(m), "pred_s": float(p),
                             "rel_err": float((p - m) / m) if m > 0 else np.nan, "n": len(done)})
    return pd.DataFrame(rows)


def format_aggregate_validation(table: pd.DataFrame) -> str:
    """A block per level (``table``: :func:`score_aggregates` rows with a ``sample`` column):
    reported, predicted and relative error of each statistic, in ms, within 100 columns; then
    the median and worst |error| of the means out of sample."""
    lines = []
    for (run, sample), g in table.groupby(["run", "sample"], sort=False):
        where = "in sample" if sample == "in" else "out of sample"
        lines.append(f"{run} ({where}; {int(g['n'].iloc[0])} requests replayed)")
        lines.append(f"  {'metric':6s} {'stat':>5s} {'reported ms':>12s} {'predicted ms':>13s} {'error':>8s}")
        for _, r in g.iterrows():
            err = f"{r['rel_err']:+.1%}" if np.isfinite(r["rel_err"]) else "n/a"
            lines.append(f"  {_LABELS[r['metric'] + '_s']:6s} {r['statistic']:>5s} {1e3 * r['meas_s']:12.2f} "
                         f"{1e3 * r['pred_s']:13.2f} {err:>8s}")
    out = table[(table["sample"] == "out") & (table["statistic"] == "mean")]
    for metric, g in out.groupby("metric", sort=False):
        errs = g["rel_err"].abs().to_numpy(float)
        if np.isfinite(errs).any():
            lines.append(f"out of sample, mean {_LABELS[metric + '_s']}: median |error| {np.nanmedian(errs):.1%}, "
                         f"worst {np.nanmax(errs):.1%} over {len(g)} level(s)")
    return "\n".join(lines)
