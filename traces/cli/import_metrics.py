"""``traces import``: the importers of production metrics (Prometheus scrapes of vLLM or SGLang)."""
from __future__ import annotations

import click

from schemas.text import wrap_error

from ._shared import OUTPUT, file_errors
from .import_files import import_, write_summary


@import_.command("prometheus")
@click.argument("sources", nargs=-1, required=True, type=click.Path())
@OUTPUT
@click.option("--window-s", type=click.FloatRange(min=0, min_open=True), default=300.0, show_default=True,
              help="Seconds of one window: each window becomes a level of aggregate_targets/1. A window ends on "
                   "the first scrape at least this long after its start (scrapes every 15 s and --window-s 20 give "
                   "30 s windows); one in which no request finished is left out, with a warning.")
@click.option("--by-label", default=None, metavar="LABEL",
              help="Keep the series of each value of LABEL apart (model_name, engine, pod, ...): one level per "
                   "value and window. Default: every series summed (several models: an error).")
@file_errors
def import_prometheus_cmd(sources, output, window_s, by_label):
    """Prometheus scrapes of a vLLM or SGLang /metrics page -> aggregate_targets/1,
    one level per window (finished requests, arrival rate, length and latency
    distributions from the histograms' increases).

    SOURCES: folders or files of scrapes, each named with its unix time
    (metrics-<unix s>.txt) or opened by a line '# scrape at <unix s>', or
    Prometheus query_range JSON exports. Counters reset by a restart count from 0.

    \b
    Example:
      while sleep 15; do curl -s localhost:8000/metrics > scrapes/metrics-$(date +%s).txt; done
      traces import prometheus scrapes/ --window-s 300 -o prod.parquet
    """
    from ..importers.prometheus import import_prometheus

    frame, meta = import_prometheus(sources, window_s, by_label)
    write_summary(frame, meta, output, 0)
    if meta.get("windows_left_out"):  # no request finished there: nothing to match, but said
        click.echo(wrap_error(f"Warning: window(s) with no finished request left out: {meta['windows_left_out']}"),
                   err=True)
    if meta["counter_resets"] != "0":
        click.echo(f"Warning: {meta['counter_resets']} counter reset(s) (a restart?), counted from 0: "
                   f"{meta['counter_reset_series'][:300]}", err=True)
