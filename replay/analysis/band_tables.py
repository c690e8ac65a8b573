"""Predictions with their 95 % bands as text: ``replay``'s PREDICTION table, the line saying
how many measured statistics fall inside their band, and the band cells of the sweep and
scheduler tables.

A cell is ``"412.3 [398.0, 430.1]"``: the prediction at the calibration's values and the
band's ends (:class:`replay.analysis.bands.Band`), in milliseconds as :func:`replay.analysis.compare.ms_cell`
writes them; the prediction alone when there is no band.
"""
from __future__ import annotations

import numpy as np

from .bands import BAND_STATS, Band
from ..text import WIDTH, render_table
from .compare import METRICS, NARROW_PERCENTILES, SCHEDULER_TABLE_METRICS, ms_cell
from .metrics import PERCENTILES

#: Rows of the PREDICTION table, in order (labels of :data:`replay.analysis.compare.METRICS`).
PREDICTION_METRICS = tuple(label for _, _, label in METRICS)
#: Percentiles whose measured values are checked against their band.
COVERAGE_PERCENTILES = (50, 90)
#: What ``replay`` says when the calibration carries no band points.
NO_BAND_POINTS = "no band: the calibration has no band points (written before bands; refit)"


def band_cell(band: Band, stat: str) -> str:
    """``"412.3 [398.0, 430.1]"``: ``stat`` (seconds) of ``band`` in ms, its band in brackets."""
    return band.cell(stat, fmt=ms_cell)


def rate_cell(band: Band, stat: str) -> str:
    """``"12.345 [12.100, 12.600]"``: a rate (requests/s) and its band."""
    return band.cell(stat, fmt=lambda x: f"{x:.3f}")


def band_legend(band: Band | None, reason: str | None = None) -> str:
    """What the brackets are: ``"[low, high]: the 95 % band of what a run of this configuration would
    measure: ..."``, the parts it combines and the band's notes (the distance from the fitted load, a
    carried calibration, a poor one); ``reason`` (or :data:`NO_BAND_POINTS`) when ``band`` has none."""
    if band is None or not band.has_band:
        return reason or NO_BAND_POINTS
    parts = []
    if band.n_points:
        parts.append(f"the parameters (replayed at the {band.n_points} points of the calibration's 95 % confidence "
                     "set, as wide on both sides)")
    if band.n_seeds:
        parts.append(f"{band.n_seeds} other seeds of the random draws")
    used = {k for p in band.parts.values() for k, (lo, hi) in p.items() if lo or hi}
    if "sampling" in used:
        parts.append("the sampling noise of each percentile over this many requests")
    if "model" in used:
        parts.append("the model's error on data its fit did not see")
    if "transfer" in used:
        parts.append("the error of carrying a calibration across models, GPUs or engines")
    text = "[low, high]: the 95 % band of what a run would measure, combining " + "; ".join(parts)
    if not band.n_points:
        text += f" ({NO_BAND_POINTS.removeprefix('no band: ')}: no parameters' part)"
    return text + "".join(f". NOTE: {n}" for n in band.notes)


def prediction_cells(band: Band, percentiles=PERCENTILES) -> tuple[list[str], list[list[str]]]:
    """Header and cells of the PREDICTION table: a row per metric of :data:`PREDICTION_METRICS` and
    ITL when the replay recorded token times, a column per percentile (ms, with bands)."""
    head = ["metric"] + [f"p{q}" for q in percentiles]
    shown = [m for m in (*PREDICTION_METRICS, "itl")
             if m != "itl" or any(np.isfinite(band.point.get(f"itl_p{q}_s", np.nan)) for q in percentiles)]
    rows = [[m] + [band_cell(band, f"{m}_p{q}_s") for q in percentiles] for m in shown]
    return head, rows


