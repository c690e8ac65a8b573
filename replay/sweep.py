"""Parameter sweeps (``replay --sweep``): replay one trace at every point of a grid of options.

``--sweep rate-scale=0.5:3:0.25 --sweep scheduler=fcfs,chunked`` replays the trace at each
point of the cartesian product of the swept values and tabulates the predicted latency
percentiles, goodput and throughput, one row per point. Points are independent replays,
so they run in parallel: local processes by default (:func:`replay.parallel.map_in_processes`,
spawn start method, Ctrl-C handled by the parent alone), or the tasks of a Ray cluster. Every point is evaluated by the same
function with the same inputs, so the table does not depend on where or in which order
the points ran.
"""
from __future__ import annotations

import contextlib

import itertools
import os
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation
from pathlib import Path

import pandas as pd

from .closed_loop import check_closed_loop, on_send_times
from .compare import scheduler_table
from .errors import ConfigError
from .metrics import PERCENTILES, goodput_rps
from .progress import optional_bar
from .schedulers import check_scheduler_names
from .simulate import ReplayConfig, replay_frame

#: Sweepable options (their ``replay`` names) and the type of their values. ``rate-scale``
#: divides the trace's arrival times (2 = twice the load); the others are
#: :class:`~replay.simulate.ReplayConfig` fields.
PARAMS = {
    "rate-scale": float,
    "scheduler": str,
    "max-num-seqs": int,
    "max-num-batched-tokens": int,
    "replicas": int,
    "concurrency": int,
}
#: Most points one sweep may have (a guard against a mistyped range).
MAX_POINTS = 10_000
#: Metrics of the printed table (the file also has ``queue_wait``).
TABLE_METRICS = ("ttft", "tpot", "e2e")
#: Formats ``--sweep-out`` can write, by file suffix.
OUTPUT_FORMATS = (".parquet", ".csv")


def column(name: str) -> str:
    """The table column of a swept option: ``rate-scale`` -> ``rate_scale``."""
    return name.replace("-", "_")


def parse_sweep(text: str) -> tuple[str, list]:
    """One ``--sweep`` value: ``NAME=a,b,c`` (a list) or ``NAME=start:stop:step`` (a range).

    A range holds ``start, start + step, ...`` up to ``stop``, which is included when it
    lands on the grid; it is computed in decimal, so ``0.5:3:0.25`` gives exactly
    0.5, 0.75, ..., 3.0.

    Returns
    -------
    (name, values)
        ``name`` a key of :data:`PARAMS`; ``values`` of its type, in the order given.

    Raises
    ------
    ConfigError
        Unknown name, malformed or empty values, a repeated value, a number out of range
        (rates > 0, counts >= 1), a range over schedulers, a scheduler that cannot be loaded.
    """
    name, sep, spec = (part.strip() for part in text.partition("="))
    if name not in PARAMS:
        raise ConfigError(f"--sweep {text}: unknown option {name!r}; sweepable: {', '.join(PARAMS)}")
    kind = PARAMS[name]
    if not sep or not spec:
        raise ConfigError(f"--sweep {text}: give values, e.g. {name}=a,b,c or {name}=start:stop:step")
    if ":" in spec and kind is not str:
        values = _range(name, spec, kind)
    else:
        values = [_value(name, v.strip(), kind) for v in spec.split(",") if v.strip()]
        if not values:
            raise ConfigError(f"--sweep {text}: no values")
    if kind is str:
        check_scheduler_names(values, f"--sweep {name}")
    else:
        repeated = sorted({str(v) for v in values if values.count(v) > 1})
        if repeated:
            raise ConfigError(f"--sweep {name}: {', '.join(repeated)} given more than once")
    return name, values


def _value(name: str, text: str, kind):
    if kind is str:
        return text
    try:
        v = Decimal(text)
    except InvalidOperation:
        raise ConfigError(f"--sweep {name}: {text!r} is not a number") from None
    return _checked(name, v, kind)


