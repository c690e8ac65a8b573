"""``traces``: import, validate, describe, synthesise and transform serving traces."""
from __future__ import annotations

import contextlib
import os
import sys

import click

from schemas.cli_support import user_errors, version_option
from schemas.errors import SchemaError
from schemas.tables import REQUEST_TRACE, STEP_TRACE

from .errors import TraceError
from .importers.csv_generic import MappingError
from .io import read_trace, write_trace

_errors = user_errors(data_errors=(TraceError, OSError))
#: Commands whose TraceErrors are about the options, not a file (exit code 2).
_option_errors = user_errors(data_errors=(OSError,), usage_errors=(TraceError,))

_OUTPUT = click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Output Parquet file.")
_INVALID = click.option(
    "--invalid", type=click.Choice(["error", "flag", "drop"]), default="error", show_default=True,
    help="A row that breaks a rule of its format: stop with an error naming it; keep it with "
         "status 'invalid: <rule>' (replay and compare skip it); or leave it out (counted in the metadata).")
_ARRIVALS = click.option(
    "--arrivals", type=click.Choice(["auto", "recorded", "zero", "synth"]), default="auto", show_default=True,
    help="Arrival times: recorded start_times; all at 0 (request_rate=inf); synthesised from the run's "
         "request_rate and burstiness (seeded); auto = recorded, else zero for an inf rate, else an error.")
_SEED = click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seed of --arrivals synth.")


@contextlib.contextmanager
def _progress(label: str, path):
    """A progress bar over the bytes of ``path`` on stderr, only when stderr is a terminal."""
    try:
        size = os.path.getsize(path)
    except OSError:
        size = 0
    if not sys.stderr.isatty() or size < (8 << 20):
        yield None
        return
    with click.progressbar(length=size, label=label, file=sys.stderr) as bar:
        yield bar.update


def _write_requests(frame, meta: dict, output) -> None:
    """Validate and write an imported request trace; print a one-line summary and any warning."""
    write_trace(frame, REQUEST_TRACE, output, meta, source=meta.get("source"))
    span = float(frame["arrival_time_s"].iloc[-1]) if len(frame) else 0.0
    line = f"{output}: {len(frame)} requests over {span:.1f} s (request_trace/1)"
    extras = [f"{meta[k]} {w}" for k, w in (("num_failed", "failed"), ("num_invalid", "invalid"))
              if meta.get(k, "0") != "0"]
    if meta.get("num_invalid_dropped"):
        extras.append(f"{meta['num_invalid_dropped']} dropped")
    if extras:
        line += "; " + ", ".join(extras)
    click.echo(line)
    for k in ("arrival_vs_send_warning", "arrival_warning"):
        if meta.get(k):
            click.echo(f"Warning: {meta[k]}", err=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@version_option()
def main():
    """Import, validate, describe, synthesise and transform serving traces.

    \b
    Example:
      traces import azure AzureLLMInferenceTrace_conv.csv -o conv.parquet
      traces validate conv.parquet
      traces describe conv.parquet --plot conv.png
      traces slice conv.parquet --start 600 --end 1200 -o conv_10min.parquet
    """


@main.group("import")
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
@_errors
def import_vllm_request_stats(src, output, arrival_clock):
    """vLLM v1 per-request state timestamps (one JSON object per line) -> request trace.

    \b
    Example:
      traces import vllm-request-stats lss_vllm_rtxpro6000_llama31_8b_requests.jsonl -o llama.parquet
    """
    from .importers.vllm_request_stats import import_vllm_request_stats as imp

    frame, meta = imp(src, arrival_clock)
    write_trace(frame, REQUEST_TRACE, output, meta, source=str(src))
    click.echo(f"{output}: {len(frame)} requests over {frame['arrival_time_s'].iloc[-1]:.1f} s (request_trace/1)")


@import_.command("llmservingsim-profile")
@click.argument("sources", nargs=-1, required=True, type=click.Path())
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Output Parquet file.")
@click.option("--num-layers", type=click.IntRange(min=1), default=None,
              help="Decoder layers of the model (default: from the catalog entry of meta.yaml's model).")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True, help="TP degree of the profile to use.")