def format_prediction(band: Band, slo: str | None = None, measured_goodput: float | None = None,
                      legend: str | None = None, wide: bool = False) -> str:
    """The PREDICTION block: latency percentiles (ms) with their bands, throughput, goodput
    (with ``slo``, its objectives in words: ``"ttft <= 0.5 s"``; ``measured_goodput`` in
    requests/s beside it when known) and the legend line (:func:`band_legend`, or ``legend``).

    Within :data:`replay.text.WIDTH` (100) columns (p99 goes first when it does not fit)
    unless ``wide``.
    """
    from ..text import WIDTH, render_table, wrap

    head, rows = prediction_cells(band)
    table = render_table(head, rows, None if wide else WIDTH, drop_order=("p99",))
    lines = [f"PREDICTION ({band.point.get('n_ok', 0)} completed requests; latencies in ms)", table,
             f"throughput: {rate_cell(band, 'throughput_rps')} completed requests/s"]
    if slo:
        meas = "" if measured_goodput is None else f"; measured {measured_goodput:.3f} req/s"
        lines.append(wrap(f"goodput ({slo}): {rate_cell(band, 'goodput_rps')} req/s{meas}"))
    lines.append(wrap(f"({legend or band_legend(band)})"))
    if wide and band.has_band and band.parts:
        lines.append(parts_table(band))
    return "\n".join(lines)


#: The parts of a band in the order :func:`parts_table` shows them.
PART_NAMES = ("parameters", "model", "transfer", "sampling")


def parts_table(band: Band, percentiles=COVERAGE_PERCENTILES) -> str:
    """The band's breakdown (``--wide``): per statistic, each part's half width (the wider side) in
    % of the point, and the band's own half width; they combine in quadrature
    (:func:`replay.analysis.bands.band_of_rows`)."""
    from ..text import render_table

    head = ["statistic", *PART_NAMES, "band"]
    rows = []
    for m in (*PREDICTION_METRICS, "itl"):
        for q in percentiles:
            s = f"{m}_p{q}_s"
            p, parts = band.point.get(s, np.nan), band.parts.get(s, {})
            if not (np.isfinite(p) and p > 0 and parts):
                continue
            rows.append([f"{m} p{q}", *(f"{max(parts[k]) / p:.1%}" for k in PART_NAMES), f"{band.half_width(s):.1%}"])
    return "band parts (half width, % of the point, the wider side):\n" + render_table(head, rows, None)


def band_coverage(table, band: Band, percentiles=COVERAGE_PERCENTILES) -> str | None:
    """One line: how many measured ``p50``/``p90`` statistics of a :func:`replay.analysis.compare.compare`
    table lie inside their band, naming those outside (measured value and band, ms); None
    without a band or measured values."""
    if not band.has_band or table is None or table.empty:
        return None
    inside, outside = 0, []
    for r in table.to_dict("records"):
        if r["metric"] not in (*PREDICTION_METRICS, "itl"):  # ITL: with token times on both sides
            continue
        for q in percentiles:
            stat, meas = f"{r['metric']}_p{q}_s", r.get(f"meas_p{q}", np.nan)
            if not (np.isfinite(meas) and np.isfinite(band.point.get(stat, np.nan))):
                continue
            if band.holds(stat, meas):
                inside += 1
            else:
                outside.append(f"{r['metric']} p{q} (measured {ms_cell(meas)}, band "
                               f"[{ms_cell(band.low[stat])}, {ms_cell(band.high[stat])}])")
    total = inside + len(outside)
    if not total:
        return None
    qs = "/".join(f"p{q}" for q in percentiles)
    line = f"inside their 95 % band: {inside} of {total} measured {qs} statistics"
    return line + (f"; outside: {', '.join(outside)}" if outside else "")


def band_columns(row: dict, band: Band) -> dict:
    """``row`` with ``{stat}_low`` and ``{stat}_high`` for every stat of
    :data:`replay.analysis.bands.BAND_STATS` (same units) from ``band``, and ``band_points`` and
    ``band_seeds`` (what was replayed for it; 0 and 0: no band, low = high = the point)."""

    out = dict(row)
    for s in BAND_STATS:
        out[f"{s}_low"], out[f"{s}_high"] = band.low[s], band.high[s]
    out["band_points"], out["band_seeds"] = band.n_points, band.n_seeds
    return out


