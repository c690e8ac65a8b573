"""``replay AGG[#K]``: aggregates (a benchmark's summary, the windows of Prometheus scrapes) replayed
level by level, each reported statistic beside the prediction and its 95 % band.

A level records no requests. Its workload is synthesized from its length statistics and replayed
at its load exactly as ``calibrate fit`` replays it (:mod:`traces.aggregate_workload`: the same
seed, the same closed loop); every mean and percentile it reports of TTFT, TPOT and E2E is set
beside the same statistic of the replay's completed requests (numpy's linear percentiles:
:func:`replay.analysis.metrics.statistics`), with the band ``replay`` puts on its p50, p90 and
p99 (:mod:`replay.analysis.bands`). The reported values are those of another sample of
requests than the synthesized one, so the band includes the sampling noise of a new run's
percentiles (:attr:`replay.analysis.band_basis.BandBasis.new_sample`). A percentile read from
Prometheus histograms is known only to its bucket (the import interpolates inside it;
the import keeps each one's bucket width, ``resolution_s`` in the metadata's ``windows``): its
band also holds half that width, in quadrature with the band's other parts.
"""
from __future__ import annotations

import json
import math
import re
import time
from dataclasses import replace
from pathlib import Path

import click

from traces.cli.support import DataError

from ..text import wrap
from .band_run import main_band
from .engine_settings import replay_config

#: Latencies a level reports, with their labels.
_LABELS = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "E2E"}
#: The options whose outputs are those of one request trace's replay, and the load options a level sets itself.
_PER_REQUEST = ("-o", "--steps-out", "--chrome-trace", "--token-times", "--measured-timeseries", "--tolerance",
                "--sweep", "--compare-schedulers", "--concurrency", "--think-time-s")
#: What a level's band holds beyond the parameters and the model error, said in the report.
_BAND_NOTE = ("The reported statistics are of another sample of requests than the synthesized one: each band holds "
              "that sampling noise, and a percentile read from Prometheus histograms also half its bucket.")


def split_level(trace: str) -> tuple[str, int | None]:
    """``FILE#K`` -> ``(FILE, K)`` when ``FILE#K`` is not itself a file and ``FILE`` is; else
    ``(trace, None)``.

    Raises
    ------
    DataError
        ``FILE#X`` of an existing ``FILE`` with ``X`` not a level number.
    """
    m = re.fullmatch(r"(.+)#([^#/]*)", trace)
    if m and not Path(trace).exists() and Path(m.group(1)).exists():
        if not (m.group(2).isascii() and m.group(2).isdigit()):
            raise DataError(f"{trace}: expected FILE[#K] with K a level number (0, 1, ...)")
        return m.group(1), int(m.group(2))
    return trace, None


def refuse_per_request_options(given: dict) -> None:
    """A usage error naming the options of :data:`_PER_REQUEST` given (``given``: option -> value)
    with aggregates, which have no requests to write, report or sweep."""
    clash = [opt for opt in _PER_REQUEST if given.get(opt)]
    if clash:
        raise click.UsageError(f"{', '.join(clash)} need{'s' if len(clash) == 1 else ''} a request trace: aggregates "
                               "are replayed level by level at each level's own load, one table each")


