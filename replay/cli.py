"""``replay``: run a trace through the simulated engine and compare with what was measured."""
from __future__ import annotations


import click
import numpy as np

from schemas.calibration import Calibration
from schemas.cli_support import DataError, user_errors, version_option
from schemas.tables import REPLAY_RESULT, REQUEST_TRACE, STEP_TRACE
from schemas.specs import get_model

from .closed_loop import on_send_times
from .compare import broken_tolerances, compare, format_scheduler_table, format_table, scheduler_table
from .cost_model import LINKS, cost_model_from_calibration
from .disagg import DisaggEngine, describe_config
from .errors import ConfigError, ReplayError
from .schedulers import check_scheduler_names, get_scheduler_factory
from .schedulers.disagg import FIRST_TOKEN_FROM
from .simulate import ReplayConfig, replay_frame, steps_frame
from .text import wrap

_errors = user_errors(data_errors=(ReplayError,), usage_errors=(ConfigError,))


def replay_options(fn):
    """The engine options shared by ``replay`` and ``calibrate fit`` (vLLM's names)."""
    opts = [
        click.option("--scheduler", default="chunked", show_default=True,
                     help="chunked | fcfs | static | sjf | edf | disagg (prefill/decode pools), "
                          "or package.module:ClassName."),
        click.option("--max-num-seqs", type=click.IntRange(min=1), default=256, show_default=True,
                     help="Requests running at once per replica."),
        click.option("--max-num-batched-tokens", type=click.IntRange(min=1), default=8192, show_default=True,
                     help="Token budget per step."),
        click.option("--num-gpu-blocks", type=click.IntRange(min=1), default=None,
                     help="KV blocks per replica [default: from GPU memory]."),
        click.option("--gpu-memory-utilization", type=click.FloatRange(0, 1, min_open=True), default=0.9,
                     show_default=True, help="Fraction of GPU memory for weights + KV."),
        click.option("--block-size", type=click.IntRange(min=1), default=16, show_default=True,
                     help="Tokens per KV block."),
        click.option("--max-model-len", type=click.IntRange(min=1), default=None,
                     help="Longest prompt + output [default: the model's context length]."),
        click.option("--replicas", type=click.IntRange(min=1), default=1, show_default=True,
                     help="Replicas of a colocated scheduler (disagg: --prefill-replicas, --decode-replicas)."),
        click.option("--router", type=click.Choice(["round_robin", "least_loaded", "prefix_affinity"]),
                     default="round_robin", show_default=True, help="How arrivals are spread over replicas."),
        click.option("--enable-prefix-caching/--no-enable-prefix-caching", default=False, show_default=True,
                     help="Share full prompt KV blocks between requests (vLLM v1), from block_hashes."),
        click.option("--hash-block-size", type=click.IntRange(min=1), default=None,
                     help="Tokens per block of the trace's block_hashes (Mooncake: 512) "
                          "[default: the trace's hash_block_tokens metadata, else 16]."),
        click.option("--preemption-mode", type=click.Choice(["recompute", "swap"]), default="recompute",
                     show_default=True, help="What preemption does with the victim's KV."),
        click.option("--slo-ttft-s", type=click.FloatRange(min=0, min_open=True), default=None,
                     help="TTFT objective, seconds, of requests without a slo_ttft_s column (edf, goodput)."),
        click.option("--slo-tpot-s", type=click.FloatRange(min=0, min_open=True), default=None,
                     help="TPOT objective, seconds, of requests without a slo_tpot_s column (edf, goodput)."),
        # --scheduler disagg (replay.disagg): defaults None so that giving them elsewhere is an error
        click.option("--prefill-replicas", type=click.IntRange(min=1), default=None,
                     help="disagg: prefill instances [default: 1]."),
        click.option("--decode-replicas", type=click.IntRange(min=1), default=None,
                     help="disagg: decode instances [default: 1]."),
        click.option("--tp-prefill", type=click.IntRange(min=1), default=None,
                     help="disagg: tensor-parallel degree of a prefill instance [default: --tp]."),
        click.option("--tp-decode", type=click.IntRange(min=1), default=None,
                     help="disagg: tensor-parallel degree of a decode instance [default: --tp]."),
        click.option("--link", type=click.Choice(list(LINKS)), default=None,
                     help="disagg: prefill-to-decode KV link [default: the GPU's own tp_link]."),
        click.option("--link-bandwidth-bytes-per-s", type=click.FloatRange(min=0, min_open=True), default=None,
                     help="disagg: KV link bandwidth, bytes/s [default: --link's]."),
        click.option("--link-latency-s", type=click.FloatRange(min=0), default=None,
                     help="disagg: KV link one-way latency, seconds [default: --link's]."),
        click.option("--first-token-from", type=click.Choice(FIRST_TOKEN_FROM), default=None,
                     help="disagg: instance that emits output token 1 [default: prefill, as DistServe]."),
        click.option("--concurrency", type=click.IntRange(min=1), default=None,
                     help="Closed loop: N clients send the trace's requests in order, each when its previous "
                          "one completes (llmperf, GenAI-Perf, vllm bench --max-concurrency); arrival times "
                          "are ignored [default: open loop, arrivals as traced]."),
        click.option("--think-time-s", type=click.FloatRange(min=0, max=float("inf"), max_open=True), default=0.0,
                     show_default=True, help="Closed loop: a client's pause between a completion and its next send, seconds."),
        click.option("--long-prefill-token-threshold", type=click.IntRange(min=0), default=0, show_default=True,
                     help="vLLM's per-request cap on the prompt tokens of one step, applied before the token "
                          "budget to new and partially prefilled requests alike (chunked, sjf, edf, disagg "
                          "prefill; fcfs and static admit whole prompts); 0: none, >= the budget: no effect."),
        click.option("--speculative-tokens", type=click.IntRange(min=0), default=0, show_default=True,
                     help="Speculative decoding: draft tokens K per decode and step (vLLM's "
                          "num_speculative_tokens). Each decode verifies K+1 positions (token budget and cost "
                          "model count them) and emits 1 + the accepted drafts; 0: off."),
        click.option("--spec-acceptance-rate", type=click.FloatRange(0, 1), default=None,
                     help="Speculative decoding: probability A that a draft token is accepted given the ones "
                          "before it were (a prefix is accepted); vLLM's mean acceptance length is "
                          "(1 - A^(K+1)) / (1 - A). Required with --speculative-tokens."),
        click.option("--exact-steps", is_flag=True, default=False,
                     help="Simulate every step and request one by one, through the event heap: the reference "
                          "the fast path is tested against (same results, slower)."),
        click.option("--vllm-log", type=click.Path(dir_okay=False), default=None,
                     help="The measured server's stdout log: its engine settings (max_num_seqs, "
                          "max_num_batched_tokens, KV blocks, prefix caching, TP/DP, ...) fill every option "
                          "not given here."),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def output_options(fn):
    """``--wide`` and ``--quiet``: how much a command prints (shared with ``calibrate``)."""
    fn = click.option("-q", "--quiet", is_flag=True, default=False,
                      help="No progress bars or timings on stderr (they only show on a terminal anyway).")(fn)
    return click.option("--wide", is_flag=True, default=False,
                        help="Print every column of the tables [default: what fits 100 columns].")(fn)


def show_progress(quiet: bool) -> None:
    """Progress bars on stderr, when it is a terminal, until the current command ends (none with ``quiet``)."""
    from .progress import reporting

    click.get_current_context().with_resource(reporting(enabled=not quiet))


#: Options of :func:`replay_options` that only ``--scheduler disagg`` uses (None when not given).
DISAGG_OPTIONS = ("prefill_replicas", "decode_replicas", "tp_prefill", "tp_decode", "link",
                  "link_bandwidth_bytes_per_s", "link_latency_s", "first_token_from")


#: Engine options a vLLM log or a calibration can supply (ReplayConfig names = option names).
ENGINE_OPTIONS = ("scheduler", "max_num_seqs", "max_num_batched_tokens", "num_gpu_blocks", "gpu_memory_utilization",
                  "block_size", "max_model_len", "enable_prefix_caching", "preemption_mode", "replicas", "router",
                  "long_prefill_token_threshold", "speculative_tokens")
#: vLLM's names of the hardware settings, and the option each fills.
_HARDWARE_KEYS = {"tensor_parallel_size": "tp", "data_parallel_size": "dp", "enable_expert_parallel": "expert_parallel"}


def fill_engine_options(kwargs: dict, sources: list) -> list[str]:
    """Fill the engine options left at their defaults from ``sources`` (``(label, settings)``
    pairs, vLLM's names, first source first), in place; return what to tell the user: the
    options taken, and those given on the command line that differ from a source.

    Command-line options win, then the sources in order; the hardware keys
    (``tensor_parallel_size``...) fill ``tp``, ``dp``, ``expert_parallel`` when present in ``kwargs``.
    """
    import textwrap

    ctx = click.get_current_context()
    taken, differ = {}, []
    for key in (*ENGINE_OPTIONS, *_HARDWARE_KEYS):
        name = _HARDWARE_KEYS.get(key, key)
        if name not in kwargs:
            continue
        src = ctx.get_parameter_source(name)
        given = src is not None and src != click.core.ParameterSource.DEFAULT
        for label, settings in sources:
            value = (settings or {}).get(key)
            if value is None:
                continue
            if given:
                if value != kwargs[name]:
                    differ.append(f"--{name.replace('_', '-')} {kwargs[name]} (the {label} says {value})")
            else:
                kwargs[name] = value
                taken.setdefault(label, []).append(f"{name}={value}")
            break
    lines = [f"engine settings from the {label}: {', '.join(items)}" for label, items in taken.items()]
    if differ:
        lines.append(f"note: given on the command line, unlike the measured run: {'; '.join(differ)}")
    return [textwrap.fill(line, 100, subsequent_indent="  ") for line in lines]


def max_running(trace) -> int | None:
    """Most requests the measured engine ran at once, from ``queue_wait_s`` and ``e2e_s``
    (scheduled = arrival + queue wait, until arrival + E2E); None without both columns."""
    if "queue_wait_s" not in trace or "e2e_s" not in trace:
        return None
    t0 = (trace["arrival_time_s"] + trace["queue_wait_s"]).to_numpy(float)
    t1 = (trace["arrival_time_s"] + trace["e2e_s"]).to_numpy(float)
    ok = np.isfinite(t0) & np.isfinite(t1)
    if not ok.any():
        return None
    events = np.concatenate([np.stack([t0[ok], np.ones(ok.sum())], 1), np.stack([t1[ok], -np.ones(ok.sum())], 1)])
    events = events[np.lexsort((events[:, 1], events[:, 0]))]  # ends before starts at a tie
    return int(np.max(np.cumsum(events[:, 1])))


def check_limits(name: str, trace, max_num_seqs: int, dp: int = 1) -> str | None:
    """A warning when the measured run had more requests running at once than the limits allow."""
    most = max_running(trace)
    if most is not None and most > max_num_seqs * dp:
        return (f"warning: {name} had up to {most} requests running at once, above --max-num-seqs "
                f"{max_num_seqs}{f' x {dp} ranks' if dp > 1 else ''}: the options do not describe the measured "
                "engine (give its settings, or --vllm-log)")
    return None


def replay_config(kwargs: dict, one_scheduler: bool = True, **extra) -> ReplayConfig:
    """A ReplayConfig from the options of :func:`replay_options`.

    With ``one_scheduler`` (not ``--compare-schedulers``), options that the chosen scheduler
    would ignore are a ConfigError: ``disagg`` options with another scheduler, ``--replicas``
    with ``disagg``.
    """
    keys = ("scheduler", "max_num_seqs", "max_num_batched_tokens", "num_gpu_blocks", "gpu_memory_utilization",
            "block_size", "max_model_len", "replicas", "router", "enable_prefix_caching", "hash_block_size",
            "preemption_mode", "slo_ttft_s", "slo_tpot_s", "concurrency", "think_time_s", "exact_steps",
            "long_prefill_token_threshold", "speculative_tokens", "spec_acceptance_rate")
    keys = tuple(k for k in keys if k in kwargs)
    given = {k: kwargs[k] for k in DISAGG_OPTIONS if kwargs.get(k) is not None}
    if one_scheduler and kwargs["scheduler"] != "disagg" and given:
        names = ", ".join("--" + k.replace("_", "-") for k in given)
        raise ConfigError(f"{names}: only --scheduler disagg uses these (the scheduler is {kwargs['scheduler']})")
    if one_scheduler and kwargs["scheduler"] == "disagg" and kwargs["replicas"] != 1:
        raise ConfigError("--replicas: with --scheduler disagg give --prefill-replicas and --decode-replicas")
    return ReplayConfig(**{k: kwargs[k] for k in keys}, **given, **extra)


def parse_tolerances(text: str | None) -> dict[str, float]:
    """``"ttft_p50=0.1,tpot_p50=0.1"`` -> ``{"ttft_p50": 0.1, "tpot_p50": 0.1}``."""
    from .compare import METRIC_LABELS

    known = set(METRIC_LABELS)
    out = {}
    for part in filter(None, (text or "").split(",")):
        key, sep, val = part.partition("=")
        key = key.strip()
        metric, _, stat = key.rpartition("_")
        try:
            out[key] = float(val)
            assert sep and out[key] >= 0
        except (ValueError, AssertionError):
            raise click.BadParameter(f"{part!r}: expected metric_stat=fraction, e.g. ttft_p50=0.1",
                                     param_hint="--tolerance") from None
        if metric not in known or not (stat == "mape" or stat in ("p50", "p90", "p99")):
            raise click.BadParameter(f"{key!r}: expected <metric>_<stat> with metric one of "
                                     f"{', '.join(sorted(known))} and stat p50, p90, p99 or mape",
                                     param_hint="--tolerance")
    return out


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@version_option()
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option("--calibration", "calibration_path", required=True, type=click.Path(dir_okay=False),
              help="Calibration JSON written by 'calibrate fit'.")
@click.option("--model", default=None, help="Replay another model on the calibrated GPU (catalog key, "
                                            "HF id or config.json).")
@click.option("--tp", type=click.IntRange(min=1), default=None, help="Tensor-parallel degree [default: the calibration's].")
@click.option("--data-parallel-size", "dp", type=click.IntRange(min=1), default=None,
              help="vLLM data-parallel ranks stepping in lock step [default: the calibration's].")
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
                   "or .md (figures in the folder <name>_files beside it).")