@_errors
def import_llmservingsim_profile(sources, output, num_layers, tp):
    """LLMServingSim per-layer kernel profile -> step trace (one row per batch shape).

    SOURCES is the profiler's folder, or files ending in meta.yaml, dense.csv,
    attention.csv and per_sequence.csv.

    \b
    Example:
      traces import llmservingsim-profile lss_profile_rtxpro6000_llama31_8b_* -o steps.parquet
    """
    from schemas.specs import get_model

    from .importers.llmservingsim_profile import import_llmservingsim_profile as imp, read_profile_meta

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


@main.command()
@click.argument("file", type=click.Path(dir_okay=False))
@_errors
def validate(file):
    """Check a servecal Parquet file against its schema; exit 0 if valid, 1 if not.

    \b
    Example:
      traces validate run.parquet
    """
    kind, frame, _ = read_trace(file)
    click.echo(f"{file}: valid {kind}, {len(frame)} rows")


@main.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--plot", "plot", type=click.Path(dir_okay=False), default=None,
              help="Also draw the arrival rate over time and the prompt/output length histograms to this image "
                   "(format from the suffix: .png, .pdf, .svg).")
@_errors
def describe(file, plot):
    """Summarise a trace: count, span, rate, burstiness, lengths, measured latencies.

    \b
    Example:
      traces describe run.parquet
      traces describe run.parquet --plot run.png
    """
    from .describe import describe_frame, format_description, plot_trace

    if plot and os.path.splitext(str(plot))[1].lower() not in (".png", ".pdf", ".svg", ".jpg", ".jpeg"):
        raise click.BadParameter(f"{plot}: expected a .png, .pdf, .svg or .jpg file name", param_hint="--plot")
    kind, frame, meta = read_trace(file)
    click.echo(format_description(describe_frame(kind, frame)))
    if plot:
        if kind == STEP_TRACE:
            raise click.UsageError("--plot draws request traces; this file is a step trace")
        plot_trace(frame, plot, title=os.path.basename(str(file)))
        click.echo(f"plot: {plot}")


# ---------------------------------------------------------------------------
# Importers of request traces, one command per format
# ---------------------------------------------------------------------------

@import_.command("azure")
@click.argument("src", type=click.Path(dir_okay=False))
@_OUTPUT
@_INVALID
@_errors
def import_azure_cmd(src, output, invalid):
    """Azure LLM inference trace CSV (2023/2024: TIMESTAMP, ContextTokens, GeneratedTokens).

    Arrival = TIMESTAMP minus the first, exact to 100 ns. Streams the file, so
    traces of 10^7 rows fit in bounded memory.

    \b
    Example:
      traces import azure AzureLLMInferenceTrace_conv.csv -o conv.parquet
    """
    from .importers.azure import import_azure

    with _progress("azure", src) as bar:
        frame, meta = import_azure(src, invalid=invalid, progress=bar)
    _write_requests(frame, meta, output)


@import_.command("vidur")
@click.argument("src", type=click.Path(dir_okay=False))
@_OUTPUT
@_INVALID
@_errors
def import_vidur_cmd(src, output, invalid):
    """Vidur processed trace CSV (arrived_at s, num_prefill_tokens, num_decode_tokens).

    \b
    Example:
      traces import vidur splitwise_conv.csv -o conv.parquet
    """
    from .importers.vidur import import_vidur

    with _progress("vidur", src) as bar:
        frame, meta = import_vidur(src, invalid=invalid, progress=bar)
    _write_requests(frame, meta, output)


