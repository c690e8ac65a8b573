"""The two modes of ``replay`` that print one table of predictions instead of a comparison:
``--compare-schedulers`` and ``--sweep``."""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import click

from ..errors import ConfigError
from ..schedulers import check_scheduler_names
from ..text import wrap

if TYPE_CHECKING:
    from ..config import DisaggOptions, ReplayConfig


class TableReport(NamedTuple):
    """``--report`` of a table of predictions: its path, what was run
    (:func:`replay.report.report_context`), the calibration (``(path, Calibration)``) and the trace."""

    path: str
    context: list
    calibration: tuple
    trace: str


def parse_scheduler_list(text: str) -> list[str]:
    """``"fcfs,chunked,disagg"`` -> ``["fcfs", "chunked", "disagg"]``, every name checked before any replay.

    Raises
    ------
    ConfigError
        An empty list, a repeated name or an unknown scheduler.
    """
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ConfigError("--compare-schedulers: give a comma-separated list, e.g. fcfs,chunked,disagg")
    check_scheduler_names(names, "--compare-schedulers")
    return names


def compare_schedulers_run(frame, meta, cost_model, cfg: ReplayConfig, disagg: DisaggOptions | None,
                           names: list[str], wide: bool = False, points: list | None = (),
                           basis=None, report: TableReport | None = None) -> None:
    """Replay ``frame`` under each scheduler of ``names`` (``cfg`` otherwise) and print one table
    (and write it, with a figure, to ``report``).

    Colocated schedulers run on ``cfg``'s replicas, ``disagg`` on the pools ``disagg``
    (:meth:`~replay.config.ReplayConfig.with_scheduler`); the ``gpus`` column says how many GPUs
    each uses. Each row carries its 95 % band from the calibration's band ``points``
    (:func:`.band_run.band_of_replay`; none: no band).
    """
    import time

    import pandas as pd

    from ..analysis.band_tables import band_columns, band_legend
    from ..analysis.bands import prediction_row
    from ..analysis.band_tables import format_scheduler_table
    from ..core.disagg_pools import describe_config
    from ..simulate import replay_frame
    from .band_run import band_of_replay

    m, eng, sched = cost_model.model, cfg.engine, cfg.scheduling
    click.echo(wrap(f"comparing {len(names)} schedulers on {len(frame)} requests: model {m.name}, "
                    f"{hardware(cost_model, sched.replicas)}, max_num_seqs={eng.max_num_seqs}, "
                    f"max_num_batched_tokens={eng.max_num_batched_tokens}"))
    if "disagg" in names:
        click.echo(wrap(f"  disagg: {describe_config(cost_model, cfg.with_scheduler('disagg', disagg).disagg)}"))
    rows, band = [], None
    for name in names:
        run = cfg.with_scheduler(name, disagg)
        started = time.perf_counter()
        result, _ = replay_frame(frame, cost_model, run, meta)
        row = prediction_row(result, sched.slo_ttft_s, sched.slo_tpot_s)
        band = band_of_replay(frame, meta, cost_model, run, points, row, time.perf_counter() - started,
                              basis.with_scheduler(name) if basis is not None else None, result)
        rows.append({"scheduler": name, "gpus": num_gpus(cost_model, sched.replicas, run.disagg),
                     **band_columns(row, band)})
    table = pd.DataFrame(rows)
    click.echo(format_scheduler_table(table, wide=wide))
    slo = [f"{k} <= {v} s" for k, v in (("ttft", sched.slo_ttft_s), ("tpot", sched.slo_tpot_s)) if v is not None]
    note = ("Predicted, ms over completed requests; goodput: completed requests/s"
            + (f" meeting {' and '.join(slo)}" if slo else "; no --slo-ttft-s/--slo-tpot-s given"))
    legend = band_legend(band, no_band(points))
    click.echo(wrap(f"({note[0].lower()}{note[1:]}" + ("" if wide else "; --wide: every column") + f"; {legend})"))
    if report is not None:
        from ..report.predictions import write_scheduler_report

        written = write_scheduler_report(report.path, table, report.context, report.calibration, report.trace,
                                         legend, note + ".")
        click.echo(wrap(f"wrote {', '.join(map(str, written))}"))


