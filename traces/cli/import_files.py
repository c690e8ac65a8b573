"""``traces import``: the group, and the importers of trace and profile files (public traces,
per-request timestamp logs, kernel profiles, any CSV through a column mapping)."""
from __future__ import annotations

import click

from .support import user_errors
from schemas.errors import SchemaError
from schemas.kinds import AGGREGATE_TARGETS, REQUEST_TRACE, STEP_TRACE

from ..errors import MappingError, TraceError
from ._shared import INVALID, OUTPUT, file_errors, pairs, progress, write_requests


@click.group("import")
def import_():
    """Convert a foreign trace or profile into a servecal Parquet table.

    \b
    Example:
      traces import vllm-request-stats run_requests.jsonl -o run.parquet
    """


@import_.command("vllm-request-stats")
@click.argument("src", type=click.Path(dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Output Parquet file.")
@click.option("--arrival-clock", type=click.Choice(["engine", "wall"]), default="engine", show_default=True,
              help="Clock of arrival_time_s: the engine's queued_ts or the client's arrival_time.")
@file_errors
def import_vllm_request_stats(src, output, arrival_clock):
    """vLLM v1 per-request state timestamps (one JSON object per line) -> request trace.

    \b
    Example:
      traces import vllm-request-stats lss_vllm_rtxpro6000_llama31_8b_requests.jsonl -o llama.parquet
    """
    from ..importers.vllm_request_stats import import_vllm_request_stats as imp
    from ..io import write_trace

    frame, meta = imp(src, arrival_clock)
    write_trace(frame, REQUEST_TRACE, output, meta, source=str(src))
    click.echo(f"{output}: {len(frame)} requests over {frame['arrival_time_s'].iloc[-1]:.1f} s (request_trace/1)")


@import_.command("llmservingsim-profile")
@click.argument("sources", nargs=-1, required=True, type=click.Path())
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Output Parquet file.")
@click.option("--num-layers", type=click.IntRange(min=1), default=None,
              help="Decoder layers of the model (default: from the catalog entry of meta.yaml's model).")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True, help="TP degree of the profile to use.")
@file_errors
def import_llmservingsim_profile(sources, output, num_layers, tp):
    """LLMServingSim per-layer kernel profile -> step trace (one row per batch shape).

    SOURCES is the profiler's folder, or files ending in meta.yaml, dense.csv,
    attention.csv and per_sequence.csv.

    \b
    Example:
      traces import llmservingsim-profile lss_profile_rtxpro6000_llama31_8b_* -o steps.parquet
    """
    from schemas.specs import get_model

    from ..importers.llmservingsim_profile import import_llmservingsim_profile as imp, read_profile_meta
    from ..io import write_trace

    where = ", ".join(str(s) for s in sources)
    if num_layers is None:
        meta = read_profile_meta(list(sources))
        model_name = meta.get("model")
        if not model_name:
            raise click.UsageError(f"{where}: meta.yaml names no model; give --num-layers")
        try:
            num_layers = get_model(str(model_name)).num_layers
        except SchemaError as exc:
            raise click.UsageError(f"{where}: meta.yaml's model: {exc}; give --num-layers") from None
    frame, meta = imp(list(sources), num_layers=num_layers, tp=tp)
    write_trace(frame, STEP_TRACE, output, {k: v for k, v in meta.items() if isinstance(v, (str, int, float))},
                source=where)
    click.echo(f"{output}: {len(frame)} steps (step_trace/1), {num_layers} layers")



# ---------------------------------------------------------------------------
# Importers of request traces, one command per format
# ---------------------------------------------------------------------------

@import_.command("azure")
@click.argument("src", type=click.Path(dir_okay=False))
@OUTPUT
@INVALID
@file_errors
def import_azure_cmd(src, output, invalid):
    """Azure LLM inference trace CSV (2023/2024: TIMESTAMP, ContextTokens, GeneratedTokens).

    Arrival = TIMESTAMP minus the first, exact to 100 ns. Streams the file, so
    traces of 10^7 rows fit in bounded memory.

    \b
    Example:
      traces import azure AzureLLMInferenceTrace_conv.csv -o conv.parquet
    """
    from ..importers.azure import import_azure

    with progress("azure", src) as bar:
        frame, meta = import_azure(src, invalid=invalid, progress=bar)
    write_requests(frame, meta, output)


@import_.command("vidur")
@click.argument("src", type=click.Path(dir_okay=False))
@OUTPUT
@INVALID
@file_errors
def import_vidur_cmd(src, output, invalid):
    """Vidur processed trace CSV (arrived_at s, num_prefill_tokens, num_decode_tokens).

    \b
    Example:
      traces import vidur splitwise_conv.csv -o conv.parquet
    """
    from ..importers.vidur import import_vidur

    with progress("vidur", src) as bar:
        frame, meta = import_vidur(src, invalid=invalid, progress=bar)
    write_requests(frame, meta, output)


@import_.command("burstgpt")
@click.argument("src", type=click.Path(dir_okay=False))
@OUTPUT
# not named 'model': that parameter name is a --model spec file to user_errors
@click.option("--model", "keep_model", default=None, help="Keep only this Model (e.g. GPT-4, ChatGPT).")
@INVALID
@file_errors
def import_burstgpt_cmd(src, output, keep_model, invalid):
    """BurstGPT CSV (Timestamp s, Model, Request/Response/Total tokens, Log Type).

    Rows with 0 response tokens are failed requests: kept with status
    'failed: zero response tokens' and skipped by replay. Equal timestamps are
    kept in file order (the trace's resolution is 1 s).

    \b
    Example:
      traces import burstgpt BurstGPT_1.csv --model GPT-4 -o gpt4.parquet
    """
    from ..importers.burstgpt import import_burstgpt

    with progress("burstgpt", src) as bar:
        frame, meta = import_burstgpt(src, model=keep_model, invalid=invalid, progress=bar)
    write_requests(frame, meta, output)


@import_.command("mooncake")
@click.argument("src", type=click.Path(dir_okay=False))
@OUTPUT
@click.option("--block-tokens", type=click.IntRange(min=1), default=512, show_default=True,
              help="Tokens per hash_ids block in the trace.")
@INVALID
@file_errors
def import_mooncake_cmd(src, output, block_tokens, invalid):
    """Mooncake JSONL trace (timestamp ms, input_length, output_length, hash_ids).

    hash_ids become block_hashes; a row whose hash_ids count is not
    ceil(input_length / 512) follows --invalid.

    \b
    Example:
      traces import mooncake conversation_trace.jsonl -o mooncake.parquet
    """
    from ..importers.mooncake import import_mooncake

    with progress("mooncake", src) as bar:
        frame, meta = import_mooncake(src, block_tokens=block_tokens, invalid=invalid, progress=bar)
    write_requests(frame, meta, output)



@import_.command("csv")
@click.argument("src", type=click.Path(dir_okay=False))
@OUTPUT
@click.option("--map", "mapping", multiple=True, required=True, metavar="SOURCE_COLUMN=FIELD",
              help="Map a source column onto a field (repeat). Fields: request_id, num_prompt_tokens, "
                   "num_output_tokens, arrival_time_s, send_time, scheduled_time, first_token_time, end_time "
                   "(instants); queue_wait_s, ttft_s, tpot_s, e2e_s, slo_ttft_s, slo_tpot_s (durations); "
                   "num_cached_tokens, replica_id, priority, status.")
@click.option("--time-unit", type=click.Choice(["s", "ms", "us", "ns"]), default="s", show_default=True,
              help="Unit of numeric time columns (date-times and Arrow timestamp/duration types carry their own).")
@click.option("--filter", "filters", multiple=True, metavar="COLUMN=VALUE",
              help="Keep only rows whose COLUMN equals VALUE (repeat to AND several).")
@INVALID
@user_errors(data_errors=(TraceError, OSError), usage_errors=(MappingError,))
def import_csv_cmd(src, output, mapping, time_unit, filters, invalid):
    """Any CSV or Parquet request log, through a column mapping.

    Every time column is brought to one origin (the first arrival); latencies are
    instants minus the send time, and a relative column is never subtracted from
    an epoch one.

    \b
    Example:
      traces import csv log.csv -o run.parquet --time-unit us \\
        --map send_time_us=send_time --map first_token_time_us=first_token_time \\
        --map end_time_us=end_time --map input_tokens=num_prompt_tokens \\
        --map output_tokens=num_output_tokens --map request_id=request_id
    """
    from ..importers.csv_generic import import_csv
    from ..importers.csv_generic.mapping import parse_mapping

    fmap = parse_mapping(mapping)
    with progress("csv", src) as bar:
        frame, meta = import_csv(src, fmap, time_unit=time_unit, filters=pairs("--filter", filters),
                                 invalid=invalid, progress=bar)
    write_requests(frame, meta, output)


def _selector(field: str, kind, what: str):
    return click.option(f"--{field}", f"select_{field}", multiple=True, type=kind, metavar="VALUE[,VALUE]",
                        help=f"inferencemax: keep the points of {what} (repeatable, or comma-separated).")


def _inferencemax_selection(given: dict) -> dict:
    """``--hw h200,b200 --tp 8`` (``select_hw``, ``select_tp``) -> ``{"hw": ("h200", "b200"),
    "tp": (8,)}``, whole numbers for the numeric fields (click.BadParameter naming the option
    otherwise)."""
    from ..importers.inferencemax import SELECTORS

    out = {}
    for name, values in given.items():
        field = name.removeprefix("select_")  # not 'model': that name is a model spec's (--model in calibrate)
        items = [v.strip() for value in values for v in value.split(",") if v.strip()]
        if SELECTORS[field] is int:
            bad = [v for v in items if not (v.isascii() and v.isdigit())]
            if bad:
                raise click.BadParameter(f"{bad[0]!r} is not a whole number", param_hint=f"--{field}")
            items = [int(v) for v in items]
        if items:
            out[field] = tuple(items)
    return out


@import_.command("summary")
@click.argument("fmt", metavar="FORMAT",
                type=click.Choice(["llmperf", "guidellm", "vllm-bench", "sglang-bench", "inferencemax"]))
@click.argument("sources", nargs=-1, required=True, type=click.Path(dir_okay=False))
@OUTPUT
@click.option("--shared-prefix-tokens", type=click.IntRange(min=0), default=0, show_default=True,
              help="Tokens every prompt of a level opens with (a shared system prompt, GuideLLM's prefix_tokens): "
                   "the fit's synthesized prompts share them, so the prefix cache hits as measured. An aggregate "
                   "does not record it.")
@_selector("hw", str, "these GPUs (h100, h200, b200, b200-trt, ...)")
@_selector("model", str, "these models (Hugging Face ids)")
@_selector("framework", str, "these engines (vllm, sglang, trt, ...)")
@_selector("precision", str, "these precisions (fp4, fp8)")
@_selector("tp", str, "these tensor-parallel sizes")
@_selector("ep", str, "these expert-parallel sizes")
@_selector("isl", str, "these input lengths (tokens)")
@_selector("osl", str, "these output lengths (tokens)")
@click.option("--range-ratio", type=click.FloatRange(0, 1), default=None,
              help="inferencemax: the benchmark's --random-range-ratio R, lengths uniform in [int(L*R), L] "
                   "[default: 0.8, InferenceMAX's; not in the file].")
@click.option("--prompts-per-client", type=click.IntRange(min=1), default=None,
              help="inferencemax: requests per client (--num-prompts / conc) [default: 10, InferenceMAX's; "
                   "not in the file].")
@file_errors
def import_summary_cmd(fmt, sources, output, shared_prefix_tokens, range_ratio, prompts_per_client, **selection):
    """A benchmark's aggregate results (percentiles per load level, no per-request rows)
    -> aggregate_targets/1, which 'calibrate fit' matches by replaying each level.

    One level per LLMPerf summary, per GuideLLM benchmark, per vLLM result file, per line
    of an SGLang output file, per selected point of an InferenceMAX agg_bmk.json (one
    deployment; in order of isl, osl, conc); FILE#K in 'calibrate fit' takes level K
    (0-based, in order).

    \b
    Example:
      traces import summary llmperf anyscale_70b_summary.json -o agg.parquet
      traces import summary vllm-bench rate2.json rate4.json rate8.json -o agg.parquet
      traces import summary inferencemax agg_bmk.json --hw h200 --framework sglang \\
                            --precision fp8 --isl 1024 --osl 1024 -o dsr1_1k1k.parquet
    """
    selection = _inferencemax_selection(selection)
    if fmt == "inferencemax":
        from ..importers.inferencemax import DEFAULT_RANGE_RATIO, PROMPTS_PER_CLIENT, import_inferencemax

        if len(sources) != 1:
            raise click.UsageError("inferencemax: give one agg_bmk.json (each run's points are one file)")
        frame, meta = import_inferencemax(sources[0], selection,
                                          DEFAULT_RANGE_RATIO if range_ratio is None else range_ratio,
                                          PROMPTS_PER_CLIENT if prompts_per_client is None else prompts_per_client)
        write_summary(frame, meta, output, shared_prefix_tokens)
        return
    named = [f"--{f}" for f in selection] + ["--range-ratio"] * (range_ratio is not None) \
        + ["--prompts-per-client"] * (prompts_per_client is not None)
    if named:
        raise click.UsageError(f"{', '.join(named)}: only for FORMAT inferencemax")
    from ..importers.summaries import import_summaries

    frame, meta = import_summaries(sources, fmt)
    write_summary(frame, meta, output, shared_prefix_tokens)


def write_summary(frame, meta: dict, output: str, shared_prefix_tokens: int) -> None:
    """Write an imported aggregate (with ``shared_prefix_tokens`` in its metadata) and say what it holds."""
    from schemas.text import wrap

    from ..io import write_trace

    meta["shared_prefix_tokens"] = str(shared_prefix_tokens)
    write_trace(frame, AGGREGATE_TARGETS, output, meta, source=meta["source"])

    levels = frame.drop_duplicates("level")
    named = meta.get("levels") or ", ".join(f"{k.replace('_', ' ')} {v:g}" for k, v in zip(levels["level_kind"],
                                                                                        levels["level_value"]))
    click.echo(wrap(f"{output}: {len(levels)} level(s) ({named}), {len(frame)} statistics (aggregate_targets/1)"))