@import_.command("burstgpt")
@click.argument("src", type=click.Path(dir_okay=False))
@_OUTPUT
@click.option("--model", default=None, help="Keep only this Model (e.g. GPT-4, ChatGPT).")
@_INVALID
@_errors
def import_burstgpt_cmd(src, output, model, invalid):
    """BurstGPT CSV (Timestamp s, Model, Request/Response/Total tokens, Log Type).

    Rows with 0 response tokens are failed requests: kept with status
    'failed: zero response tokens' and skipped by replay. Equal timestamps are
    kept in file order (the trace's resolution is 1 s).

    \b
    Example:
      traces import burstgpt BurstGPT_1.csv --model GPT-4 -o gpt4.parquet
    """
    from .importers.burstgpt import import_burstgpt

    with _progress("burstgpt", src) as bar:
        frame, meta = import_burstgpt(src, model=model, invalid=invalid, progress=bar)
    _write_requests(frame, meta, output)


@import_.command("mooncake")
@click.argument("src", type=click.Path(dir_okay=False))
@_OUTPUT
@click.option("--block-tokens", type=click.IntRange(min=1), default=512, show_default=True,
              help="Tokens per hash_ids block in the trace.")
@_INVALID
@_errors
def import_mooncake_cmd(src, output, block_tokens, invalid):
    """Mooncake JSONL trace (timestamp ms, input_length, output_length, hash_ids).

    hash_ids become block_hashes; a row whose hash_ids count is not
    ceil(input_length / 512) follows --invalid.

    \b
    Example:
      traces import mooncake conversation_trace.jsonl -o mooncake.parquet
    """
    from .importers.mooncake import import_mooncake

    with _progress("mooncake", src) as bar:
        frame, meta = import_mooncake(src, block_tokens=block_tokens, invalid=invalid, progress=bar)
    _write_requests(frame, meta, output)


@import_.command("vllm-bench")
@click.argument("src", type=click.Path(dir_okay=False))
@_OUTPUT
@_ARRIVALS
@_SEED
@_INVALID
@_errors
def import_vllm_bench_cmd(src, output, arrivals, seed, invalid):
    """vLLM benchmark_serving / 'vllm bench serve' result JSON with per-request arrays.

    Needs --save-detailed (input_lens, output_lens, ttfts, itls, errors). Failed
    requests are kept with status 'failed: <error>' and no latencies.

    \b
    Example:
      traces import vllm-bench vllm-10.0qps-Llama-3.1-8B.json -o bench.parquet
      traces import vllm-bench old-result.json --arrivals synth --seed 1 -o bench.parquet
    """
    from .importers.vllm_bench import import_vllm_bench

    frame, meta = import_vllm_bench(src, arrivals=arrivals, seed=seed, invalid=invalid)
    _write_requests(frame, meta, output)


@import_.command("sglang-bench")
@click.argument("src", type=click.Path(dir_okay=False))
@_OUTPUT
@click.option("--run", type=click.IntRange(min=1), default=None,
              help="1-based line (run) of the JSONL file; needed when several runs have per-request arrays.")
@_ARRIVALS
@_SEED
@_INVALID
@_errors
def import_sglang_bench_cmd(src, output, run, arrivals, seed, invalid):
    """SGLang bench_serving JSONL output (one run per line, saved with --output-details).

    \b
    Example:
      traces import sglang-bench sglang_0510_1000_sharegpt.jsonl --run 2 --arrivals synth -o run2.parquet
    """
    from .importers.sglang_bench import import_sglang_bench

    frame, meta = import_sglang_bench(src, run=run, arrivals=arrivals, seed=seed, invalid=invalid)
    _write_requests(frame, meta, output)


@import_.command("llmperf")
@click.argument("src", type=click.Path(dir_okay=False))
@_OUTPUT
@click.option("--concurrency", type=click.IntRange(min=1), required=True,
              help="The run's --num-concurrent-requests (not in the file; the summary JSON has it).")