def row_band(row: dict) -> Band:
    """The :class:`Band` of a table row carrying ``{stat}_low``/``{stat}_high``
    (:func:`band_columns`) for the stats it has (a sweep without SLOs drops ``goodput_rps``
    and its band); a row without them has no band."""

    # a table without goodput (no --slo-ttft-s/--slo-tpot-s) has no goodput band either
    present = [s for s in BAND_STATS if s in row]
    has = bool(present) and "band_points" in row and all(f"{s}_low" in row and f"{s}_high" in row for s in present)
    low = {s: row.get(f"{s}_low", np.nan) if has else row.get(s, np.nan) for s in BAND_STATS}
    high = {s: row.get(f"{s}_high", np.nan) if has else row.get(s, np.nan) for s in BAND_STATS}
    n = int(row.get("band_points", 0) or 0) if has else 0
    return Band({s: row.get(s, np.nan) for s in (*BAND_STATS, "n_ok")}, low, high, n,
                int(row.get("band_seeds", 0) or 0) if has else 0)


def band_table_cells(table, lead: list[str], percentiles=PERCENTILES) -> tuple[list[str], list[list[str]]]:
    """Header and cells of a table of predictions with bands (a sweep's or a scheduler
    comparison's, rows of :func:`band_columns`) for a report: every row, the ``lead`` columns,
    ``n_ok``, then every percentile of TTFT, TPOT, E2E and queue wait (ms) and the goodput and
    throughput (requests/s), each ``"point [low, high]"`` as the printed tables write their band
    cells (:func:`band_cell`, :func:`rate_cell`)."""
    stats = [(m, q) for m in SCHEDULER_TABLE_METRICS for q in percentiles]
    rates = [c for c in ("goodput_rps", "throughput_rps") if c in table]
    lead = [c for c in lead if c in table]
    head = lead + ["n_ok"] + [f"{m}_p{q}_ms" for m, q in stats] + rates
    rows = []
    for r in table.to_dict("records"):
        band = row_band(r)
        cells = [f"{r[c]:g}" if isinstance(r[c], float) else str(r[c]) for c in lead] + [str(r["n_ok"])]
        cells += [band_cell(band, f"{m}_p{q}_s") if f"{m}_p{q}_s" in r else "-" for m, q in stats]
        cells += [rate_cell(band, c) for c in rates]
        rows.append(cells)
    return head, rows


def format_scheduler_table(table, percentiles=PERCENTILES, wide: bool = False) -> str:
    """A :func:`~replay.analysis.compare.scheduler_table` (a pandas DataFrame) as text:
    milliseconds for times, requests/s for goodput.

    By default p50 and p90 of TTFT, TPOT and E2E and the goodput, within
    :data:`replay.text.WIDTH` (100) characters (the p90 columns go first when the scheduler
    names are long); ``wide=True`` prints every column, ``_ms`` in the names. A ``gpus``
    column is printed when the table has one; rows with bands
    (:func:`band_columns`) show each p90 cell (``wide``: every cell) as
    ``"point [low, high]"``.
    """

    if table.empty:
        return "(no schedulers)"
    if wide:
        cols = [(label, q) for label in SCHEDULER_TABLE_METRICS for q in percentiles]
        head = ["scheduler", "n_ok"] + [f"{label}_p{q}_ms" for label, q in cols] + ["goodput_rps"]
    else:
        qs = [q for q in NARROW_PERCENTILES if q in percentiles] or list(percentiles)[:2]
        cols = [(label, q) for label in ("ttft", "tpot", "e2e") for q in qs]
        head = ["scheduler", "n_ok"] + [f"{label}_p{q}" for label, q in cols] + ["goodput"]
    gpus = ["gpus"] if "gpus" in table else []
    head[1:1] = gpus

    def ms(x):
        return f"{x * 1e3:.1f}" if wide else ms_cell(x)

    lines = []
    for r in table.to_dict("records"):
        band = row_band(r)
        cells = [str(r["scheduler"])] + [str(r[c]) for c in gpus] + [str(r["n_ok"])]
        cells += [band.cell(f"{label}_p{q}_s", fmt=ms) if wide or q == 90 else ms(r[f"{label}_p{q}_s"])
                  for label, q in cols]
        cells.append(band.cell("goodput_rps", fmt=lambda x: f"{x:.3f}") if wide else f"{r['goodput_rps']:.3f}")
        lines.append(cells)
    if wide:
        return render_table(head, lines)
    drop = tuple(f"{label}_p{q}" for label in ("e2e", "tpot", "ttft") for q in reversed(qs[1:]))
    return render_table(head, lines, WIDTH, drop_order=drop)
