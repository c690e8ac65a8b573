"""Reading an LLMServingSim profile's CSV tables, every cell and every operator checked.

``dense.csv`` and ``per_sequence.csv`` become ``{op: (x sorted, time_us)}``; ``attention.csv``
its grid columns. Errors name the file, row, line and column.
"""
from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pandas as pd

from ...errors import TraceFormatError
from .compose import PER_LAYER_DENSE_CALLS, PER_STEP_DENSE, PER_STEP_SEQUENCE

_ATTENTION_KEYS = ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode")


def _read_csv(path: Path, columns: dict[str, str]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Read ``columns`` ({name: "str" | "int" | "time"}) of a CSV, validating every cell.

    Returns the columns as arrays and, per data row, its 1-based file line.
    ``int`` cells must be integers >= 0; ``time`` cells finite numbers > 0.
    """
    try:
        fh = path.open("r", encoding="utf-8-sig", newline="")
    except OSError as exc:
        raise TraceFormatError(path, f"cannot read ({exc})") from None
    with fh:
        reader = csv.reader(fh)
        try:
            header = next(reader, None)
            while header is not None and not any(c.strip() for c in header):
                header = next(reader, None)
            if header is None:
                raise TraceFormatError(path, "empty file",
                                       expected=f"a header with {', '.join(columns)}")
            header = [c.strip() for c in header]
            header_line = reader.line_num
            for name in columns:
                if name not in header:
                    raise TraceFormatError(path, "missing column", column=name, line=header_line,
                                           expected=f"columns {', '.join(columns)}")
            index = {name: header.index(name) for name in columns}
            values: dict[str, list] = {name: [] for name in columns}
            lines: list[int] = []
            row = 0
            for record in reader:
                if not any(c.strip() for c in record):
                    continue
                row += 1
                line = reader.line_num
                if len(record) != len(header):
                    raise TraceFormatError(path, f"{len(record)} fields", row=row, line=line,
                                           expected=f"{len(header)} as in the header")
                for name, kind in columns.items():
                    values[name].append(_cell(path, record[index[name]].strip(), kind,
                                              row, line, name))
                lines.append(line)
        except (csv.Error, UnicodeDecodeError) as exc:
            raise TraceFormatError(path, f"not a readable CSV file ({exc})",
                                   line=reader.line_num or None) from None
    if not lines:
        raise TraceFormatError(path, "no data rows", expected="at least one row after the header")
    arrays = {
        name: np.asarray(values[name], dtype={"str": object, "int": np.int64,
                                              "time": np.float64}[kind])
        for name, kind in columns.items()
    }
    return arrays, np.asarray(lines, dtype=np.int64)


def _cell(path: Path, text: str, kind: str, row: int, line: int, column: str):
    if kind == "str":
        if not text:
            raise TraceFormatError(path, "empty value", row=row, line=line, column=column,
                                   expected="an operator name")
        return text
    if kind == "int":
        try:
            value = int(text)
        except ValueError:
            try:
                f = float(text)
            except ValueError:
                f = math.nan
            if not (math.isfinite(f) and f.is_integer()):
                raise TraceFormatError(path, f"not an integer: {text!r}", row=row, line=line,
                                       column=column, expected="a whole number >= 0") from None
            value = int(f)
        if value < 0:
            raise TraceFormatError(path, f"negative value {value}", row=row, line=line,
                                   column=column, expected="a whole number >= 0")
        if value >= 2 ** 63:
            raise TraceFormatError(path, f"value {text[:20]}... ({len(text)} characters) is out of range", row=row,
                                   line=line, column=column, expected="a 64-bit integer")
        return value
    try:
        value = float(text)
    except ValueError:
        raise TraceFormatError(path, f"not a number: {text!r}", row=row, line=line,
                               column=column, expected="a time in microseconds > 0") from None
    if not math.isfinite(value):
        raise TraceFormatError(path, f"not a finite number: {text!r}", row=row, line=line,
                               column=column, expected="a time in microseconds > 0")
    if value <= 0:
        raise TraceFormatError(path, f"{'zero' if value == 0 else 'negative'} time {text}",
                               row=row, line=line, column=column,
                               expected="a time in microseconds > 0")
    return value


def op_tables(path: Path, x_column: str, required: tuple[str, ...],
               min_x: int = 1) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Read dense.csv / per_sequence.csv into {op: (x sorted, time_us)} for ``required`` ops."""
    cols, lines = _read_csv(path, {"layer": "str", x_column: "int", "time_us": "time"})
    layers, xs, ts = cols["layer"], cols[x_column], cols["time_us"]
    known = set(required) | (set(PER_LAYER_DENSE_CALLS) | set(PER_STEP_DENSE)
                             if x_column == "tokens" else set(PER_STEP_SEQUENCE))
    seen: dict[tuple[str, int], int] = {}
    for i, (op, x) in enumerate(zip(layers, xs)):
        if op not in known:
            raise TraceFormatError(
                path, f"unknown operator {op!r}", row=i + 1, line=int(lines[i]), column="layer",
                expected=f"one of {', '.join(sorted(known))} (this importer composes "
                         "Llama-architecture profiles)")
        if x < min_x:
            raise TraceFormatError(path, f"{x_column} = {x}", row=i + 1, line=int(lines[i]),
                                   column=x_column, expected=f">= {min_x}")
        key = (op, int(x))
        if key in seen:
            raise TraceFormatError(
                path, f"duplicate point ({op}, {x_column}={x}), first at row {seen[key]}",
                row=i + 1, line=int(lines[i]), column=x_column,
                expected="one row per operator and point")
        seen[key] = i + 1
    tables = {}
    for op in required:
        mask = layers == op
        if not mask.any():
            raise TraceFormatError(path, f"no rows for operator {op!r}", column="layer",
                                   expected=f"rows for {', '.join(required)}")
        order = np.argsort(xs[mask], kind="stable")
        tables[op] = (xs[mask][order].astype(np.float64), ts[mask][order])
    return tables


def read_attention(path: Path) -> tuple[dict[str, np.ndarray], np.ndarray]:
    cols, lines = _read_csv(path, {**{k: "int" for k in _ATTENTION_KEYS}, "time_us": "time"})
    pc, nd = cols["prefill_chunk"], cols["n_decode"]
    empty = np.flatnonzero((pc == 0) & (nd == 0))
    if empty.size:
        i = int(empty[0])
        raise TraceFormatError(path, "empty batch (prefill_chunk = 0 and n_decode = 0)",
                               row=i + 1, line=int(lines[i]), column="n_decode",
                               expected="a prefill chunk, decode requests or both")
    keys = pd.DataFrame({k: cols[k] for k in _ATTENTION_KEYS})
    dup = np.flatnonzero(keys.duplicated().to_numpy())
    if dup.size:
        i = int(dup[0])
        raise TraceFormatError(path, "duplicate grid point "
                               + ", ".join(f"{k}={int(cols[k][i])}" for k in _ATTENTION_KEYS),
                               row=i + 1, line=int(lines[i]),
                               expected="one row per (prefill_chunk, kv_prefill, n_decode, kv_decode)")
    return cols, lines
