"""``servecal plan``: the cheapest deployment meeting a percentile SLO, with the stated confidence.

The command parses and prints; the plan itself is :mod:`replay.plan`. Nothing heavy is
imported before the command runs (``--help`` stays quick).
"""
from __future__ import annotations

import click

from schemas.errors import SpecError
from traces.cli.support import DataError, FoldedCommand, user_errors, version_option

from ..errors import ConfigError, ReplayError
from ..text import wrap
from .aggregate_levels import split_level
from .options import output_options, report_folders, setting_option, show_progress

_errors = user_errors(data_errors=(ReplayError,), usage_errors=(ConfigError, SpecError), output_folders=report_folders)


@click.command(cls=FoldedCommand, context_settings={"help_option_names": ["-h", "--help"]})
@version_option()
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option("--calibration", "calibration_path", multiple=True, type=click.Path(dir_okay=False),
              help="Calibration JSON (calibrate fit); repeat with one per GPU type: each applies to its own GPU, "
                   "the first is carried to the others (an extrapolation).")
@click.option("--rate", type=float, default=None, help="Target mean arrival rate, req/s: the trace's arrival times "
                                                      "rescaled to it.")
@click.option("--rate-scale", type=float, default=None, help="Target rate as a factor of the trace's own.")
@click.option("--slo", multiple=True, metavar="KEY=VALUE,...",
              help="Objectives: {ttft,tpot,e2e,queue_wait}_p{50,90,99} with a unit (2s, 50ms), goodput=F "
                   "(the least fraction of requests meeting the TTFT/TPOT limits, e.g. 0.9 or 90%).")
@click.option("--gpu", "gpus", default=None, help="GPU types (catalog keys, calibrate catalog), e.g. "
                                                  "h100-80gb,a100-80gb [default: the calibrations'].")
@setting_option("tp", None, values_help="TP degrees, e.g. 1,2,4 [default: the calibration's].")
@setting_option("pp", None, values_help="Pipeline stages of a replica, each of TP GPUs holding 1/PP of the layers, "
                                       "e.g. 1,2 [default: the calibration's].")
@setting_option("dp", None, values_help="Data-parallel ranks stepping in lock step as one replica (vLLM "
                                       "--data-parallel-size, a MoE layout), e.g. 1,2 [default: the calibration's].")
@setting_option("replicas", None, values_help="Replicas behind the router, e.g. 1:8 [default: the calibration's].")
@setting_option("max_num_seqs", None, values_help="Requests running at once per replica, e.g. 64,128,256 "
                                                  "[default: the calibration's].")
@setting_option("max_num_batched_tokens", None, values_help="Token budgets per step, e.g. 2048,8192 "
                                                            "[default: the calibration's].")
@setting_option("scheduler", None, values_help="Schedulers, e.g. chunked,disagg (disagg: prefill and decode pools) "
                                               "[default: the calibration's].")
@setting_option("prefill_replicas", None, values_help="disagg: prefill instances [default: --replicas' values, at "
                                                      "most the colocated GPU budget].")
@setting_option("decode_replicas", None, values_help="disagg: decode instances [default: as --prefill-replicas].")
@setting_option("tp_prefill", None, values_help="disagg: TP of a prefill instance [default: --tp's values].")
@setting_option("tp_decode", None, values_help="disagg: TP of a decode instance [default: --tp's values].")
@setting_option("router", None, " [default: the calibration's]")
@setting_option("gpu_memory_utilization", None, ", sizing each candidate's KV cache [default: the calibration's, "
                                                "else 0.9]")
@click.option("--price", default=None, metavar="GPU=PRICE,...",
              help="Price per GPU-hour of every --gpu (e.g. h100-80gb=2.5,a100-80gb=1.8); without, the cost is "
                   "the GPU count.")
@click.option("--confidence", type=click.Choice(["band", "point"]), default="band", show_default=True,
              help="band: meet the SLOs at the worst end of the 95 % band; point: at the calibration's values.")
@click.option("--top", "top_k", type=click.IntRange(min=1), default=5, show_default=True,
              help="Stop computing bands once this many candidates meet the SLOs.")
@click.option("--probes", type=click.IntRange(min=0), default=8, show_default=True,
              help="Replays of the max-rate bisection per front candidate (0: no max rate).")
@click.option("--exhaustive", is_flag=True, default=False,
              help="Replay every candidate at its point, also those costlier than the --top cheapest meeting the "
                   "SLOs (a Pareto front over the whole grid; slower).")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="Local processes running the replays [default: the number of CPUs].")
@click.option("--ray-address", default=None, metavar="ADDR",
              help="Run the replays on the Ray cluster at ADDR (needs pip install 'servecal[ray]').")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Write every candidate's row (.csv or .parquet; seconds, requests/s).")
@click.option("--report", type=click.Path(dir_okay=False), default=None,
              help="Write the plan as a report: .html (one self-contained file) or .md (its figure in the folder "
                   "<name>_files beside it): the calibrations' parameters, the candidates with their bands, the "
                   "answer, the Pareto front drawn.")
