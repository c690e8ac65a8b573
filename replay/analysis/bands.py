"""Prediction bands: how sure a replay is, from the calibration's uncertainty.

A calibration is a point of a set of parameter vectors the data cannot reject (its 95 %
confidence set, :mod:`calibrate.confidence`); it carries points of that set
(:attr:`schemas.calibration.Calibration.band_points`). A what-if replayed at each of them
gives the range of answers the data allow: the band of every predicted statistic is its
smallest and largest value over the calibration's point and the set's points. Where the
replay itself draws random numbers (accepted draft tokens of speculative decoding) the
optimum is also replayed at other seeds and the band widened by their spread.

This is the projection method (Casella & Berger, Statistical Inference, 2nd ed., section
9.2.3): when the set holds the true parameters with probability 0.95, the range of a
prediction over the set holds the true prediction at least as often. The points are an
inner approximation of the set (the ends of the line searches that traced it), so the band
is an inner approximation of that range; ``tests/calibrate/test_bands.py`` measures its coverage over
seeds on synthetic logs of a known cluster and ``bench/bands.py`` on real runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..core.closed_loop import on_send_times
from .compare import SCHEDULER_TABLE_METRICS, scheduler_table
from .metrics import PERCENTILES, goodput_rps
from ..simulate import replay_frame

#: Other seeds the optimum is replayed at when the replay draws random numbers.
SEED_REPLAYS = 4


def band_cost_models(cost_model, points: list[dict]) -> list:
    """``cost_model`` at each point of ``points`` (name -> value; the others kept).

    Parameters
    ----------
    cost_model : replay.cost.cost_model.RooflineCostModel
        The calibration's model (any model, TP or GPU it was carried to).
    points : list of dict
        :attr:`schemas.calibration.Calibration.band_points`.
    """
    return [cost_model.with_params(cost_model.params.replace(**pt)) for pt in points]


def prediction_row(result: pd.DataFrame, slo_ttft_s: float | None = None, slo_tpot_s: float | None = None) -> dict:
    """The predicted statistics of one replay result.

    Returns
    -------
    dict
        ``n_ok`` (completed requests), ``{metric}_p{q}_s`` for the metrics of
        :data:`replay.analysis.compare.SCHEDULER_TABLE_METRICS` and the percentiles of
        :data:`replay.analysis.metrics.PERCENTILES` (seconds), ``throughput_rps`` (completed
        requests/s) and ``goodput_rps`` (those meeting the SLOs given; requests/s,
        :func:`replay.analysis.metrics.goodput_rps`), on the simulated sends of a closed loop.
    """
    result = on_send_times(result)
    row = scheduler_table({"": result}, slo_ttft_s, slo_tpot_s).iloc[0].to_dict()
    del row["scheduler"]
    row["throughput_rps"] = goodput_rps(result, None, None)
    return row


#: Columns of :func:`prediction_row` that a band is put on (every one but ``n_ok``).
BAND_STATS = tuple(f"{m}_p{q}_s" for m in SCHEDULER_TABLE_METRICS for q in PERCENTILES) + ("goodput_rps",
                                                                                        "throughput_rps")


@dataclass
class Band:
    """A prediction and its 95 % band.

    Attributes
    ----------
    point : dict
        :func:`prediction_row` at the calibration's values.
    low, high : dict
        Per statistic of :data:`BAND_STATS`, the band's ends (same units); equal to
        ``point`` when the calibration has no band points.
    n_points : int
        Points of the confidence set replayed (0: no band).
    n_seeds : int
        Other seeds the optimum was replayed at (0: the replay draws no random numbers).
    model_error : dict
        The calibration's model error the band includes (metric -> relative discrepancy).
    """

    point: dict
    low: dict
    high: dict
    n_points: int
    n_seeds: int
    model_error: dict = field(default_factory=dict)

    def cell(self, stat: str, scale: float = 1e3, digits: int = 1, fmt=None) -> str:
        """``"412.3 [398.0, 430.1]"``: the point and the band of ``stat``, times ``scale``;
        the point alone without a band, ``"-"`` when it is not finite. ``fmt(value)``, when
        given, formats each of the three numbers in ``stat``'s own units instead (e.g.
        :func:`replay.analysis.compare.ms_cell`: seconds as milliseconds)."""
        if fmt is None:
            def fmt(x):
                return f"{x * scale:.{digits}f}"
        p, lo, hi = self.point[stat], self.low[stat], self.high[stat]
        if not np.isfinite(p):
            return "-"
        if not self.has_band:
            return fmt(p)
        return f"{fmt(p)} [{fmt(lo)}, {fmt(hi)}]"

    @property
    def has_band(self) -> bool:
        """Whether the band is more than the point (band points, other seeds or a model error)."""
        return bool(self.n_points or self.n_seeds or any(self.model_error.values()))

    def holds(self, stat: str, value: float) -> bool:
        """Whether ``value`` lies in the band of ``stat`` (ends included)."""
        return bool(self.low[stat] <= value <= self.high[stat])

    def half_width(self, stat: str) -> float:
        """The band's half width relative to the point: ``(high - low) / 2 / point`` (NaN at 0)."""
        p = self.point[stat]
        return (self.high[stat] - self.low[stat]) / 2 / p if p else float("nan")