@click.option("--measured-timeseries", type=click.Path(dir_okay=False), default=None,
              help="Measured 1 s time series (CSV: t, running, waiting, ...; vLLM's timeseries.csv) "
                   "to plot against the simulated counts in --report.")
@click.option("--tolerance", default=None,
              help="Exit 3 when an error exceeds its bound, e.g. ttft_p50=0.1,tpot_p50=0.1.")
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
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seed of the simulation's random draws (accepted draft tokens of --speculative-tokens).")
@output_options
@_errors
def main(trace, calibration_path, model, tp, dp, output, steps_out, token_times, chrome_trace, chrome_trace_window,
         chrome_trace_max_requests, report, measured_timeseries, tolerance, compare_schedulers, sweep, jobs,
         ray_address, sweep_out, vllm_log, wide, quiet, seed, **kwargs):
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

    show_progress(quiet)
    tolerances = parse_tolerances(tolerance)
    names = None
    sweeps = check_sweep_options(sweep, jobs, ray_address, sweep_out, compare_schedulers,
                                 (("-o", output), ("--steps-out", steps_out), ("--chrome-trace", chrome_trace),
                                  ("--report", report), ("--tolerance", tolerance), ("--token-times", token_times)))
    if compare_schedulers is not None:
        names = parse_scheduler_list(compare_schedulers)
        clash = [opt for opt, v in (("-o", output), ("--steps-out", steps_out), ("--chrome-trace", chrome_trace),
                                    ("--report", report), ("--tolerance", tolerance)) if v]
        if clash:
            raise ConfigError(f"--compare-schedulers prints one table of predictions; it cannot be combined "
                              f"with {', '.join(clash)}")
    trace_window = chrome_trace_options(chrome_trace, chrome_trace_window, chrome_trace_max_requests)
    if measured_timeseries and not report:
        raise click.UsageError("--measured-timeseries is drawn in the report: give --report too")
    if report:
        from .report import read_timeseries, report_format

        report_format(report)  # an unknown suffix fails before the replay
        timeseries = read_timeseries(measured_timeseries) if measured_timeseries else None
    cal = Calibration.read(calibration_path)
    model_spec = get_model(model) if model else None
    kwargs.update(tp=tp, dp=dp)
    for line in fill_engine_options(kwargs, engine_sources(vllm_log, cal, calibration_path)):
        click.echo(wrap(line), err=True)
    tp, dp = kwargs.pop("tp"), kwargs.pop("dp")
    cost_model = calibrated_cost_model(calibration_path, cal, model_spec, tp, dp)
    if model_spec is not None and model_spec.name != cal.model.name:
        click.echo(wrap(f"note: the calibration was fitted on {cal.model.name}; its efficiencies are carried over "
                        f"to {model_spec.name} on the same GPU (an extrapolation: check against a measured run)"),
                   err=True)
    kind, frame, meta = read_trace(trace)
    if kind != REQUEST_TRACE:
        raise DataError(f"{trace}: is a {kind}; replay needs a request trace ({REQUEST_TRACE})")
    warning = check_limits(str(trace), frame, kwargs["max_num_seqs"], cost_model.dp)
    if warning:
        click.echo(wrap(warning), err=True)
    if names is not None:
        compare_schedulers_run(frame, meta, cost_model, replay_config(kwargs, one_scheduler=False, seed=seed), names,
                               wide)
        return
    if sweeps is not None:
        sweep_run(frame, meta, cost_model, replay_config(kwargs, one_scheduler="scheduler" not in sweeps, seed=seed),
                  sweeps, jobs, ray_address, sweep_out, wide, quiet)
        return
    cfg = replay_config(kwargs, record_token_times=token_times, record_steps=steps_out is not None or bool(report),
                        record_step_requests=chrome_trace is not None, seed=seed)
    if cfg.scheduler != "disagg":
        get_scheduler_factory(cfg.scheduler)  # a bad --scheduler fails before anything is printed
    m = cost_model.model
    where = (f"scheduler disagg: {describe_config(cost_model, cfg)}" if cfg.scheduler == "disagg" else
             f"{hardware(cost_model, cfg)}, scheduler {cfg.scheduler}")
    loop = "" if cfg.concurrency is None else \
        f", closed loop: {cfg.concurrency} clients, think time {cfg.think_time_s:g} s"
    if cfg.long_prefill_token_threshold:
        loop += f", long_prefill_token_threshold={cfg.long_prefill_token_threshold}"
    if cfg.speculative_tokens:
        loop += f", speculative decoding: K={cfg.speculative_tokens}, acceptance {cfg.spec_acceptance_rate:g}"
    click.echo(wrap(f"replaying {len(frame)} requests: model {m.name}, {where}, max_num_seqs={cfg.max_num_seqs}, "
                    f"max_num_batched_tokens={cfg.max_num_batched_tokens}{loop}"))
    result, engine = replay_frame(frame, cost_model, cfg, meta)
    n_ok = int((result["pred_status"] == "ok").sum())
    rejected = result["pred_status"].str.startswith("rejected").sum()
    kv = f"{engine.replicas[0].kv.num_gpu_blocks} blocks"
    if isinstance(engine, DisaggEngine):
        kv = f"prefill {kv}, decode {engine.replicas[engine.num_prefill_replicas].kv.num_gpu_blocks} blocks"
    click.echo(wrap(f"simulated {engine.num_steps} steps; {n_ok} completed, {rejected} rejected, "
                    f"{int(result['pred_num_preemptions'].sum())} preemptions; "
                    f"KV cache {kv} x {cfg.block_size} tokens"))
    skipped = ~result["pred_status"].isin(["ok"]) & ~result["pred_status"].str.startswith("rejected")
    for reason, count in result.loc[~(result["pred_status"] == "ok"), "pred_status"].value_counts().items():
        click.echo(f"  {count} {reason}")
    if skipped.all() or n_ok == 0:
        click.echo("warning: no request completed in the simulation; nothing to compare", err=True)
    if cfg.speculative_tokens:
        from .simulate import spec_decode_stats

        st = spec_decode_stats(engine)
        click.echo(f"speculative decoding: {st['num_accepted_tokens']} of {st['num_draft_tokens']} draft tokens "
                   f"accepted ({st['acceptance_rate']:.1%}), mean acceptance length {st['acceptance_length']:.2f} "
                   f"tokens per verify step over {st['num_drafts']} verify steps")
    if cfg.enable_prefix_caching:
        hit, total = int(result["pred_num_cached_tokens"].sum()), int(frame["num_prompt_tokens"].sum())
        click.echo(f"prefix cache: {hit} of {total} prompt tokens hit ({hit / total:.1%})"
                   + ("" if "block_hashes" in frame else "; the trace has no block_hashes, so nothing can hit"))
    elif cfg.router == "prefix_affinity":
        click.echo("note: --router prefix_affinity needs --enable-prefix-caching; routing by load only", err=True)
    if cfg.slo_ttft_s is not None or cfg.slo_tpot_s is not None:
        from .metrics import goodput_rps

        slos = ", ".join(f"{k} <= {v} s" for k, v in (("ttft", cfg.slo_ttft_s), ("tpot", cfg.slo_tpot_s)) if v is not None)
        line = f"goodput ({slos}): predicted " \
               f"{goodput_rps(on_send_times(result), cfg.slo_ttft_s, cfg.slo_tpot_s):.3f} req/s"
        if {"ttft_s", "tpot_s", "e2e_s"} <= set(result.columns):
            line += f", measured {goodput_rps(result, cfg.slo_ttft_s, cfg.slo_tpot_s, prefix=''):.3f} req/s"
        click.echo(line)
    if output:
        from traces.io import write_trace

        write_trace(result, REPLAY_RESULT, output, {"calibration": str(calibration_path), "scheduler": cfg.scheduler})
        click.echo(f"wrote {output}")
    if steps_out:
        from traces.io import write_trace

        write_trace(steps_frame(engine), STEP_TRACE, steps_out, {"source": "servecal replay"})
        click.echo(f"wrote {steps_out}")
    if chrome_trace:
        from .chrome_trace import write_chrome_trace

        # closed loop: the simulated sends
        written = write_chrome_trace(chrome_trace, engine, on_send_times(result), trace_window,
                                     chrome_trace_max_requests)
        if written.cut:
            click.echo(wrap(f"warning: --chrome-trace-max-requests {chrome_trace_max_requests}: {chrome_trace} holds the "
                            f"first {written.num_requests} of {written.num_in_window} requests (simulated time up to "
                            f"{written.end_s:.1f} s); raise it (0: no limit) or choose a --chrome-trace-window"),
                       err=True)
        click.echo(f"wrote {chrome_trace}")
    table = compare(result)
    click.echo(format_table(table, wide=wide))
    if report:
        from .report import write_report

        from .report import report_context

        written = write_report(on_send_times(result), report, timeseries, steps_frame(engine),
                               report_context(trace, calibration_path, cost_model, cfg, engine), tolerances)
        click.echo(wrap(f"wrote {', '.join(str(p) for p in written)}"))
    if tolerances:
        broken = broken_tolerances(table, tolerances)
        for b in broken:
            click.echo(wrap(f"tolerance broken: {b}"), err=True)
        if broken:
            raise SystemExit(3)


