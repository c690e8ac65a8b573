"""Parameter sweeps (``replay --sweep``): replay one trace at every point of a grid of options.

``--sweep rate-scale=0.5:3:0.25 --sweep scheduler=fcfs,chunked`` replays the trace at each
point of the cartesian product of the swept values and tabulates the predicted latency
percentiles, goodput and throughput, one row per point. Points are independent replays,
so they run in parallel: local processes by default (:func:`replay.parallel.map_in_processes`,
spawn start method, Ctrl-C handled by the parent alone), or the tasks of a Ray cluster. Every
point is evaluated by the same function with the same inputs, so the table does not depend on where or in which order
the points ran.

This module runs the points; the grid is parsed in :mod:`.grid`, the table printed and
written in :mod:`.table`, and Ray tasks come from :mod:`replay.ray_tasks`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import pandas as pd

from ..analysis.band_tables import band_columns
from ..analysis.bands import BandBasis, BandJob, band_of_rows, point_details, predict_with_band, prediction_row
from ..config import DisaggOptions, ReplayConfig
from ..errors import ConfigError
from ..progress import optional_bar
from ..ray_tasks import map_on_ray
from ..simulate import replay_frame
from .grid import MAX_POINTS, PARAMS, column, parse_sweep, parse_sweeps, sweep_points
from .table import OUTPUT_FORMATS, check_output_path, format_sweep_table, write_sweep_table

__all__ = ["MAX_POINTS", "OUTPUT_FORMATS", "PARAMS", "SweepContext", "check_output_path", "column", "evaluate_point",
           "format_sweep_table", "parse_sweep", "parse_sweeps", "point_config", "run_sweep", "sweep_points",
           "write_sweep_table"]


def point_config(cfg: ReplayConfig, point: dict, disagg: DisaggOptions | None = None) -> tuple[ReplayConfig, float]:
    """The replay options of one point and its rate scale (1.0 when not swept).

    A swept ``scheduler`` goes through :meth:`ReplayConfig.with_scheduler` (``disagg``: the
    pools ``disagg``).

    Raises
    ------
    ConfigError
        ``rate-scale`` in closed loop (arrival times are not used there); ``replicas``
        with ``disagg`` (which has prefill and decode pools); bad options.
    """
    options = {k.replace("-", "_"): v for k, v in point.items() if k != "rate-scale"}
    scheduler = options.pop("scheduler", None)
    new = cfg if scheduler is None else cfg.with_scheduler(scheduler, disagg)
    if "replicas" in point and new.scheduling.scheduler == "disagg":
        raise ConfigError("--sweep replicas: --scheduler disagg has --prefill-replicas and --decode-replicas")
    if options:
        new = new.with_options(**options)
    scale = float(point.get("rate-scale", 1.0))
    if "rate-scale" in point and new.closed_loop.concurrency is not None:
        raise ConfigError("--sweep rate-scale: a closed loop (--concurrency) does not use arrival times; "
                          "sweep concurrency instead")
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
    cost_model : replay.cost.cost_model.RooflineCostModel
    cfg : ReplayConfig
        The options of every point but the swept ones.
    disagg : DisaggOptions, optional
        The pools of the points whose swept ``scheduler`` is ``disagg`` (default: ``cfg``'s
        or :class:`DisaggOptions`'s defaults).
    band_points : list of dict or None
        The calibration's band points (:attr:`schemas.calibration.Calibration.band_points`):
        every point of the sweep is also replayed at each, for its band (empty: no band but
        the seed spread where the replay draws; None: no band at all).
    basis : replay.analysis.bands.BandBasis
        The rest of what a band takes from the calibration (held-out errors, fitted load, transfer).
    """

    frame: pd.DataFrame
    metadata: dict
    cost_model: object
    cfg: ReplayConfig
    disagg: DisaggOptions | None = None
    band_points: list | None = field(default_factory=list)
    basis: BandBasis = field(default_factory=BandBasis)


def evaluate_point(ctx: SweepContext, point: dict) -> dict:
    """Replay one point; its row of the sweep table.

    The band points are replayed here, one after the other: the sweep's points already
    keep every worker busy.

    Returns
    -------
    dict
        The swept values (columns of :func:`column`), ``n_ok``, ``{metric}_p{q}_s`` of
        :data:`replay.analysis.compare.SCHEDULER_TABLE_METRICS` (seconds), ``goodput_rps`` and
        ``throughput_rps`` (requests/s, :func:`replay.analysis.metrics.goodput_rps` with and without
        the SLOs of ``ctx.cfg``), and their bands: ``{stat}_low``, ``{stat}_high`` for every
        stat of :data:`replay.analysis.bands.BAND_STATS`, ``band_points`` and ``band_seeds``
        (:func:`replay.analysis.band_tables.band_columns`).
    """
    cfg, scale = point_config(ctx.cfg, point, ctx.disagg)
    frame = ctx.frame
    if scale != 1.0:
        frame = frame.assign(arrival_time_s=frame["arrival_time_s"] / scale)
    result, _ = replay_frame(frame, ctx.cost_model, cfg, ctx.metadata)
    row = prediction_row(result, cfg.scheduling.slo_ttft_s, cfg.scheduling.slo_tpot_s)
    band = (band_of_rows(row, []) if ctx.band_points is None else
            predict_with_band(BandJob(frame, ctx.metadata, ctx.cost_model, cfg, list(ctx.band_points),
                                      ctx.basis.with_scheduler(cfg.scheduling.scheduler)),
                              row, details=point_details(result, ctx.basis.new_sample)))
    return {**{column(k): v for k, v in point.items()}, **band_columns(row, band)}


# -- where the points run -----------------------------------------------------------------------

_WORKER_CONTEXT: SweepContext | None = None


def _init_worker(ctx: SweepContext) -> None:
    global _WORKER_CONTEXT
    _WORKER_CONTEXT = ctx


def _evaluate_in_worker(point: dict) -> dict:
    return evaluate_point(_WORKER_CONTEXT, point)


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
        point_config(ctx.cfg, p, ctx.disagg)
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
            from ..parallel import map_in_processes

            # spawned workers that ignore Ctrl-C: the parent alone reports it (exit 130)
            rows = map_in_processes(_evaluate_in_worker, points, min(jobs, len(points)), _init_worker, (ctx,), done)
    table = pd.DataFrame(rows)
    if ctx.cfg.scheduling.slo_ttft_s is None and ctx.cfg.scheduling.slo_tpot_s is None:
        table = table.drop(columns=["goodput_rps", "goodput_rps_low", "goodput_rps_high"])
    return table


