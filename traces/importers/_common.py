"""Helpers shared by the importers: streaming CSV, JSON reading, time conversion, row rules.

Nothing here knows a particular format. The importers (one module per format) describe
their columns and rules; these helpers read the file in bounded memory, turn every problem
into a :class:`~traces.errors.TraceFormatError` naming the file, the row (1-based data
row), the physical line and the column, and assemble the ``request_trace/1`` frame.

Conventions
-----------
* ``row`` is the 1-based position of a request in its source (CSV data row without the
  header, JSONL record, element of a JSON array); ``line`` is the 1-based physical line of
  a text file (the CSV header is line 1).
* Unless the source has its own ids, ``request_id`` is the row number as a string, so every
  request can be traced back to the source after sorting.
* Times are converted to float64 seconds **after** subtracting the origin in the source's
  own integer unit, so epoch nanoseconds (~1.7e18, beyond float64's 2**53) keep their
  precision.
* Rows are sorted by arrival with a stable sort: ties keep file order; nothing is
  deduplicated.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from schemas.metrics import tpot_s
from schemas.validate import token_time_limit_s

from ..errors import TraceFormatError

#: Nanoseconds per unit of the ``--time-unit`` choices.
UNIT_NS: dict[str, int] = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}
#: Seconds-since-epoch above which a time column is taken to be an epoch clock (1973-03-03).
EPOCH_THRESHOLD_S = 1e8
#: CSV cells read as missing (the same list for the fast Arrow path and the diagnosis).
NULL_VALUES = ["", "NA", "N/A", "n/a", "NULL", "null", "None"]
#: Integers must lie in [-2**63, 2**63) (int64).
MAX_INT64 = 2 ** 63
#: What ``--invalid`` may say about rows that break a rule of their format.
INVALID_POLICIES = ("error", "flag", "drop")

Progress = Callable[[int], None]

__all__ = [
    "UNIT_NS", "EPOCH_THRESHOLD_S", "NULL_VALUES", "INVALID_POLICIES", "Progress",
    "RowStatus", "stream_csv", "csv_header", "line_of_row", "fail_at_row", "check_rows",
    "read_json", "iter_jsonl", "json_number", "relative_seconds", "time_resolution_s",
    "is_epoch_seconds", "assemble_frame", "bench_arrays_frame",
]


# ---------------------------------------------------------------------------
# Row status: ok / failed / invalid, and the --invalid policy
# ---------------------------------------------------------------------------

@dataclass
class RowStatus:
    """Per-row status codes, built while a file is read.

    Code 0 is ``ok``. Every other code is a reason: ``failed: ...`` (the source says the
    request failed; always kept, excluded from replay) or ``invalid: ...`` (the row breaks a
    rule of its format; handled by the ``--invalid`` policy).

    Parameters
    ----------
    path : str or Path
        The source file, named in errors.
    policy : {"error", "flag", "drop"}
        ``error``: stop at the first invalid row. ``flag``: keep it with status
        ``invalid: <rule>`` (replay and compare skip it). ``drop``: leave it out and count it.
    lines : bool
        Whether the source is line-oriented text (CSV), so errors can name the line.
    """

    path: Path
    policy: str = "error"
    lines: bool = False
    reasons: list = field(default_factory=lambda: ["ok"])
    _meta: dict = field(default_factory=dict)
    _chunks: list = field(default_factory=list)

    def __post_init__(self):
        if self.policy not in INVALID_POLICIES:
            raise TraceFormatError(self.path, f"unknown --invalid policy {self.policy!r}",
                                   expected=" or ".join(INVALID_POLICIES))

    def code(self, reason: str, column: str | None = None, expected: str | None = None) -> int:
        """The code of ``reason`` (``failed: ...`` or ``invalid: ...``), registering it once."""
        if reason not in self.reasons:
            self.reasons.append(reason)
            self._meta[reason] = (column, expected)
        return self.reasons.index(reason)

    def add(self, codes: np.ndarray, row0: int = 0, rows: np.ndarray | None = None) -> None:
        """Record the codes of rows ``row0 + 1 ...`` (or of the 1-based ``rows``).

        Under the ``error`` policy, raise at once for the first invalid row.
        """
        codes = np.asarray(codes, dtype=np.int16)
        if self.policy == "error":
            bad = np.flatnonzero([self.reasons[c].startswith("invalid") for c in range(len(self.reasons))])
            hit = np.flatnonzero(np.isin(codes, bad))
            if hit.size:
                i = int(hit[0])
                reason = self.reasons[int(codes[i])]
                column, expected = self._meta[reason]
                row = int(rows[i]) if rows is not None else row0 + i + 1
                fail_at_row(self.path, reason.removeprefix("invalid: "), row, column=column,
                            expected=expected, lines=self.lines,
                            hint="or --invalid flag to keep such rows marked, --invalid drop to leave them out")
        self._chunks.append(codes)

    def all_codes(self) -> np.ndarray:
        return np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.int16)

    def metadata(self, codes: np.ndarray) -> dict[str, str]:
        """Counts of failed and invalid rows for the file metadata (``codes`` as read)."""
        counts = np.bincount(codes, minlength=len(self.reasons)) if codes.size else np.zeros(len(self.reasons), int)
        failed = sum(int(n) for r, n in zip(self.reasons, counts) if r.startswith("failed"))
        invalid = sum(int(n) for r, n in zip(self.reasons, counts) if r.startswith("invalid"))
        meta = {"num_failed": str(failed), "num_invalid": str(invalid), "invalid_policy": self.policy}
        by = {r: int(n) for r, n in zip(self.reasons[1:], counts[1:]) if n}
        if by:
            meta["status_counts"] = json.dumps(by, sort_keys=True)
        return meta


# ---------------------------------------------------------------------------
# Errors with lines
# ---------------------------------------------------------------------------

def line_of_row(path: str | os.PathLike, row: int) -> int | None:
    """The physical line of 1-based data ``row`` of a CSV file (blank lines skipped, as Arrow does).

    Only called when an error is reported, so a full scan is acceptable.
    """
    try:
        with open(path, newline="", encoding="utf-8", errors="replace") as fh:
            reader = csv.reader(fh)
            next(reader, None)
            n = 0
            for rec in reader:
                if not rec:
                    continue
                n += 1
                if n == row:
                    return reader.line_num
    except (OSError, csv.Error):
        return None
    return None


def fail_at_row(path, rule: str, row: int, *, column: str | None = None, expected: str | None = None,
                lines: bool = False, hint: str = ""):
    """Raise :class:`TraceFormatError` for 1-based ``row`` (with its line for CSV files)."""
    line = line_of_row(path, row) if lines else None
    if hint:
        expected = f"{expected} ({hint})" if expected else hint
    raise TraceFormatError(path, rule, row=row, column=column, expected=expected, line=line)


# ---------------------------------------------------------------------------
# Streaming CSV
# ---------------------------------------------------------------------------

def _open_binary(path: Path):
    try:
        return open(path, "rb")
    except IsADirectoryError:
        raise TraceFormatError(path, "is a directory", expected="a file") from None
    except OSError as exc:
        raise TraceFormatError(path, f"cannot open ({exc.strerror or exc})") from None


def csv_header(path: str | os.PathLike) -> list[str]:
    """The header (first record) of a CSV file, names stripped of surrounding spaces.

    Raises
    ------
    TraceFormatError
        Empty file, not UTF-8 text, or no header line.
    """
    return [c.strip() for c in _raw_csv_header(path)]


def _raw_csv_header(path: str | os.PathLike) -> list[str]:
    """The header cells as written (spaces kept): the names Arrow's reader sees."""
    path = Path(path)
    with _open_binary(path) as fh:
        head = fh.read(1 << 16)
    if not head.strip():
        raise TraceFormatError(path, "empty file", expected="a header line, then one row per request")
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff")
    try:
        rec = next(csv.reader(io.StringIO(text)), [])
    except csv.Error as exc:
        raise TraceFormatError(path, f"unreadable header ({exc})", line=1) from None
    return rec