@output_options
@_errors
def plan(trace, calibration_path, rate, rate_scale, slo, gpus, tp, pp, dp, replicas, max_num_seqs,
         max_num_batched_tokens, scheduler, prefill_replicas, decode_replicas, tp_prefill, tp_decode, router,
         gpu_memory_utilization, price, confidence, top_k, probes, exhaustive, jobs, ray_address, output, report,
         wide, quiet):
    """Find the cheapest deployment whose predicted latencies meet the SLOs at a rate.

    Candidates (GPU type x TP x PP x DP x replicas x engine limits x scheduler), counted in
    GPUs (replicas x TP x PP x DP), replay TRACE at the target rate, cheapest first; those
    failing at the calibration's values are pruned, the rest get a 95 % band from the
    calibration's confidence set; the answer is the cheapest whose band's worst end meets
    every SLO, and the search stops once --top do. Prints the best candidates, the Pareto
    front, and which parameters to measure when the band changes the answer. TRACE is a
    request trace, or aggregates (Prometheus scrapes, a benchmark's summary): then their
    busiest open-loop level's workload (FILE#K: level K's), synthesized as calibrate fit
    replays it.

    \b
    Example:
      servecal plan run.parquet --calibration cal.json --rate 3 --slo ttft_p90=2s,tpot_p90=50ms \\
             --gpu h100-80gb,a100-80gb --tp 1,2,4 --replicas 1:8 --price h100-80gb=2.5,a100-80gb=1.8
    """
    from schemas.calibration import Calibration
    from schemas.kinds import AGGREGATE_TARGETS, REQUEST_TRACE, a_kind
    from traces.io import read_trace

    from ..plan import Calibrations, parse_slo, plan_deployments
    from ..plan.grid import parse_prices
    from ..plan.table import check_output_path

    show_progress(quiet)
    slos = parse_slo(slo)  # a bad option fails before anything is read
    if output:
        check_output_path(output)
    if report:
        from ..report import report_format

        report_format(report)  # an unknown suffix fails before the plan
    if rate is not None and rate_scale is not None:
        raise click.UsageError("--rate and --rate-scale: give one")
    if not calibration_path:
        raise click.UsageError("Missing option '--calibration' (make one: calibrate fit TRACE --model M --gpu G "
                               "-o cal.json)")
    cals = Calibrations([(p, Calibration.read(p)) for p in calibration_path])
    axes = _axes(cals, gpus, tp, pp, dp, replicas, max_num_seqs, max_num_batched_tokens, scheduler,
                 {"--prefill-replicas": prefill_replicas, "--decode-replicas": decode_replicas,
                  "--tp-prefill": tp_prefill, "--tp-decode": tp_decode})
    prices = parse_prices(price, axes.gpus)
    axes.candidates()  # too many fails before the trace is read
    trace, level = split_level(trace)
    kind, frame, meta = read_trace(trace)
    if kind == AGGREGATE_TARGETS:
        frame, meta, level_rate = _busiest_window(trace, frame, meta, level)
        if rate is None:  # the level's stated rate, not its few synthesized arrivals' own
            rate, rate_scale = level_rate * (rate_scale or 1.0), None
    elif level is not None:
        raise DataError(f"{trace}#{level}: #K picks a level of aggregates ({AGGREGATE_TARGETS}); {trace} is a "
                        f"request trace, planned whole")
    elif kind != REQUEST_TRACE:
        raise DataError(f"{trace}: is {a_kind(kind)}; plan needs a request trace ({REQUEST_TRACE}) or aggregates "
                        f"({AGGREGATE_TARGETS})")
    result = plan_deployments(frame, meta, cals, axes, slos, rate, rate_scale, prices, confidence, top_k, probes,
                              jobs, ray_address, {"router": router, "gpu_memory_utilization": gpu_memory_utilization},
                              exhaustive)
    from .plan_report import print_plan

    found = print_plan(result, cals, slos, trace, prices, wide)
    if output:
        from ..plan.table import plan_frame, write_plan

        write_plan(plan_frame(result.result, slos, bool(prices)), output)
        click.echo(wrap(f"wrote {output}"))
    if report:
        _write_report(report, result, cals, slos, prices, trace, calibration_path)
    if not found:
        raise SystemExit(3)



