"""Import (and export) Vidur's processed request traces.

Format (microsoft/vidur, ``data/processed_traces/*.csv``, read by
``vidur/request_generator/trace_replay_request_generator.py``)::

    arrived_at,num_prefill_tokens,num_decode_tokens
    0.0,4808,10
    0.052,3180,8

``arrived_at`` is seconds since the first request (float), ``num_prefill_tokens`` the
prompt and ``num_decode_tokens`` the output length in tokens. Other columns (e.g.
``num_total_tokens``, ``pd_ratio``) are ignored.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from schemas.status import OK

from ..errors import TraceError, TraceFormatError
from ._csv import stream_csv
from ._frame import assemble_frame
from ._rows import check_rows, RowStatus
from ._source import Progress

__all__ = ["import_vidur", "export_vidur", "VIDUR_COLUMNS"]

VIDUR_COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
_TYPES = {"arrived_at": pa.float64(), "num_prefill_tokens": pa.int64(), "num_decode_tokens": pa.int64()}


def import_vidur(path: str | Path, invalid: str = "error",
                 progress: Progress | None = None) -> tuple[pd.DataFrame, dict]:
    """Read a Vidur processed trace CSV, streaming.

    Parameters
    ----------
    path : str or Path
    invalid : {"error", "flag", "drop"}
        What to do with a row whose ``num_decode_tokens`` is 0.
    progress : callable, optional
        Called with bytes read.

    Returns
    -------
    frame : pandas.DataFrame
        ``arrival_time_s`` = ``arrived_at`` minus the smallest ``arrived_at`` (the first
        request; 0 in Vidur's own files), float64 seconds; ``request_id`` = 1-based data
        row. Sorted by arrival, ties in file order.
    metadata : dict

    Raises
    ------
    TraceFormatError
        A missing column, a negative, NaN or infinite ``arrived_at``, a non-integer or
        negative token count, prompt < 1, a truncated row (naming row, line, column).
    """
    path = Path(path)
    status = RowStatus(path, invalid, lines=True)
    c_zero = status.invalid("num_decode_tokens is 0", "num_decode_tokens", ">= 1 decode token")
    arr, pre, dec = [], [], []
    for row0, batch in stream_csv(path, _TYPES, progress=progress):
        a = batch.column(0).to_numpy()
        p = batch.column(1).to_numpy()
        d = batch.column(2).to_numpy()
        check_rows(path, ~np.isfinite(a), row0, "arrived_at is not finite", column="arrived_at",
                   expected="seconds since the first request", lines=True)
        check_rows(path, a < 0, row0, "arrived_at is negative", column="arrived_at",
                   expected="seconds since the first request (>= 0)", lines=True)
        check_rows(path, p < 1, row0, "num_prefill_tokens is below 1", column="num_prefill_tokens",
                   expected=">= 1 token", lines=True)
        check_rows(path, d < 0, row0, "num_decode_tokens is negative", column="num_decode_tokens",
                   expected=">= 0", lines=True)
        status.add(np.where(d == 0, c_zero, 0).astype(np.int16), row0)
        arr.append(a), pre.append(p), dec.append(d)
    if not arr or sum(len(a) for a in arr) == 0:
        raise TraceFormatError(path, "has no rows", expected="one row per request after the header")
    a = np.concatenate(arr)
    df, meta = assemble_frame(a - a.min(), np.concatenate(pre), np.concatenate(dec), status=status,
                              codes=status.all_codes())
    meta.update({"source_format": "vidur", "source": str(path), "time_origin": "arrived_at of the first request"})
    return df, meta


def export_vidur(frame: pd.DataFrame, path: str | os.PathLike) -> dict[str, int]:
    """Write a request trace as a Vidur processed trace CSV, atomically.

    Parameters
    ----------
    frame : pandas.DataFrame
        A ``request_trace/1`` frame (sorted by arrival).
    path : str or PathLike
        Output CSV: ``arrived_at`` (float seconds, shortest round-trip decimal),
        ``num_prefill_tokens``, ``num_decode_tokens``.

    Returns
    -------
    dict
        ``written`` rows and ``skipped`` rows (``status`` set and not ``ok``: failed or
        invalid requests have no output to simulate; Vidur's format cannot mark them).

    Raises
    ------
    TraceError
        If no row is left to write.
    """
    from schemas.atomic import atomic_output

    ok = np.ones(len(frame), bool)
    if "status" in frame:
        st = frame["status"].astype(object)
        ok = (st.isna() | (st == OK)).to_numpy()
    sub = frame.loc[ok]
    if sub.empty:
        raise TraceError(f"{path}: no ok requests to export")
    table = pa.table({
        "arrived_at": pa.array(sub["arrival_time_s"].to_numpy(np.float64)),
        "num_prefill_tokens": pa.array(sub["num_prompt_tokens"].to_numpy(np.int64)),
        "num_decode_tokens": pa.array(sub["num_output_tokens"].to_numpy(np.int64)),
    })
    with atomic_output(path) as tmp:
        with open(tmp, "wb") as fh:
            fh.write((",".join(VIDUR_COLUMNS) + "\n").encode())
            pacsv.write_csv(table, fh, write_options=pacsv.WriteOptions(include_header=False, quoting_style="none"))
    return {"written": int(ok.sum()), "skipped": int((~ok).sum())}