def chrome_trace_options(chrome_trace, window: str | None, max_requests: int):
    """The parsed ``--chrome-trace-window`` (None when not given).

    Raises
    ------
    click.UsageError
        ``--chrome-trace-window`` or a non-default ``--chrome-trace-max-requests`` without
        ``--chrome-trace``; a bad window.
    """
    from .chrome_trace import parse_window

    ctx = click.get_current_context()
    given = [opt for opt, name in (("--chrome-trace-window", "chrome_trace_window"),
                                   ("--chrome-trace-max-requests", "chrome_trace_max_requests"))
             if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE]
    if given and not chrome_trace:
        raise click.UsageError(f"{', '.join(given)}: give --chrome-trace too")
    try:
        return parse_window(window)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None


def engine_sources(vllm_log: str | None, cal: Calibration | None = None, cal_path=None) -> list:
    """The sources of engine settings, first wins: the measured server's log, then the
    calibration's recorded settings (:func:`fill_engine_options`)."""
    out = []
    if vllm_log:
        from traces.importers.vllm_log import engine_settings_from_vllm_log

        out.append((f"vLLM log {vllm_log}", engine_settings_from_vllm_log(vllm_log)))
    if cal is not None and cal.engine:
        out.append((f"calibration {cal_path}", cal.engine))
    return out


