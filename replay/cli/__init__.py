"""``replay``: run a trace through the simulated engine and compare with what was measured.

The command is here; its shared options are in :mod:`.options`, the engine settings'
sources in :mod:`.engine_settings`, ``--compare-schedulers`` and ``--sweep`` in
:mod:`.runners`, and ``traces describe --calibration`` in :mod:`.describe_load`. The engine,
numpy, pandas and pyarrow are imported when a command runs, not for ``--help``.
"""
from __future__ import annotations

import click

from schemas.calibration import Calibration
from traces.cli.support import DataError, FoldedCommand, user_errors, version_option
from schemas.kinds import AGGREGATE_TARGETS, REQUEST_TRACE, a_kind
from schemas.errors import SpecError
from schemas.specs import get_model

from ..config import EngineOptions
from ..errors import ConfigError, ReplayError
from ..text import wrap
from .engine_settings import (calibrated_cost_model, check_limits, engine_sources, fill_engine_options,
                              multi_scheduler_config, parse_measured_with, replay_config, taken_settings_checked)
from .baseline import refuse_tolerance, rederive_kv_blocks, whatif_differences
from .aggregate_levels import refuse_per_request_options, replay_levels, split_level
from .one_replay import (ReplayInputs, check_tolerances, print_comparison, replay_and_summarise,
                         write_outputs, write_replay_report)
from .options import (chrome_trace_options, command_line, hardware_options, output_options, parse_tolerances,
                      replay_options, report_folders, setting_option, show_progress)
from .runners import (TableReport, check_sweep_options, compare_schedulers_run, parse_scheduler_list,
                      sweep_run)

# an unknown --model is a bad option (exit 2), as in 'calibrate fit'; a bad spec inside a
# calibration file is reported as that file's fault (SchemaError, exit 1) by Calibration.read
#: The engine options the KV cache's size depends on (:func:`replay.analysis.kv_capacity_log.kv_blocks_from_logs`).
_KV_OPTIONS = ("num_gpu_blocks", "gpu_memory_utilization", "block_size", "max_num_seqs")
_errors = user_errors(data_errors=(ReplayError,), usage_errors=(ConfigError, SpecError), output_folders=report_folders)


@click.command(cls=FoldedCommand, context_settings={"help_option_names": ["-h", "--help"]})
@version_option()
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option("--calibration", "calibration_path", default=None, type=click.Path(dir_okay=False),
              help="Calibration JSON written by 'calibrate fit'.")
@click.option("--model", default=None, help="Replay another model on the calibrated GPU (catalog key, "
                                            "HF id or config.json).")
@hardware_options(None, " [default: the calibration's]")
@replay_options
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Write the replay result (replay_result/1 Parquet).")
@click.option("--steps-out", type=click.Path(dir_okay=False), default=None,
              help="Write the simulated step trace (step_trace/1 Parquet).")
@click.option("--token-times/--no-token-times", default=False, show_default=True,
              help="Record every predicted token time (pred_token_times_s).")
@click.option("--chrome-trace", type=click.Path(dir_okay=False), default=None,
              help="Write the simulated timeline as a Chrome/Perfetto trace (JSON, gzipped when it ends in .gz; "
                   "open in ui.perfetto.dev).")
@click.option("--chrome-trace-window", default=None, metavar="START:END",
              help="--chrome-trace: only the steps and requests within these seconds of simulated time "
                   "(e.g. 100:160; 100: or :60).")
@click.option("--chrome-trace-max-requests", type=click.IntRange(min=0), default=20_000, show_default=True,
              help="--chrome-trace: the first N requests of the window; the window ends where the next one "
                   "arrives (0: no limit).")
@click.option("--report", type=click.Path(dir_okay=False), default=None,
              help="Write a measured-vs-predicted report: .html (one self-contained file, figures embedded) "
                   "or .md (figures in the folder <name>_files beside it); with --sweep or --compare-schedulers "
                   "the table of predictions with its bands and a figure.")
@click.option("--measured-timeseries", type=click.Path(dir_okay=False), default=None,
              help="Measured 1 s time series (CSV: t, running, waiting, ...; vLLM's timeseries.csv; t in "
                   "seconds since the trace's start) to plot against the simulated counts in --report.")