def band_of_rows(point: dict, at_points: list[dict], at_seeds: list[dict] = (),
                 model_error: dict | None = None) -> Band:
    """The band of ``point`` (:func:`prediction_row` at the calibration's values) from the rows
    at the confidence set's points and at other seeds, and the calibration's model error.

    The band of a statistic is ``[min, max]`` over ``point`` and ``at_points``, widened by how
    far the seeds' rows fall below or above ``point``. Statistics that are NaN at some point
    (no completed request) take the range of the finite ones. With ``model_error`` (metric ->
    relative discrepancy ``d``, :attr:`schemas.calibration.Calibration.model_error`) each side
    of a latency's band is combined in quadrature with ``1.96 d`` x the point: the parameters'
    uncertainty and the model's discrepancy, independent errors (Kennedy & O'Hagan 2001)."""
    low, high = {}, {}
    model_error = model_error or {}
    for s in BAND_STATS:
        p = point.get(s, np.nan)
        vals = np.array([p] + [r.get(s, np.nan) for r in at_points], float)
        seeds = np.array([r.get(s, np.nan) for r in at_seeds], float)
        finite = vals[np.isfinite(vals)]
        lo, hi = (finite.min(), finite.max()) if finite.size else (np.nan, np.nan)
        if seeds.size and np.isfinite(p):
            seeds = seeds[np.isfinite(seeds)]
            if seeds.size:
                lo += min(0.0, seeds.min() - p)
                hi += max(0.0, seeds.max() - p)
        d = model_error.get(s.split("_p")[0] + "_s", 0.0) if "_p" in s else 0.0
        if d and np.isfinite(p):
            w = 1.96 * d * abs(p)
            lo, hi = p - float(np.hypot(p - lo, w)), p + float(np.hypot(hi - p, w))
        low[s], high[s] = float(lo), float(hi)
    return Band(dict(point), low, high, len(at_points), len(at_seeds), dict(model_error))


@dataclass
class BandJob:
    """One what-if to put a band on (picklable: the replays may run in worker processes).

    Attributes
    ----------
    frame : pandas.DataFrame
        The request trace (arrival times already scaled for a what-if at another rate).
    metadata : dict
        Its ``servecal.*`` metadata.
    cost_model : replay.cost.cost_model.RooflineCostModel
        At the calibration's values.
    cfg : replay.config.ReplayConfig
    points : list of dict
        The calibration's band points.
    model_error : dict
        The calibration's model error (:attr:`schemas.calibration.Calibration.model_error`).
    """

    frame: pd.DataFrame
    metadata: dict
    cost_model: object
    cfg: object
    points: list
    model_error: dict = field(default_factory=dict)

    def replays(self) -> list[tuple[str, object, object]]:
        """What to replay: ``("point", cost model, cfg)`` once, ``("set", ...)`` per band point,
        ``("seed", ...)`` per other seed when the replay draws random numbers."""
        out = [("point", self.cost_model, self.cfg)]
        out += [("set", cm, self.cfg) for cm in band_cost_models(self.cost_model, self.points)]
        if self.cfg.engine.num_speculative_tokens:
            out += [("seed", self.cost_model, self.cfg.with_options(seed=self.cfg.engine.seed + k))
                    for k in range(1, SEED_REPLAYS + 1)]
        return out

    def row(self, cost_model, cfg) -> dict:
        """:func:`prediction_row` of one replay."""
        result, _ = replay_frame(self.frame, cost_model, cfg, self.metadata)
        s = cfg.scheduling
        return prediction_row(result, s.slo_ttft_s, s.slo_tpot_s)


def _row_of(job: BandJob, item) -> dict:
    return job.row(item[1], item[2])


def predict_with_band(job: BandJob, point_row: dict | None = None, mapper=None) -> Band:
    """Replay ``job`` at the calibration's values and at its band points; the band.

    Parameters
    ----------
    job : BandJob
    point_row : dict, optional
        :func:`prediction_row` at the calibration's values when already replayed (saves one replay).
    mapper : callable, optional
        ``mapper(fn, items) -> list`` running the replays elsewhere (a process pool's map);
        default: here, one after the other. The band does not depend on where they ran.

    Returns
    -------
    Band
    """
    from functools import partial

    todo = job.replays()
    if point_row is not None:
        todo = todo[1:]
    fn = partial(_row_of, job)
    rows = mapper(fn, todo) if mapper is not None else [fn(item) for item in todo]
    kinds = [k for k, _, _ in todo]
    if point_row is None:
        point_row = rows[0]
    return band_of_rows(point_row, [r for k, r in zip(kinds, rows) if k == "set"],
                        [r for k, r in zip(kinds, rows) if k == "seed"], job.model_error)
