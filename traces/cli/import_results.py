"""``traces import``: benchmark clients' result folders that hold per-request records and
aggregates side by side (inference-perf, AIPerf): the records when present, else the aggregates."""
from __future__ import annotations

from pathlib import Path

import click

from ._shared import INVALID, OUTPUT, file_errors, write_requests
from .import_files import import_, write_summary

AGGREGATES = click.option("--aggregates", is_flag=True, default=False,
                          help="Read the aggregate files even when the per-request file is there.")


def _pick(sources, per_request: str, is_records, summaries, aggregates: bool) -> tuple[Path | None, list[Path]]:
    """(the per-request file to read, or None; else the aggregate files) of ``sources``: folders
    (``summaries(folder)``: their per-request file, else their aggregate files) or files (a file
    ``is_records`` says holds records, or aggregate files); ``per_request`` names the former."""
    from ..errors import TraceFormatError

    found: list[Path] = []
    records = []
    for src in map(Path, sources):
        if src.is_dir():
            rec, aggs = summaries(src)
            if rec is not None and not aggregates:
                records.append(rec)
                continue
            if not aggs:
                raise TraceFormatError(src, "holds no result file", expected=f"{per_request} or the aggregate files")
            found += aggs
        elif is_records(src) and not aggregates:
            records.append(src)
        else:
            found.append(src)
    if records and (found or len(records) > 1):
        raise click.UsageError(f"give one {per_request} (a request trace) or aggregate files (levels), not both")
    return (records[0] if records else None), found


@import_.command("inference-perf")
@click.argument("sources", nargs=-1, required=True, type=click.Path())
@OUTPUT
@AGGREGATES
@click.option("--load-type", type=click.Choice(["constant", "poisson", "concurrent"]), default=None,
              help="load.type of the run when no config.yaml is beside the stage files.")
@INVALID
@file_errors
def import_inference_perf_cmd(sources, output, aggregates, load_type, invalid):
    """inference-perf report folder (or its files) -> a request trace from
    per_request_lifecycle_metrics.json when present, else aggregate_targets/1 with one
    level per stage_N_lifecycle_metrics.json (the load from config.yaml).

    \b
    Example:
      traces import inference-perf reports-20250801-120000/ -o ip.parquet
      traces import inference-perf reports-20250801-120000/ --aggregates -o ip_agg.parquet
    """
    from ..importers.inference_perf import PER_REQUEST, find_reports, import_inference_perf_stages
    from ..importers.inference_perf_requests import import_inference_perf_requests

    records, stages = _pick(sources, PER_REQUEST, lambda p: p.name == PER_REQUEST, find_reports, aggregates)
    if records is not None:
        frame, meta = import_inference_perf_requests(records, invalid=invalid)
        write_requests(frame, meta, output)
        return
    frame, meta = import_inference_perf_stages(stages, load_type)
    write_summary(frame, meta, output, 0)


def _aiperf_files(folder: Path) -> tuple[Path | None, list[Path]]:
    from ..importers.aiperf import PER_REQUEST, SUMMARY

    rec, agg = folder / PER_REQUEST, folder / SUMMARY
    return (rec if rec.is_file() else None), ([agg] if agg.is_file() else [])


@import_.command("aiperf")
@click.argument("sources", nargs=-1, required=True, type=click.Path())
@OUTPUT
@AGGREGATES
@INVALID
@file_errors
def import_aiperf_cmd(sources, output, aggregates, invalid):
    """AIPerf artifact folder (or its files) -> a request trace from profile_export.jsonl
    (a .jsonl file) when present, else aggregate_targets/1 with one level per profile_export_aiperf.json
    (several folders or files: a sweep). Each value's own unit is honoured.

    \b
    Example:
      traces import aiperf artifacts/my-run/ -o aiperf.parquet
      traces import aiperf artifacts/c1/ artifacts/c8/ artifacts/c32/ --aggregates -o sweep.parquet
    """
    from ..importers.aiperf import PER_REQUEST, import_aiperf_records, import_aiperf_summaries

    records, summaries = _pick(sources, PER_REQUEST, lambda p: p.suffix == ".jsonl", _aiperf_files,
                                   aggregates)
    if records is not None:
        frame, meta = import_aiperf_records(records, invalid=invalid)
        write_requests(frame, meta, output)
        return
    frame, meta = import_aiperf_summaries(summaries)
    write_summary(frame, meta, output, 0)
