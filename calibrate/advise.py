"""``calibrate advise``: which benchmark run to measure next, ranked by how much it would narrow the
calibration's uncertainty (:mod:`calibrate.advise_design` holds the method and its sources).

Each candidate run (:mod:`calibrate.advise_candidates`) and the what-if are replayed at the
calibration's values and at its band points (:class:`replay.analysis.bands.BandJob`, the replays a
prediction band runs); the candidates are scored by the spread of their predictions between the
points, relative to the noise a measurement of them would carry; the what-if's band now is the one
``replay`` and ``servecal plan`` give (:func:`replay.analysis.bands.band_of_rows`), and its band after
is estimated from the same parts:

- parameters: each band point's prediction of the what-if is drawn towards the calibration's by the
  factor :func:`calibrate.advise_design.conditioned_shrink` (the set's spread conditioned on a
  measurement of the candidate within its noise);
- model: the held-out error is kept; its widening with the distance from the fitted load is taken
  from the fitted range extended by the candidate's load (as if the candidate were among the
  calibration's runs after a joint refit), so a candidate near the what-if's load brings it in;
- sampling and transfer: unchanged (no measurement of another run removes them).

It is an estimate before the run: the refit may move the calibration itself, which no estimate
from the present set can foresee.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from replay.analysis.band_basis import BandBasis
from replay.analysis.band_parts import FEATURES, model_error_quantiles
from replay.analysis.bands import BAND_STATS, Band, BandJob, band_of_rows

from .advise_candidates import FittedLoad, Workload
from .advise_design import (DESIGN_STATS, conditioned_shrink, information_nats, log_matrix, main_direction,
                            measurement_noise, terms_moved)


@dataclass
class Replayed:
    """A workload's replays: ``point`` (:func:`replay.analysis.bands.prediction_row` at the calibration's
    values), ``details`` (:func:`replay.analysis.bands.point_details`: load and percentile noise) and
    ``at_points`` (the rows at the band points, in their order)."""

    workload: Workload
    point: dict
    details: dict
    at_points: list

    @property
    def duration_s(self) -> float:
        """The run's predicted length at the calibration's values: completed requests over throughput
        (seconds; NaN when none completed)."""
        rps = self.point.get("throughput_rps", math.nan)
        return self.point.get("n_ok", 0) / rps if rps and np.isfinite(rps) and rps > 0 else math.nan


@dataclass
class Scored:
    """One candidate's score: ``information_nats`` (on the parameters), ``terms`` ((parameter,
    correlation) it would pin), ``after`` (the what-if's estimated band after measuring it),
    ``shrink`` (statistic -> factor of the parameters' part of the what-if)."""

    run: Replayed
    information_nats: float
    terms: list
    after: Band
    shrink: dict

    def what_if_width(self) -> float:
        """Mean relative half width of the what-if's band after, over :data:`DESIGN_STATS` (NaN if none)."""
        w = [self.after.half_width(s) for s in DESIGN_STATS]
        w = [x for x in w if np.isfinite(x)]
        return float(np.mean(w)) if w else math.nan


@dataclass
class Advice:
    """The what-if's replays and band now, and the candidates, best first (``by_what_if``: ranked by the
    what-if's band after, else by the information on the parameters)."""

    what_if: Replayed
    now: Band
    ranked: list
    by_what_if: bool
    n_replays: int


def model_sd(cal) -> dict:
    """Metric (``ttft``, ``tpot``, ``e2e``) -> the model's own relative error as a standard deviation: the
    held-out errors' 95 % quantile / 1.96 (:func:`replay.analysis.band_parts.model_error_quantiles`), or
    the in-sample misfit beyond noise (:attr:`schemas.calibration.Calibration.model_error`)."""
    q = model_error_quantiles(cal.holdout.get("errors", []))
    out = {}
    for m in ("ttft_s", "tpot_s", "e2e_s"):
        v = q[m][0] / 1.959963984540054 if m in q and np.isfinite(q[m][0]) else cal.model_error.get(m, 0.0)
        out[m.removesuffix("_s")] = float(v)
    return out


def fitted_load(cal, runs, cost_model) -> FittedLoad:
    """The load of the calibration's runs (:class:`calibrate.run_errors.Run`) replayed at its values:
    mean lengths over their scored requests, the highest arrival rate (requests/s; of a run whose
    requests all arrive at once, its predicted throughput) and running requests
    (:func:`calibrate.holdout.run_features`)."""
    from replay.analysis.metrics import goodput_rps
    from replay.simulate import replay_frame

    from .holdout import run_features

    rates, running, prompt, output, n = [], [], 0.0, 0.0, 0
    for run in runs:
        result, _ = replay_frame(run.trace, cost_model, run.config, run.metadata)
        feats = run_features(run, cost_model, result)
        rate = feats["rate_rps"]
        rates.append(rate if np.isfinite(rate) else goodput_rps(run.scored_rows(result), None, None))
        running.append(feats["running"])
        rows = run.scored_rows(run.trace)
        prompt += float(rows["num_prompt_tokens"].sum())
        output += float(rows["num_output_tokens"].sum())
        n += len(rows)
    return FittedLoad(prompt / n, output / n, float(np.nanmax(rates)), float(np.nanmax(running)), dict(cal.engine))


def _replay_one(task) -> dict:
    """One replay of a band job (a module-level function: process pools pickle it by reference)."""
    job, (kind, cost_model, cfg) = task
    return job.row(cost_model, cfg, details=kind == "point")


def replay_all(cal, cost_model, base_cfg, workloads: list, poisson: bool, mapper=None) -> tuple[list, int]:
    """Each workload (:class:`Workload` or :class:`calibrate.advise_candidates.MeasuredRun`) replayed at
    the calibration's values and its band points: one :class:`Replayed` each, and the number of replays.
    ``mapper(fn, items) -> list`` runs them elsewhere (a pool's map)."""
    basis = replace(BandBasis.of(cal), new_sample=True)
    jobs = [BandJob(w.trace(poisson), w.metadata, cost_model, w.config(base_cfg), cal.band_points, basis)
            for w in workloads]
    tasks = [(job, item) for job in jobs for item in job.replays()]
    rows = mapper(_replay_one, tasks) if mapper is not None else [_replay_one(t) for t in tasks]
    out, i = [], 0
    for w, job in zip(workloads, jobs):
        k = len(job.replays())
        point = dict(rows[i])
        details = point.pop("details")
        out.append(Replayed(w, point, details, [r for (kind, _, _), r in zip(job.replays(), rows[i:i + k])
                                                if kind == "set"]))
        i += k
    return out, len(tasks)


def _extended(fitted_range: dict, load: dict) -> dict:
    """``fitted_range`` (feature -> [low, high]) widened to hold ``load``'s finite positive features."""
    out = {k: list(v) for k, v in fitted_range.items()}
    for name in FEATURES:
        x = load.get(name, math.nan)
        if np.isfinite(x) and x > 0 and name in out:
            out[name] = [min(out[name][0], x), max(out[name][1], x)]
    return out


def _drawn_in(point: dict, rows: list, shrink: dict) -> list:
    """The band points' rows with each statistic drawn towards ``point`` by its factor in ``shrink``
    (in logs for positive values; a statistic without its own factor takes its metric's p90's)."""
    out = []
    for r in rows:
        new = dict(r)
        for s in BAND_STATS:
            p, v = point.get(s, math.nan), r.get(s, math.nan)
            f = shrink.get(s, shrink.get(f"{s.split('_p')[0]}_p90_s", 1.0))
            if np.isfinite(p) and np.isfinite(v) and p > 0 and v > 0:
                new[s] = p * math.exp(f * math.log(v / p))
        out.append(new)
    return out


def score(cal, what_if: Replayed, cand: Replayed, sd: dict) -> Scored:
    """A candidate's :class:`Scored` against the what-if (the module's docstring)."""
    y_c = log_matrix([cand.point, *cand.at_points])
    noise = measurement_noise(cand.point, cand.details.get("noise", {}), sd)
    stats = [s for s in BAND_STATS if s.endswith("_s") and np.isfinite(what_if.point.get(s, math.nan))]
    y_w = log_matrix([what_if.point, *what_if.at_points], stats)
    shrink = dict(zip(stats, conditioned_shrink(y_c, noise, y_w)))
    values = {n: np.array([cal.value(n), *[pt.get(n, cal.value(n)) for pt in cal.band_points]])
              for n in sorted({k for pt in cal.band_points for k in pt})}
    terms = terms_moved(values, main_direction(y_c, noise))
    basis = replace(BandBasis.of(cal), new_sample=True)
    holdout = dict(basis.holdout)
    if holdout.get("fitted_range"):
        holdout["fitted_range"] = _extended(holdout["fitted_range"], cand.details.get("load", {}))
    after = band_of_rows(what_if.point, _drawn_in(what_if.point, what_if.at_points, shrink),
                         basis=replace(basis, holdout=holdout), details=what_if.details)
    return Scored(cand, information_nats(y_c, noise), terms, after, shrink)


def advise(cal, cost_model, base_cfg, what_if: Workload, workloads: list, by_what_if: bool, poisson: bool,
           mapper=None) -> Advice:
    """Replay the what-if and the candidate ``workloads``, score and rank them.

    Parameters
    ----------
    cal : schemas.calibration.Calibration
        With band points (the caller checks).
    cost_model, base_cfg
        The calibration's cost model and its engine's :class:`replay.config.ReplayConfig`.
    what_if : Workload
    workloads : list of Workload
    by_what_if : bool
        Rank by the what-if's band after (a what-if was asked); else by the information on the parameters.
    poisson : bool
        Poisson arrivals (``vllm bench serve``'s) instead of constant ones.
    mapper : callable, optional
        Runs the replays elsewhere (``mapper(fn, items) -> list``).
    """
    replayed, n = replay_all(cal, cost_model, base_cfg, [what_if, *workloads], poisson, mapper)
    w, cands = replayed[0], replayed[1:]
    now = band_of_rows(w.point, w.at_points, basis=replace(BandBasis.of(cal), new_sample=True), details=w.details)
    sd = model_sd(cal)
    scored = [score(cal, w, c, sd) for c in cands]
    if by_what_if:
        scored.sort(key=lambda s: (np.nan_to_num(s.what_if_width(), nan=np.inf), -s.information_nats))
    else:
        scored.sort(key=lambda s: -s.information_nats)
    return Advice(w, now, scored, by_what_if, n)