def no_band(points: list | None) -> str:
    """Why a table has no band: ``--no-band`` given (``points`` None), or a calibration without band points."""
    from ..analysis.band_tables import NO_BAND_POINTS

    return "no band (--no-band)" if points is None else NO_BAND_POINTS


def hardware(cost_model, replicas: int) -> str:
    """``"2 replicas of 2 x h100-80gb (TP=2), 4 GPUs"``, ``"1 x h100-80gb (TP=1)"`` or, with
    data parallelism, ``"2 x rtx-pro-6000 (TP=1, DP=2)"`` (pipeline: ``PP=2``, its GPUs counted)."""
    dp, pp = getattr(cost_model, "dp", 1), getattr(cost_model, "pp", 1)
    one = (f"{num_gpus(cost_model, 1)} x {cost_model.gpu.name} (TP={cost_model.tp}{f', DP={dp}' if dp > 1 else ''}"
           f"{f', PP={pp}' if pp > 1 else ''})")
    if replicas == 1:
        return one
    return f"{replicas} replicas of {one}, {num_gpus(cost_model, replicas)} GPUs"


def deployment_words(cost_model, cfg) -> str:
    """What a replay runs on, as its header says it: ``"model llama-3.1-8b, 1 x h100-80gb (TP=1),
    scheduler chunked, max_num_seqs=256, max_num_batched_tokens=8192"`` (``disagg``: its pools,
    :func:`replay.core.disagg_pools.describe_config`)."""
    from ..core.disagg_pools import describe_config

    eng, sched = cfg.engine, cfg.scheduling
    where = (f"scheduler disagg: {describe_config(cost_model, cfg.disagg)}" if cfg.disagg is not None else
             f"{hardware(cost_model, sched.replicas)}, scheduler {sched.scheduler}")
    return (f"model {cost_model.model.name}, {where}, max_num_seqs={eng.max_num_seqs}, "
            f"max_num_batched_tokens={eng.max_num_batched_tokens}")


def num_gpus(cost_model, replicas: int, disagg=None) -> int:
    """GPUs a run uses: ``replicas`` x TP x DP x PP colocated, or the prefill and decode pools'
    (:func:`replay.core.disagg_pools.pool_gpus`) of ``disagg`` (:class:`~replay.config.DisaggOptions`)."""
    if disagg is not None:
        from ..core.disagg_pools import pool_gpus

        return pool_gpus(cost_model, disagg)
    return replicas * cost_model.tp * getattr(cost_model, "dp", 1) * getattr(cost_model, "pp", 1)


def check_sweep_options(sweep, jobs, ray_address, sweep_out, compare_schedulers, exclusive) -> dict | None:
    """Parse ``--sweep`` and check the options that go with it, before anything runs.

    Parameters
    ----------
    sweep : tuple[str, ...]
        The ``--sweep`` values.
    jobs, ray_address, sweep_out, compare_schedulers
        The options of the same names (None when not given).
    exclusive : sequence of (option, value)
        Options that a sweep cannot be combined with (set when truthy).

    Returns
    -------
    dict or None
        ``{name: values}`` (:func:`replay.sweep.parse_sweeps`); None without ``--sweep``.

    Raises
    ------
    ConfigError
        A bad ``--sweep``; ``--jobs``/``--ray-address``/``--sweep-out`` without it; an option
        both swept and given; a clash with another mode; Ray not installed; an output that is
        neither .parquet nor .csv.
    """
    from ..ray_tasks import check_ray
    from ..sweep import check_output_path, parse_sweeps

    if not sweep:
        given = [opt for opt, v in (("--jobs", jobs), ("--ray-address", ray_address), ("--sweep-out", sweep_out))
                 if v is not None]
        if given:
            raise ConfigError(f"{', '.join(given)}: only --sweep uses these")
        return None
    sweeps = parse_sweeps(sweep)
    clash = (["--compare-schedulers"] if compare_schedulers is not None else []) + [o for o, v in exclusive if v]
    if clash:
        raise ConfigError(f"--sweep prints one table of predictions; it cannot be combined with {', '.join(clash)}")
    ctx = click.get_current_context()
    fixed = [f"--{n}" for n in sweeps if n != "rate-scale"
             and ctx.get_parameter_source(n.replace("-", "_")) == click.core.ParameterSource.COMMANDLINE]
    if fixed:
        raise ConfigError(f"{', '.join(fixed)}: swept by --sweep, so give its values there only")
    if ray_address is not None:
        if jobs is not None:
            raise ConfigError("--jobs: with --ray-address the Ray cluster runs the points")
        check_ray()
    if sweep_out:
        check_output_path(sweep_out)
    return sweeps


