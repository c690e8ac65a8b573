"""Reading CSV files: the header, and the named columns streamed in typed Arrow batches.

The fast path is Arrow's CSV reader (bounded memory); only after it fails does a slow
diagnosis re-read the file with Python's ``csv`` module to name the row, line and column.
"""
from __future__ import annotations

import csv
import io
import os
import re
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from ..errors import TraceFormatError
from ._rows import fail_at_row
from ._source import MAX_INT64, Progress, first_line, open_binary


#: CSV cells read as missing (the same list for the fast Arrow path and the diagnosis).
NULL_VALUES = ["", "NA", "N/A", "n/a", "NULL", "null", "None"]


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
    with open_binary(path) as fh:
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
    raise TraceFormatError(path, f"unreadable CSV ({first_line(arrow_msg)})")


#: What Arrow's CSV reader raises for a file it cannot read (all turned into one message).
ARROW_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowKeyError, pa.ArrowNotImplementedError,
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
    open_binary(path).close()  # a missing file or a folder: one message
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
                    column_types={raw[c]: t for c, t in column_types.items()},
                    include_columns=[raw[c] for c in column_types],
                    null_values=NULL_VALUES, strings_can_be_null=True, quoted_strings_can_be_null=False),
            )
        except ARROW_ERRORS as exc:
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
            except ARROW_ERRORS as exc:
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