@_INVALID
@_errors
def import_llmperf_cmd(src, output, concurrency, invalid):
    """LLMPerf individual responses JSON (ttft_s, end_to_end_latency_s, token counts).

    The file has no send times: arrivals are reconstructed as a closed loop of
    --concurrency clients (recorded as an estimate in the metadata).

    \b
    Example:
      traces import llmperf llmperf_leaderboard_anyscale_llama2_70b_individual.json --concurrency 5 -o llmperf.parquet
    """
    from .importers.llmperf import import_llmperf

    frame, meta = import_llmperf(src, concurrency=concurrency, invalid=invalid)
    _write_requests(frame, meta, output)


@import_.command("genai-perf")
@click.argument("src", type=click.Path(dir_okay=False))
@_OUTPUT
@click.option("--experiment", type=click.IntRange(min=1), default=None,
              help="1-based experiment (load level) of the file; needed when it holds several.")
@click.option("--prompt-tokens", type=click.IntRange(min=1), default=None,
              help="Prompt length for requests whose responses carry no usage (fixed-length synthetic inputs).")
@_INVALID
@_errors
def import_genai_perf_cmd(src, output, experiment, prompt_tokens, invalid):
    """GenAI-Perf / Perf Analyzer profile_export.json (request and response timestamps in ns).

    \b
    Example:
      traces import genai-perf artifacts/my_profile_export.json --prompt-tokens 128 -o genai.parquet
    """
    from .importers.genai_perf import import_genai_perf

    frame, meta = import_genai_perf(src, experiment=experiment, prompt_tokens=prompt_tokens, invalid=invalid)
    _write_requests(frame, meta, output)


@import_.command("guidellm")
@click.argument("src", type=click.Path(dir_okay=False))
@_OUTPUT
@click.option("--benchmark", type=click.IntRange(min=0), default=None,
              help="0-based benchmark of the report, in file order [default: all, with a 'benchmark' column].")
@click.option("--no-block-hashes", is_flag=True, default=False,
              help="Do not derive block_hashes (prefix-cache blocks) from the prompt text.")
@_INVALID
@_errors
def import_guidellm_cmd(src, output, benchmark, no_block_hashes, invalid):
    """GuideLLM benchmark report JSON (client timings per request) -> request trace.

    TTFT, E2E and TPOT come from info.timings (first/last token iteration);
    request_id = response_id + '-0', vLLM's request id, so the trace joins
    'traces import vllm-otlp'. block_hashes (16-token blocks) are derived from
    the prompt text at one characters-per-token ratio for the file (an
    approximation); errored/incomplete requests are kept with status 'failed: ...'.

    \b
    Example:
      traces import guidellm benchmarks.json -o sweep.parquet
      traces import guidellm benchmarks.json --benchmark 2 -o rate_0.76.parquet
    """
    from .importers.guidellm import import_guidellm

    frame, meta = import_guidellm(src, benchmark=benchmark, block_hashes=not no_block_hashes, invalid=invalid)
    _write_requests(frame, meta, output)
    if meta.get("num_dropped_unstarted", "0") != "0":
        click.echo(f"{meta['num_dropped_unstarted']} errored/incomplete requests that never started left out")
    if "shared_prefix_blocks" in meta:
        import json

        shared = json.loads(meta["shared_prefix_blocks"])
        click.echo(f"block_hashes: {meta['hash_block_tokens']}-token blocks at {float(meta['chars_per_token']):.3f} "
                   f"chars/token; leading blocks shared by all prompts, per benchmark: "
                   + ", ".join(f"{k}: {v}" for k, v in shared.items())
                   + f"; implied prefix-cache hit rate {float(meta['implied_prefix_cache_hit_rate']):.1%}")


@import_.command("vllm-otlp")
@click.argument("src", type=click.Path(dir_okay=False))
@_OUTPUT
@click.option("--guidellm", "guidellm", type=click.Path(dir_okay=False), default=None,
              help="GuideLLM report of the same run: adds its 'benchmark' column and the block_hashes derived "
                   "from its prompts, joined on the request id.")