@click.option("--tolerance", default=None,
              help="Exit 3 when an error exceeds its bound, e.g. ttft_p50=0.1,tpot_p50=0.1 (a replay of the "
                   "measured run only: refused when an option makes it a what-if).")
@click.option("--compare-schedulers", default=None, metavar="LIST",
              help="Replay the trace under each scheduler of LIST (e.g. fcfs,chunked,static,sjf,edf,disagg) "
                   "and print one table of predicted latency percentiles and goodput instead of the "
                   "comparison with measured latencies.")
@click.option("--sweep", multiple=True, metavar="NAME=VALUES",
              help="Replay at every point of a grid and print one table of predicted percentiles, goodput and "
                   "throughput. NAME: rate-scale (arrival times divided by it), scheduler, max-num-seqs, "
                   "max-num-batched-tokens, replicas, concurrency; VALUES: a,b,c or start:stop:step (stop "
                   "included when on the grid). Repeat for a cartesian product.")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="--sweep: local processes evaluating the points [default: the number of CPUs].")
@click.option("--ray-address", default=None, metavar="ADDR",
              help="--sweep: run the points on the Ray cluster at ADDR (auto, ray://host:10001); needs "
                   "pip install 'servecal[ray]' here and servecal on the cluster.")
@click.option("--sweep-out", type=click.Path(dir_okay=False), default=None,
              help="--sweep: also write the table (.parquet or .csv; seconds, requests/s).")
@setting_option("seed")
@click.option("--measured-with", multiple=True, metavar="SETTING=VALUE",
              help="An engine setting the trace's run was measured with, when its file does not record it "
                   "(max_num_seqs=128; repeatable): it fills that option as the run's own, so replaying the run "
                   "under it validates the calibration instead of being a what-if.")
@click.option("--band/--no-band", default=True, show_default=True,
              help="Replay at the calibration's band points too and print each prediction's 95 % band "
                   "(--sweep and --compare-schedulers: every row's).")
