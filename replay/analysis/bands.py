"""Prediction bands: what a run of a configuration would measure, with the calibration's uncertainty.

A band combines independent parts in quadrature (:func:`band_of_rows`; each shown by ``--wide``):

- the parameters: a calibration is a point of the set of parameter vectors its data cannot reject
  (its 95 % confidence set, :mod:`calibrate.confidence`) and carries points of that set
  (:attr:`schemas.calibration.Calibration.band_points`); the what-if is replayed at each, and the
  farthest one moves the prediction, by ratio, is taken on both sides (the projection method,
  Casella & Berger, Statistical Inference, 2nd ed., section 9.2.3, linearised: a parameter at a
  bound does not make the band one-sided). Where the replay draws random numbers (speculative
  decoding) the optimum is also replayed at other seeds, which count as points;
- the model's error out of sample, held out inside the calibration's own data
  (:mod:`calibrate.holdout`), widened with the what-if's distance from the fitted load
  (:mod:`replay.analysis.band_parts`);
- the transfer error of a calibration carried to another model, GPU, parallelism or engine;
- for a plan's future traffic only, the sampling noise of each percentile.

``tests/calibrate/test_bands.py`` checks the arithmetic by hand, ``tests/calibrate/test_band_coverage.py``
the coverage over seeds on synthetic logs of a cluster the simulator misdescribes, and
``bench/bands.py`` the coverage on real runs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..core.closed_loop import on_send_times
from .band_basis import BandBasis
from .band_windows import windowed, windowed_rows
from .band_parts import ERROR_SOURCE, Z95, distance, growth, load_features, model_error_quantiles, percentile_noise
from .compare import METRICS, SCHEDULER_TABLE_METRICS, scheduler_table
from .metrics import PERCENTILES, goodput_rps, window_percentiles
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
        :func:`replay.analysis.metrics.goodput_rps`), on the simulated sends of a closed loop;
        ``itl_p{q}_s`` over the completed requests' inter-token gaps when the replay recorded token
        times (NaN otherwise).
    """
    result = on_send_times(result)
    row = scheduler_table({"": result}, slo_ttft_s, slo_tpot_s).iloc[0].to_dict()
    del row["scheduler"]
    row["throughput_rps"] = goodput_rps(result, None, None)
    row.update(_itl_percentiles(result))
    return row


def _itl_percentiles(result: pd.DataFrame) -> dict:
    """``itl_p{q}_s`` of the completed requests' inter-token gaps (seconds; NaN without token times)."""
    from schemas.status import OK

    from .metrics import percentile

    gaps = np.empty(0)
    if "pred_token_times_s" in result:
        times = result.loc[result["pred_status"] == OK, "pred_token_times_s"]
        diffs = [np.diff(np.asarray(t, float)) for t in times if t is not None and len(t) > 1]
        gaps = np.concatenate(diffs) if diffs else gaps
    return {f"itl_p{q}_s": percentile(gaps, q) if gaps.size else float("nan") for q in PERCENTILES}


#: Columns of :func:`prediction_row` that a band is put on (every one but ``n_ok``).
BAND_STATS = tuple(f"{m}_p{q}_s" for m in (*SCHEDULER_TABLE_METRICS, "itl") for q in PERCENTILES) + (
    "goodput_rps", "throughput_rps")