def sweep_run(frame, meta, cost_model, cfg: ReplayConfig, sweeps: dict, jobs: int | None, ray_address: str | None,
              sweep_out: str | None, wide: bool = False, quiet: bool = False,
              disagg: DisaggOptions | None = None, points: list | None = (),
              basis=None, report: TableReport | None = None) -> None:
    """Replay ``frame`` at every point of ``sweeps`` (``cfg`` otherwise; ``disagg``: the pools of swept
    ``disagg`` points), each also at the calibration's band ``points`` for its band; print the
    table, write ``sweep_out`` and the ``report``."""
    import os
    import time

    from ..analysis.band_tables import band_legend, row_band
    from ..sweep import SweepContext, format_sweep_table, run_sweep, sweep_points, write_sweep_table

    from traces.transform import rescaled_arrival_problem

    for scale in sweeps.get("rate-scale", ()):
        problem = rescaled_arrival_problem(frame["arrival_time_s"], float(scale))
        if problem:
            raise ConfigError(f"--sweep rate-scale={scale:g}: {problem}", options=("sweep",))
    n = len(sweep_points(sweeps))
    m, eng, sched, concurrency = cost_model.model, cfg.engine, cfg.scheduling, cfg.closed_loop.concurrency
    loop = "" if concurrency is None else f", closed loop: {concurrency} clients"
    click.echo(wrap(f"sweeping {n} points ({' x '.join(f'{len(v)} {k}' for k, v in sweeps.items())}) on "
                    f"{len(frame)} requests: model {m.name}, {hardware(cost_model, sched.replicas)}, "
                    f"scheduler {sched.scheduler}, max_num_seqs={eng.max_num_seqs}, "
                    f"max_num_batched_tokens={eng.max_num_batched_tokens}{loop} (swept options override these)"))
    start = time.perf_counter()
    from ..analysis.bands import BandBasis

    context = SweepContext(frame, meta or {}, cost_model, cfg, disagg, points, basis or BandBasis())
    table = run_sweep(context, sweeps, jobs, ray_address)
    where = (f"on Ray ({ray_address})" if ray_address else
             f"on {min(jobs or os.cpu_count() or 1, n)} local process(es)")
    click.echo(format_sweep_table(table, list(sweeps), wide=wide))
    slo = [f"{k} <= {v} s" for k, v in (("ttft", sched.slo_ttft_s), ("tpot", sched.slo_tpot_s)) if v is not None]
    note = ("Predicted, ms over completed requests; throughput: completed requests/s"
            + (f"; goodput: those meeting {' and '.join(slo)}" if slo else
               "; give --slo-ttft-s/--slo-tpot-s for goodput"))
    legend = band_legend(row_band(table.iloc[0].to_dict()) if len(table) else None, no_band(points))
    click.echo(wrap(f"({note[0].lower()}{note[1:]}" + ("" if wide else "; --wide: every column") + f"; {legend})"))
    if not quiet:
        click.echo(f"{n} points in {time.perf_counter() - start:.1f} s {where}", err=True)
    if sweep_out:
        write_sweep_table(table, sweep_out)
        click.echo(f"wrote {sweep_out}")
    if report is not None:
        from ..report.predictions import write_sweep_report

        written = write_sweep_report(report.path, table, list(sweeps), report.context, report.calibration,
                                     report.trace, legend, note + ".")
        click.echo(wrap(f"wrote {', '.join(map(str, written))}"))
