"""``replay``: run a trace through the simulated engine and compare with what was measured.

The command is here; its shared options are in :mod:`.options`, the engine settings'
sources in :mod:`.engine_settings`, ``--compare-schedulers`` and ``--sweep`` in
:mod:`.runners`, and ``traces describe --calibration`` in :mod:`.describe_load`. The engine,
numpy, pandas and pyarrow are imported when a command runs, not for ``--help``.
"""
from __future__ import annotations

import time

import click

from schemas.calibration import Calibration
from traces.cli.support import DataError, FoldedCommand, user_errors, version_option
from schemas.kinds import REPLAY_RESULT, REQUEST_TRACE, STEP_TRACE
from schemas.errors import SpecError
from schemas.specs import get_model
from schemas.status import OK, REJECTED

from ..config import EngineOptions
from ..errors import ConfigError, ReplayError
from ..text import wrap
from .engine_settings import (calibrated_cost_model, check_limits, engine_sources, fill_engine_options,
                              multi_scheduler_config, replay_config, taken_settings_checked)
from .baseline import refuse_tolerance, rederive_kv_blocks, whatif_differences
from .options import (chrome_trace_options, command_line, hardware_options, output_options, parse_tolerances,
                      replay_options, report_folders, setting_option, show_progress)
from .runners import (TableReport, check_sweep_options, compare_schedulers_run, hardware, parse_scheduler_list,
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
@click.option("--band/--no-band", default=True, show_default=True,
              help="Replay at the calibration's band points too and print each prediction's 95 % band "
                   "(--sweep and --compare-schedulers: every row's).")
@output_options
@_errors
def main(trace, calibration_path, model, tp, dp, pp, expert_parallel, output, steps_out, token_times, chrome_trace, chrome_trace_window,
         chrome_trace_max_requests, report, measured_timeseries, tolerance, compare_schedulers, sweep, jobs,
         ray_address, sweep_out, vllm_log, wide, quiet, seed, band, **kwargs):
    """Replay TRACE through the simulated engine; compare with measured latencies.

    \b
    Example:
      replay run.parquet --calibration cal.json --scheduler chunked \\
             --max-num-seqs 128 --max-num-batched-tokens 2048 -o pred.parquet
      replay run.parquet --calibration cal.json --concurrency 32
      replay run.parquet --calibration cal.json --slo-ttft-s 0.5 \\
             --sweep rate-scale=0.5:3:0.25 --sweep scheduler=fcfs,chunked --sweep-out sweep.csv
    """
    from traces.io import read_trace

    from ..core.closed_loop import on_send_times
    from ..analysis.compare import METRICS, broken_tolerances, compare, format_table
    from ..core.disagg import DisaggEngine, describe_config
    from ..schedulers import get_scheduler_factory
    from ..config import RecordOptions
    from ..core.result_columns import steps_frame
    from ..simulate import replay_frame
    from ..analysis.band_tables import band_coverage, format_prediction
    from ..analysis.whatif_table import format_whatif_table
    from .band_run import main_band, measured_goodput, slo_words

    show_progress(quiet)
    tolerances = parse_tolerances(tolerance)
    names = None
    sweeps = check_sweep_options(sweep, jobs, ray_address, sweep_out, compare_schedulers,
                                 (("-o", output), ("--steps-out", steps_out), ("--chrome-trace", chrome_trace),
                                  ("--measured-timeseries", measured_timeseries), ("--tolerance", tolerance),
                                  ("--token-times", token_times)))
    if compare_schedulers is not None:
        names = parse_scheduler_list(compare_schedulers)
        clash = [opt for opt, v in (("-o", output), ("--steps-out", steps_out), ("--chrome-trace", chrome_trace),
                                    ("--measured-timeseries", measured_timeseries), ("--tolerance", tolerance))
                 if v]
        if clash:
            raise ConfigError(f"--compare-schedulers prints one table of predictions; it cannot be combined "
                              f"with {', '.join(clash)}")
    trace_window = chrome_trace_options(chrome_trace, chrome_trace_window, chrome_trace_max_requests)
    if measured_timeseries and not report:
        raise click.UsageError("--measured-timeseries is drawn in the report: give --report too")
    if report:
        from ..report import read_timeseries, report_format

        report_format(report)  # an unknown suffix fails before the replay
        timeseries = read_timeseries(measured_timeseries) if measured_timeseries else None
    if calibration_path is None:
        raise click.UsageError("Missing option '--calibration' (make one: calibrate fit TRACE --model M --gpu G "
                               "-o cal.json)")
    cal = Calibration.read(calibration_path)
    model_spec = get_model(model) if model else None
    kwargs.update(tp=tp, dp=dp, pp=pp)
    sources = engine_sources(vllm_log, cal, calibration_path, trace)
    for line in fill_engine_options(kwargs, sources):
        click.echo(wrap(line), err=True)
    tp, dp, pp = kwargs.pop("tp"), kwargs.pop("dp"), kwargs.pop("pp")
    with taken_settings_checked():
        cost_model = calibrated_cost_model(calibration_path, cal, model_spec, tp, dp, pp, expert_parallel)
        kv_note = rederive_kv_blocks(kwargs, sources, cal, cost_model)
    if kv_note:
        click.echo(wrap(kv_note), err=True)
    points = cal.band_points if band else None  # None: no band replays at all (--no-band)
    model_error = cal.model_error if band else {}
    if model_spec is not None and model_spec.name != cal.model.name:
        click.echo(wrap(f"note: the calibration was fitted on {cal.model.name}; its efficiencies are carried over "
                        f"to {model_spec.name} on the same GPU (an extrapolation: check against a measured run)"),
                   err=True)
    kind, frame, meta = read_trace(trace)
    if kind != REQUEST_TRACE:
        raise DataError(f"{trace}: is a {kind}; replay needs a request trace ({REQUEST_TRACE})")
    differences = whatif_differences(cal, calibration_path, model_spec, cost_model, kwargs["scheduler"], meta,
                                     trace, sources)
    if tolerances:
        refuse_tolerance(differences)
    warning = check_limits(str(trace), frame, kwargs["max_num_seqs"], cost_model.dp)
    if warning:
        click.echo(wrap(warning), err=True)
    from ..analysis.kv_capacity_log import kv_blocks_from_logs  # numpy: not for --help

    blocks, kv_line = kv_blocks_from_logs(
        [(str(trace), frame)], EngineOptions(**{k: kwargs[k] for k in _KV_OPTIONS}), cost_model,
        not differences and kwargs["scheduler"] != "disagg" and kwargs["replicas"] == 1)
    if blocks is not None:  # the bound alone is said by calibrate fit, not at every replay
        kwargs["num_gpu_blocks"] = blocks
        click.echo(wrap(kv_line), err=True)
    if measured_timeseries:
        from ..report import check_timeseries_span

        warning = check_timeseries_span(timeseries, measured_timeseries, frame)  # before the replay
        if warning:
            click.echo(wrap(warning), err=True)
    kwargs["seed"] = seed

    def table_report(cfg) -> TableReport | None:
        """Where and what the report of a table of predictions says was run (--report)."""
        from ..report import report_context

        if not report:
            return None
        return TableReport(report, report_context(trace, calibration_path, cost_model, cfg, command=command_line()),
                           (str(calibration_path), cal), trace)

    if names is not None:
        with taken_settings_checked():
            cfg, disagg = multi_scheduler_config(kwargs)
            compare_schedulers_run(frame, meta, cost_model, cfg, disagg, names, wide, points, model_error,
                                   table_report(cfg))
        return
    if sweeps is not None:
        with taken_settings_checked():
            cfg, disagg = multi_scheduler_config(kwargs) if "scheduler" in sweeps else (replay_config(kwargs), None)
            sweep_run(frame, meta, cost_model, cfg, sweeps, jobs, ray_address, sweep_out, wide, quiet, disagg, points,
                      model_error, table_report(cfg))
        return
    with taken_settings_checked():
        cfg = replay_config(kwargs, RecordOptions(token_times=token_times, steps=steps_out is not None or bool(report),
                                                  step_requests=chrome_trace is not None))
    eng, sched, closed = cfg.engine, cfg.scheduling, cfg.closed_loop
    if cfg.disagg is None:
        get_scheduler_factory(sched.scheduler)  # a bad --scheduler fails before anything is printed
    m = cost_model.model
    where = (f"scheduler disagg: {describe_config(cost_model, cfg.disagg)}" if cfg.disagg is not None else
             f"{hardware(cost_model, sched.replicas)}, scheduler {sched.scheduler}")
    loop = "" if closed.concurrency is None else \
        f", closed loop: {closed.concurrency} clients, think time {closed.think_time_s:g} s"
    if eng.long_prefill_token_threshold:
        loop += f", long_prefill_token_threshold={eng.long_prefill_token_threshold}"
    if eng.num_speculative_tokens:
        loop += f", speculative decoding: K={eng.num_speculative_tokens}, acceptance {eng.spec_acceptance_rate:g}"
    click.echo(wrap(f"replaying {len(frame)} requests: model {m.name}, {where}, max_num_seqs={eng.max_num_seqs}, "
                    f"max_num_batched_tokens={eng.max_num_batched_tokens}{loop}"))
    with taken_settings_checked():
        started = time.perf_counter()
        result, engine = replay_frame(frame, cost_model, cfg, meta)
        seconds = time.perf_counter() - started
    n_ok = int((result["pred_status"] == OK).sum())
    rejected = result["pred_status"].str.startswith(REJECTED).sum()
    kv = f"{engine.replicas[0].kv.num_gpu_blocks} blocks"
    if isinstance(engine, DisaggEngine):
        kv = f"prefill {kv}, decode {engine.replicas[engine.num_prefill_replicas].kv.num_gpu_blocks} blocks"
    click.echo(wrap(f"simulated {engine.num_steps} steps; {n_ok} completed, {rejected} rejected, "
                    f"{int(result['pred_num_preemptions'].sum())} preemptions; "
                    f"KV cache {kv} x {eng.block_size} tokens"))
    skipped = ~result["pred_status"].isin([OK]) & ~result["pred_status"].str.startswith(REJECTED)
    for reason, count in result.loc[~(result["pred_status"] == OK), "pred_status"].value_counts().items():
        click.echo(wrap(f"  {count} {reason}"))
    if skipped.all() or n_ok == 0:
        click.echo("warning: no request completed in the simulation; nothing to compare", err=True)
    if eng.num_speculative_tokens:
        from ..core.result_columns import spec_decode_stats

        st = spec_decode_stats(engine)
        click.echo(wrap(f"speculative decoding: {st['num_accepted_tokens']} of {st['num_draft_tokens']} draft tokens "
                        f"accepted ({st['acceptance_rate']:.1%}), mean acceptance length "
                        f"{st['acceptance_length']:.2f} tokens per verify step over {st['num_drafts']} verify steps"))
    if eng.enable_prefix_caching:
        hit, total = int(result["pred_num_cached_tokens"].sum()), int(frame["num_prompt_tokens"].sum())
        click.echo(wrap(f"prefix cache: {hit} of {total} prompt tokens hit ({hit / total:.1%})"
                        + ("" if "block_hashes" in frame else "; the trace has no block_hashes, so nothing can hit")))
    elif sched.router == "prefix_affinity":
        click.echo("note: --router prefix_affinity needs --enable-prefix-caching; routing by load only", err=True)
    if output:
        from traces.io import write_trace

        write_trace(result, REPLAY_RESULT, output, {"calibration": str(calibration_path), "scheduler": sched.scheduler})
        click.echo(f"wrote {output}")
    if steps_out:
        from traces.io import write_trace

        write_trace(steps_frame(engine), STEP_TRACE, steps_out, {"source": "servecal replay"})
        click.echo(f"wrote {steps_out}")
    if chrome_trace:
        from ..analysis.chrome_trace import write_chrome_trace

        # closed loop: the simulated sends
        written = write_chrome_trace(chrome_trace, engine, on_send_times(result), trace_window,
                                     chrome_trace_max_requests)
        if written.cut:
            click.echo(wrap(f"warning: --chrome-trace-max-requests {chrome_trace_max_requests}: {chrome_trace} holds the "
                            f"first {written.num_requests} of {written.num_in_window} requests (simulated time up to "
                            f"{written.end_s:.1f} s); raise it (0: no limit) or choose a --chrome-trace-window"),
                       err=True)
        click.echo(f"wrote {chrome_trace}")
    pred_band = main_band(frame, meta, cost_model, cfg, points, result, seconds, model_error)
    click.echo(format_prediction(pred_band, slo_words(sched), measured_goodput(result, sched), wide=wide,
                                 legend=None if band else "no band (--no-band)"))
    table = compare(result)
    if table.empty:
        measured = any(c in result and result[c].notna().any() for c, _, _ in METRICS)
        click.echo("(no request completed in the simulation: nothing to compare)" if n_ok == 0 and measured
                   else "(the trace has no measured latencies: a prediction only, nothing to compare)")
    elif differences:
        click.echo(format_whatif_table(table, differences, wide=wide))
    else:
        click.echo("MEASURED vs PREDICTED\n" + format_table(table, wide=wide))
        coverage = band_coverage(table, pred_band)
        if coverage:
            click.echo(wrap(coverage))
    if report:
        from ..report import report_context, write_report

        written = write_report(on_send_times(result), report, timeseries, steps_frame(engine),
                               report_context(trace, calibration_path, cost_model, cfg, engine,
                                              command=command_line()),
                               tolerances, band=pred_band, differences=differences, calibration=cal, trace=trace,
                               band_note=None if band else "no band (--no-band)")
        click.echo(wrap(f"wrote {', '.join(str(p) for p in written)}"))
    if tolerances:
        broken = broken_tolerances(table, tolerances)
        for b in broken:
            click.echo(wrap(f"tolerance broken: {b}"), err=True)
        if broken:
            raise SystemExit(3)
        click.echo(f"tolerance: all {len(tolerances)} checks pass")