def calibrated_cost_model(path, cal: Calibration, model_spec=None, tp: int | None = None, dp: int | None = None):
    """The cost model of calibration file ``path``; a model it cannot build (an unknown
    term, a TP that does not divide the heads) is the file's fault when nothing overrides it.

    Raises
    ------
    DataError
        Naming the file, when the file alone is at fault.
    ConfigError
        When ``--model`` or ``--tp`` makes the combination impossible.
    """
    try:
        return cost_model_from_calibration(cal, model_spec, tp, dp)
    except ConfigError as exc:
        if model_spec is None and tp is None and dp is None:
            raise DataError(f"{path}: {exc}") from None
        raise


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


def compare_schedulers_run(frame, meta, cost_model, cfg: ReplayConfig, names: list[str], wide: bool = False) -> None:
    """Replay ``frame`` under each scheduler of ``names`` (``cfg`` otherwise) and print one table.

    Colocated schedulers run on ``cfg.replicas`` replicas, ``disagg`` on its prefill and decode
    pools; the header says how many GPUs each uses.
    """
    from dataclasses import replace

    m = cost_model.model
    click.echo(wrap(f"comparing {len(names)} schedulers on {len(frame)} requests: model {m.name}, "
                    f"{hardware(cost_model, cfg)}, max_num_seqs={cfg.max_num_seqs}, "
                    f"max_num_batched_tokens={cfg.max_num_batched_tokens}"))
    if "disagg" in names:
        click.echo(wrap(f"  disagg: {describe_config(cost_model, cfg)}"))
    results = {}
    for name in names:
        results[name], _ = replay_frame(frame, cost_model, replace(cfg, scheduler=name), meta)
    click.echo(format_scheduler_table(scheduler_table(results, cfg.slo_ttft_s, cfg.slo_tpot_s), wide=wide))
    slo = [f"{k} <= {v} s" for k, v in (("ttft", cfg.slo_ttft_s), ("tpot", cfg.slo_tpot_s)) if v is not None]
    click.echo(wrap("(predicted, ms over completed requests; goodput: completed requests/s"
                    + (f" meeting {' and '.join(slo)}" if slo else "; no --slo-ttft-s/--slo-tpot-s given")
                    + ("" if wide else "; --wide: every column") + ")"))