_INT_RE = re.compile(r"^[+-]?\d+$")
_TS_RE = re.compile(r"^\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?(Z|[+-]\d{2}:?\d{2})?$")


def _cell_ok(s: str, typ: pa.DataType) -> bool:
    if pa.types.is_integer(typ):
        return bool(_INT_RE.match(s)) and len(s) <= 20 and -MAX_INT64 <= int(s) < MAX_INT64
    if pa.types.is_floating(typ):
        try:
            float(s)
            return True
        except ValueError:
            return False
    if pa.types.is_timestamp(typ):
        return bool(_TS_RE.match(s))
    return True


def _type_words(typ: pa.DataType) -> str:
    if pa.types.is_integer(typ):
        return "a whole number (64-bit)"
    if pa.types.is_floating(typ):
        return "a number"
    if pa.types.is_timestamp(typ):
        return "a date and time like 2023-11-16 18:17:03.9799600"
    return str(typ)


def _diagnose_csv(path: Path, column_types: dict[str, pa.DataType], arrow_msg: str):
    """Find the line Arrow could not read (slow path, only after an error) and raise."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh)
            header = [c.strip() for c in next(reader, [])]
            idx = {c: header.index(c) for c in column_types if c in header}
            row = 0
            for rec in reader:
                if not rec:
                    continue
                row += 1
                if len(rec) != len(header):
                    raise TraceFormatError(path, f"has {len(rec)} field(s)", row=row, line=reader.line_num,
                                           expected=f"{len(header)} fields, as in the header")
                for c, typ in column_types.items():
                    s = rec[idx[c]]
                    if s in NULL_VALUES:
                        continue
                    if not _cell_ok(s, typ):
                        raise TraceFormatError(path, f"value {s[:40]!r} is not {_type_words(typ)}", row=row,
                                               line=reader.line_num, column=c)
    except UnicodeDecodeError:
        raise TraceFormatError(path, "is not UTF-8 text", expected="a UTF-8 CSV file") from None
    except csv.Error as exc:
        raise TraceFormatError(path, f"unreadable CSV ({exc})") from None
    except (KeyError, ValueError, IndexError):
        pass
    raise TraceFormatError(path, f"unreadable CSV ({_first_line(arrow_msg)})")


#: What Arrow's CSV reader raises for a file it cannot read (all turned into one message).
_ARROW_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowKeyError, pa.ArrowNotImplementedError,
                 pa.ArrowIndexError, pa.ArrowCapacityError, OverflowError, UnicodeDecodeError)


def raw_column_names(path: str | os.PathLike, columns) -> dict[str, str]:
    """Each wanted column (by its stripped name) -> its name as written in the header.

    Raises
    ------
    TraceFormatError
        A column missing from the header (listing the header), or present twice once
        surrounding spaces are ignored.
    """
    path = Path(path)
    raw = _raw_csv_header(path)
    header = [c.strip() for c in raw]
    missing = [c for c in columns if c not in header]
    if missing:
        raise TraceFormatError(path, f"has no column {', '.join(repr(c) for c in missing)}", line=1,
                               expected=f"columns {', '.join(columns)} (the header has: {', '.join(header)})")
    out = {}
    for c in columns:
        idx = [i for i, h in enumerate(header) if h == c]
        if len(idx) > 1:
            raise TraceFormatError(path, f"has column {c!r} {len(idx)} times", line=1, column=c,
                                   expected="each column once in the header")
        out[c] = raw[idx[0]]
    return out


def stream_csv(path: str | os.PathLike, column_types: dict[str, pa.DataType], *, progress: Progress | None = None,
               block_size: int = 1 << 22, allow_null: tuple = ()) -> Iterator[tuple[int, pa.RecordBatch]]:
    """Read the named columns of a CSV file in record batches (bounded memory).

    Parameters
    ----------
    path : str or PathLike
    column_types : dict
        Column name -> Arrow type; other columns are not read.
    progress : callable, optional
        Called with the number of bytes read, for a progress bar.
    block_size : int
        Bytes per batch (Arrow's block size), 4 MiB by default.
    allow_null : tuple of str
        Columns that may have missing cells (all others: an error naming the row).

    Yields
    ------
    row0 : int
        Rows before this batch (its first row is ``row0 + 1``).
    batch : pyarrow.RecordBatch
        The columns as typed; cells in :data:`NULL_VALUES` are null.

    Raises
    ------
    TraceFormatError
        Missing file, empty file, a missing column (listing the header), a row with the
        wrong number of fields or a value of the wrong type (naming row, line and column).
    """
    path = Path(path)
    raw = raw_column_names(path, column_types)
    _open_binary(path).close()  # a missing file or a folder: one message
    try:
        # Arrow's own file, not a Python one: its I/O threads never call back into Python
        # (a Python file read from Arrow's threads while the interpreter exits after an error
        # could abort the process or hang it).
        fh = pa.OSFile(str(path), "r")
    except OSError as exc:
        raise TraceFormatError(path, f"cannot open ({exc})") from None
    reader = None
    read = 0
    try:
        try:
            # The header check strips names; the reader is given the names as written
            # (``raw``) and its columns are renamed back, so both see the same columns.
            reader = pacsv.open_csv(
                fh,
                read_options=pacsv.ReadOptions(block_size=block_size, use_threads=False),
                parse_options=pacsv.ParseOptions(newlines_in_values=False),
                convert_options=pacsv.ConvertOptions(
                    column_types={raw[c]: t for c, t in column_types.items()}, include_columns=[raw[c] for c in column_types],
                    null_values=NULL_VALUES, strings_can_be_null=True, quoted_strings_can_be_null=False),
            )
        except _ARROW_ERRORS as exc:
            if "Empty CSV" in str(exc):
                raise TraceFormatError(path, "empty file", expected="a header line, then one row per request") from None
            _diagnose_csv(path, column_types, str(exc))
        names = list(column_types)
        row0 = 0
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                break
            except _ARROW_ERRORS as exc:
                _diagnose_csv(path, column_types, str(exc))
            if progress is not None:
                pos = fh.tell()
                progress(pos - read)
                read = pos
            if batch.schema.names != names:
                batch = batch.rename_columns(names)
            _check_nulls(path, batch, row0, lines=True, allow=allow_null)
            yield row0, batch
            row0 += batch.num_rows
    finally:
        if reader is not None:
            reader.close()
        fh.close()
        # the reader's freed block buffers stay in Arrow's pool unless released: return them
        # to the OS so the arrays built next do not stack on top of them
        pa.default_memory_pool().release_unused()


def _check_nulls(path, batch: pa.RecordBatch, row0: int, lines: bool, allow: tuple = ()) -> None:
    """Raise for the first missing value in any column not in ``allow``."""
    for name, col in zip(batch.schema.names, batch.columns):
        if name in allow or col.null_count == 0:
            continue
        i = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        fail_at_row(path, "missing value", row0 + i + 1, column=name, expected="a value in every row", lines=lines)


def check_rows(path, mask: np.ndarray, row0: int, rule: str, *, column: str, expected: str, lines: bool,
               rows: np.ndarray | None = None) -> None:
    """Raise for the first row where ``mask`` is True (a structural error, always fatal).

    The row is ``row0 + i + 1``, or ``rows[i]`` when the 1-based rows are given.
    """
    if mask.any():
        i = int(np.flatnonzero(mask)[0])
        row = int(rows[i]) if rows is not None else row0 + i + 1
        fail_at_row(path, rule, row, column=column, expected=expected, lines=lines)


# ---------------------------------------------------------------------------
# JSON
# ---------------------------------------------------------------------------

def read_json(path: str | os.PathLike):
    """Load one JSON document.

    Raises
    ------
    TraceFormatError
        Missing or empty file, not UTF-8, or invalid JSON (naming the line).
    """
    path = Path(path)
    with _open_binary(path) as fh:
        raw = fh.read()
    if not raw.strip():
        raise TraceFormatError(path, "empty file", expected="a JSON document")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise TraceFormatError(path, "is not UTF-8 text", expected="a UTF-8 JSON file") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(path, f"not valid JSON ({exc.msg})", line=exc.lineno,
                               expected="one complete JSON document") from None
    except RecursionError:
        raise TraceFormatError(path, "JSON nested too deeply", expected="a JSON document nested at most a few hundred "
                                                                        "levels") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise TraceFormatError(path, f"not valid JSON ({_first_line(exc)})",
                               expected="numbers of ordinary size") from None


def iter_jsonl(path: str | os.PathLike, progress: Progress | None = None) -> Iterator[tuple[int, int, dict]]:
    """Yield ``(row, line, object)`` for each non-blank line of a JSON Lines file.

    Raises
    ------
    TraceFormatError
        Missing file, a line that is not one complete JSON object (e.g. truncated), not UTF-8.
    """
    path = Path(path)
    fh = _open_binary(path)
    row = 0
    with fh:
        for lineno, raw in enumerate(fh, start=1):
            if progress is not None:
                progress(len(raw))
            if not raw.strip():
                continue
            row += 1
            try:
                obj = json.loads(raw.decode("utf-8-sig" if lineno == 1 else "utf-8"))
            except UnicodeDecodeError:
                raise TraceFormatError(path, "is not UTF-8 text", row=row, line=lineno) from None
            except json.JSONDecodeError as exc:
                raise TraceFormatError(path, f"not valid JSON ({exc.msg})", row=row, line=lineno,
                                       expected="one complete JSON object per line") from None
            except RecursionError:
                raise TraceFormatError(path, "JSON nested too deeply", row=row, line=lineno,
                                       expected="one flat JSON object per line") from None
            except ValueError as exc:  # e.g. an integer of more than 4300 digits
                raise TraceFormatError(path, f"not valid JSON ({_first_line(exc)})", row=row, line=lineno,
                                       expected="numbers of ordinary size") from None
            if not isinstance(obj, dict):
                raise TraceFormatError(path, f"is a JSON {type(obj).__name__}, not an object", row=row, line=lineno)
            yield row, lineno, obj


def _short(value) -> str:
    """A number as text, at most 24 characters (a 400-digit integer is not repeated whole)."""
    text = repr(value)
    return text if len(text) <= 24 else f"{text[:10]}...{text[-4:]} ({len(text)} digits)"


def json_number(path, value, *, column: str, row: int | None = None, line: int | None = None,
                integer: bool = False, minimum: float | None = None, maximum: float | None = None):
    """Check one JSON value: a finite number (whole if ``integer``), at least ``minimum``, at most ``maximum``.

    Returns the value as int (``integer``) or float.

    Raises
    ------
    TraceFormatError
        Naming row, line and column: null, a string, a bool, NaN/inf, a fraction, too small.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TraceFormatError(path, f"value {value!r:.40} is not a number", row=row, line=line, column=column)
    if isinstance(value, float) and not math.isfinite(value):
        raise TraceFormatError(path, f"value {value!r} is not finite", row=row, line=line, column=column)
    if isinstance(value, int) and not -MAX_INT64 <= value < MAX_INT64:
        raise TraceFormatError(path, f"value {_short(value)} is out of range", row=row, line=line, column=column,
                               expected="a 64-bit integer")
    if integer:
        if value != int(value):
            raise TraceFormatError(path, f"value {value!r} is not a whole number", row=row, line=line, column=column)
        value = int(value)
        if not -MAX_INT64 <= value < MAX_INT64:  # e.g. 1e300 written as a float
            raise TraceFormatError(path, f"value {_short(value)} is out of range", row=row, line=line, column=column,
                                   expected="a 64-bit integer")
    else:
        try:
            value = float(value)
        except OverflowError:
            raise TraceFormatError(path, f"value {_short(value)} is out of range", row=row, line=line, column=column,
                                   expected="a finite number") from None
    if minimum is not None and value < minimum:
        raise TraceFormatError(path, f"value {value!r} is below {minimum:g}", row=row, line=line, column=column,
                               expected=f">= {minimum:g}")
    if maximum is not None and value > maximum:
        raise TraceFormatError(path, f"value {_short(value)} is above {maximum:g}", row=row, line=line, column=column,
                               expected=f"<= {maximum:g}")
    return value


# ---------------------------------------------------------------------------
# Time
# ---------------------------------------------------------------------------

def relative_seconds(ticks: np.ndarray, tick_ns: float, origin=None) -> np.ndarray:
    """``(ticks - origin) * tick`` as float64 seconds, subtracting in the source dtype.

    Parameters
    ----------
    ticks : ndarray of int64 or float64, shape (n,)
        Instants in units of ``tick_ns`` nanoseconds (e.g. int64 ns of a timestamp column,
        int64 ms of a Mooncake trace).
    tick_ns : float
        Nanoseconds per tick.
    origin : scalar, optional
        Default: ``ticks.min()``.

    Notes
    -----
    The subtraction happens in int64 for integer ticks, so epoch nanoseconds (beyond
    float64's 2**53) lose nothing; the difference is then converted once.
    """
    if origin is None:
        origin = ticks.min() if ticks.size else 0
    rel = (ticks - origin).astype(np.float64)
    per_s = 1e9 / tick_ns
    # dividing by an exact integer (1e3, 1e6, 1e9) rounds once; multiplying by 1e-9 would not
    return rel / per_s if per_s == int(per_s) else rel * (tick_ns / 1e9)


def time_resolution_s(rel_ticks: np.ndarray, tick_ns: int) -> float:
    """The coarsest power-of-ten of seconds (1 s ... 1 ns) that every integer offset is a multiple of.

    A ``timestamp[s]`` column read back as ``timestamp[ms]`` (BR-16) still reports 1 s.
    """
    v = np.asarray(rel_ticks, dtype=np.int64) * int(tick_ns)
    for k in range(9, -1, -1):
        if not np.any(v % (10 ** k)):
            return 10.0 ** (k - 9)
    return 1e-9


def is_epoch_seconds(seconds_min: float) -> bool:
    """Whether a column whose smallest value is ``seconds_min`` seconds is an epoch clock."""
    return bool(seconds_min > EPOCH_THRESHOLD_S)


# ---------------------------------------------------------------------------
# The output frame
# ---------------------------------------------------------------------------

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
        invalid_codes = [i for i, r in enumerate(status.reasons) if r.startswith("invalid")]
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


# ---------------------------------------------------------------------------
# Benchmark result JSON with per-request arrays (vLLM benchmark_serving, SGLang bench_serving)
# ---------------------------------------------------------------------------

_BENCH_REQUIRED = ("input_lens", "output_lens", "ttfts", "itls", "errors")
ARRIVAL_CHOICES = ("auto", "recorded", "zero", "synth")


def _first_line(text: str, limit: int = 120) -> str:
    s = str(text).strip().splitlines()
    s = s[-1].strip() if s else ""
    return s[:limit]


def bench_arrays_frame(path, result: dict, *, source_format: str, arrivals: str = "auto", seed: int = 0,
                       invalid: str = "error", row_offset_line: int | None = None) -> tuple[pd.DataFrame, dict]:
    """Convert one benchmark result with per-request arrays into a request trace.

    Parameters
    ----------
    path : str or Path
        The source (named in errors).
    result : dict
        ``input_lens``, ``output_lens``, ``ttfts`` (s), ``itls`` (list of s per request),
        ``errors`` ("" or null for success); optional ``start_times`` (client
        ``perf_counter`` s at send), ``latencies`` (E2E s), ``successes`` (bool),
        ``request_rate`` (number or "inf"), ``burstiness``, ``max_concurrency``.
    arrivals : {"auto", "recorded", "zero", "synth"}
        ``recorded``: ``start_times`` relative to the first. ``zero``: every request at 0
        (exact for ``request_rate=inf``). ``synth``: gamma gaps with shape ``burstiness``
        and mean ``1/request_rate``, seeded, first request at 0 (the benchmark's own
        sampler, not its draws). ``auto``: recorded if present, zero if the rate was
        inf, else an error asking for a choice.
    seed : int
        Seed of ``synth``.
    invalid : {"error", "flag", "drop"}
        A success with TTFT 0 and output > 0, or with 0 output tokens, is invalid (BR-17).
    row_offset_line : int, optional
        The line of a JSONL file holding ``result`` (named in errors).

    Returns
    -------
    frame, metadata

    Raises
    ------
    TraceFormatError
        Missing or unequal arrays, a bad value (naming the array and the 1-based request),
        unknown arrival times under ``auto``.
    """
    path = Path(path)
    line = row_offset_line
    for k in _BENCH_REQUIRED:
        if k not in result:
            raise TraceFormatError(path, f"has no per-request array '{k}'", line=line, column=k,
                                   expected="a result saved with per-request details (vLLM --save-detailed "
                                            "/ SGLang --output-details)")
    optional = [k for k in ("start_times", "latencies", "successes") if k in result and result[k] is not None]
    arrays = {k: result[k] for k in (*_BENCH_REQUIRED, *optional)}
    for k, v in arrays.items():
        if not isinstance(v, list):
            raise TraceFormatError(path, f"'{k}' is a {type(v).__name__}", line=line, column=k, expected="a list")
    n = len(arrays["input_lens"])
    for k, v in arrays.items():
        if len(v) != n:
            raise TraceFormatError(path, f"'{k}' has {len(v)} entries but 'input_lens' has {n}", line=line, column=k,
                                   expected="one entry per request in every array")
    if n == 0:
        raise TraceFormatError(path, "has no requests", line=line, expected="non-empty per-request arrays")
    if arrivals not in ARRIVAL_CHOICES:
        raise TraceFormatError(path, f"unknown arrivals choice {arrivals!r}", expected=" or ".join(ARRIVAL_CHOICES))

    status = RowStatus(path, invalid, lines=False)
    prompt = np.zeros(n, np.int64)
    output = np.zeros(n, np.int64)
    ttft = np.full(n, np.nan)
    e2e = np.full(n, np.nan)
    codes = np.zeros(n, np.int16)
    token_times = np.empty(n, dtype=object)
    chunked = 0
    c_ttft0 = status.code("invalid: success with ttft 0", "ttfts", "ttft > 0 for a request that produced tokens")
    c_out0 = status.code("invalid: success with 0 output tokens", "output_lens", ">= 1 token for a successful request")
    for i in range(n):
        r = i + 1
        prompt[i] = json_number(path, arrays["input_lens"][i], column="input_lens", row=r, integer=True, minimum=1)
        output[i] = json_number(path, arrays["output_lens"][i], column="output_lens", row=r, integer=True, minimum=0)
        err = arrays["errors"][i]
        ok = err in ("", None)
        if "successes" in arrays:
            ok = ok and bool(arrays["successes"][i])
        if not ok:
            codes[i] = status.code(f"failed: {_first_line(err) or 'unsuccessful'}")
            continue
        t = json_number(path, arrays["ttfts"][i], column="ttfts", row=r, minimum=0)
        itl = arrays["itls"][i]
        if not isinstance(itl, list):
            raise TraceFormatError(path, f"itls entry is a {type(itl).__name__}", row=r, column="itls",
                                   expected="a list of seconds")
        gaps = np.array([json_number(path, g, column="itls", row=r, minimum=0) for g in itl], dtype=np.float64)
        if output[i] == 0:
            codes[i] = c_out0
            continue
        if t == 0:
            codes[i] = c_ttft0
            continue
        ttft[i] = t
        if "latencies" in arrays:
            e2e[i] = json_number(path, arrays["latencies"][i], column="latencies", row=r, minimum=0)
            if e2e[i] < t * (1 - 1e-9):
                raise TraceFormatError(path, f"latency {e2e[i]!r} is below ttft {t!r}", row=r, column="latencies",
                                       expected="latencies >= ttfts")
        else:
            e2e[i] = t + float(gaps.sum())
        if gaps.size + 1 == output[i]:
            times = t + np.concatenate([[0.0], np.cumsum(gaps)])
            if times[-1] > token_time_limit_s(e2e[i]):
                # the client's latency ends before its own last chunk: the row contradicts itself
                codes[i] = status.code("invalid: ttft + sum(itls) is beyond the latency", "itls",
                                       "the last token by the request's latency (ttfts + sum(itls) <= latencies)")
                ttft[i] = e2e[i] = np.nan
                continue
            token_times[i] = times
        else:
            chunked += 1
    status.add(codes, 0)

    rate = result.get("request_rate")
    rate_f = math.inf if rate in ("inf", None, float("inf")) else rate
    if not isinstance(rate_f, (int, float)) or isinstance(rate_f, bool) or not rate_f > 0:
        raise TraceFormatError(path, f"request_rate {_short(rate)[:40]} is not a positive number or 'inf'", line=line,
                               column="request_rate")
    if rate_f != math.inf:
        rate_f = json_number(path, rate_f, column="request_rate", line=line)  # in range: a float
    burst = result.get("burstiness", 1.0)
    if isinstance(burst, bool) or not isinstance(burst, (int, float)) or not burst > 0:
        raise TraceFormatError(path, f"burstiness {_short(burst)[:40]} is not a positive number", line=line,
                               column="burstiness")
    burst = json_number(path, burst, column="burstiness", line=line)
    choice = arrivals
    if choice == "auto":
        if "start_times" in arrays:
            choice = "recorded"
        elif math.isinf(rate_f):
            choice = "zero"
        else:
            raise TraceFormatError(
                path, f"has no per-request send times ('start_times') and request_rate is {rate_f:g}/s, so the "
                      "arrival times are unknown", line=line, column="start_times",
                expected="--arrivals synth (gamma gaps with the run's rate and burstiness, seeded) or --arrivals zero")
    meta = {"source_format": source_format, "source": str(path)}
    if choice == "recorded":
        if "start_times" not in arrays:
            raise TraceFormatError(path, "has no 'start_times'", line=line, column="start_times",
                                   expected="a result from a benchmark version that saves start_times, or "
                                            "--arrivals zero/synth")
        st = np.array([json_number(path, v, column="start_times", row=i + 1) for i, v in
                       enumerate(arrays["start_times"])])
        arrival = st - st.min()
        meta["arrival_source"] = "recorded: start_times (client perf_counter at send), relative to the first"
    elif choice == "zero":
        arrival = np.zeros(n)
        meta["arrival_source"] = "zero: every request at t=0 (the benchmark sent them all at once)"
        if result.get("max_concurrency"):
            meta["arrival_warning"] = (f"max_concurrency={result['max_concurrency']}: the client held requests "
                                       "back, so t=0 is when they were created, not when the server saw them")
    else:
        if math.isinf(rate_f):
            raise TraceFormatError(path, "request_rate is inf: nothing to synthesise", line=line,
                                   column="request_rate", expected="--arrivals zero")
        rng = np.random.default_rng(seed)
        gaps = rng.gamma(float(burst), 1.0 / (rate_f * float(burst)), n - 1)
        arrival = np.concatenate([[0.0], np.cumsum(gaps)])
        meta["arrival_source"] = (f"synthesized: gamma gaps, shape={float(burst):g}, mean={1 / rate_f:g} s, "
                                  f"seed={seed} (not the run's own draws)")
    meta["request_rate"] = "inf" if math.isinf(rate_f) else repr(float(rate_f))
    meta["burstiness"] = repr(float(burst))
    for k in ("max_concurrency", "backend", "model_id", "date", "dataset_name"):
        if result.get(k) is not None:
            meta[k] = str(result[k])
    meta["e2e_source"] = "latencies" if "latencies" in arrays else "ttft + sum(itls)"
    meta["token_times_missing_multi_token_chunks"] = str(chunked)
    df, m = assemble_frame(arrival, prompt, output, status=status, codes=codes,
                           extra={"ttft_s": ttft, "e2e_s": e2e, "tpot_s": tpot_s(ttft, e2e, output),
                                  "token_times_s": token_times})
    return df, {**meta, **m}
