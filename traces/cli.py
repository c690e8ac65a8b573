"""``traces``: import, validate and describe serving traces."""
from __future__ import annotations

import click

from schemas.cli_support import user_errors, version_option
from schemas.tables import REQUEST_TRACE, STEP_TRACE

from .errors import TraceError
from .io import read_trace, write_trace

_errors = user_errors(data_errors=(TraceError,))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@version_option()
def main():
    """Import, validate and describe serving traces.

    \b
    Example:
      traces import vllm-request-stats run_requests.jsonl -o run.parquet
      traces validate run.parquet
      traces describe run.parquet
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
    write_trace(frame, REQUEST_TRACE, output, meta)
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

    if num_layers is None:
        meta = read_profile_meta(list(sources))
        model_name = meta.get("model")
        if not model_name:
            raise click.UsageError("meta.yaml names no model: give --num-layers")
        num_layers = get_model(str(model_name)).num_layers
    frame, meta = imp(list(sources), num_layers=num_layers, tp=tp)
    write_trace(frame, STEP_TRACE, output, {k: v for k, v in meta.items() if isinstance(v, (str, int, float))})
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
@_errors
def describe(file):
    """Summarise a trace: count, span, rate, burstiness, lengths, measured latencies.

    \b
    Example:
      traces describe run.parquet
    """
    from .describe import describe_frame, format_description

    kind, frame, meta = read_trace(file)
    click.echo(format_description(describe_frame(kind, frame)))
