"""Where a plan's replays run: here, in local worker processes, or as tasks of a Ray cluster.

The trace is sent to each local worker once (the pool's initializer, as ``replay --sweep``
does, :mod:`replay.sweep`) or put in Ray's object store once; a task is then a candidate's
cost model, options and rate scale. Every replay is the same function of the same inputs
wherever it runs, so a plan does not depend on ``--jobs`` or ``--ray-address``.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import pandas as pd

from ..analysis.bands import point_details, prediction_row
from ..errors import ConfigError
from ..simulate import replay_frame
from .slo import attainment


@dataclass
class Workload:
    """What every replay of a plan shares.

    Attributes
    ----------
    frame : pandas.DataFrame
        The request trace at its own arrival times.
    metadata : dict
        Its ``servecal.*`` metadata.
    num_requests : int
        Requests the replays simulate (rows not failed in the measured run): the denominator
        of the goodput's attainment, and the count every passing replay must complete.
    """

    frame: pd.DataFrame
    metadata: dict
    num_requests: int

    def at_scale(self, rate_scale: float) -> pd.DataFrame:
        """The trace arriving ``rate_scale`` times as fast (arrival times divided by it)."""
        if rate_scale == 1.0:
            return self.frame
        return self.frame.assign(arrival_time_s=self.frame["arrival_time_s"].to_numpy(float) / rate_scale)


@dataclass(frozen=True)
class Task:
    """One replay: a cost model, the options and the rate scale (relative to the trace's own rate)."""

    cost_model: object
    cfg: object
    rate_scale: float


def run_task(work: Workload, task: Task) -> dict:
    """Replay ``task``; its :func:`replay.analysis.bands.prediction_row` plus ``attainment`` (fraction of
    the requests meeting the per-request SLOs of ``task.cfg``), or ``{"error": message}`` when
    the options cannot be replayed (an impossible combination only the replay finds)."""
    cfg = task.cfg
    try:
        result, _ = replay_frame(work.at_scale(task.rate_scale), task.cost_model, cfg, work.metadata)
    except ConfigError as exc:
        return {"error": str(exc)}
    row = prediction_row(result, cfg.scheduling.slo_ttft_s, cfg.scheduling.slo_tpot_s)
    row["attainment"] = attainment(row, work.num_requests)
    row["details"] = point_details(result, noise=True)  # a plan's band: future traffic's sampling noise, distance
    return row


def _call(fn, item):
    return fn(item)


_WORKER: Workload | None = None


def _init_worker(work: Workload) -> None:
    global _WORKER
    _WORKER = work


def _task_in_worker(task: Task) -> dict:
    return run_task(_WORKER, task)


class Runner:
    """Runs a plan's replays (a context manager: the worker pool or the Ray connection lives
    while it is open).

    Parameters
    ----------
    work : Workload
    jobs : int, optional
        Local processes (default: one per CPU); 1 runs everything here.
    ray_address : str, optional
        Run on the Ray cluster at this address instead (servecal installed on its workers).
    """

    def __init__(self, work: Workload, jobs: int | None = None, ray_address: str | None = None):
        self.work = work
        self.jobs = jobs or os.cpu_count() or 1
        self.ray_address = ray_address
        self._stack = contextlib.ExitStack()
        self._pool = None
        #: Replays run so far.
        self.replays = 0

    def __enter__(self) -> "Runner":
        if self.ray_address is not None:
            from ..ray_tasks import ray_session

            self._stack.enter_context(ray_session(self.ray_address))
        elif self.jobs > 1:
            from ..parallel import worker_pool

            # spawned workers that ignore Ctrl-C: the parent alone reports it (exit 130)
            self._pool = self._stack.enter_context(worker_pool(self.jobs, _init_worker, (self.work,)))
        return self

    def __exit__(self, *exc) -> None:
        self._stack.__exit__(*exc)

    def tasks(self, tasks: list[Task], done=None) -> list[dict]:
        """:func:`run_task` of every task, in order; ``done(k)`` as ``k`` more finish."""
        if not tasks:
            return []
        self.replays += len(tasks)
        if self.ray_address is not None:
            from ..ray_tasks import map_on_ray

            return map_on_ray(run_task, self.work, tasks, self.ray_address, done)
        if self._pool is not None and len(tasks) > 1:
            return self._pool(_task_in_worker, tasks, done)
        out = []
        for t in tasks:
            out.append(run_task(self.work, t))
            if done is not None:
                done(1)
        return out

    def map(self, fn, items: list) -> list:
        """``[fn(x) for x in items]`` where the replays run (``fn`` picklable): the ``mapper`` of
        :func:`replay.analysis.bands.predict_with_band`."""
        items = list(items)
        self.replays += len(items)
        if self.ray_address is not None and items:
            from ..ray_tasks import map_on_ray

            return map_on_ray(_call, fn, items, self.ray_address)
        if self._pool is not None and len(items) > 1:
            return self._pool(fn, items)
        return [fn(x) for x in items]