@_INVALID
@_errors
def import_vllm_otlp_cmd(src, output, guidellm, invalid):
    """vLLM OpenTelemetry spans (OTLP/JSON lines from a collector's file exporter) -> request trace.

    One 'llm_request' span per request; other spans are counted and ignored.
    Latencies are vLLM's own (gen_ai.latency.*), arrivals the engine's.

    \b
    Example:
      traces import vllm-otlp traces.jsonl -o spans.parquet
      traces import vllm-otlp traces.jsonl --guidellm benchmarks.json -o spans.parquet
    """
    from .importers.vllm_otlp import import_vllm_otlp, join_guidellm

    if guidellm and os.path.realpath(guidellm) == os.path.realpath(output):
        raise click.UsageError(f"-o/--output {output}: the same file as --guidellm; choose another output name")
    with _progress("vllm-otlp", src) as bar:
        frame, meta = import_vllm_otlp(src, invalid=invalid, progress=bar)
    if guidellm:
        frame, meta = join_guidellm(frame, meta, guidellm)
    _write_requests(frame, meta, output)
    if meta.get("num_other_spans", "0") != "0":
        click.echo(f"{meta['num_other_spans']} other spans ignored ({meta['other_span_names']})")
    if guidellm:
        click.echo(f"--guidellm: {meta['guidellm_num_matched']} of {len(frame)} spans matched a GuideLLM request"
                   + (f"; {meta['guidellm_num_unmatched_spans']} have no benchmark"
                      if meta["guidellm_num_unmatched_spans"] != "0" else ""))


