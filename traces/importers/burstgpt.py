"""Import BurstGPT traces.

Format (HPMLL/BurstGPT, ``README.md`` "Data Description"; files ``data/BurstGPT_*.csv``)::

    Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
    862919,ChatGPT,266,290,556,Conversation log

``Timestamp`` is seconds since the start of the collection (whole seconds: equal values are
requests within the same second, in order; HPMLL/BurstGPT#2). ``Model`` is ChatGPT or
GPT-4. ``Response tokens`` = 0 marks a failed request (the "with failures" files;
HPMLL/BurstGPT#11; vLLM's loader drops them). ``Total tokens`` = Request + Response.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from schemas.status import OK

from ..errors import TraceFormatError
from ._csv import csv_header, stream_csv
from ._frame import assemble_frame
from ._rows import check_rows, RowStatus
from ._source import Progress

__all__ = ["import_burstgpt"]

_TYPES = {"Timestamp": pa.float64(), "Model": pa.string(), "Request tokens": pa.int64(),
          "Response tokens": pa.int64(), "Total tokens": pa.int64()}


def import_burstgpt(path: str | Path, model: str | None = None, invalid: str = "error",
                    progress: Progress | None = None) -> tuple[pd.DataFrame, dict]:
    """Read a BurstGPT CSV, streaming.

    Parameters
    ----------
    path : str or Path
    model : str, optional
        Keep only rows whose ``Model`` equals this (e.g. ``GPT-4``); the time origin is
        then the first kept row.
    invalid : {"error", "flag", "drop"}
        What to do with a row whose ``Total tokens`` differs from Request + Response.
    progress : callable, optional
        Called with bytes read.

    Returns
    -------
    frame : pandas.DataFrame
        ``arrival_time_s`` = Timestamp minus the first kept Timestamp (ties allowed, file
        order kept, no deduplication, no jitter). A row with 0 response tokens is kept
        with ``status = 'failed: zero response tokens'`` and ``num_output_tokens = 0``
        (replay and compare skip it). ``request_id`` = 1-based data row of the file.
    metadata : dict
        ``time_resolution_s`` = 1 (the format's), ``models`` (rows per model in the whole
        file), ``model_filter``, ``mean_rate_rps`` with its formula (ok rows only).

    Raises
    ------
    TraceFormatError
        A missing column, a non-numeric or negative value, Request tokens < 1, a truncated
        row, and (``invalid='error'``) Total != Request + Response; or no row of ``model``.
    """
    path = Path(path)
    has_log_type = "Log Type" in csv_header(path)
    status = RowStatus(path, invalid, lines=True)
    c_total = status.invalid("Total tokens != Request tokens + Response tokens", "Total tokens",
                          "Total tokens = Request tokens + Response tokens")
    c_failed = status.failed("zero response tokens")
    models: dict[str, int] = {}
    ts, req, resp, rows = [], [], [], []
    whole = True
    for row0, batch in stream_csv(path, _TYPES, progress=progress):
        m = batch.column(1)
        for v in pc.value_counts(m).to_pylist():
            models[v["values"]] = models.get(v["values"], 0) + int(v["counts"])
        keep = np.ones(batch.num_rows, bool) if model is None else pc.equal(m, model).to_numpy(zero_copy_only=False)
        idx = np.flatnonzero(keep)
        r = row0 + idx + 1
        t = batch.column(0).to_numpy()[idx]
        q = batch.column(2).to_numpy()[idx]
        a = batch.column(3).to_numpy()[idx]
        tot = batch.column(4).to_numpy()[idx]
        check_rows(path, ~np.isfinite(t) | (t < 0), 0, "Timestamp is not a finite number >= 0", column="Timestamp",
                   expected="seconds", lines=True, rows=r)
        check_rows(path, q < 1, 0, "Request tokens is below 1", column="Request tokens", expected=">= 1", lines=True,
                   rows=r)
        check_rows(path, a < 0, 0, "Response tokens is negative", column="Response tokens", expected=">= 0",
                   lines=True, rows=r)
        codes = np.where(tot != q + a, c_total, np.where(a == 0, c_failed, 0)).astype(np.int16)
        status.add(codes, rows=r)
        whole = whole and bool(np.all(t == np.round(t)))
        ts.append(t), req.append(q), resp.append(a), rows.append(r)
    n = sum(len(t) for t in ts)
    if n == 0:
        if model is not None and models:
            raise TraceFormatError(path, f"has no rows of model {model!r}",
                                   expected=f"one of {', '.join(sorted(models))}")
        raise TraceFormatError(path, "has no rows", expected="one row per request after the header")
    rel = np.concatenate(ts)
    del ts
    t0 = float(rel.min())
    rel -= t0
    codes = status.all_codes()
    req, resp, rows = np.concatenate(req), np.concatenate(resp), np.concatenate(rows)
    df, meta = assemble_frame(rel, req, resp, status=status, codes=codes, rows=rows)
    del rel, req, resp, rows
    ta = df["arrival_time_s"].to_numpy()
    if "status" in df:
        ta = ta[df["status"].astype(object).eq(OK).to_numpy()]
    span = float(ta[-1] - ta[0]) if ta.size else 0.0
    meta.update({
        "source_format": "burstgpt",
        "source": str(path),
        "time_origin": f"Timestamp {t0:g} s of the first kept row",
        "time_resolution_s": "1" if whole else "fractional seconds (finer than the format's 1 s)",
        "models": ", ".join(f"{k}={v}" for k, v in sorted(models.items())),
        "model_filter": model or "",
        "has_log_type": str(has_log_type).lower(),
        "mean_rate_rps": repr(ta.size / span) if span > 0 else "nan",
        "mean_rate_formula": "n_ok / (t_last - t_first) over ok rows",
    })
    return df, meta