@dataclass
class Band:
    """A prediction and its 95 % band.

    Attributes
    ----------
    point : dict
        :func:`prediction_row` at the calibration's values.
    low, high : dict
        Per statistic of :data:`BAND_STATS`, the band's ends (same units; a time or rate never
        below 0); equal to ``point`` when there is no band.
    n_points : int
        Points of the confidence set replayed (0: none).
    n_seeds : int
        Other seeds the optimum was replayed at (0: the replay draws no random numbers).
    parts : dict
        Per statistic, part -> ``(below, above)`` half widths (same units) of what the band
        combines in quadrature: ``parameters``, ``sampling``, ``model``, ``transfer``.
    notes : list of str
        What the reader must know: the distance from the fitted load, a model error from fewer
        than 19 held-out errors, a calibration graded poor.
    distance : float
        How far the replay's load is outside the calibration's (log2 units; 0 inside or unknown).
    meaningful : bool
        False when the calibration is graded poor.
    warnings : list of str
        The notes a user must not miss (``replay`` prints them on stderr): the replay is outside the
        fitted load, or the calibration is graded poor.
    """

    point: dict
    low: dict
    high: dict
    n_points: int
    n_seeds: int
    parts: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    distance: float = 0.0
    meaningful: bool = True
    warnings: list = field(default_factory=list)

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
        """Whether the band is more than the point."""
        return any(self.low[s] != self.high[s] for s in self.low if np.isfinite(self.low[s]))

    def holds(self, stat: str, value: float) -> bool:
        """Whether ``value`` lies in the band of ``stat`` (ends included)."""
        return bool(self.low[stat] <= value <= self.high[stat])

    def half_width(self, stat: str) -> float:
        """The band's half width relative to the point: ``(high - low) / 2 / point`` (NaN at 0)."""
        p = self.point[stat]
        return (self.high[stat] - self.low[stat]) / 2 / p if p else float("nan")


def point_details(result: pd.DataFrame, noise: bool = False) -> dict:
    """What a band takes from the replay at the calibration's values besides its statistics:
    ``load`` (:func:`replay.analysis.band_parts.load_features` of the replay: arrival rate, requests
    in the system and running by Little's law on the predicted latencies, mean prompt) and, with
    ``noise`` (:attr:`BandBasis.new_sample`: only a plan's band uses it; it sorts every latency),
    ``noise`` (statistic -> ``(below, above)``, :func:`replay.analysis.band_parts.percentile_noise`
    of the completed requests' latencies, seconds)."""
    result = on_send_times(result)
    out: dict = {"load": load_features(result)}
    if noise:
        from schemas.status import OK


        ok = (result["pred_status"] == OK).to_numpy()
        pred_col = {label: p for _, p, label in METRICS}
        out["noise"] = {}
        for label in SCHEDULER_TABLE_METRICS:
            values = np.sort(result.loc[ok, pred_col[label]].to_numpy(float, na_value=np.nan))
            values = values[np.isfinite(values)]
            for q in PERCENTILES:
                out["noise"][f"{label}_p{q}_s"] = percentile_noise(values, q, presorted=True)
    return out


def _parameter_part(p: float, vals: np.ndarray, seeds: np.ndarray) -> tuple[float, float]:
    """The parameters' part ``(below, above)``: as far on each side as the farthest of the set's
    points (and the other seeds) moves the prediction from ``p`` on either side, by ratio: a
    prediction ``r`` times the point on one side is taken ``r`` times below it on the other (for
    positive values; by difference otherwise). The set is symmetric about the optimum to first order
    in the parameters, which act on a time as factors (an efficiency divides it), so a side that a
    bound cuts short (a parameter at 0) is taken as wide as the other, and the band never reaches 0
    by this part alone (the linearised projection, Casella & Berger section 9.2.3)."""
    allv = np.concatenate([vals, seeds])
    allv = allv[np.isfinite(allv)]
    if not allv.size:
        return 0.0, 0.0
    if p > 0 and np.all(allv > 0):
        w = float(np.max(np.abs(np.log(allv / p))))
        return p - p * math.exp(-w), p * math.exp(w) - p
    w = float(np.max(np.abs(allv - p)))
    return w, w


def _notes(basis: BandBasis, words: str | None, widened: float, quantiles: dict) -> tuple[list[str], list[str]]:
    """What a band's reader must know: ``(warnings, other notes)`` (:attr:`Band.warnings`,
    :attr:`Band.notes`): the distance from the fitted load and a poor calibration; a model error from
    few held-out errors and a carried calibration."""
    warnings, notes = [], []
    if words:
        warnings.append(f"{words}: outside the load the calibration saw, its model error widened x{widened:.1f}"
                        + ("" if quantiles else " (it has no held-out errors to widen: its runs were too short to "
                                                "split, or it was fitted before 'calibrate fit' held parts out)"))
    if basis.grade == "poor":
        warnings.append("the calibration is graded poor: its bands are not meaningful")
    thin = sorted(m for m, (_, n, ok) in quantiles.items() if not ok)
    if thin:
        notes.append(f"model error from fewer than 19 held-out errors ({', '.join(thin)}): the largest is used, "
                     "the 95 % is not guaranteed")
    if basis.carried_all:
        notes.append("carried across " + "; ".join(basis.carried_all) + ": the transfer error measured on the "
                     "project's real cross-runs is added")
    return warnings, notes


