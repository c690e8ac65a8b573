"""Options and helpers shared by the ``traces`` commands."""
from __future__ import annotations

import contextlib
import os
import sys

import click

from .support import user_errors
from schemas.kinds import REQUEST_TRACE

from ..errors import TraceError

file_errors = user_errors(data_errors=(TraceError, OSError))
#: Commands whose TraceErrors are about the options, not a file (exit code 2).
option_errors = user_errors(data_errors=(OSError,), usage_errors=(TraceError,))

OUTPUT = click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Output Parquet file.")
INVALID = click.option(
    "--invalid", type=click.Choice(["error", "flag", "drop"]), default="error", show_default=True,
    help="A row that breaks a rule of its format: stop with an error naming it; keep it with "
         "status 'invalid: <rule>' (replay and compare skip it); or leave it out (counted in the metadata).")
ARRIVALS = click.option(
    "--arrivals", type=click.Choice(["auto", "recorded", "zero", "synth"]), default="auto", show_default=True,
    help="Arrival times: recorded start_times; all at 0 (request_rate=inf); synthesised from the run's "
         "request_rate and burstiness (seeded); auto = recorded, else zero for an inf rate, else an error.")
SEED = click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
                    help="Seed of --arrivals synth.")


@contextlib.contextmanager
def progress(label: str, path):
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


def write_requests(frame, meta: dict, output) -> None:
    """Validate and write an imported request trace; print a one-line summary and any warning."""
    from ..io import write_trace

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

def pairs(option: str, values) -> dict[str, str]:
    out = {}
    for v in values:
        k, sep, x = v.partition("=")
        if not sep or not k:
            raise click.BadParameter(f"{v!r}: expected COLUMN=VALUE", param_hint=option)
        out[k] = x
    return out

