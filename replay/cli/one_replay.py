"""``replay``'s own replay of the trace (neither ``--sweep`` nor ``--compare-schedulers``): the run and
its summary, the files it writes (``-o``, ``--steps-out``, ``--chrome-trace``, ``--report``), the
comparison with the measured latencies and ``--tolerance``.

The command (:func:`replay.cli.main`) reads the inputs into a :class:`ReplayInputs` and calls these
in order. Numpy and pandas are imported when they run, not for ``--help``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import click

from schemas.calibration import Calibration
from schemas.kinds import REPLAY_RESULT, REQUEST_TRACE, STEP_TRACE
from schemas.status import OK, REJECTED

from ..config import ReplayConfig
from ..text import wrap
from .engine_settings import taken_settings_checked
from .options import command_line
from .runners import deployment_words


@dataclass
class ReplayInputs:
    """What ``replay`` read before replaying.

    ``settings`` are the engine options by name (:func:`.options.replay_options`, filled from
    their sources, :func:`.engine_settings.fill_engine_options`); ``differences`` what makes the
    run a what-if (:func:`.baseline.whatif_differences`; empty: a replay of the measured run);
    ``points`` the calibration's band points (None: ``--no-band``) and ``basis`` the rest of what its
    bands take from it (:class:`replay.analysis.bands.BandBasis`).
    """

    trace: str
    calibration_path: str
    cal: Calibration
    cost_model: object  # replay.cost_model.RooflineCostModel
    frame: object  # the request trace, a pandas DataFrame
    meta: dict
    settings: dict
    differences: list[str]
    points: list | None
    basis: object  # replay.analysis.bands.BandBasis
    kind: str = REQUEST_TRACE  # or aggregate_targets/1: levels replayed on synthesized workloads


def replay_and_summarise(run: ReplayInputs, cfg: ReplayConfig):
    """Replay ``run.frame`` under ``cfg`` and print what was run and what happened.

    Returns ``(result, engine, seconds)``: the replay_result/1 frame, the engine after the run
    and the wall time of the replay, seconds.
    """
    from ..core.disagg import DisaggEngine
    from ..schedulers import get_scheduler_factory
    from ..simulate import replay_frame

    eng, sched, closed = cfg.engine, cfg.scheduling, cfg.closed_loop
    if cfg.disagg is None:
        get_scheduler_factory(sched.scheduler)  # a bad --scheduler fails before anything is printed
    cost_model = run.cost_model
    loop = "" if closed.concurrency is None else \
        f", closed loop: {closed.concurrency} clients, think time {closed.think_time_s:g} s"
    if eng.long_prefill_token_threshold:
        loop += f", long_prefill_token_threshold={eng.long_prefill_token_threshold}"
    if eng.num_speculative_tokens:
        loop += f", speculative decoding: K={eng.num_speculative_tokens}, acceptance {eng.spec_acceptance_rate:g}"
    click.echo(wrap(f"replaying {len(run.frame)} requests: {deployment_words(cost_model, cfg)}{loop}"))
    with taken_settings_checked():
        started = time.perf_counter()
        result, engine = replay_frame(run.frame, cost_model, cfg, run.meta)
        seconds = time.perf_counter() - started
    rejected = result["pred_status"].str.startswith(REJECTED).sum()
    kv = f"{engine.replicas[0].kv.num_gpu_blocks} blocks"
    if isinstance(engine, DisaggEngine):
        kv = f"prefill {kv}, decode {engine.replicas[engine.num_prefill_replicas].kv.num_gpu_blocks} blocks"
    click.echo(wrap(f"simulated {engine.num_steps} steps; {completed(result)} completed, {rejected} rejected, "
                    f"{int(result['pred_num_preemptions'].sum())} preemptions; "
                    f"KV cache {kv} x {eng.block_size} tokens"))
    _print_outcomes(run, cfg, result, engine)
    return result, engine, seconds


def completed(result) -> int:
    """The requests of replay result ``result`` that completed in the simulation."""
    return int((result["pred_status"] == OK).sum())


def _print_outcomes(run: ReplayInputs, cfg: ReplayConfig, result, engine) -> None:
    """The requests that did not complete, by reason; the speculative decoding and prefix cache counts."""
    eng, sched, frame = cfg.engine, cfg.scheduling, run.frame
    skipped = ~result["pred_status"].isin([OK]) & ~result["pred_status"].str.startswith(REJECTED)
    for reason, count in result.loc[~(result["pred_status"] == OK), "pred_status"].value_counts().items():
        click.echo(wrap(f"  {count} {reason}"))
    if skipped.all() or completed(result) == 0:
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


def write_outputs(run: ReplayInputs, cfg: ReplayConfig, result, engine, output, steps_out, chrome_trace,
                  trace_window, chrome_trace_max_requests: int) -> None:
    """Write ``-o`` (the result), ``--steps-out`` (the step trace) and ``--chrome-trace`` (the
    timeline, ``trace_window`` of :func:`.options.chrome_trace_options`), those given."""
    from traces.io import write_trace

    from ..core.closed_loop import on_send_times
    from ..core.result_columns import steps_frame

    if output:
        write_trace(result, REPLAY_RESULT, output, {"calibration": str(run.calibration_path),
                                                    "scheduler": cfg.scheduling.scheduler})
        click.echo(f"wrote {output}")
    if steps_out:
        write_trace(steps_frame(engine), STEP_TRACE, steps_out, {"source": "servecal replay"})
        click.echo(f"wrote {steps_out}")
    if chrome_trace:
        from ..analysis.chrome_trace import write_chrome_trace

        # closed loop: the simulated sends
        written = write_chrome_trace(chrome_trace, engine, on_send_times(result), trace_window,
                                     chrome_trace_max_requests)
        if written.cut:
            click.echo(wrap(f"warning: --chrome-trace-max-requests {chrome_trace_max_requests}: {chrome_trace} "
                            f"holds the first {written.num_requests} of {written.num_in_window} requests (simulated "
                            f"time up to {written.end_s:.1f} s); raise it (0: no limit) or choose a "
                            "--chrome-trace-window"), err=True)
        click.echo(f"wrote {chrome_trace}")


def print_comparison(run: ReplayInputs, result, pred_band, wide: bool):
    """Print the measured-vs-predicted table (the what-if table when ``run.differences``), the
    band's coverage, or why there is nothing to compare; return the comparison
    (:func:`replay.analysis.compare.compare`, empty: nothing compared)."""
    from ..analysis.band_tables import band_coverage
    from ..analysis.compare import METRICS, compare, format_table
    from ..analysis.whatif_table import format_whatif_table

    table = compare(result)
    if table.empty:
        measured = any(c in result and result[c].notna().any() for c, _, _ in METRICS)
        click.echo("(no request completed in the simulation: nothing to compare)"
                   if completed(result) == 0 and measured
                   else "(the trace has no measured latencies: a prediction only, nothing to compare)")
    elif run.differences:
        click.echo(format_whatif_table(table, run.differences, wide=wide))
    else:
        click.echo("MEASURED vs PREDICTED\n" + format_table(table, wide=wide))
        coverage = band_coverage(table, pred_band)
        if coverage:
            click.echo(wrap(coverage))
    return table


def write_replay_report(run: ReplayInputs, cfg: ReplayConfig, result, engine, report, timeseries, tolerances,
                        pred_band, band: bool) -> None:
    """Write ``--report`` of this replay (``timeseries``: the measured one, or None)."""
    from ..core.closed_loop import on_send_times
    from ..report import report_context, write_report
    from ..core.result_columns import steps_frame

    written = write_report(on_send_times(result), report, timeseries, steps_frame(engine),
                           report_context(run.trace, run.calibration_path, run.cost_model, cfg, engine,
                                          command=command_line()),
                           tolerances, band=pred_band, differences=run.differences, calibration=run.cal,
                           trace=run.trace, band_note=None if band else "no band (--no-band)")
    click.echo(wrap(f"wrote {', '.join(str(p) for p in written)}"))


def check_tolerances(table, tolerances) -> None:
    """Print each broken ``--tolerance`` and exit 3 when one is, or say that all pass."""
    from ..analysis.compare import broken_tolerances

    broken = broken_tolerances(table, tolerances)
    for b in broken:
        click.echo(wrap(f"tolerance broken: {b}"), err=True)
    if broken:
        raise SystemExit(3)
    click.echo(f"tolerance: all {len(tolerances)} checks pass")
