"""The options of ``replay`` that ``calibrate`` shares, and the checks of option values that
need no trace (tolerances, the Chrome trace window).

Nothing heavy is imported here: these definitions are built for ``--help``.
"""
from __future__ import annotations

import math

import click

from schemas.specs import link_presets

from ..errors import ConfigError
from ..schedulers.disagg import FIRST_TOKEN_FROM


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
        click.option("--pp-prefill", type=click.IntRange(min=1), default=None,
                     help="disagg: pipeline-parallel stages of a prefill instance [default: --pp]."),
        click.option("--pp-decode", type=click.IntRange(min=1), default=None,
                     help="disagg: pipeline-parallel stages of a decode instance [default: --pp]."),
        click.option("--link", type=click.Choice(list(link_presets())), default=None,
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


def pipeline_parallel_option(default: int | None, default_help: str):
    """``--pp``/``--pipeline-parallel-size`` (vLLM's name): the pipeline-parallel stages of one
    replica (:mod:`replay.pipeline`), shared by ``replay`` and ``calibrate``; the value is ``pp``."""
    return click.option("--pp", "--pipeline-parallel-size", "pp", type=click.IntRange(min=1), default=default,
                        show_default=default is not None,
                        help="Pipeline-parallel stages of one replica (vLLM --pipeline-parallel-size): each holds "
                             f"1/PP of the layers, up to PP micro-batches in flight{default_help}.")


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


def report_folders(kwargs: dict) -> dict:
    """``{"--report": (folder, "figures", names)}`` for a Markdown ``--report`` (its figures'
    folder, :func:`replay.report.figures_folder`, and the files it may write there,
    :data:`replay.report.FIGURE_NAMES`), else ``{}``: ``user_errors`` refuses, before any
    work, a file of that name, any input or output inside it, and a figure's name there
    that is not a regular file."""
    if not kwargs.get("report"):
        return {}
    from ..report import FIGURE_NAMES, figures_folder

    folder = figures_folder(kwargs["report"])
    return {"--report": (str(folder), "figures", FIGURE_NAMES)} if folder is not None else {}


#: Options of :func:`replay_options` that only ``--scheduler disagg`` uses (None when not given).
DISAGG_OPTIONS = ("prefill_replicas", "decode_replicas", "tp_prefill", "tp_decode", "pp_prefill", "pp_decode", "link",
                  "link_bandwidth_bytes_per_s", "link_latency_s", "first_token_from")


def parse_tolerances(text: str | None) -> dict[str, float]:
    """``"ttft_p50=0.1,tpot_p50=0.1"`` -> ``{"ttft_p50": 0.1, "tpot_p50": 0.1}``."""
    from ..compare import METRIC_LABELS

    known = set(METRIC_LABELS)
    out = {}
    for part in filter(None, (text or "").split(",")):
        key, sep, val = part.partition("=")
        key = key.strip()
        metric, _, stat = key.rpartition("_")
        try:
            out[key] = float(val)
        except ValueError:
            out[key] = math.nan
        if not (sep and out[key] >= 0):  # NaN fails too
            raise click.BadParameter(f"{part!r}: expected metric_stat=fraction, e.g. ttft_p50=0.1",
                                     param_hint="--tolerance") from None
        if metric not in known or not (stat == "mape" or stat in ("p50", "p90", "p99")):
            raise click.BadParameter(f"{key!r}: expected <metric>_<stat> with metric one of "
                                     f"{', '.join(sorted(known))} and stat p50, p90, p99 or mape",
                                     param_hint="--tolerance")
    return out


def chrome_trace_options(chrome_trace, window: str | None, max_requests: int):
    """The parsed ``--chrome-trace-window`` (None when not given).

    Raises
    ------
    click.UsageError
        ``--chrome-trace-window`` or a non-default ``--chrome-trace-max-requests`` without
        ``--chrome-trace``; a bad window.
    """
    from ..chrome_trace import parse_window

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


def command_line() -> str:
    """The command being run as typed, from its parameters given on the command line
    (``replay run.parquet --calibration cal.json --tp 2``; shell-quoted), for a report."""
    import shlex

    ctx = click.get_current_context()
    words = ctx.command_path.split()  # 'servecal plan': two words, not one quoted
    for p in ctx.command.params:
        if ctx.get_parameter_source(p.name) != click.core.ParameterSource.COMMANDLINE:
            continue
        value = ctx.params.get(p.name)
        if isinstance(p, click.Argument):
            words.append(str(value))
        elif getattr(p, "is_flag", False) and not getattr(p, "count", False):
            words.append(p.opts[0] if value or not p.secondary_opts else p.secondary_opts[0])
        else:
            for v in (value if p.multiple else [value]):
                words += [p.opts[-1] if p.opts[-1].startswith("--") else p.opts[0], str(v)]
    return shlex.join(words)
