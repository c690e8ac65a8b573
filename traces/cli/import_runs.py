"""``traces import``: the importers of benchmark clients' results and of vLLM's own outputs
(OpenTelemetry spans, the server log)."""
from __future__ import annotations

import click

from schemas.kinds import REQUEST_TRACE

from schemas.text import wrap
from ._shared import ARRIVALS, INVALID, OUTPUT, SEED, file_errors, progress, write_requests
from .import_files import import_


@import_.command("vllm-bench")
@click.argument("src", type=click.Path(dir_okay=False))
@OUTPUT
@ARRIVALS
@SEED
@INVALID
@file_errors
def import_vllm_bench_cmd(src, output, arrivals, seed, invalid):
    """vLLM benchmark_serving / 'vllm bench serve' result JSON with per-request arrays.

    Needs --save-detailed (input_lens, output_lens, ttfts, itls, errors). Failed
    requests are kept with status 'failed: <error>' and no latencies.

    \b
    Example:
      traces import vllm-bench vllm-10.0qps-Llama-3.1-8B.json -o bench.parquet
      traces import vllm-bench old-result.json --arrivals synth --seed 1 -o bench.parquet
    """
    from ..importers.vllm_bench import import_vllm_bench

    frame, meta = import_vllm_bench(src, arrivals=arrivals, seed=seed, invalid=invalid)
    write_requests(frame, meta, output)


@import_.command("sglang-bench")
@click.argument("src", type=click.Path(dir_okay=False))
@OUTPUT
@click.option("--run", type=click.IntRange(min=1), default=None,
              help="1-based line (run) of the JSONL file; needed when several runs have per-request arrays.")
@ARRIVALS
@SEED
@INVALID
@file_errors
def import_sglang_bench_cmd(src, output, run, arrivals, seed, invalid):
    """SGLang bench_serving JSONL output (one run per line, saved with --output-details).

    \b
    Example:
      traces import sglang-bench sglang_0510_1000_sharegpt.jsonl --run 2 --arrivals synth \\
        -o run2.parquet
    """
    from ..importers.sglang_bench import import_sglang_bench

    frame, meta = import_sglang_bench(src, run=run, arrivals=arrivals, seed=seed, invalid=invalid)
    write_requests(frame, meta, output)


@import_.command("llmperf")
@click.argument("src", type=click.Path(dir_okay=False))
@OUTPUT
@click.option("--concurrency", type=click.IntRange(min=1), required=True,
              help="The run's --num-concurrent-requests (not in the file; the summary JSON has it).")
@INVALID
@file_errors
def import_llmperf_cmd(src, output, concurrency, invalid):
    """LLMPerf individual responses JSON (ttft_s, end_to_end_latency_s, token counts).

    The file has no send times: arrivals are reconstructed as a closed loop of
    --concurrency clients (recorded as an estimate in the metadata).

    \b
    Example:
      traces import llmperf llmperf_leaderboard_anyscale_llama2_70b_individual.json \\
        --concurrency 5 -o llmperf.parquet
    """
    from ..importers.llmperf import import_llmperf

    frame, meta = import_llmperf(src, concurrency=concurrency, invalid=invalid)
    write_requests(frame, meta, output)


@import_.command("distserve")
@click.argument("src", type=click.Path(dir_okay=False))
@OUTPUT
@INVALID
@file_errors
def import_distserve_cmd(src, output, invalid):
    """DistServe benchmark result (.exp: a Python list of per-request timestamps) -> request trace.

    Arrival = issue_time minus the first; TTFT and E2E from the timestamps
    (DistServe's ttft_ms, latency_ms, tpot_ms must agree). The file name's
    settings (vllm-N-RATE, distserve-c21d11-N-RATE: engine, request rate, pool
    TP/PP) go in the metadata.

    \b
    Example:
      traces import distserve distserve_opt13b_a100_distserve-c21d11-300-3.exp -o ds3.parquet
    """
    import json

    from ..importers.distserve import import_distserve

    frame, meta = import_distserve(src, invalid=invalid)
    write_requests(frame, meta, output)
    if "engine" not in meta:
        click.echo(wrap("note: the file name does not end in vllm-N-RATE.exp or distserve-cXYdXY-N-RATE.exp: "
                        "engine, rate and parallelism not recorded"))
        return
    line = f"run (file name): {meta['engine']}"
    if "engine_settings" in meta:
        d = json.loads(meta["engine_settings"])
        line += f", prefill TP {d['tp_prefill']} PP {d['pp_prefill']}, decode TP {d['tp_decode']} PP {d['pp_decode']}"
    line += f", {meta['name_num_requests']} requests at {float(meta['request_rate']):g} req/s"
    if meta["name_num_requests"] != str(len(frame)):
        line += f" (the file holds {len(frame)})"
    click.echo(wrap(line))


@import_.command("genai-perf")
@click.argument("src", type=click.Path(dir_okay=False))
@OUTPUT
@click.option("--experiment", type=click.IntRange(min=1), default=None,
              help="1-based experiment (load level) of the file; needed when it holds several.")
@click.option("--prompt-tokens", type=click.IntRange(min=1), default=None,
              help="Prompt length for requests whose responses carry no usage (fixed-length synthetic inputs).")
@INVALID
@file_errors
def import_genai_perf_cmd(src, output, experiment, prompt_tokens, invalid):
    """GenAI-Perf / Perf Analyzer profile_export.json (request and response timestamps in ns).

    \b
    Example:
      traces import genai-perf artifacts/my_profile_export.json --prompt-tokens 128 -o genai.parquet
    """
    from ..importers.genai_perf import import_genai_perf

    frame, meta = import_genai_perf(src, experiment=experiment, prompt_tokens=prompt_tokens, invalid=invalid)
    write_requests(frame, meta, output)


