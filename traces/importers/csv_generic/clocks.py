"""Time columns of any kind (numbers, date-times, Arrow timestamps and durations) as ticks, and differences of two
instants.

Subtraction happens in the source's integer unit first, so epoch nanoseconds lose nothing;
a column is on the ``epoch`` clock when it is a date-time or its smallest value is beyond
1e8 s, else ``relative``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from ...errors import TraceFormatError
from .._rows import check_rows, fail_at_row
from .._time import UNIT_NS, is_epoch_seconds, relative_seconds


@dataclass
class TimeColumn:
    """One time column as read: ticks (int64 or float64) of ``tick_ns`` ns; datetime or number."""

    ticks: np.ndarray
    tick_ns: float
    datetime: bool
    source: str

    def seconds_min(self) -> float:
        return float(self.ticks.min()) * self.tick_ns / 1e9

    def clock(self) -> str:
        if self.datetime or is_epoch_seconds(self.seconds_min()):
            return "epoch"
        return "relative"


def time_ticks(path, col: pa.Array, name: str, unit: str, rows: np.ndarray,
                lines: bool) -> tuple[np.ndarray, float, bool]:
    """(ticks, tick_ns, is_datetime) of one batch of a time column (``rows``: their 1-based source rows)."""
    typ = col.type
    if pa.types.is_dictionary(typ):
        col, typ = col.cast(typ.value_type), typ.value_type
    if pa.types.is_timestamp(typ):
        return col.cast(pa.int64()).to_numpy(), UNIT_NS[typ.unit], True
    if pa.types.is_date(typ):
        return col.cast(pa.timestamp("ns")).cast(pa.int64()).to_numpy(), 1, True
    if pa.types.is_duration(typ):
        return col.cast(pa.int64()).to_numpy(), UNIT_NS[typ.unit], False
    if pa.types.is_integer(typ):
        return col.cast(pa.int64()).to_numpy(), UNIT_NS[unit], False
    if pa.types.is_floating(typ) or pa.types.is_decimal(typ):
        v = col.cast(pa.float64()).to_numpy(zero_copy_only=False)
        check_rows(path, ~np.isfinite(v), 0, "is NaN or infinite", column=name, expected="a finite time",
                   lines=lines, rows=rows)
        return v, UNIT_NS[unit], False
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        s = pd.Series(col.to_numpy(zero_copy_only=False))
        try:
            ts = pd.to_datetime(s, format="ISO8601", utc=True)
        except (ValueError, TypeError, OverflowError):
            for i, v in enumerate(s):
                try:
                    pd.to_datetime(v, format="ISO8601", utc=True)
                except (ValueError, TypeError, OverflowError):
                    fail_at_row(path, f"value {str(v)[:40]!r} is not a date-time or a number", int(rows[i]),
                                column=name, expected="ISO 8601, e.g. 2024-05-10T00:00:00.250Z", lines=lines)
            raise
        return ts.astype("int64").to_numpy(), 1, True
    raise TraceFormatError(path, f"column has type {typ}", column=name,
                           expected="numbers, date-times or Arrow timestamp/duration")


def concat_time(path, parts: list, name: str) -> TimeColumn:
    kinds = {(p[0].dtype.kind, p[1], p[2]) for p in parts}
    if len(kinds) > 1:
        raise TraceFormatError(path, "mixes kinds of values (numbers and date-times, or several units)", column=name,
                               expected="one kind of time value in the whole column")
    return TimeColumn(np.concatenate([p[0] for p in parts]), parts[0][1], parts[0][2], name)


def difference_s(a: TimeColumn, b: TimeColumn) -> np.ndarray:
    """``a - b`` row by row in seconds, subtracting in a common tick first."""
    tick = min(a.tick_ns, b.tick_ns)
    if a.ticks.dtype.kind == "i" and b.ticks.dtype.kind == "i":
        ra, rb = int(a.tick_ns // tick), int(b.tick_ns // tick)
        d = a.ticks * ra - b.ticks * rb
        return relative_seconds(d, tick, 0)
    d = a.ticks.astype(np.float64) * (a.tick_ns / tick) - b.ticks.astype(np.float64) * (b.tick_ns / tick)
    return d * (tick / 1e9)