@import_.command("vllm-log")
@click.argument("src", type=click.Path(dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Output Parquet file (vllm_stats/1; the engine settings in its metadata).")
@click.option("--timeseries-csv", type=click.Path(dir_okay=False), default=None,
              help="Also write the series as the CSV 'replay --report --measured-timeseries' reads "
                   "(t, running, waiting, throughputs, kv_cache_pct).")
@click.option("--align-to", "align_to", type=click.Path(dir_okay=False), default=None,
              help="A request trace of the same run (from 'traces import guidellm' or 'vllm-otlp'): t_s becomes "
                   "seconds since its first arrival instead of since the first stats line.")
@click.option("--log-utc-offset", type=float, default=None,
              help="With --align-to: hours the log's clock is ahead of UTC (e.g. -8 for PST) "
                   "[default: inferred, the first stats line nearest the trace's start].")
@_errors
def import_vllm_log_cmd(src, output, timeseries_csv, align_to, log_utc_offset):
    """vLLM server log -> stats time series (vllm_stats/1) and engine settings.

    Reads the 'non-default args' dict, the resolved engine settings (chunked
    prefill budget, max model len, parallel sizes, prefix caching), the KV cache
    size and num_gpu_blocks, and every periodic 'Engine NNN: Avg prompt
    throughput ...' line (running, waiting, KV cache usage, prefix cache hit rate).

    \b
    Example:
      traces import vllm-log vllm.log -o stats.parquet
      traces import vllm-log vllm.log --align-to run.parquet --timeseries-csv ts.csv -o stats.parquet
    """
    import json

    from schemas.cli_support import check_outputs
    from schemas.tables import VLLM_STATS

    from .importers.vllm_log import import_vllm_log, timeseries_csv_frame

    if log_utc_offset is not None and not align_to:
        raise click.UsageError("--log-utc-offset places the log on a trace's clock: give --align-to too")
    if timeseries_csv:
        check_outputs([src, output, align_to], {"--timeseries-csv": timeseries_csv})
    origin = None
    if align_to:
        _, _, tmeta = read_trace(align_to, REQUEST_TRACE)
        if "time_origin_unix_s" not in tmeta:
            raise click.UsageError(f"--align-to {align_to}: the trace has no time_origin_unix_s metadata (import it "
                                   "with 'traces import guidellm' or 'traces import vllm-otlp')")
        origin = float(tmeta["time_origin_unix_s"])
    frame, meta = import_vllm_log(src, origin_unix_s=origin, utc_offset_hours=log_utc_offset)
    if align_to:
        meta["aligned_to"] = str(align_to)
    write_trace(frame, VLLM_STATS, output, meta, source=src)
    if timeseries_csv:
        from schemas.tables import write_text_atomic

        write_text_atomic(timeseries_csv_frame(frame).to_csv(index=False, float_format="%.6g"), timeseries_csv)
    s = json.loads(meta["engine_settings"])
    keys = ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "tensor_parallel_size", "block_size",
            "num_gpu_blocks", "enable_prefix_caching", "enable_chunked_prefill")
    click.echo(f"{output}: {len(frame)} stats lines over {frame['t_s'].iloc[-1] - frame['t_s'].iloc[0]:.0f} s "
               f"(vllm_stats/1), vLLM {meta['vllm_version'] or '?'}")
    click.echo("engine: " + ", ".join(f"{k}={s.get(k)}" for k in keys))
    if align_to:
        click.echo(f"aligned to {align_to}: log clock UTC{float(meta['log_utc_offset_hours']):+g} h "
                   f"({meta['log_utc_offset_source'].split(' (')[0]}), first stats line at t = "
                   f"{float(meta['first_stats_line_t_s']):.1f} s")
    if timeseries_csv:
        click.echo(f"timeseries: {timeseries_csv}")


def _pairs(option: str, values) -> dict[str, str]:
    out = {}
    for v in values:
        k, sep, x = v.partition("=")
        if not sep or not k:
            raise click.BadParameter(f"{v!r}: expected COLUMN=VALUE", param_hint=option)
        out[k] = x
    return out


@import_.command("csv")
@click.argument("src", type=click.Path(dir_okay=False))
@_OUTPUT
@click.option("--map", "mapping", multiple=True, required=True, metavar="SOURCE_COLUMN=FIELD",
              help="Map a source column onto a field (repeat). Fields: request_id, num_prompt_tokens, "
                   "num_output_tokens, arrival_time_s, send_time, scheduled_time, first_token_time, end_time "
                   "(instants); queue_wait_s, ttft_s, tpot_s, e2e_s, slo_ttft_s, slo_tpot_s (durations); "
                   "num_cached_tokens, replica_id, priority, status.")
@click.option("--time-unit", type=click.Choice(["s", "ms", "us", "ns"]), default="s", show_default=True,
              help="Unit of numeric time columns (date-times and Arrow timestamp/duration types carry their own).")
@click.option("--filter", "filters", multiple=True, metavar="COLUMN=VALUE",
              help="Keep only rows whose COLUMN equals VALUE (repeat to AND several).")
@_INVALID
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
    from .importers.csv_generic import import_csv, parse_mapping

    fmap = parse_mapping(mapping)
    with _progress("csv", src) as bar:
        frame, meta = import_csv(src, fmap, time_unit=time_unit, filters=_pairs("--filter", filters),
                                 invalid=invalid, progress=bar)
    _write_requests(frame, meta, output)


# ---------------------------------------------------------------------------
# Export
# ---------------------------------------------------------------------------

@main.group("export")
def export_():
    """Write a servecal trace in another tool's format.

    \b
    Example:
      traces export vidur conv.parquet -o conv_vidur.csv
    """


@export_.command("vidur")
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Output CSV file.")
@_errors
def export_vidur_cmd(trace, output):
    """Request trace -> Vidur processed trace CSV (arrived_at, num_prefill_tokens, num_decode_tokens).

    Rows whose status is not ok (failed or invalid) are left out and counted.

    \b
    Example:
      traces export vidur conv.parquet -o splitwise_conv.csv
    """
    from .importers.vidur import export_vidur

    _, frame, _ = read_trace(trace, REQUEST_TRACE)
    counts = export_vidur(frame, output)
    msg = f"{output}: {counts['written']} requests (vidur)"
    if counts["skipped"]:
        msg += f"; {counts['skipped']} not-ok rows left out"
    click.echo(msg)


# ---------------------------------------------------------------------------
# Synthesis and transformations
# ---------------------------------------------------------------------------

@main.command()
@click.option("--requests", "num_requests", type=click.IntRange(min=1), required=True, help="Number of requests.")
@click.option("--rate", type=float, required=True, help="Mean arrival rate, requests/s.")
@_OUTPUT
@click.option("--arrival", type=click.Choice(["poisson", "gamma"]), default="poisson", show_default=True,
              help="Arrival process: exponential gaps, or gamma gaps with coefficient of variation --cv.")
@click.option("--cv", type=float, default=1.0, show_default=True,
              help="Coefficient of variation of the gamma gaps (> 1 bursty).")
@click.option("--prompt-tokens", default="lognormal:mean=512,sigma=0.8", show_default=True,
              help="Prompt length distribution: fixed:N, uniform:LO,HI, lognormal:mean=M,sigma=S, "
                   "empirical:TRACE.parquet.")
@click.option("--output-tokens", default="lognormal:mean=256,sigma=0.8", show_default=True,
              help="Output length distribution (same forms).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seed: same seed, same bytes.")
@_option_errors
def synth(num_requests, rate, output, arrival, cv, prompt_tokens, output_tokens, seed):
    """Write a synthetic request trace (no measured latencies), reproducibly.

    \b
    Example:
      traces synth --requests 1000 --rate 5 --arrival gamma --cv 2 \\
        --prompt-tokens lognormal:mean=1024,sigma=0.6 --output-tokens fixed:128 --seed 7 -o synth.parquet
    """
    from .synth import synth_requests

    frame = synth_requests(num_requests, rate, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                           arrival=arrival, cv=cv, seed=seed)
    meta = {"source_format": "synth", "synth_requests": str(num_requests), "synth_rate_rps": repr(float(rate)),
            "synth_arrival": arrival, "synth_cv": repr(float(cv)), "synth_prompt_tokens": prompt_tokens,
            "synth_output_tokens": output_tokens, "synth_seed": str(seed)}
    write_trace(frame, REQUEST_TRACE, output, meta)
    click.echo(f"{output}: {len(frame)} requests over {frame['arrival_time_s'].iloc[-1]:.1f} s (request_trace/1)")


@main.command("slice")
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option("--start", type=float, default=0.0, show_default=True, help="Window start, seconds (inclusive).")
@click.option("--end", type=float, default=float("inf"), help="Window end, seconds (exclusive; default: the end).")
@_OUTPUT
@_option_errors
def slice_cmd(trace, start, end, output):
    """Keep the requests arriving in [START, END) s; arrivals rebased to START.

    \b
    Example:
      traces slice conv.parquet --start 600 --end 1200 -o conv_10min.parquet
    """
    from .transform import slice_trace

    _, frame, meta = read_trace(trace, REQUEST_TRACE)
    out, m = slice_trace(frame, start, end)
    m["num_rows"] = str(len(out))
    write_trace(out, REQUEST_TRACE, output, {**meta, **m})
    click.echo(f"{output}: {len(out)} of {len(frame)} requests in [{start:g}, {end:g}) s")


@main.command("scale")
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option("--rate-scale", type=float, required=True,
              help="Multiply the arrival rate by K (arrival times divided by K); 2 = twice the load.")
@_OUTPUT
@_option_errors
def scale_cmd(trace, rate_scale, output):
    """Replay the same requests K times as fast (arrival times / K); measured latencies dropped.

    \b
    Example:
      traces scale conv.parquet --rate-scale 2 -o conv_2x.parquet
    """
    from .transform import scale_trace

    _, frame, meta = read_trace(trace, REQUEST_TRACE)
    out, m = scale_trace(frame, rate_scale)
    write_trace(out, REQUEST_TRACE, output, {**meta, **m})
    click.echo(f"{output}: {len(out)} requests over {out['arrival_time_s'].iloc[-1]:.1f} s (rate x{rate_scale:g})")