@import_.command("guidellm")
@click.argument("src", type=click.Path(dir_okay=False))
@OUTPUT
@click.option("--benchmark", type=click.IntRange(min=0), default=None,
              help="0-based benchmark of the report, in file order [default: all, with a 'benchmark' column].")
@click.option("--no-block-hashes", is_flag=True, default=False,
              help="Do not derive block_hashes (prefix-cache blocks) from the prompt text.")
@INVALID
@file_errors
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
    from ..importers.guidellm import import_guidellm

    frame, meta = import_guidellm(src, benchmark=benchmark, block_hashes=not no_block_hashes, invalid=invalid)
    write_requests(frame, meta, output)
    if meta.get("num_dropped_unstarted", "0") != "0":
        click.echo(f"{meta['num_dropped_unstarted']} errored/incomplete requests that never started left out")
    if "shared_prefix_blocks" in meta:
        import json

        shared = json.loads(meta["shared_prefix_blocks"])
        click.echo(wrap(f"block_hashes: {meta['hash_block_tokens']}-token blocks at "
                        f"{float(meta['chars_per_token']):.3f} chars/token; leading blocks shared by all prompts, "
                        "per benchmark: " + ", ".join(f"{k}: {v}" for k, v in shared.items())
                        + f"; implied prefix-cache hit rate {float(meta['implied_prefix_cache_hit_rate']):.1%}"))


@import_.command("blis-observe")
@click.argument("src", type=click.Path(dir_okay=False))
@OUTPUT
@click.option("--data", "data", type=click.Path(dir_okay=False), default=None,
              help="The data CSV (blis observe --trace-data) [default: SRC with the suffix .csv].")
@INVALID
@file_errors
def import_blis_observe_cmd(src, output, data, invalid):
    """BLIS TraceV2 (blis observe): header YAML + per-request CSV -> request trace.

    SRC is the --trace-header YAML (trace_version 2 or 3); the CSV is found beside
    it (same name, .csv) or given with --data. Arrival = client send time; TTFT and
    E2E = first/last chunk - send, as BLIS computes them (seconds). The header's
    engine settings (max_num_seqs, block_size, tensor_parallel, ...) go in the
    metadata, where replay takes them as defaults; failed requests are kept with
    status 'failed: ...'.

    \b
    Example:
      traces import blis-observe trace.yaml -o observed.parquet
      traces import blis-observe header.yaml --data requests.csv -o observed.parquet
    """
    from ..importers.blis_header import blis_file_pair
    from ..importers.blis_observe import import_blis_observe
    from .support import check_outputs

    check_outputs(blis_file_pair(src, data), {"-o/--output": output})  # the CSV beside SRC is an input too
    frame, meta = import_blis_observe(src, data=data, invalid=invalid)
    write_requests(frame, meta, output)
    if meta.get("engine_settings"):
        import json

        s = json.loads(meta["engine_settings"])
        click.echo(wrap("engine (trace header): " + ", ".join(f"{k}={v}" for k, v in s.items())))


@import_.command("vllm-otlp")
@click.argument("src", type=click.Path(dir_okay=False))
@OUTPUT
@click.option("--guidellm", "guidellm", type=click.Path(dir_okay=False), default=None,
              help="GuideLLM report of the same run: adds its 'benchmark' column and the block_hashes derived "
                   "from its prompts, joined on the request id.")
@INVALID
@file_errors
def import_vllm_otlp_cmd(src, output, guidellm, invalid):
    """vLLM OpenTelemetry spans (OTLP/JSON lines from a collector's file exporter) -> request trace.

    One 'llm_request' span per request; other spans are counted and ignored.
    Latencies are vLLM's own (gen_ai.latency.*), arrivals the engine's.

    \b
    Example:
      traces import vllm-otlp traces.jsonl -o spans.parquet
      traces import vllm-otlp traces.jsonl --guidellm benchmarks.json -o spans.parquet
    """
    from ..importers.vllm_otlp import import_vllm_otlp, join_guidellm

    with progress("vllm-otlp", src) as bar:
        frame, meta = import_vllm_otlp(src, invalid=invalid, progress=bar)
    if guidellm:
        frame, meta = join_guidellm(frame, meta, guidellm)
    write_requests(frame, meta, output)
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
@file_errors
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

    from schemas.tables import VLLM_STATS

    from ..importers.vllm_log.stats import import_vllm_log, timeseries_csv_frame
    from ..io import read_trace, write_trace

    if log_utc_offset is not None and not align_to:
        raise click.UsageError("--log-utc-offset places the log on a trace's clock: give --align-to too")
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
        from schemas.atomic import write_text_atomic

        write_text_atomic(timeseries_csv_frame(frame).to_csv(index=False, float_format="%.6g"), timeseries_csv)
    s = json.loads(meta["engine_settings"])
    keys = ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "tensor_parallel_size", "block_size",
            "num_gpu_blocks", "enable_prefix_caching", "enable_chunked_prefill")
    click.echo(f"{output}: {len(frame)} stats lines over {frame['t_s'].iloc[-1] - frame['t_s'].iloc[0]:.0f} s "
               f"(vllm_stats/1), vLLM {meta['vllm_version'] or '?'}")
    click.echo(wrap("engine: " + ", ".join(f"{k}={s.get(k)}" for k in keys)))
    if align_to:
        click.echo(f"aligned to {align_to}: log clock UTC{float(meta['log_utc_offset_hours']):+g} h "
                   f"({meta['log_utc_offset_source'].split(' (')[0]}), first stats line at t = "
                   f"{float(meta['first_stats_line_t_s']):.1f} s")
    if timeseries_csv:
        click.echo(f"timeseries: {timeseries_csv}")