def hardware(cost_model, cfg: ReplayConfig) -> str:
    """``"2 replicas of 2 x h100-80gb (TP=2), 4 GPUs"`` or ``"1 x h100-80gb (TP=1)"``."""
    one = f"{cost_model.tp} x {cost_model.gpu.name} (TP={cost_model.tp})"
    if cfg.replicas == 1:
        return one
    return f"{cfg.replicas} replicas of {one}, {cfg.replicas * cost_model.tp} GPUs"


def add_load_to_describe(describe: click.Command) -> click.Command:
    """Give ``traces describe`` the ``--calibration``/``--model`` options (offered load, P-K).

    ``traces`` sits below ``replay`` and cannot import it, so the top-level command line
    (calibrate/umbrella.py) extends the command in place.
    """
    describe.params += [
        click.Option(["--calibration", "calibration_path"], type=click.Path(dir_okay=False), default=None,
                     help="Show the offered load rho, E[S], E[S^2] and the Pollaczek-Khinchine wait of a "
                          "request-at-a-time server with this calibration, next to the replayed wait."),
        click.Option(["--model"], default=None, help="With --calibration: another model on the calibrated GPU."),
    ]
    base = describe.callback

    @_errors
    def callback(calibration_path=None, model=None, **kwargs):
        base(**kwargs)
        if calibration_path:
            click.echo(describe_load(kwargs["file"], calibration_path, model))

    describe.callback = callback
    describe.help += ("\n\n    With --calibration, the M/G/1 view (seed section 3): each request served alone "
                      "on the roofline,\n    rho = lambda E[S], and the P-K mean wait next to a batch-size-1 FCFS replay.")
    return describe


