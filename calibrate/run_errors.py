"""A measured run and the relative errors of its predicted latency quantiles.

What every request-level fit, held-out error and validation shares: :class:`Run` (a request log,
or a level of an aggregate, with the engine settings it ran under), :func:`statistics` (its
percentiles and means) and :class:`QuantileResidual` (the relative errors of the predicted
quantiles for candidate parameters, one replay per run). The fits (:mod:`calibrate.request_fit`),
the model-error and held-out estimates (:mod:`calibrate.discrepancy`, :mod:`calibrate.holdout`)
and the scoring (:mod:`calibrate.runs`, :mod:`calibrate.aggregate_score`) build on it.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

from replay.analysis.metrics import statistics
from replay.config import ReplayConfig
from replay.core.trace_requests import TraceRequests
from replay.simulate import replay_columns, replay_frame
from schemas.cost_params import CostParams
from traces.scrape_window import observed, observed_until

from .errors import FitError


@dataclass
class Run:
    """One measured request log and the engine settings it ran under.

    Attributes
    ----------
    name : str
        Shown in tables (the file name, or ``file#benchmark``).
    trace : pandas.DataFrame
        request_trace/1 rows with measured latencies (seconds).
    config : ReplayConfig
        The measured engine's settings.
    metadata : dict
        The trace's ``servecal.*`` metadata (hash block size, ...).
    note : str, optional
        What the fit left out of this run (set by the fit).
    scored : numpy bool array, optional
        Rows whose latencies are matched or scored (a time window); all rows are replayed,
        as they all shared the engine in the measured run. None: every row.
    targets : dict, optional
        Reported statistics matched instead of the trace's measured latencies (a run built
        from an aggregate, :mod:`calibrate.aggregate_runs`, whose trace is a synthesized
        workload): metric -> (percentiles, NaN for a mean; values in seconds), float arrays
        of one shape.
    reported : dict, optional
        Every statistic of TTFT, TPOT and E2E the aggregate reported (means and all
        percentiles, the tails too), in the form of ``targets``: what validation scores
        (:mod:`calibrate.aggregate_score`). None for a request log.
    """

    name: str
    trace: pd.DataFrame
    config: ReplayConfig
    metadata: dict
    note: str | None = None
    scored: np.ndarray | None = None
    targets: dict | None = None
    reported: dict | None = None

    def scored_rows(self, frame: pd.DataFrame) -> pd.DataFrame:
        """The rows of ``frame`` (this run's trace or its replay result) that are scored."""
        return frame if self.scored is None else frame[self.scored]

    def predicted(self, columns, metric: str) -> np.ndarray:
        """The predicted ``metric`` of this run's replay as matched or scored, by trace row: the
        values of its scored rows and, for a window of Prometheus scrapes (its metadata's
        :data:`traces.scrape_window.OBSERVED_UNTIL`), of the requests its histograms would have
        counted, first token or end by the window's end (:func:`traces.scrape_window.observed`);
        NaN for the others.

        ``columns``: the replay's result or columns (``pred_<metric>``, and ``pred_ttft_s``,
        ``pred_e2e_s`` for a window; N floats each, seconds, by row of :attr:`trace`). Returns N
        floats, seconds."""
        values = np.asarray(columns[f"pred_{metric}"], float)
        keep = np.ones(values.shape, bool) if self.scored is None else np.asarray(self.scored, bool)
        until_s = observed_until(self.metadata)
        if until_s is not None:
            keep = keep & observed(self.trace["arrival_time_s"].to_numpy(float), columns, metric, until_s)
        return np.where(keep, values, np.nan)

    def measures(self, metric: str) -> bool:
        """Whether the run has a measured value of ``metric`` to match (a target, or a latency in its trace)."""
        if self.targets is not None:
            return metric in self.targets
        return _has(self.scored_rows(self.trace), metric)

    def measured(self, metric: str, quantiles) -> tuple[np.ndarray, np.ndarray]:
        """``(percentiles, values)`` matched for ``metric``: the targets', or ``quantiles`` of the trace."""
        if self.targets is not None:
            return self.targets[metric]
        q = np.asarray(quantiles, float)
        return q, statistics(finite_values(self.scored_rows(self.trace)[metric]), q)


class QuantileResidual:
    """Relative errors of the predicted latency quantiles of every run for candidate
    parameters (one replay per run per call). Picklable: the starts may run elsewhere.

    Each run's trace is read for the engine once (:class:`~replay.core.trace_requests.TraceRequests`,
    its prompts' block keys kept), not at every call, and a call reads the predicted columns it
    matches without building the result frame (:func:`replay.simulate.replay_columns`)."""

    def __init__(self, runs, cost_model, metrics, quantiles):
        self.runs, self.cost_model, self.metrics, self.quantiles = runs, cost_model, metrics, quantiles
        self.rows = [TraceRequests(r.trace, keep_prompt_keys=True) for r in runs]
        #: per run, metric -> (percentiles, NaN for a mean; measured values)
        self.meas = [{m: r.measured(m, quantiles) for m in metrics if r.measures(m)} for r in runs]

    def sampling_cov(self, num_samples: int = 200, seed: int = 0) -> np.ndarray:
        """Covariance of the residual vector from the sampling of the measured requests: a
        moving-block bootstrap of each run's measured latencies (blocks of consecutive
        requests in arrival order, about n^(1/3) long, since the latencies of a busy period
        move together; Kuensch 1989), each resample's quantiles relative to the measured ones.
        Runs are resampled independently, so the matrix is block diagonal. A run of targets
        (an aggregate) has no measured requests: its replay at the cost model's values stands
        for them, with the level's count of requests (a parametric bootstrap; for a window of
        scrapes, the requests the replay finishes inside it: :meth:`Run.predicted`)."""
        rng = np.random.default_rng(seed)
        blocks = []
        for r, trace_rows, meas in zip(self.runs, self.rows, self.meas):
            rows = r.scored_rows(r.trace)
            if r.targets is not None:
                res, _ = replay_frame(trace_rows, self.cost_model, r.config, r.metadata)
                rows = res.assign(**{m: r.predicted(res, m) for m in meas})
            n = len(rows)
            size = max(1, int(round(n ** (1 / 3))))
            starts = rng.integers(0, max(n - size, 0) + 1, (num_samples, -(-n // size)))
            idx = (starts[:, :, None] + np.arange(size)).reshape(num_samples, -1)[:, :n]
            draws = []
            for m, (pcts, q_meas) in meas.items():
                v = pd.to_numeric(rows[m], errors="coerce").to_numpy(float)
                with np.errstate(all="ignore"), warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # a resample without a measured value
                    q = statistics(v[idx], pcts, axis=1)
                if r.targets is not None:  # the spread of the replayed sample around its own statistics
                    q = q - statistics(finite_values(rows[m]), pcts) + q_meas
                draws.append((q - q_meas) / np.maximum(q_meas, 1e-3))
            draws = np.hstack(draws)
            draws = draws[np.all(np.isfinite(draws), axis=1)]  # resamples with no measured value of a metric
            n_stats = draws.shape[1]  # np.cov of one statistic is 0-d: at least 2-d, 1 x 1
            blocks.append(np.atleast_2d(np.cov(draws, rowvar=False)) if len(draws) > 1 else np.zeros((n_stats,) * 2))
        out = np.zeros((sum(b.shape[0] for b in blocks),) * 2)
        k = 0
        for b in blocks:
            out[k:k + b.shape[0], k:k + b.shape[0]] = b
            k += b.shape[0]
        return out

    def errors(self, p: CostParams) -> list[dict]:
        """Per run, metric -> relative quantile errors (array)."""
        cm = self.cost_model.with_params(p)
        out = []
        for run, rows, meas in zip(self.runs, self.rows, self.meas):
            columns, _ = replay_columns(rows, cm, run.config, run.metadata)
            errs = {}
            for m, (pcts, q_meas) in meas.items():
                pv = run.predicted(columns, m)
                pv = pv[np.isfinite(pv)]
                q = statistics(pv, pcts) if pv.size else np.full(len(pcts), 1e9)
                errs[m] = (q - q_meas) / np.maximum(q_meas, 1e-3)
            out.append(errs)
        return out

    def __call__(self, p: CostParams) -> np.ndarray:
        return np.concatenate([e for run in self.errors(p) for e in run.values()])


def finite_values(col) -> np.ndarray:
    v = pd.to_numeric(col, errors="coerce").to_numpy(float)
    return v[np.isfinite(v)]


def _has(trace: pd.DataFrame, m: str) -> bool:
    """Whether ``trace`` holds a finite value of metric ``m``."""
    return m in trace and finite_values(trace[m]).size > 0


def chosen(frame: pd.DataFrame, column: str, k: int | None, where: str, noun: str) -> list:
    """The values of ``column`` a run spec ``FILE#K`` takes: ``[k]``, or every one in order
    when ``k`` is None. Raises FitError naming ``where`` when the file has no ``k``."""
    have = sorted(frame[column].unique())
    if k is not None and k not in have:
        raise FitError(f"{where}: no {noun} {k} (the file has {', '.join(str(x) for x in have)})")
    return [k] if k is not None else have
