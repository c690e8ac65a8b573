"""The search of a plan: the cheapest deployment whose predicted latencies meet the SLOs.

1. **Point**: candidates that can run are replayed once at the target rate with the
   calibration's values, cheapest first, a batch at a time. One that breaks an objective
   there cannot meet it with its band (the band holds the point), so it is out; so is one
   dominated by another no dearer and at least as good on every objective (ties: the first
   in grid order is kept).
2. **Band**: each survivor, cheapest first (ties: the lower first objective), is replayed at
   the points of its calibration's 95 % confidence set (:func:`replay.analysis.bands.predict_with_band`).
   Once ``top_k`` meet every objective at their band's worst end (``confidence="band"``) or
   at their point (``"point"``), and one meets it with its band, no costlier candidate can
   change the answer or the top of the table: the rest are not replayed ("not evaluated";
   ``exhaustive`` replays every point, for a front over the whole grid). Over-provisioned
   candidates, the slowest to replay (many replicas, each stepping at low load), are the ones
   this skips.
3. **Max rate**: for the Pareto front of throughput per GPU against the first objective (and
   the answer), the highest arrival rate at which the objectives still hold (at the point, and
   with ``"band"`` at the band too), by a geometric bisection on the rate scale of ``probes``
   replays (doubling or halving until bracketed), as Vidur-Search (Agrawal et al., MLSys'24)
   and DistServe's placement search (Zhong et al., OSDI'24) search a deployment's capacity.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from ..analysis.bands import Band, BandJob, predict_with_band
from ..progress import optional_bar
from .grid import Prepared
from .runner import Runner, Task, Workload
from .slo import Slo, attainment

CONFIDENCES = ("band", "point")

#: :attr:`Evaluation.status` values.
SKIPPED, ERROR, FAILS, DOMINATED, SURVIVES, MEETS, POINT_ONLY, NOT_EVALUATED = (
    "skipped", "error", "fails", "dominated", "survives", "meets", "point only", "not evaluated")


@dataclass
class Evaluation:
    """What the search learnt about one candidate.

    Attributes
    ----------
    prepared : Prepared
    status : str
        ``skipped`` (cannot run), ``error`` (the replay refused it), ``fails`` (an objective
        broken at its point), ``dominated``, ``survives`` (meets them at its point, band not
        computed), ``meets`` (at its band's worst end too), ``point only`` (at its point, not
        at its band's worst end).
    reason : str
        Why it is skipped, fails or is dominated (the objectives broken, with values).
    point : dict | None
        :func:`replay.runner.run_task`'s row at the target rate (seconds, requests/s).
    band : Band | None
        At the target rate.
    attainment_band : tuple of float
        ``(low, high)`` of the fraction of requests meeting the per-request SLOs.
    band_rows : list of dict
        Rows at each band point, in the calibration's ``band_points`` order (attainment included).
    max_rate_rps : float | None
        Highest arrival rate found where the objectives hold (requests/s); NaN when none of
        the rates tried; None when not searched.
    """

    prepared: Prepared
    status: str = ""
    reason: str = ""
    point: dict | None = None
    band: Band | None = None
    attainment_band: tuple = (math.nan, math.nan)
    band_rows: list = field(default_factory=list)
    max_rate_rps: float | None = None

    @property
    def candidate(self):
        return self.prepared.candidate

    @property
    def cost(self) -> float:
        return self.prepared.cost


@dataclass
class PlanResult:
    """The answer of :func:`search` and what supports it.

    Attributes
    ----------
    evaluations : list of Evaluation
        Every candidate, in grid order.
    ranked : list of Evaluation
        Those meeting the objectives at their point and not dominated, cheapest first.
    answer : Evaluation | None
        The cheapest meeting the objectives under the chosen confidence.
    cheapest_point, cheapest_band : Evaluation | None
        The cheapest meeting them at its point, and with its band.
    front : list of Evaluation
        The Pareto front of throughput per GPU against the first objective (point, target rate).
    target_rate_rps : float
    confidence : str
    replays : int
        Replays the search ran.
    timings_s : dict
        Wall seconds of ``points_and_bands`` and ``max_rate``.
    """

    evaluations: list
    ranked: list
    answer: Evaluation | None
    cheapest_point: Evaluation | None
    cheapest_band: Evaluation | None
    front: list
    target_rate_rps: float
    confidence: str
    replays: int = 0
    timings_s: dict = field(default_factory=dict)


def point_violations(slo: Slo, row: dict, num_requests: int) -> list[str]:
    """The objectives ``row`` breaks, and the requests it did not complete."""
    if "error" in row:
        return [row["error"]]
    out = []
    if row["n_ok"] < num_requests:
        out.append(f"{num_requests - row['n_ok']} of {num_requests} requests not completed")
    return out + slo.violations(row, row["attainment"])


def _stats(slo: Slo, row: dict) -> list[float]:
    return [row[f"{k}_s"] for k in slo.latency_s]


def _dominates(slo: Slo, a: Evaluation, b: Evaluation) -> bool:
    """``a`` is no dearer than ``b`` and at least as good on every objective."""
    if a.cost > b.cost or any(x > y for x, y in zip(_stats(slo, a.point), _stats(slo, b.point))):
        return False
    return slo.goodput is None or a.point["attainment"] >= b.point["attainment"]


def _high_first(v) -> float:
    """``v``, with NaN (nothing completed) as the highest."""
    return v if v is not None and v == v else math.inf


def _order_key(slo: Slo, ev: Evaluation):
    return ev.cost, ev.candidate.num_gpus, ev.point[f"{slo.primary}_s"]


class Search:
    """One plan's search (:func:`search` runs it)."""

    def __init__(self, prepared: list[Prepared], work: Workload, slo: Slo, rate_scale: float,
                 target_rate_rps: float, runner: Runner, confidence: str = "band", top_k: int = 5, probes: int = 8,
                 exhaustive: bool = False):
        if confidence not in CONFIDENCES:
            raise ValueError(f"confidence must be one of {CONFIDENCES}, not {confidence!r}")
        self.evals = [Evaluation(p) for p in prepared]
        self.work, self.slo, self.scale, self.rate = work, slo, rate_scale, target_rate_rps
        self.runner, self.confidence, self.top_k, self.probes = runner, confidence, top_k, probes
        self.exhaustive = exhaustive

    # -- the phases ---------------------------------------------------------------------------

    def points(self) -> list[Evaluation]:
        """Phases 1 and 2, cheapest first: the points of a batch of candidates, then the bands of
        those meeting the objectives there and not dominated, until :meth:`settled` (or every
        candidate with ``exhaustive``). Returns the survivors, cheapest first."""
        todo = []
        for ev in self.evals:
            if ev.prepared.skip:
                ev.status, ev.reason = SKIPPED, ev.prepared.skip
            else:
                todo.append(ev)
        todo.sort(key=lambda ev: (ev.cost, ev.candidate.num_gpus))  # stable: grid order within a cost
        batch_size = max(8, 4 * getattr(self.runner, "jobs", 1))
        kept: list[Evaluation] = []
        with optional_bar("candidates", len(todo)) as bar:
            for i in range(0, len(todo), batch_size):
                if self.settled() and not self.exhaustive:
                    for ev in todo[i:]:
                        ev.status, ev.reason = NOT_EVALUATED, (f"costlier than the {self.top_k} cheapest meeting "
                                                               "the SLOs (--exhaustive replays it)")
                    break
                batch = todo[i:i + batch_size]
                rows = self.runner.tasks([Task(ev.prepared.cost_model, ev.prepared.cfg, self.scale) for ev in batch])
                passing = []
                for ev, row in zip(batch, rows):
                    ev.point = row
                    broken = point_violations(self.slo, row, self.work.num_requests)
                    if "error" in row:
                        ev.status, ev.reason = ERROR, row["error"]
                    elif broken:
                        ev.status, ev.reason = FAILS, "; ".join(broken)
                    else:
                        passing.append(ev)
                for ev in sorted(passing, key=lambda ev: _order_key(self.slo, ev)):
                    by = next((a for a in kept if _dominates(self.slo, a, ev)), None)
                    if by is not None:
                        ev.status, ev.reason = DOMINATED, f"dominated by {by.candidate.label()}"
                        continue
                    ev.status = SURVIVES
                    kept.append(ev)
                    if not self.settled():
                        self._band_at_target(ev)
                if bar is not None:
                    bar.update(len(batch))
        return sorted(kept, key=lambda ev: _order_key(self.slo, ev))

    def settled(self) -> bool:
        """``top_k`` candidates meet the objectives under the chosen confidence and one meets
        them with its band: no costlier candidate can change the answer or the top of the table."""
        meets = sum(ev.status == MEETS for ev in self.evals)
        by_conf = meets if self.confidence == "band" else meets + sum(ev.status == POINT_ONLY for ev in self.evals)
        return by_conf >= self.top_k and meets >= 1

    def band_of(self, ev: Evaluation, factor: float = 1.0, point_row: dict | None = None):
        """The band of ``ev`` at ``factor`` times the target rate: ``(band, (att_low, att_high), rows)``."""
        scale = self.scale * factor
        job = BandJob(self.work.at_scale(scale), self.work.metadata, ev.prepared.cost_model, ev.prepared.cfg,
                      ev.prepared.band_points, ev.prepared.basis)
        seen = []

        def mapper(fn, items):
            rows = self.runner.map(fn, items)
            seen.extend(zip((k for k, _, _ in items), rows))
            return rows

        band = predict_with_band(job, point_row=point_row, mapper=mapper)
        n = self.work.num_requests
        rows = [r for k, r in seen if k == "set"]
        for r in rows:
            r["attainment"] = attainment(r, n)
        att = ([point_row["attainment"]] if point_row else []) + [attainment(r, n) for _, r in seen]
        return band, (min(att), max(att)), rows

    def meets_band(self, band: Band, att: tuple) -> bool:
        return not self.slo.band_violations(band, att[0])

    def _band_at_target(self, ev: Evaluation) -> None:
        ev.band, ev.attainment_band, ev.band_rows = self.band_of(ev, 1.0, ev.point)
        broken = self.slo.band_violations(ev.band, ev.attainment_band[0])
        ev.status, ev.reason = (POINT_ONLY, "band: " + "; ".join(broken)) if broken else (MEETS, "")

    def objectives_hold(self, evs: list[Evaluation], factors: list[float]) -> list[bool]:
        """Whether each candidate meets the objectives at ``factor`` times the target rate: at its
        point and, with ``confidence="band"``, at every band point (the band's worst end meets an
        objective only if every point does).

        The replays run in batches, each only for the candidates still passing: with the band,
        first the band point that gave each candidate's worst first objective at the target rate
        (the likeliest to fail), then the points, then the other band points; so a candidate whose
        band fails there costs one replay, not two. The answer is the conjunction whatever the
        order. A replay that draws random numbers (speculative decoding) gets its point, then its
        full band (:meth:`band_of`), whose seed spread no single point shows."""
        from ..analysis.bands import band_cost_models

        points = [(i, Task(ev.prepared.cost_model, ev.prepared.cfg, self.scale * f))
                  for i, (ev, f) in enumerate(zip(evs, factors))]
        batches, spec = [points], []
        if self.confidence == "band":
            key = f"{self.slo.primary}_s"
            first, rest = [], []
            for i, ev in enumerate(evs):
                pts = ev.prepared.band_points
                if ev.prepared.cfg.engine.num_speculative_tokens:
                    spec.append(i)
                    continue
                worst = max(range(len(pts)), key=lambda j: _high_first(ev.band_rows[j].get(key))) if ev.band_rows else 0
                cms = band_cost_models(ev.prepared.cost_model, pts)
                order = [worst] + [j for j in range(len(pts)) if j != worst] if pts else []
                first += [(i, Task(cms[j], ev.prepared.cfg, self.scale * factors[i])) for j in order[:1]]
                rest += [(i, Task(cms[j], ev.prepared.cfg, self.scale * factors[i])) for j in order[1:]]
            batches = [first, points, rest]
        ok = [True] * len(evs)
        for batch in batches:
            todo = [(i, t) for i, t in batch if ok[i]]
            for (i, _), row in zip(todo, self.runner.tasks([t for _, t in todo])):
                if point_violations(self.slo, row, self.work.num_requests):
                    ok[i] = False
        for i in spec:
            if ok[i]:
                band, att, _ = self.band_of(evs[i], factors[i])
                ok[i] = self.meets_band(band, att)
        return ok

    def max_rates(self, evs: list[Evaluation]) -> None:
        """Phase 3: the highest rate where the objectives hold, for ``evs`` in lock step (per
        probe, the batches of :meth:`objectives_hold`)."""
        for ev in evs:
            if ev.band is None:
                self._band_at_target(ev)
        lo = {id(ev): 1.0 if self._holds(ev.status) else None for ev in evs}
        hi = {id(ev): None if self._holds(ev.status) else 1.0 for ev in evs}
        with optional_bar("max rate", self.probes * len(evs)) as bar:
            for _ in range(self.probes):
                factors = []
                for ev in evs:
                    a, b = lo[id(ev)], hi[id(ev)]
                    factors.append(a * 2 if b is None else b / 2 if a is None else math.sqrt(a * b))
                for ev, f, o in zip(evs, factors, self.objectives_hold(evs, factors)):
                    if o:
                        lo[id(ev)] = f
                    else:
                        hi[id(ev)] = f
                if bar is not None:
                    bar.update(len(evs))
        for ev in evs:
            f = lo[id(ev)]
            ev.max_rate_rps = f * self.rate if f is not None else math.nan

    def _holds(self, status: str) -> bool:
        return status == MEETS or (self.confidence == "point" and status in (MEETS, POINT_ONLY))

    def front(self, ranked: list[Evaluation]) -> list[Evaluation]:
        """The Pareto front of throughput per GPU (higher better) against the first objective
        (lower better), at the target rate and the point: fewest GPUs first."""
        key = f"{self.slo.primary}_s"
        out, best = [], math.inf
        for ev in sorted(ranked, key=lambda e: (-e.point["throughput_rps"] / e.candidate.num_gpus, e.point[key])):
            if ev.point[key] < best:
                out.append(ev)
                best = ev.point[key]
        return out

    def run(self, max_front: int = 6) -> PlanResult:
        t0 = time.perf_counter()
        ranked = self.points()
        t1 = time.perf_counter()
        banded = [ev for ev in ranked if ev.band is not None]
        cheapest_band = next((ev for ev in banded if ev.status == MEETS), None)
        cheapest_point = ranked[0] if ranked else None
        answer = cheapest_band if self.confidence == "band" else cheapest_point
        front = self.front(ranked)[:max_front]
        targets = list(front) + [ev for ev in (answer,) if ev is not None and ev not in front]
        if targets and self.probes:
            self.max_rates(targets)
        timings = {"points_and_bands": t1 - t0, "max_rate": time.perf_counter() - t1}
        return PlanResult(self.evals, ranked, answer, cheapest_point, cheapest_band, front, self.rate,
                          self.confidence, self.runner.replays, timings)


def search(prepared: list[Prepared], work: Workload, slo: Slo, rate_scale: float, target_rate_rps: float,
           runner: Runner, confidence: str = "band", top_k: int = 5, probes: int = 8,
           exhaustive: bool = False) -> PlanResult:
    """Search the cheapest of ``prepared`` meeting ``slo`` at ``rate_scale`` times the trace's rate.

    Parameters
    ----------
    prepared : list of Prepared
        The candidates (:func:`replay.plan.grid.prepare`).
    work : Workload
    slo : Slo
    rate_scale : float
        Arrival times are divided by it (the target rate over the trace's own).
    target_rate_rps : float
        That rate, requests/s (for the max rate).
    runner : Runner
        Where the replays run (opened).
    confidence : {"band", "point"}
        Meet the objectives at the band's worst end, or at the calibration's point.
    top_k : int
        Stop computing bands once this many meet the objectives.
    probes : int
        Replays of the max-rate bisection per candidate (0: no max rate).
    exhaustive : bool
        Replay every candidate at its point, not only those up to the cost of the ``top_k``
        cheapest meeting the objectives (a front over the whole grid).
    """
    return Search(prepared, work, slo, rate_scale, target_rate_rps, runner, confidence, top_k, probes,
                  exhaustive).run()