@output_options
@_errors
def main(trace, calibration_path, model, tp, dp, pp, expert_parallel, output, steps_out, token_times, chrome_trace,
         chrome_trace_window, chrome_trace_max_requests, report, measured_timeseries, tolerance, compare_schedulers,
         sweep, jobs, ray_address, sweep_out, vllm_log, wide, quiet, seed, measured_with, band, **kwargs):
    """Replay TRACE through the simulated engine; compare with measured latencies.

    TRACE may be aggregates (a benchmark's summary, Prometheus scrapes; FILE or FILE#K for one
    level): each level is replayed on a workload synthesized from its length statistics, as
    calibrate fit replays it, and every statistic it reports is set beside the prediction
    (--report: the same per level, with a figure).

    \b
    Example:
      replay run.parquet --calibration cal.json --scheduler chunked \\
             --max-num-seqs 128 --max-num-batched-tokens 2048 -o pred.parquet
      replay run.parquet --calibration cal.json --concurrency 32
      replay run.parquet --calibration cal.json --slo-ttft-s 0.5 \\
             --sweep rate-scale=0.5:3:0.25 --sweep scheduler=fcfs,chunked --sweep-out sweep.csv
    """
    from ..analysis.band_tables import format_prediction
    from ..config import RecordOptions
    from .band_run import advise_hint, main_band, measured_goodput, slo_words

    show_progress(quiet)
    tolerances = parse_tolerances(tolerance)
    outputs = (("-o", output), ("--steps-out", steps_out), ("--chrome-trace", chrome_trace),
               ("--measured-timeseries", measured_timeseries), ("--tolerance", tolerance))
    sweeps = check_sweep_options(sweep, jobs, ray_address, sweep_out, compare_schedulers,
                                 outputs + (("--token-times", token_times),))
    names = _scheduler_names(compare_schedulers, outputs)
    trace_window = chrome_trace_options(chrome_trace, chrome_trace_window, chrome_trace_max_requests)
    timeseries = _measured_timeseries(report, measured_timeseries)
    if calibration_path is None:
        raise click.UsageError("Missing option '--calibration' (make one: calibrate fit TRACE --model M --gpu G "
                               "-o cal.json)")
    kwargs.update(tp=tp, dp=dp, pp=pp)
    load_typed = {"--concurrency": kwargs.get("concurrency"), "--think-time-s": kwargs.get("think_time_s")}
    trace, level = split_level(trace)
    run = _read_inputs(trace, calibration_path, model, expert_parallel, vllm_log, kwargs, band,
                       parse_measured_with(measured_with))
    if run.kind == AGGREGATE_TARGETS:
        refuse_per_request_options({**dict(outputs), "--token-times": token_times, "--sweep": sweep,
                                    "--compare-schedulers": compare_schedulers, **load_typed})
        kwargs["seed"] = seed
        with taken_settings_checked():
            replay_levels(run, level, wide, report)
        return
    if level is not None:
        raise DataError(f"{trace}#{level}: #K picks a level of aggregates ({AGGREGATE_TARGETS}); {trace} is a "
                        f"request trace, replayed whole")
    if tolerances:
        refuse_tolerance(run.differences)
    _set_kv_blocks(run)
    if measured_timeseries:
        from ..report import check_timeseries_span

        warning = check_timeseries_span(timeseries, measured_timeseries, run.frame)  # before the replay
        if warning:
            click.echo(wrap(warning), err=True)
    kwargs["seed"] = seed
    if names is not None or sweeps is not None:
        _table_of_predictions(run, names, sweeps, jobs, ray_address, sweep_out, wide, quiet, report)
        return
    with taken_settings_checked():
        cfg = replay_config(kwargs, RecordOptions(token_times=token_times, steps=steps_out is not None or bool(report),
                                                  step_requests=chrome_trace is not None))
    result, engine, seconds = replay_and_summarise(run, cfg)
    # the band before any file is written: a band that cannot be computed leaves no output changed
    pred_band = main_band(run.frame, run.meta, run.cost_model, cfg, run.points, result, seconds, run.basis)
    write_outputs(run, cfg, result, engine, output, steps_out, chrome_trace, trace_window, chrome_trace_max_requests)
    for note in pred_band.warnings:
        click.echo(wrap(f"warning: {note}"), err=True)
    click.echo(format_prediction(pred_band, slo_words(cfg.scheduling), measured_goodput(result, cfg.scheduling),
                                 wide=wide, legend=None if band else "no band (--no-band)"))
    hint = advise_hint(run.calibration_path, run.frame, cfg, pred_band, run.differences)
    if hint:
        click.echo(wrap(hint))
    table = print_comparison(run, result, pred_band, wide)
    if report:
        write_replay_report(run, cfg, result, engine, report, timeseries, tolerances, pred_band, band)
    if tolerances:
        check_tolerances(table, tolerances)


def _scheduler_names(compare_schedulers: str | None, outputs) -> list[str] | None:
    """The schedulers of ``--compare-schedulers`` (None: not given); refused with one of ``outputs``
    (``(option, value)`` pairs: the outputs of a single replay)."""
    if compare_schedulers is None:
        return None
    names = parse_scheduler_list(compare_schedulers)
    clash = [opt for opt, v in outputs if v]
    if clash:
        raise ConfigError(f"--compare-schedulers prints one table of predictions; it cannot be combined "
                          f"with {', '.join(clash)}")
    return names


def _measured_timeseries(report, measured_timeseries):
    """The ``--measured-timeseries`` table (None: not given), read, and ``--report``'s format checked,
    before the replay."""
    if measured_timeseries and not report:
        raise click.UsageError("--measured-timeseries is drawn in the report: give --report too")
    if not report:
        return None
    from ..report import read_timeseries, report_format

    report_format(report)  # an unknown suffix fails before the replay
    return read_timeseries(measured_timeseries) if measured_timeseries else None


