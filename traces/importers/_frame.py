"""The output of every importer: the ``request_trace/1`` frame and its row-count metadata.

* Rows are sorted by arrival with a stable sort: ties keep file order; nothing is
  deduplicated. The first arrival is at 0.
* Unless the source has its own ids, ``request_id`` is the row number as a string, so every
  request can be traced back to the source after sorting.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from schemas.status import INVALID

from ..errors import TraceFormatError
from ._rows import RowStatus


def _string_series(values) -> pd.Series:
    arr = values if isinstance(values, (pa.Array, pa.ChunkedArray)) else pa.array(values, pa.string())
    if not pa.types.is_string(arr.type):
        arr = arr.cast(pa.string())
    return pd.Series(pd.arrays.ArrowExtensionArray(arr))


def assemble_frame(arrival_s: np.ndarray, prompt: np.ndarray, output: np.ndarray, *, status: RowStatus,
                   codes: np.ndarray, rows: np.ndarray | None = None, request_ids=None,
                   extra: dict | None = None) -> tuple[pd.DataFrame, dict[str, str]]:
    """Sort by arrival (stable), apply the ``--invalid`` policy, build the ``request_trace/1`` frame.

    Parameters
    ----------
    arrival_s : ndarray of float64, shape (n,)
        Seconds relative to the trace start (not yet rebased after dropping rows).
    prompt, output : ndarray of int64, shape (n,)
    status : RowStatus
    codes : ndarray of int16, shape (n,)
        Status code per row.
    rows : ndarray of int64, optional
        1-based source rows; default ``1..n``. Used for ``request_id`` when ``request_ids`` is None.
    request_ids : sequence of str or pyarrow array, optional
    extra : dict, optional
        More columns (measured latencies, ``token_times_s``, ``block_hashes``, ...), length n.

    Returns
    -------
    frame : pandas.DataFrame
        Sorted by ``arrival_time_s``, the first arrival at 0; ``status`` only when some row
        is not ok.
    metadata : dict
        ``num_rows``, failed/invalid counts, policy.
    """
    n = len(arrival_s)
    if rows is None:
        rows = np.arange(1, n + 1, dtype=np.int64)
    keep = None
    if status.policy == "drop":
        invalid_codes = [i for i, r in enumerate(status.reasons) if r.startswith(INVALID)]
        if invalid_codes:
            keep = ~np.isin(codes, invalid_codes)
    meta = status.metadata(codes)
    if keep is not None and not keep.all():
        meta["num_invalid_dropped"] = str(int((~keep).sum()))
        idx = np.flatnonzero(keep)
    else:
        idx = None
    if idx is None and n and bool(np.all(arrival_s[1:] >= arrival_s[:-1])):
        order = None  # already sorted (the usual case): no permutation, no copies
    else:
        order = np.argsort(arrival_s if idx is None else arrival_s[idx], kind="stable")
        if idx is not None:
            order = idx[order]
        if order.size == 0:
            raise TraceFormatError(status.path, "no requests left", expected="at least one request")

    def take(a):
        return a if order is None else a[order]

    arr = take(arrival_s)
    arr = arr - arr[0]
    if request_ids is None:
        ids = pa.array(take(rows)).cast(pa.string())
    else:
        ids = pa.array(request_ids, pa.string()) if not isinstance(request_ids, pa.Array) else request_ids
        if order is not None:
            ids = ids.take(pa.array(order))
    df = pd.DataFrame({
        "request_id": _string_series(ids),
        "arrival_time_s": arr,
        "num_prompt_tokens": take(np.asarray(prompt, np.int64)),
        "num_output_tokens": take(np.asarray(output, np.int64)),
    }, copy=False)
    for name, col in (extra or {}).items():
        if isinstance(col, np.ndarray) and col.dtype != object:
            df[name] = take(col)
        else:
            vals = col if isinstance(col, np.ndarray) else np.asarray(col, dtype=object)
            df[name] = pd.Series(list(take(vals)), dtype=object)
    c = take(codes)
    if c.any():
        df["status"] = pd.Categorical.from_codes(c.astype(np.int64), categories=status.reasons)
    meta["num_rows"] = str(len(df))
    return df, meta