def replay_levels(run, level: int | None, wide: bool, report: str | None = None) -> None:
    """Replay every level of the aggregates ``run.frame`` (or level ``level``) and print, per level,
    each reported statistic, the prediction, its band, the error and whether it is inside; then the
    count inside and the median |error| of the means; with ``report``, write them there
    (:func:`replay.report.predictions.write_levels_report`).

    ``run`` is :class:`replay.cli.one_replay.ReplayInputs` of an ``aggregate_targets/1`` table; its
    ``settings`` are the engine options, a level at a ``concurrency`` replayed as that closed loop.

    Raises
    ------
    DataError
        ``level`` not in the file, or a level whose workload cannot be synthesized.
    """

    from schemas.status import OK
    from traces.aggregate_workload import level_statistics, level_workload
    from traces.errors import TraceError
    from traces.scrape_window import observed_until

    from ..analysis.band_tables import NO_BAND_POINTS
    from ..simulate import replay_frame

    frame = run.frame
    levels = sorted(int(k) for k in frame["level"].unique())
    if level is not None and level not in levels:
        raise DataError(f"{run.trace}#{level}: no such level (the file has {', '.join(map(str, levels))})")
    basis = replace(run.basis, new_sample=True)  # the reported statistics are of another sample of requests
    resolutions = [w.get("resolution_s", {}) for w in json.loads(run.meta.get("windows", "[]"))]
    table, warned = [], set()
    _print_deployment(run, len(levels) if level is None else 1)
    if run.differences:
        click.echo(wrap("a what-if, not a validation: " + "; ".join(run.differences)))
    for k in levels if level is None else [level]:
        name = f"{run.trace}#{k}"
        try:
            rows, workload, meta = level_workload(frame, k, run.meta, run.trace)
        except TraceError as exc:
            raise DataError(str(exc)) from None
        kind, value = rows["level_kind"].iloc[0], float(rows["level_value"].iloc[0])
        cfg = replay_config({**run.settings, "concurrency": int(value) if kind == "concurrency" else None})
        t0 = time.perf_counter()
        result, _ = replay_frame(workload, run.cost_model, cfg, meta)
        band = main_band(workload, meta, run.cost_model, cfg, run.points, result, time.perf_counter() - t0, basis)
        done = result[result["pred_status"] == OK]
        click.echo(wrap(f"{name}: {meta['aggregate_level']}, {int(rows['num_requests'].iloc[0])} requests reported; "
                        f"{len(workload)} synthesized from its length statistics, {len(done)} completed"))
        reported = level_statistics(rows)
        if not reported:
            click.echo(wrap(f"  {name} reports no TTFT, TPOT or E2E statistic: nothing to compare"))
            continue
        until_s = observed_until(meta)
        if until_s is not None:
            click.echo(wrap(f"  a window of scrapes: its histograms counted the requests finished (TTFT: first token "
                            f"out) by its end, {until_s:.3g} s into the workload; only those are compared, and "
                            "the band is of the same statistics at each band point"))
        printed = _print_level(reported, done, band, resolutions[k] if k < len(resolutions) else {}, until_s)
        table += [{"level": k, "load": meta["aggregate_level"], **r} for r in printed]
        if band.has_band and k < len(resolutions) and resolutions[k]:
            click.echo(wrap("  each band also holds half its percentile's histogram bucket (the resolution of the "
                            "scrapes' histograms)"))
        if run.points is not None and not band.has_band:
            click.echo(wrap(f"  {NO_BAND_POINTS}"))
        for note in band.notes if wide else [w for w in band.warnings if w not in warned]:
            click.echo(wrap(f"  note: {note}"))
        warned.update(band.warnings)
    _print_summary(table)
    if report:
        _write_report(run, table, report)


def _print_deployment(run, num_levels: int) -> None:
    """What each level is replayed on, in one line, as ``replay`` says it of a request trace."""
    from .runners import deployment_words

    cfg = replay_config({**run.settings, "concurrency": None})
    click.echo(wrap(f"replaying {num_levels} level(s) of {run.trace}: {deployment_words(run.cost_model, cfg)}"))