def _read_inputs(trace, calibration_path, model, expert_parallel, vllm_log, settings: dict,
                 band: bool, measured_with: dict | None = None) -> ReplayInputs:
    """Read the calibration and the trace; fill ``settings`` (the engine options by name, ``tp``,
    ``dp`` and ``pp`` among them, taken out) from their sources and build the cost model. Says
    on stderr where settings came from and what is extrapolated."""
    from traces.io import read_trace

    cal = Calibration.read(calibration_path)
    model_spec = get_model(model) if model else None
    sources = engine_sources(vllm_log, cal, calibration_path, trace, measured_with)
    for line in fill_engine_options(settings, sources):
        click.echo(wrap(line), err=True)
    tp, dp, pp = settings.pop("tp"), settings.pop("dp"), settings.pop("pp")
    with taken_settings_checked():
        cost_model = calibrated_cost_model(calibration_path, cal, model_spec, tp, dp, pp, expert_parallel)
        kv_note = rederive_kv_blocks(settings, sources, cal, cost_model)
    if kv_note:
        click.echo(wrap(kv_note), err=True)
    if model_spec is not None and model_spec.name != cal.model.name:
        click.echo(wrap(f"note: the calibration was fitted on {cal.model.name}; its efficiencies are carried over "
                        f"to {model_spec.name} on the same GPU (an extrapolation: check against a measured run)"),
                   err=True)
    kind, frame, meta = read_trace(trace)
    if kind not in (REQUEST_TRACE, AGGREGATE_TARGETS):
        raise DataError(f"{trace}: is {a_kind(kind)}; replay needs a request trace ({REQUEST_TRACE}) or aggregates "
                        f"({AGGREGATE_TARGETS})")
    differences = whatif_differences(cal, calibration_path, model_spec, cost_model, settings["scheduler"], meta,
                                     trace, sources)
    from ..analysis.band_basis import BandBasis, carried_across

    # points None: no band replays at all (--no-band)
    basis = (BandBasis.of(cal, carried_across(cal, cost_model), scheduler=settings["scheduler"]) if band
             else BandBasis())
    return ReplayInputs(trace, calibration_path, cal, cost_model, frame, meta, settings, differences,
                        cal.band_points if band else None, basis, kind)


def _set_kv_blocks(run: ReplayInputs) -> None:
    """Warn when the trace exceeds the engine's limits; size the KV cache from the trace's log when
    it records one and this replays the measured run (:func:`replay.analysis.kv_capacity_log.kv_blocks_from_logs`)."""
    settings = run.settings
    warning = check_limits(str(run.trace), run.frame, settings["max_num_seqs"], run.cost_model.dp)
    if warning:
        click.echo(wrap(warning), err=True)
    from ..analysis.kv_capacity_log import kv_blocks_from_logs  # numpy: not for --help

    blocks, kv_line = kv_blocks_from_logs(
        [(str(run.trace), run.frame)], EngineOptions(**{k: settings[k] for k in _KV_OPTIONS}), run.cost_model,
        not run.differences and settings["scheduler"] != "disagg" and settings["replicas"] == 1)
    if blocks is not None:  # the bound alone is said by calibrate fit, not at every replay
        settings["num_gpu_blocks"] = blocks
        click.echo(wrap(kv_line), err=True)


def _table_of_predictions(run: ReplayInputs, names, sweeps, jobs, ray_address, sweep_out, wide, quiet,
                          report) -> None:
    """``--compare-schedulers`` (``names``) or ``--sweep`` (``sweeps``): one table of predictions."""
    def table_report(cfg) -> TableReport | None:
        """Where and what the report of a table of predictions says was run (--report)."""
        from ..report import report_context

        if not report:
            return None
        return TableReport(report, report_context(run.trace, run.calibration_path, run.cost_model, cfg,
                                                  command=command_line()),
                           (str(run.calibration_path), run.cal), run.trace)

    with taken_settings_checked():
        if names is not None:
            cfg, disagg = multi_scheduler_config(run.settings)
            compare_schedulers_run(run.frame, run.meta, run.cost_model, cfg, disagg, names, wide, run.points,
                                   run.basis, table_report(cfg))
            return
        cfg, disagg = (multi_scheduler_config(run.settings) if "scheduler" in sweeps
                       else (replay_config(run.settings), None))
        sweep_run(run.frame, run.meta, run.cost_model, cfg, sweeps, jobs, ray_address, sweep_out, wide, quiet, disagg,
                  run.points, run.basis, table_report(cfg))