def _checked(name: str, v: Decimal, kind):
    if not v.is_finite() or (v <= 0 if kind is float else v < 1):
        raise ConfigError(f"--sweep {name}: {v} is out of range (must be {'> 0' if kind is float else '>= 1'})")
    if kind is int:
        if v != v.to_integral_value():
            raise ConfigError(f"--sweep {name}: {v} is not an integer")
        return int(v)
    return float(v)


def _range(name: str, spec: str, kind) -> list:
    parts = spec.split(":")
    try:
        start, stop, step = (Decimal(p.strip()) for p in parts) if len(parts) == 3 else (None,) * 3
    except InvalidOperation:
        start = None
    if start is None or not all(x.is_finite() for x in (start, stop, step)):
        raise ConfigError(f"--sweep {name}={spec}: expected start:stop:step, e.g. {name}=1:4:1")
    if step <= 0 or stop < start:
        raise ConfigError(f"--sweep {name}={spec}: needs step > 0 and stop >= start")
    n = int((stop - start) // step) + 1
    if n > MAX_POINTS:
        raise ConfigError(f"--sweep {name}={spec}: {n} values; at most {MAX_POINTS}")
    return [_checked(name, start + i * step, kind) for i in range(n)]


def parse_sweeps(texts) -> dict[str, list]:
    """Every ``--sweep`` option: ``{name: values}`` in the order given (the table's order).

    Raises
    ------
    ConfigError
        See :func:`parse_sweep`; an option swept twice; more than :data:`MAX_POINTS` points.
    """
    sweeps: dict[str, list] = {}
    for text in texts:
        name, values = parse_sweep(text)
        if name in sweeps:
            raise ConfigError(f"--sweep {name}: given twice; list all its values in one --sweep")
        sweeps[name] = values
    n = 1
    for values in sweeps.values():
        n *= len(values)
    if n > MAX_POINTS:
        raise ConfigError(f"--sweep: {n} points; at most {MAX_POINTS}")
    return sweeps


def sweep_points(sweeps: dict[str, list]) -> list[dict]:
    """The cartesian product of ``sweeps`` as ``{name: value}`` dicts, the last option varying fastest."""
    names = list(sweeps)
    return [dict(zip(names, combo)) for combo in itertools.product(*sweeps.values())]


def point_config(cfg: ReplayConfig, point: dict) -> tuple[ReplayConfig, float]:
    """The replay options of one point and its rate scale (1.0 when not swept).

    Raises
    ------
    ConfigError
        ``rate-scale`` in closed loop (arrival times are not used there); ``replicas``
        with ``disagg`` (which has prefill and decode pools); bad closed-loop options.
    """
    fields = {k.replace("-", "_"): v for k, v in point.items() if k != "rate-scale"}
    new = replace(cfg, **fields)
    scale = float(point.get("rate-scale", 1.0))
    if "rate-scale" in point and new.concurrency is not None:
        raise ConfigError("--sweep rate-scale: a closed loop (--concurrency) does not use arrival times; "
                          "sweep concurrency instead")
    if "replicas" in point and new.scheduler == "disagg":
        raise ConfigError("--sweep replicas: --scheduler disagg has --prefill-replicas and --decode-replicas")
    check_closed_loop(new.concurrency, new.think_time_s)
    return new, scale


@dataclass
class SweepContext:
    """What every point of a sweep shares (sent once to each worker).

    Attributes
    ----------
    frame : pandas.DataFrame
        The request trace.
    metadata : dict
        The trace's ``servecal.*`` metadata (see :func:`replay.simulate.replay_frame`).
    cost_model : replay.cost_model.RooflineCostModel
    cfg : ReplayConfig
        The options of every point but the swept ones.
    """

    frame: pd.DataFrame
    metadata: dict
    cost_model: object
    cfg: ReplayConfig


def evaluate_point(ctx: SweepContext, point: dict) -> dict:
    """Replay one point; its row of the sweep table.

    Returns
    -------
    dict
        The swept values (columns of :func:`column`), ``n_ok``, ``{metric}_p{q}_s`` of
        :data:`replay.compare.SCHEDULER_TABLE_METRICS` (seconds), ``goodput_rps`` and
        ``throughput_rps`` (requests/s, :func:`replay.metrics.goodput_rps` with and without
        the SLOs of ``ctx.cfg``).
    """
    cfg, scale = point_config(ctx.cfg, point)
    frame = ctx.frame
    if scale != 1.0:
        frame = frame.assign(arrival_time_s=frame["arrival_time_s"] / scale)
    result, _ = replay_frame(frame, ctx.cost_model, cfg, ctx.metadata)
    result = on_send_times(result)  # rates over the simulated sends of a closed loop
    row = scheduler_table({"": result}, cfg.slo_ttft_s, cfg.slo_tpot_s).iloc[0].to_dict()
    del row["scheduler"]
    row["throughput_rps"] = goodput_rps(result, None, None)
    return {**{column(k): v for k, v in point.items()}, **row}


# -- where the points run -----------------------------------------------------------------------

_WORKER_CONTEXT: SweepContext | None = None


def _init_worker(ctx: SweepContext) -> None:
    global _WORKER_CONTEXT
    _WORKER_CONTEXT = ctx


def _evaluate_in_worker(point: dict) -> dict:
    return evaluate_point(_WORKER_CONTEXT, point)


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ConfigError("--ray-address needs Ray, which is not installed: pip install 'servecal[ray]'") from None
    return ray


@contextlib.contextmanager
def ray_session(address: str):
    """Ray connected to ``address`` for the body (started here unless it already runs, then
    stopped again), so that several :func:`map_on_ray` calls share one connection."""
    ray = _import_ray()
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, log_to_driver=False)
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