def describe_load(trace: str, calibration_path: str, model: str | None) -> str:
    """The offered-load section of ``traces describe --calibration``."""
    from traces.io import read_trace

    from .queueing import offered_load

    cal = Calibration.read(calibration_path)
    cost_model = calibrated_cost_model(calibration_path, cal, get_model(model) if model else None)
    kind, frame, _ = read_trace(trace)
    if kind != REQUEST_TRACE:
        raise DataError(f"{trace}: is a {kind}; --calibration needs a request trace")
    if "status" in frame:
        frame = frame[frame["status"].isna() | (frame["status"] == "ok")]
    load = offered_load(frame["arrival_time_s"], frame["num_prompt_tokens"], frame["num_output_tokens"], cost_model)
    lines = [f"offered load on 1 x {cost_model.gpu.name} ({cost_model.model.name}), one request at a time:",
             f"  lambda = {load['arrival_rate_per_s']:.4g} req/s, E[S] = {load['mean_service_s'] * 1e3:.1f} ms, "
             f"E[S^2] = {load['second_moment_s2']:.4g} s^2, SCV = {load['scv']:.3f}, rho = {load['rho']:.3f}"]
    if load["rho"] < 1:
        res, _ = replay_frame(frame, cost_model, ReplayConfig(scheduler="fcfs", max_num_seqs=1,
                                                              max_num_batched_tokens=1 << 62))
        lines.append(f"  P-K mean wait (M/G/1) = {load['pk_mean_wait_s'] * 1e3:.1f} ms; batch-size-1 FCFS replay "
                     f"mean wait = {np.nanmean(res['pred_queue_wait_s']) * 1e3:.1f} ms (arrivals as traced, "
                     "so equal only for Poisson arrivals)")
    else:
        lines.append("  rho >= 1: a request-at-a-time server cannot keep up; the load needs batching "
                     "(see replay) and has no M/G/1 steady state")
    if "queue_wait_s" in frame and frame["queue_wait_s"].notna().any():
        lines.append(f"  measured mean queue wait = {frame['queue_wait_s'].mean() * 1e3:.1f} ms (the batching engine)")
    return "\n".join(lines)


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
    from .sweep import check_output_path, check_ray, parse_sweeps

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
              sweep_out: str | None, wide: bool = False, quiet: bool = False) -> None:
    """Replay ``frame`` at every point of ``sweeps`` (``cfg`` otherwise), print the table, write ``sweep_out``."""
    import os
    import time

    from .sweep import SweepContext, format_sweep_table, run_sweep, sweep_points, write_sweep_table

    n = len(sweep_points(sweeps))
    m = cost_model.model
    loop = "" if cfg.concurrency is None else f", closed loop: {cfg.concurrency} clients"
    click.echo(wrap(f"sweeping {n} points ({' x '.join(f'{len(v)} {k}' for k, v in sweeps.items())}) on "
                    f"{len(frame)} requests: model {m.name}, {hardware(cost_model, cfg)}, scheduler {cfg.scheduler}, "
                    f"max_num_seqs={cfg.max_num_seqs}, max_num_batched_tokens={cfg.max_num_batched_tokens}{loop} "
                    "(swept options override these)"))
    start = time.perf_counter()
    table = run_sweep(SweepContext(frame, meta or {}, cost_model, cfg), sweeps, jobs, ray_address)
    where = (f"on Ray ({ray_address})" if ray_address else
             f"on {min(jobs or os.cpu_count() or 1, n)} local process(es)")
    click.echo(format_sweep_table(table, list(sweeps), wide=wide))
    slo = [f"{k} <= {v} s" for k, v in (("ttft", cfg.slo_ttft_s), ("tpot", cfg.slo_tpot_s)) if v is not None]
    click.echo(wrap("(predicted, ms over completed requests; throughput: completed requests/s"
                    + (f"; goodput: those meeting {' and '.join(slo)}" if slo else
                       "; give --slo-ttft-s/--slo-tpot-s for goodput")
                    + ("" if wide else "; --wide: every column") + ")"))
    if not quiet:
        click.echo(f"{n} points in {time.perf_counter() - start:.1f} s {where}", err=True)
    if sweep_out:
        write_sweep_table(table, sweep_out)
        click.echo(f"wrote {sweep_out}")
