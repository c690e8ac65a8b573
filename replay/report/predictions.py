"""Reports of the modes that print one table of predictions instead of a comparison:
``replay --sweep``, ``replay --compare-schedulers``, ``servecal plan`` and ``replay AGG`` (aggregates
replayed level by level).

Each opens as the replay report does (:func:`.provenance.provenance_blocks`: the command line
and what was run, the calibration's parameters with their 95 % intervals and whether each is
identified), then gives the table, every row, each statistic ``point [low, high]`` as the
printed table writes its band cells, the band's legend, and one figure (:mod:`.figures`).
Files are written as the replay report's are (:func:`replay.report.write_document`):
atomically, a Markdown report's figure into ``<stem>_files/``.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import pandas as pd

from .figures import front_figure, levels_figure, png, scheduler_figure, sweep_figure
from .provenance import provenance_blocks


def _write(path, title: str, context, calibrations, trace, body: list[tuple], figure: tuple | None) -> list[Path]:
    """Provenance, then ``body``, then ``figure`` (``(heading, alt, file name, matplotlib figure)``)."""
    from . import _figures_name, write_document

    path = Path(path)
    blocks = provenance_blocks(context, calibrations, trace) + body
    figures = []
    if figure is not None and figure[3] is not None:
        heading, alt, name, fig = figure
        data = png(fig)
        blocks += [("h2", heading), ("img", alt, f"{_figures_name(path)}/{name}", data)]
        figures.append((name, data))
    return write_document(blocks, figures, path, title)


def write_sweep_report(path: str | os.PathLike, table: pd.DataFrame, swept: list[str], context, calibration,
                       trace=None, legend: str = "", note: str = "") -> list[Path]:
    """The report of ``replay --sweep``: the sweep's table (:func:`replay.sweep.run_sweep`) and
    TTFT/TPOT/E2E p90 with their bands against the first swept option.

    Parameters
    ----------
    swept : list of str
        The swept options (``rate-scale``, ``max-num-seqs``, ...), in column order.
    calibration : (label, schemas.calibration.Calibration)
    legend, note : str
        What the brackets are (:func:`replay.analysis.band_tables.band_legend`) and what the numbers are.

    Returns
    -------
    list of pathlib.Path
        The report, then the PNG written (none for HTML).
    """
    from ..analysis.band_tables import band_table_cells
    from ..sweep.grid import column

    cols = [column(n) for n in swept]
    head, rows = band_table_cells(table, cols)
    body = [("h2", f"Sweep: {len(rows)} points"), ("table", head, rows),
            ("p", " ".join(t for t in (note, f"{legend}." if legend else "") if t))]
    fig = ("Predicted p90 and its band against " + swept[0], f"TTFT, TPOT and E2E p90 against {swept[0]}",
           "sweep.png", sweep_figure(table, cols)) if rows else None
    return _write(path, "servecal sweep report", context, [calibration], trace, body, fig)


def write_scheduler_report(path: str | os.PathLike, table: pd.DataFrame, context, calibration, trace=None,
                           legend: str = "", note: str = "") -> list[Path]:
    """The report of ``replay --compare-schedulers``: a row per scheduler with its GPUs and every
    statistic with its band, and a bar per scheduler of TTFT and TPOT p90 with band whiskers.
    Parameters and return as :func:`write_sweep_report`."""
    from ..analysis.band_tables import band_table_cells

    head, rows = band_table_cells(table, ["scheduler", "gpus"])
    body = [("h2", f"Schedulers: {len(rows)}"), ("table", head, rows),
            ("p", " ".join(t for t in (note, f"{legend}." if legend else "") if t))]
    fig = ("TTFT and TPOT p90 per scheduler", "a bar per scheduler of TTFT and TPOT p90 with band whiskers",
           "schedulers.png", scheduler_figure(table)) if rows else None
    return _write(path, "servecal scheduler comparison report", context, [calibration], trace, body, fig)


def write_plan_report(path: str | os.PathLike, res, slo, prices, context, calibrations, trace,
                      lines: dict[str, list[str]]) -> list[Path]:
    """The report of ``servecal plan``: what was planned for, the candidates' table (every
    candidate with a band, and the Pareto front; ``-o`` writes all of them), the answer and the
    advice, the front's table and figure (throughput per GPU vs the first objective, band as
    error bars, the objective as a line, the answer marked), the candidates skipped.

    Parameters
    ----------
    res : replay.plan.search.PlanResult
    slo : replay.plan.slo.Slo
    prices : dict or None
    context : list of (str, str)
        :func:`replay.report.report_context`.
    calibrations : list of (path, schemas.calibration.Calibration)
    trace : path
    lines : dict
        The printed plan's ``header``, ``answer`` and ``skipped`` lines
        (:mod:`replay.cli.plan_report`), as they are.
    """
    from ..plan.table import count_line, front_cells, plan_cells, unit_of

    body: list[tuple] = [("h2", "Plan")] + [("p", line) for line in lines["header"]]
    body.append(("p", count_line(res)))
    head, rows = plan_cells(res, slo, bool(prices), wide=True)
    body += [("h2", "Candidates"),
             ("table", head, rows) if rows else ("p", "(no candidate meets the SLOs at its point)"),
             ("p", "Every candidate with a band, then the rest of the Pareto front (-o writes every candidate). "
                   "Each objective's statistic is point [low, high], the 95 % band over the calibration's band "
                   "points; * marks the answer.")]
    body += [("h2", "Answer")] + [("p", line) for line in lines["answer"]]
    if lines.get("skipped"):
        body += [("h2", "Skipped")] + [("p", line) for line in lines["skipped"]]
    key = slo.primary
    unit, scale = unit_of(slo.latency_s[key])
    fig = None
    if res.front:
        body += [("h2", f"Pareto front (throughput per GPU at the target rate vs {key})"),
                 ("table", *front_cells(res, slo))]

        def point(ev) -> dict:
            stat = f"{key}_s"
            band = ev.band is not None and (ev.band.n_points or ev.band.n_seeds)
            return {"label": ev.candidate.label(), "x": ev.point["throughput_rps"] / ev.candidate.num_gpus,
                    "y": ev.point[stat] * scale, "low": ev.band.low[stat] * scale if band else math.nan,
                    "high": ev.band.high[stat] * scale if band else math.nan}

        answer = point(res.answer) if res.answer is not None and res.answer.point else None
        fig = ("Pareto front", f"throughput per GPU against {key}, the band as error bars", "front.png",
               front_figure([point(ev) for ev in res.front], slo.latency_s[key] * scale, unit, key, answer))
    return _write(path, "servecal plan report", context, [(str(p), c) for p, c in calibrations], trace, body, fig)


def write_levels_report(path: str | os.PathLike, rows: pd.DataFrame, context, calibration, trace=None,
                        note: str = "") -> list[Path]:
    """The report of ``replay AGG --report``: a row per level and reported statistic (reported,
    predicted with its 95 % band where it has one, error, inside), and per latency its reported
    and predicted p50/p90 with the band against the level (:func:`.figures.levels_figure`).

    Parameters
    ----------
    rows : pandas.DataFrame
        ``level``, ``load`` (words), ``metric``, ``statistic``, ``reported_s``, ``predicted_s``,
        ``low_s``, ``high_s`` (seconds; NaN without a band), ``inside`` (bool, or None without a band).
    calibration : (label, schemas.calibration.Calibration)
    note : str
        What the band holds (new-run sampling, the histograms' buckets).

    Returns
    -------
    list of pathlib.Path
        The report, then the PNG written (none for HTML).
    """
    def cell(r) -> str:
        point = f"{1e3 * r.predicted_s:.2f}"
        return point if math.isnan(r.low_s) else f"{point} [{1e3 * r.low_s:.2f}, {1e3 * r.high_s:.2f}]"

    head = ["level", "load", "metric", "stat", "reported ms", "predicted ms [95 % band]", "error", "inside"]
    table = [[str(r.level), r.load, r.metric, r.statistic, f"{1e3 * r.reported_s:.2f}", cell(r),
              f"{(r.predicted_s - r.reported_s) / r.reported_s:+.1%}" if r.reported_s > 0 else "n/a",
              "" if r.inside is None else ("yes" if r.inside else "no")] for r in rows.itertuples()]
    banded = rows[rows["inside"].notna()]
    summary = (f"{int(banded['inside'].sum())} of {len(banded)} reported percentiles inside their 95 % band"
               if len(banded) else "no band")
    body = [("h2", f"Levels: {rows['level'].nunique()}"), ("table", head, table),
            ("p", " ".join(t for t in (f"{summary}.", note) if t))]
    fig = ("Reported and predicted per level", "TTFT, TPOT and E2E p50/p90 per level, reported and predicted "
           "with the 95 % band", "levels.png", levels_figure(rows)) if len(rows) else None
    return _write(path, "servecal aggregates report", context, [calibration], trace, body, fig)
