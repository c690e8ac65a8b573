"""The mapped columns of a CSV or Parquet file, read in typed batches (time column types inferred)."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from schemas.tables import parquet_reason

from ...errors import TraceFormatError
from .._csv import ARROW_ERRORS, csv_header, raw_column_names, stream_csv
from .mapping import DURATIONS, INSTANTS, INTEGERS, STRINGS


def is_parquet(path: Path) -> bool:
    if path.suffix.lower() in (".parquet", ".pq"):
        return True
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == b"PAR1"
    except OSError:
        return False


def csv_types(path: Path, mapping: dict[str, str], filters: dict[str, str]) -> dict[str, pa.DataType]:
    """Arrow types to read each needed CSV column with (time columns inferred from the first block)."""
    header = csv_header(path)
    need = {*mapping.values(), *filters}
    missing = [c for c in need if c not in header]
    if missing:
        raise TraceFormatError(path, f"has no column {', '.join(repr(c) for c in sorted(missing))}", line=1,
                               expected=f"one of the header's columns: {', '.join(header)}")
    time_cols = [mapping[f] for f in (*INSTANTS, *DURATIONS) if f in mapping]
    inferred: dict[str, pa.DataType] = {}
    if time_cols:
        raw = raw_column_names(path, dict.fromkeys(time_cols))  # the names as written, spaces kept
        r = None
        try:
            r = pacsv.open_csv(path, read_options=pacsv.ReadOptions(block_size=1 << 20, use_threads=False),
                               convert_options=pacsv.ConvertOptions(include_columns=[raw[c] for c in time_cols]))
            first = r.read_next_batch()
            inferred = {c: first.schema.field(raw[c]).type for c in time_cols}
        except (*ARROW_ERRORS, StopIteration, KeyError):
            inferred = {}  # the streaming read that follows names the row and column
        finally:
            if r is not None:
                r.close()
    types: dict[str, pa.DataType] = {c: pa.string() for c in filters}
    for fld, col in mapping.items():
        if fld in STRINGS:
            types[col] = pa.string()
        elif fld in INTEGERS:
            types[col] = pa.int64()
        else:
            t = inferred.get(col, pa.float64())
            if pa.types.is_integer(t):
                types[col] = pa.int64()
            elif pa.types.is_timestamp(t) or pa.types.is_date(t):
                types[col] = pa.timestamp("ns", getattr(t, "tz", None))
            elif pa.types.is_string(t) and fld in INSTANTS:
                types[col] = pa.string()
            else:
                types[col] = pa.float64()
    return types


def batches(path: Path, types_or_cols, parquet: bool, progress, allow_null: tuple = ()):
    if parquet:
        try:
            pf = pq.ParquetFile(path)
        except (pa.ArrowException, OSError, ValueError, UnicodeDecodeError) as exc:
            raise TraceFormatError(path, parquet_reason(path, exc, import_hint=False)) from None
        try:
            names = pf.schema_arrow.names
        except UnicodeDecodeError:
            raise TraceFormatError(path, "has column names that are not UTF-8 text") from None
        missing = [c for c in types_or_cols if c not in names]
        if missing:
            raise TraceFormatError(path, f"has no column {', '.join(repr(c) for c in sorted(missing))}",
                                   expected=f"one of its columns: {', '.join(names)}")
        row0 = 0
        try:
            for batch in pf.iter_batches(batch_size=1 << 20, columns=list(dict.fromkeys(types_or_cols))):
                yield row0, batch
                row0 += batch.num_rows
        except (pa.ArrowException, OSError, ValueError, UnicodeDecodeError) as exc:
            raise TraceFormatError(path, parquet_reason(path, exc, import_hint=False)) from None
    else:
        yield from stream_csv(path, types_or_cols, progress=progress, allow_null=allow_null)
