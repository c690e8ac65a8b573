"""What a report says about where its numbers come from: the calibration's parameters with
their 95 % intervals, whether the scored trace was in the calibration's data, and the bands
put on the latency tables."""
from __future__ import annotations

import os

import numpy as np


def in_sample(trace: str | os.PathLike, cal) -> str:
    """Whether ``trace`` is among the files ``cal`` (:class:`schemas.calibration.Calibration`)
    was fitted on, in words: compared by sha256 with ``cal.source`` (as ``calibrate fit``
    records it: ``path``/``sha256`` or ``paths``/``sha256`` lists, a run spec
    ``FILE[#K][@START:END]`` each; :func:`calibrate.runs.in_source` compares alike).

    Returns
    -------
    str
        ``"in sample: ..."``, ``"out of sample: ..."`` or ``"unknown: ..."``.
    """
    from schemas.calibration import sha256_of

    src = cal.source or {}
    specs, hashes = src.get("paths", [src.get("path")]), src.get("sha256")
    hashes = hashes if isinstance(hashes, list) else [hashes]
    known = [(s, h) for s, h in zip(specs, hashes) if isinstance(s, str) and isinstance(h, str)]
    if not known:
        return "unknown: the calibration records no sha256 of the data it was fitted on"
    try:
        mine = sha256_of(trace)
    except OSError:
        return "unknown: the trace cannot be read to hash it"
    same = [s for s, h in known if h == mine]
    if same:
        part = [s for s in same if "#" in s or "@" in s]
        return ("in sample: the calibration was fitted on this trace (same sha256 as its source "
                f"{', '.join(same)}{'; that benchmark or window of it' if part else ''}); the errors below are "
                "in-sample errors, not what a what-if deserves to be trusted by")
    return (f"out of sample: the trace is none of the {len(known)} file(s) the calibration was fitted on "
            f"({', '.join(s for s, _ in known)}; compared by sha256, so a slice or copy with other bytes is not "
            "recognised: calibrate validate compares the requests themselves)")


def parameter_rows(cal) -> list[list[str]]:
    """A row per parameter of ``cal``: name, value, 95 % interval (or the bound the data give),
    ``identified`` / ``NOT IDENTIFIED`` / ``fixed`` (:func:`schemas.cost_params.param_cells`)."""
    from schemas.cost_params import param_cells

    return [[name, *param_cells(name, p)] for name, p in cal.params.items()]


#: Header of :func:`parameter_rows`.
PARAMETER_HEAD = ["parameter", "value", "ci95", "state"]


def provenance_blocks(context: list[tuple[str, str]], calibrations=(), trace=None) -> list[tuple]:
    """The opening of every report (replay, sweep, compare-schedulers, plan): what was run
    (``context``, :func:`replay.report.report_context`: the command line first), then per
    calibration its parameters with their 95 % intervals and ``identified`` / ``NOT IDENTIFIED``
    (:func:`parameter_rows`) and, with ``trace``, whether that trace was in its data
    (:func:`in_sample`).

    Parameters
    ----------
    context : list of (str, str)
    calibrations : sequence of (label, schemas.calibration.Calibration)
        One section each; the label (its path) names the section when there are several.
    trace : path, optional
        The replayed request trace.

    Returns
    -------
    list of tuple
        Report blocks (:func:`replay.report.render.render`).
    """
    blocks: list[tuple] = [("meta", list(context))]
    calibrations = list(calibrations)
    for label, cal in calibrations:
        title = "Calibration" if len(calibrations) == 1 else f"Calibration {label}"
        blocks += [("h2", title), ("table", PARAMETER_HEAD, parameter_rows(cal))]
        if trace is not None:
            blocks.append(("p", f"Scored trace: {in_sample(trace, cal)}."))
    return blocks


def with_band_columns(head: list[str], rows: list[list[str]], band) -> tuple[list[str], list[list[str]]]:
    """A measured-vs-predicted table (:func:`replay.analysis.compare.table_cells`) with a ``band_pXX``
    column after each ``err_pXX`` (or ``change_pXX``): the 95 % band ``[low, high]`` (ms) of the
    prediction, ``-`` for a metric without one (``itl``)."""
    from ..analysis.compare import ms_cell

    if band is None or not band.has_band:
        return head, rows
    out_head, cols = [], []
    for i, h in enumerate(head):
        out_head.append(h)
        if h.startswith(("err_p", "change_p")):
            q = h.rsplit("_p", 1)[1]
            out_head.append(f"band_p{q}")
            cols.append((i, q))
    out_rows = []
    for r in rows:
        new = []
        for i, c in enumerate(r):
            new.append(c)
            for j, q in cols:
                if j == i:
                    stat = f"{r[0]}_p{q}_s"
                    lo, hi = band.low.get(stat, np.nan), band.high.get(stat, np.nan)
                    new.append(f"[{ms_cell(lo)}, {ms_cell(hi)}]" if np.isfinite(lo) and np.isfinite(hi) else "-")
        out_rows.append(new)
    return out_head, out_rows