def check_ray() -> None:
    """Raise a ConfigError naming ``pip install 'servecal[ray]'`` when Ray is not installed."""
    _import_ray()


def map_on_ray(fn, shared, items: list, address: str, on_done=None) -> list:
    """``[fn(shared, item) for item in items]`` as tasks of the Ray cluster at ``address``.

    ``shared`` (the trace and settings) goes to the object store once, not once per item;
    results come back in ``items`` order. Ray is started here unless it already runs, and
    stopped again. ``on_done(k)``, when given, is called as ``k`` more tasks finish.

    Raises
    ------
    ConfigError
        Ray is not installed (the message names ``pip install 'servecal[ray]'``).
    """
    ray = _import_ray()
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, log_to_driver=False)
    try:
        ref = ray.put(shared)
        task = ray.remote(fn)
        refs = [task.remote(ref, item) for item in items]
        if on_done is not None:
            pending = refs
            while pending:
                ready, pending = ray.wait(pending, num_returns=len(pending), timeout=0.5)
                if ready:
                    on_done(len(ready))
        return ray.get(refs)
    finally:
        if started:
            ray.shutdown()


def run_sweep(ctx: SweepContext, sweeps: dict[str, list], jobs: int | None = None,
              ray_address: str | None = None) -> pd.DataFrame:
    """Replay ``ctx.frame`` at every point of ``sweeps``; one row per point, in grid order.

    Parameters
    ----------
    ctx : SweepContext
    sweeps : dict[str, list]
        From :func:`parse_sweeps`.
    jobs : int, optional
        Local processes (default ``os.cpu_count()``); 1 runs the points here, one by one.
    ray_address : str, optional
        Run the points as tasks of the Ray cluster at this address (``auto``, ``ray://host:10001``);
        servecal must be installed on its workers.

    Returns
    -------
    pandas.DataFrame
        Rows of :func:`evaluate_point`; ``goodput_rps`` only when ``ctx.cfg`` has an SLO
        (without one it equals ``throughput_rps``). The same table whatever ``jobs`` or
        ``ray_address``.

    Raises
    ------
    ConfigError
        A point that cannot be replayed (checked for every point before any runs), ``jobs < 1``,
        Ray not installed.
    """
    points = sweep_points(sweeps)
    for p in points:
        point_config(ctx.cfg, p)
    if jobs is None:
        jobs = os.cpu_count() or 1
    if jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, not {jobs}")
    with optional_bar("sweep points", len(points)) as bar:  # None unless the CLI shows progress
        done = bar.update if bar is not None else None
        if ray_address is not None:
            rows = map_on_ray(evaluate_point, ctx, points, ray_address, done)
        elif min(jobs, len(points)) <= 1:
            rows = []
            for p in points:
                rows.append(evaluate_point(ctx, p))
                if done:
                    done(1)
        else:
            from .parallel import map_in_processes

            # spawned workers that ignore Ctrl-C: the parent alone reports it (exit 130)
            rows = map_in_processes(_evaluate_in_worker, points, min(jobs, len(points)), _init_worker, (ctx,), done)
    table = pd.DataFrame(rows)
    if ctx.cfg.slo_ttft_s is None and ctx.cfg.slo_tpot_s is None:
        table = table.drop(columns="goodput_rps")
    return table