def _busiest_window(trace, frame, meta: dict, level: int | None = None) -> tuple:
    """The workload a plan replays from aggregates (``aggregate_targets/1``: a benchmark's levels, a
    production scrape's windows): its busiest open-loop level (or ``level``, ``FILE#K``), synthesized
    from its length statistics as ``calibrate fit`` replays it (:func:`traces.aggregate_workload.level_trace`);
    the request trace, its metadata and the level's arrival rate (requests/s). Says on stderr which
    level it took.

    Raises
    ------
    DataError
        No level at an arrival rate, or lengths with no statistic.
    """
    from traces.aggregate_workload import busiest_level, level_workload
    from traces.errors import TraceError
    from traces.scrape_window import OBSERVED_UNTIL

    try:
        k = busiest_level(frame, trace, level)
        rows, workload, level_meta = level_workload(frame, k, meta, trace)
    except TraceError as exc:
        raise DataError(str(exc)) from None
    # a plan serves all of the window's traffic (at another rate, too): the requests its histograms
    # happened to count by its end are what the window is scored on, not what the plan is judged by
    level_meta = {key: v for key, v in level_meta.items() if key != OBSERVED_UNTIL}
    rate = float(rows["level_value"].iloc[0])
    which = "the busiest, " if level is None else ""
    click.echo(wrap(f"{trace}: aggregates of {frame['level'].nunique()} level(s); the plan replays {which}"
                    f"#{k} at {rate:.3g} req/s: {len(workload)} requests synthesized from its length statistics "
                    "(as calibrate fit replays it; --rate-scale scales that rate, --rate replaces it)"), err=True)
    return workload, level_meta, rate


def _schedulers(scheduler: str | None, eng: dict) -> list[str]:
    """The schedulers of ``--scheduler`` (default: the calibration's ``eng``, else chunked), each known."""
    from ..schedulers import get_scheduler_factory

    sched_list = [s.strip() for s in (scheduler if scheduler is not None else eng.get("scheduler") or "chunked")
                  .split(",") if s.strip()]
    if not sched_list:
        raise click.UsageError(f"--scheduler {scheduler!r}: no scheduler named; expected e.g. chunked,disagg")
    for s in sched_list:
        if s != "disagg":
            get_scheduler_factory(s)  # an unknown scheduler fails before any replay
    return sched_list


def _axes(cals, gpus, tp, pp, dp, replicas, max_num_seqs, max_num_batched_tokens, scheduler, disagg: dict):
    """The grid of candidates (:class:`replay.plan.Axes`) from the options, the reference calibration's
    values where one is not given; ``disagg``: the pools' options by name (refused without disagg).

    Raises
    ------
    click.UsageError
        A ``--pp`` above the model's layer count (vLLM refuses a stage without a layer), or
        only ``--pp`` above 1 with ``--dp`` above 1 (the engine does not model both at once).
    """
    from ..plan import Axes
    from ..plan.grid import parse_gpus, parse_int_list

    ref = cals.reference
    eng = ref.engine

    def ints(option, text, default):
        return parse_int_list(option, text) if text is not None else [default]

    def pools(option):
        return parse_int_list(option, disagg[option]) if disagg[option] is not None else None

    gpu_keys = parse_gpus(gpus) if gpus is not None else [c.gpu.name for _, c in cals.items]
    sched_list = _schedulers(scheduler, eng)
    pps, dps = ints("--pp", pp, ref.pp), ints("--dp", dp, ref.dp)
    layers = ref.model.num_layers
    if max(pps) > layers:
        raise click.BadParameter(f"{max(pps)} pipeline stages exceed the {layers} layers of {ref.model.name} "
                                 "(vLLM refuses a stage without a layer)", param_hint="'--pp'")
    if min(pps) > 1 and min(dps) > 1:
        raise click.UsageError(f"--pp {pp if pp is not None else ref.pp} with --dp {dp if dp is not None else ref.dp}: "
                               "pipeline stages with DP ranks are not modelled (DP ranks step in lock step); "
                               "give 1 among the values of one of them")
    axes = Axes(gpu_keys, ints("--tp", tp, ref.tp), ints("--replicas", replicas, eng.get("replicas") or 1),
                ints("--max-num-seqs", max_num_seqs, eng.get("max_num_seqs") or 256),
                ints("--max-num-batched-tokens", max_num_batched_tokens, eng.get("max_num_batched_tokens") or 8192),
                sched_list, pools("--prefill-replicas"), pools("--decode-replicas"), pools("--tp-prefill"),
                pools("--tp-decode"), dp=dps, pp=pps)
    if "disagg" not in sched_list:
        given = [o for o, v in disagg.items() if v is not None]
        if given:
            raise click.UsageError(f"{', '.join(given)}: only --scheduler disagg uses these")
    return axes


def _write_report(report, result, cals, slos, prices, trace, calibration_path) -> None:
    """Write ``--report``: the plan's table of predictions, its answer and its figure."""
    from ..report import report_context
    from ..report.predictions import write_plan_report
    from .options import command_line
    from .plan_report import answer_lines, header_lines, skipped_lines

    context = report_context(trace, ", ".join(map(str, calibration_path)), command=command_line())
    lines = {"header": header_lines(result, cals, slos, trace), "answer": answer_lines(result, cals, slos, prices),
             "skipped": skipped_lines(result)}
    written = write_plan_report(report, result.result, slos, prices, context, cals.items, trace, lines)
    click.echo(wrap(f"wrote {', '.join(map(str, written))}"))
