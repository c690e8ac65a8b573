"""``traces``: import, validate, describe, synthesise and transform serving traces.

The group and the commands on whole traces are here; ``traces import`` is in
:mod:`.import_files`, :mod:`.import_runs`, :mod:`.import_metrics` and :mod:`.import_results`,
shared options in :mod:`._shared`. Nothing heavy (pandas, pyarrow) is imported before a command
runs, so ``--help`` is quick.
"""
from __future__ import annotations

import os

import click

from .support import FoldedGroup, version_option
from schemas.kinds import REQUEST_TRACE, a_kind

from ._shared import OUTPUT, file_errors, option_errors
from .import_files import import_
from . import import_runs  # noqa: F401  (registers the importers of runs on ``import_``)
from . import import_metrics  # noqa: F401  (registers the importers of production metrics)
from . import import_results  # noqa: F401  (registers inference-perf and AIPerf)


@click.group(cls=FoldedGroup, context_settings={"help_option_names": ["-h", "--help"]})
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



main.add_command(import_, "import")


@main.command()
@click.argument("file", type=click.Path(dir_okay=False))
@file_errors
def validate(file):
    """Check a servecal Parquet file against its schema; exit 0 if valid, 1 if not.

    \b
    Example:
      traces validate run.parquet
    """
    from ..io import read_trace

    kind, frame, _ = read_trace(file)
    click.echo(f"{file}: valid {kind}, {len(frame)} rows")


@main.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--plot", "plot", type=click.Path(dir_okay=False), default=None,
              help="Also draw the arrival rate over time and the prompt/output length histograms to this image "
                   "(format from the suffix: .png, .pdf, .svg).")
@file_errors
def describe(file, plot):
    """Summarise a trace: count, span, rate, burstiness, lengths, measured latencies.

    \b
    Example:
      traces describe run.parquet
      traces describe run.parquet --plot run.png
    """
    from ..describe import describe_frame, format_description, plot_trace
    from ..io import read_trace

    if plot and os.path.splitext(str(plot))[1].lower() not in (".png", ".pdf", ".svg", ".jpg", ".jpeg"):
        raise click.BadParameter(f"{plot}: expected a .png, .pdf, .svg or .jpg file name", param_hint="--plot")
    kind, frame, meta = read_trace(file)
    if plot and kind != REQUEST_TRACE:
        raise click.UsageError(f"--plot draws request traces; {file} is {a_kind(kind)}")
    click.echo(format_description(describe_frame(kind, frame)))
    if plot:
        plot_trace(frame, plot, title=os.path.basename(str(file)))
        click.echo(f"plot: {plot}")



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
@file_errors
def export_vidur_cmd(trace, output):
    """Request trace -> Vidur processed trace CSV (arrived_at, num_prefill_tokens, num_decode_tokens).

    Rows whose status is not ok (failed or invalid) are left out and counted.

    \b
    Example:
      traces export vidur conv.parquet -o splitwise_conv.csv
    """
    from ..importers.vidur import export_vidur
    from ..io import read_trace

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
@OUTPUT
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
@option_errors
def synth(num_requests, rate, output, arrival, cv, prompt_tokens, output_tokens, seed):
    """Write a synthetic request trace (no measured latencies), reproducibly.

    \b
    Example:
      traces synth --requests 1000 --rate 5 --arrival gamma --cv 2 --seed 7 \\
        --prompt-tokens lognormal:mean=1024,sigma=0.6 --output-tokens fixed:128 -o synth.parquet
    """
    from ..synth import synth_requests
    from ..io import write_trace

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
@OUTPUT
@option_errors
def slice_cmd(trace, start, end, output):
    """Keep the requests arriving in [START, END) s; arrivals rebased to START.

    \b
    Example:
      traces slice conv.parquet --start 600 --end 1200 -o conv_10min.parquet
    """
    from ..transform import slice_trace
    from ..io import read_trace, write_trace

    _, frame, meta = read_trace(trace, REQUEST_TRACE)
    out, m = slice_trace(frame, start, end)
    m["num_rows"] = str(len(out))
    write_trace(out, REQUEST_TRACE, output, {**meta, **m})
    click.echo(f"{output}: {len(out)} of {len(frame)} requests in [{start:g}, {end:g}) s")


@main.command("scale")
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option("--rate-scale", type=float, required=True,
              help="Multiply the arrival rate by K (arrival times divided by K); 2 = twice the load.")
@OUTPUT
@option_errors
def scale_cmd(trace, rate_scale, output):
    """Replay the same requests K times as fast (arrival times / K); measured latencies dropped.

    \b
    Example:
      traces scale conv.parquet --rate-scale 2 -o conv_2x.parquet
    """
    from ..transform import scale_trace
    from ..io import read_trace, write_trace

    _, frame, meta = read_trace(trace, REQUEST_TRACE)
    out, m = scale_trace(frame, rate_scale)
    write_trace(out, REQUEST_TRACE, output, {**meta, **m})
    click.echo(f"{output}: {len(out)} requests over {out['arrival_time_s'].iloc[-1]:.1f} s (rate x{rate_scale:g})")