# -- output ----------------------------------------------------------------------------------------

def format_sweep_table(table: pd.DataFrame, swept: list[str], percentiles=PERCENTILES, wide: bool = False) -> str:
    """A :func:`run_sweep` table as text: the swept values, then milliseconds and requests/s.

    Parameters
    ----------
    swept : list[str]
        The swept options (keys of :data:`PARAMS`), in column order.
    wide : bool
        Every column (p50, p90, p99 of each metric, ``_ms`` and ``_rps`` in the names).
        By default p50 and p90 of each metric, goodput and throughput, within
        :data:`replay.text.WIDTH` (100) characters a line (when many options are swept,
        E2E p90, n_ok, E2E p50, TPOT p90 and TTFT p90 are left out, in that order, until
        the table fits).
    """
    from .compare import NARROW_PERCENTILES, ms_cell
    from .text import WIDTH, render_table

    if table.empty:
        return "(no points)"
    cols = [column(n) for n in swept]
    qs = list(percentiles) if wide else ([q for q in NARROW_PERCENTILES if q in percentiles] or list(percentiles)[:2])
    stats = [(m, q) for m in TABLE_METRICS for q in qs]
    rates = [c for c in ("goodput_rps", "throughput_rps") if c in table]
    if wide:
        head = cols + ["n_ok"] + [f"{m}_p{q}_ms" for m, q in stats] + rates
    else:
        head = cols + ["n_ok"] + [f"{m}_p{q}" for m, q in stats] + [c.removesuffix("_rps") for c in rates]
    lines = []
    for r in table.to_dict("records"):  # keeps each column's type (iterrows would make ints floats)
        cells = [f"{r[c]:g}" if isinstance(r[c], float) else str(r[c]) for c in cols] + [str(r["n_ok"])]
        cells += [f"{r[f'{m}_p{q}_s'] * 1e3:.1f}" if wide else ms_cell(r[f"{m}_p{q}_s"]) for m, q in stats]
        cells += [f"{r[c]:.3f}" for c in rates]
        lines.append(cells)
    if wide:
        return render_table(head, lines)
    drop = ("e2e_p90", "n_ok", "e2e_p50", "tpot_p90", "ttft_p90")
    return render_table(head, lines, WIDTH, drop_order=drop)


def check_output_path(path: str) -> None:
    """Raise a ConfigError unless ``path`` ends in a format of :data:`OUTPUT_FORMATS`."""
    if Path(path).suffix.lower() not in OUTPUT_FORMATS:
        raise ConfigError(f"--sweep-out {path}: give a .parquet or .csv file")


def write_sweep_table(table: pd.DataFrame, path: str) -> None:
    """Write a sweep table as Parquet or CSV (by suffix), atomically (seconds, requests/s)."""
    from schemas.atomic import atomic_output

    check_output_path(path)
    with atomic_output(path) as tmp:
        if Path(path).suffix.lower() == ".csv":
            table.to_csv(tmp, index=False)
        else:
            table.to_parquet(tmp, index=False)
