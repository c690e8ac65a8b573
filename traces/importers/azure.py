"""Import the Azure LLM inference traces (2023 and 2024).

Format (Azure/AzurePublicDataset, ``AzureLLMInferenceDataset2023.md`` and
``AzureLLMInferenceDataset2024.md``; files ``AzureLLMInferenceTrace_{code,conv}.csv`` and
``..._1week.csv``)::

    TIMESTAMP,ContextTokens,GeneratedTokens
    2023-11-16 18:17:03.9799600,4808,10

``TIMESTAMP`` is the invocation time, a naive date-time with 7 fractional digits (100 ns);
the time zone is not stated. ``ContextTokens`` is the prompt length, ``GeneratedTokens``
the output length, in tokens. No latencies are recorded.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from ..errors import TraceFormatError
from ._csv import stream_csv
from ._frame import assemble_frame
from ._rows import check_rows, RowStatus
from ._source import Progress
from ._time import relative_seconds, time_resolution_s

__all__ = ["import_azure"]

_TYPES = {"TIMESTAMP": pa.timestamp("ns"), "ContextTokens": pa.int64(), "GeneratedTokens": pa.int64()}


def import_azure(path: str | Path, invalid: str = "error",
                 progress: Progress | None = None) -> tuple[pd.DataFrame, dict]:
    """Read an Azure LLM inference trace CSV, streaming (bounded memory for 10^7+ rows).

    Parameters
    ----------
    path : str or Path
        CSV with ``TIMESTAMP``, ``ContextTokens``, ``GeneratedTokens`` (other columns ignored).
    invalid : {"error", "flag", "drop"}
        What to do with a row whose ``GeneratedTokens`` is 0 (no output: not replayable).
    progress : callable, optional
        Called with bytes read.

    Returns
    -------
    frame : pandas.DataFrame
        ``request_trace/1`` columns. ``arrival_time_s`` = TIMESTAMP minus the earliest
        TIMESTAMP, subtracted exactly in int64 nanoseconds, then float64 seconds.
        ``request_id`` = 1-based data row. Sorted by arrival, ties in file order.
    metadata : dict
        ``time_origin`` (the earliest TIMESTAMP, time zone unknown), ``time_resolution_s``
        (observed; the format's tick is 100 ns), counts.

    Raises
    ------
    TraceFormatError
        Naming file, row, line and column: a missing column, a timestamp that is not a
        date-time, a non-integer, negative or missing token count, prompt < 1, a
        truncated row.
    """
    path = Path(path)
    status = RowStatus(path, invalid, lines=True)
    c_zero = status.invalid("GeneratedTokens is 0", "GeneratedTokens", ">= 1 generated token")
    ts, ctx, gen = [], [], []
    for row0, batch in stream_csv(path, _TYPES, progress=progress):
        t = batch.column(0).cast(pa.int64()).to_numpy()
        p = batch.column(1).to_numpy()
        o = batch.column(2).to_numpy()
        check_rows(path, p < 1, row0, "ContextTokens is below 1", column="ContextTokens", expected=">= 1 token",
                   lines=True)
        check_rows(path, o < 0, row0, "GeneratedTokens is negative", column="GeneratedTokens", expected=">= 0",
                   lines=True)
        status.add(np.where(o == 0, c_zero, 0).astype(np.int16), row0)
        ts.append(t), ctx.append(p), gen.append(o)
    if not ts or sum(len(t) for t in ts) == 0:
        raise TraceFormatError(path, "has no rows", expected="one row per request after the header")
    t = np.concatenate(ts)
    del ts
    origin = int(t.min())
    arrival = relative_seconds(t, 1, origin)
    res = time_resolution_s(t - origin, 1)
    del t
    ctx = np.concatenate(ctx)
    gen = np.concatenate(gen)
    df, meta = assemble_frame(arrival, ctx, gen, status=status, codes=status.all_codes())
    del arrival, ctx, gen
    meta.update({
        "source_format": "azure-llm",
        "source": str(path),
        "time_origin": str(pd.Timestamp(origin, unit="ns")) + " (time zone not stated by the source)",
        "time_resolution_s": f"{res:g}",
    })
    return df, meta