def band_of_rows(point: dict, at_points: list[dict], at_seeds: list[dict] = (), basis: BandBasis | None = None,
                 details: dict | None = None) -> Band:
    """The band of ``point`` (:func:`prediction_row` at the calibration's values) from the rows at
    the confidence set's points and at other seeds, the calibration's ``basis`` and the point
    replay's ``details`` (:func:`point_details`).

    Each side of a statistic's band is ``sqrt(parameters^2 + sampling^2 + model^2 + transfer^2)``
    from the point, the parts independent errors (Kennedy & O'Hagan 2001), the low end clipped at 0:

    - parameters: :func:`_parameter_part` over ``at_points`` and ``at_seeds`` (ITL, which the band's
      replays do not record, takes TPOT's by ratio);
    - sampling (``basis.new_sample`` only): the order-statistic interval of the percentile
      (``details["noise"]``); a rate's relative ``1.96 / sqrt(n_ok)``;
    - model: the held-out errors' conformal quantile for the statistic's metric
      (:data:`replay.analysis.band_parts.ERROR_SOURCE`) times ``growth(distance)`` of ``details["load"]``
      from the fitted range, relative to the point (the queue wait takes TTFT's in milliseconds);
      without held-out errors for that metric, ``1.96`` x the in-sample misfit;
    - transfer: ``basis.transfer_error`` of the metric when ``basis.carried``.

    Without points, seeds or an informative ``basis`` (a calibration written before bands) there
    is no band: the point alone (:attr:`Band.has_band` False).
    """
    basis = basis or BandBasis()
    if not at_points and not at_seeds and not basis.informative:
        details = None
    details = details or {}
    noise = details.get("noise", {})
    dist, words = distance(details.get("load", {}), basis.holdout.get("fitted_range", {}))
    quantiles = model_error_quantiles(basis.holdout.get("errors", []))
    carried = basis.carried_all
    warnings, notes = _notes(basis, words, growth(dist), quantiles)

    def model_rel(label: str) -> float:
        m = ERROR_SOURCE.get(label, "")
        if m in quantiles and np.isfinite(quantiles[m][0]):
            return quantiles[m][0] * growth(dist)
        return Z95 * basis.model_error.get(m, 0.0)

    low, high, parts = {}, {}, {}
    clipped = False
    n_ok = point.get("n_ok", 0) or 0
    for s in BAND_STATS:
        p = point.get(s, np.nan)
        if not np.isfinite(p):
            low[s], high[s], parts[s] = float(p), float(p), {}
            continue
        label, _, pct = s.removesuffix("_s").rpartition("_p") if "_p" in s else (s.removesuffix("_rps"), "", "")
        at = np.array([r.get(s, np.nan) for r in at_points], float)
        par_lo, par_hi = _parameter_part(p, at, np.array([r.get(s, np.nan) for r in at_seeds], float))
        tpot = f"tpot_p{pct}_s"
        if label == "itl" and at.size and not np.isfinite(at).any() and point.get(tpot) and tpot in parts:
            # the band's replays record no token times: the gaps move as TPOT does, by the same ratio
            lo_t, hi_t = parts[tpot].get("parameters", (0.0, 0.0))
            par_lo, par_hi = p * lo_t / point[tpot], p * hi_t / point[tpot]
        scale = point.get(f"ttft_p{pct}_s", p) if label == "queue_wait" else p  # the queue wait: TTFT's ms
        below = above = 0.0
        if basis.new_sample and pct:
            below, above = noise.get(s, (0.0, 0.0))
        elif basis.new_sample and n_ok and details:  # a rate: the count of completed requests is about Poisson
            below = above = abs(p) * Z95 / np.sqrt(n_ok)
        w_mod = model_rel(label) * abs(scale)
        m = ERROR_SOURCE.get(label, "")
        w_tr = basis.transfer_error.get(m, 0.0) * abs(scale) if carried else 0.0
        parts[s] = {"parameters": (par_lo, par_hi), "sampling": (below, above), "model": (w_mod, w_mod),
                    "transfer": (w_tr, w_tr)}
        low[s] = max(0.0, p - math.hypot(par_lo, below, w_mod, w_tr))
        high[s] = p + math.hypot(par_hi, above, w_mod, w_tr)
        # the queue wait is near 0 by nature; a latency clipped at 0 is a band that bounds nothing below
        clipped = clipped or (low[s] == 0.0 < p and pct != "" and label != "queue_wait")
    if clipped:
        notes.append("some bands reach 0 (their low end is clipped there): the calibration cannot bound those "
                     "statistics from below here, and their bands say little")
    return Band(dict(point), low, high, len(at_points), len(at_seeds), parts, warnings + notes, dist,
                basis.grade != "poor", warnings)


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
    basis : BandBasis
        The rest of what the band takes from the calibration.
    """

    frame: pd.DataFrame
    metadata: dict
    cost_model: object
    cfg: object
    points: list
    basis: BandBasis = field(default_factory=BandBasis)

    def replays(self) -> list[tuple[str, object, object]]:
        """What to replay: ``("point", cost model, cfg)`` once, ``("set", ...)`` per band point,
        ``("seed", ...)`` per other seed when the replay draws random numbers."""
        out = [("point", self.cost_model, self.cfg)]
        out += [("set", cm, self.cfg) for cm in band_cost_models(self.cost_model, self.points)]
        if self.cfg.engine.num_speculative_tokens:
            out += [("seed", self.cost_model, self.cfg.with_options(seed=self.cfg.engine.seed + k))
                    for k in range(1, SEED_REPLAYS + 1)]
        return out

    def row(self, cost_model, cfg, details: bool = False) -> dict:
        """:func:`prediction_row` of one replay; with ``details``, also its :func:`point_details`
        under the key ``details``."""
        result, _ = replay_frame(self.frame, cost_model, cfg, self.metadata)
        s = cfg.scheduling
        row = {**prediction_row(result, s.slo_ttft_s, s.slo_tpot_s), **window_percentiles(result, self.metadata)}
        if details:
            row["details"] = point_details(result, self.basis.new_sample)
        return row


def _row_of(job: BandJob, item) -> dict:
    return job.row(item[1], item[2], details=item[0] == "point")


def predict_with_band(job: BandJob, point_row: dict | None = None, mapper=None, details: dict | None = None) -> Band:
    """Replay ``job`` at the calibration's values and at its band points; the band. A trace of more
    than :data:`~replay.analysis.band_windows.WINDOWED_ABOVE` requests replays the band points on
    windows of it (:mod:`replay.analysis.band_windows`).

    Parameters
    ----------
    job : BandJob
    point_row : dict, optional
        :func:`prediction_row` at the calibration's values when already replayed (saves one replay).
    mapper : callable, optional
        ``mapper(fn, items) -> list`` running the replays elsewhere (a process pool's map);
        default: here, one after the other. The band does not depend on where they ran.
    details : dict, optional
        :func:`point_details` of the replay of ``point_row`` (without it, that replay's sampling
        noise and distance are not in the band).

    Returns
    -------
    Band
    """
    from functools import partial

    todo = job.replays()
    fn = partial(_row_of, job)
    if windowed(job.frame, job.cfg):  # a long trace: the band points on windows of it (band_windows)
        point_row = dict(point_row) if point_row is not None else fn(todo[0])
        s = job.cfg.scheduling
        rows = [point_row, *windowed_rows(job.frame, job.metadata, todo, point_row,
                                          partial(prediction_row, slo_ttft_s=s.slo_ttft_s, slo_tpot_s=s.slo_tpot_s),
                                          BAND_STATS, mapper)]
    else:
        done = [] if point_row is None else [dict(point_row)]
        rest = todo[len(done):]
        rows = done + (mapper(fn, rest) if mapper is not None else [fn(item) for item in rest])
    point_row = dict(rows[0])
    details = point_row.pop("details", details)
    kinds = [k for k, _, _ in todo]
    return band_of_rows(point_row, [r for k, r in zip(kinds, rows) if k == "set"],
                        [r for k, r in zip(kinds, rows) if k == "seed"], job.basis, details)