def _print_level(reported: dict, done, band, resolution: dict, until_s: float | None) -> list[dict]:
    """The table of one level: each ``reported`` statistic (:func:`traces.aggregate_workload.level_statistics`)
    beside the same statistic of the completed requests ``done`` (for a window of scrapes ending
    at ``until_s``, seconds on the workload's clock, only those its histograms would have
    counted: :func:`replay.analysis.metrics.window_values`; the band's are of the same requests
    of each of its replays: :func:`replay.analysis.metrics.window_percentiles`) and ``band``'s interval
    where it has one, widened by half the statistic's histogram bucket
    (``resolution``: metric -> ``{"p50": width in seconds or None}``). Returns a dict per
    statistic: ``metric``, ``statistic``, ``reported_s``, ``predicted_s``, ``low_s``, ``high_s``
    (NaN without a band) and ``inside`` (None without a band)."""
    import numpy as np

    from ..analysis.metrics import stat_label, statistics, window_values

    out = []
    predicted_head = "predicted ms [95 % band]" if band.has_band else "predicted ms"
    click.echo(f"  {'metric':6s} {'stat':>5s} {'reported ms':>12s} {predicted_head:>30s} {'error':>8s}")
    for metric, (pcts, values_meas) in reported.items():
        values = window_values(done, metric, until_s)
        predicted = statistics(values[np.isfinite(values)], pcts)
        for pct, meas, pred in zip(pcts, values_meas, predicted):
            stat = f"{metric.removesuffix('_s')}_p{pct:g}_s"
            row = {"metric": _LABELS[metric], "statistic": stat_label(pct), "reported_s": float(meas),
                   "predicted_s": float(pred), "low_s": math.nan, "high_s": math.nan, "inside": None}
            cell, mark = f"{1e3 * pred:.2f}", ""
            if stat in band.low and band.has_band:
                low, high = _with_bucket(band.point[stat], band.low[stat], band.high[stat],
                                         resolution.get(metric, {}).get(stat_label(pct)))
                cell = f"{cell} [{1e3 * low:.2f}, {1e3 * high:.2f}]"
                row.update(low_s=low, high_s=high, inside=bool(low <= meas <= high))
                mark = " in" if row["inside"] else " OUT"
            err = (pred - meas) / meas if meas > 0 else np.nan
            err_text = f"{err:+.1%}" if np.isfinite(err) else "n/a"
            click.echo(f"  {_LABELS[metric]:6s} {stat_label(pct):>5s} {1e3 * meas:12.2f} {cell:>30s} "
                       f"{err_text:>8s}{mark}")
            out.append(row)
    return out


def _print_summary(table: list[dict]) -> None:
    """The count of reported percentiles inside their band (and of bands reaching 0), and the median
    |error| of the reported means, over every level's rows (:func:`_print_level`)."""
    import numpy as np

    banded = [r for r in table if r["inside"] is not None]
    if banded:
        floor = sum(r["low_s"] == 0.0 for r in banded)
        click.echo(wrap(f"{sum(r['inside'] for r in banded)} of {len(banded)} reported percentiles inside their "
                        "95 % band (p50, p90, p99)" + (f"; {floor} of those bands reach 0 and bound nothing below"
                                                       if floor else "")))
    mean_errors = [abs(r["predicted_s"] / r["reported_s"] - 1) for r in table
                   if r["statistic"] == "mean" and r["reported_s"] > 0 and math.isfinite(r["predicted_s"])]
    if mean_errors:
        click.echo(wrap(f"median |error| of the reported means: {np.median(mean_errors):.1%} over {len(mean_errors)}"))


def _write_report(run, rows: list[dict], report: str) -> None:
    """Write the levels' ``rows`` to ``report`` (:func:`replay.report.predictions.write_levels_report`)."""
    import pandas as pd

    from ..report import report_context
    from ..report.predictions import write_levels_report
    from .options import command_line

    context = report_context(run.trace, run.calibration_path, run.cost_model, command=command_line())
    columns = ["level", "load", "metric", "statistic", "reported_s", "predicted_s", "low_s", "high_s", "inside"]
    written = write_levels_report(report, pd.DataFrame(rows, columns=columns), context,
                                  (str(run.calibration_path), run.cal), run.trace, _BAND_NOTE)
    click.echo(wrap("wrote " + ", ".join(map(str, written))))


def _with_bucket(point: float, low: float, high: float, width_s: float | None) -> tuple[float, float]:
    """A band ``[low, high]`` around ``point`` (seconds) that also holds half a histogram bucket of
    ``width_s`` seconds (None: not from a histogram), in quadrature with its sides; clipped at 0."""
    if not width_s:
        return low, high
    return max(0.0, point - math.hypot(point - low, width_s / 2)), point + math.hypot(high - point, width_s / 2)
