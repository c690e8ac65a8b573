"""Import any CSV or Parquet request log by naming which column is which.

There is no fixed format: the caller maps source columns onto fields (``--map
send_time_us=send_time``). The fields are

==================  =========================================================================
field               meaning
==================  =========================================================================
request_id          the request's id (string); default: the 1-based source row
num_prompt_tokens   prompt tokens (whole number >= 1)                            **required**
num_output_tokens   output tokens (whole number >= 0; 0 only with a non-ok status) **required**
arrival_time_s      instant the request entered the system: the replay injects it here
send_time           instant the server saw the request; the origin of measured latencies
scheduled_time      instant first scheduled  -> ``queue_wait_s = scheduled - send``
first_token_time    instant of the first token -> ``ttft_s = first_token - send``
end_time            instant of the last token  -> ``e2e_s = end - send``
queue_wait_s, ttft_s, tpot_s, e2e_s, slo_ttft_s, slo_tpot_s
                    durations, already relative
num_cached_tokens, replica_id, priority
                    whole numbers
status              ``ok`` or why not
==================  =========================================================================

At least one of ``arrival_time_s`` and ``send_time`` is required; either one alone serves
as both. Instants may be numbers (in ``time_unit``), date-time strings (ISO 8601, with or
without a UTC offset), or Arrow ``timestamp`` columns of any unit and time zone (Parquet;
the unit is read from the type, never assumed; BR-16). Durations may be numbers (in
``time_unit``) or Arrow ``duration`` columns.

Clocks (BR-11): every instant column is converted to one origin, the first arrival (and
the first send for latencies), by subtracting **in the source's integer unit** first.
Latencies are differences of two instants, so both must be on the same clock: a relative
column (seconds since the run started) and an epoch column (seconds since 1970) are never
subtracted from each other; that is an error naming both columns. A column is "epoch"
when its smallest value is beyond 1e8 s (1973), or when it is a date-time.

``mapping``: the fields and ``parse_mapping``; ``columns``: reading the mapped columns;
``clocks``: time columns and their differences.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from schemas.metrics import tpot_s
from schemas.status import FAILED, INVALID, OK

from ...errors import MappingError, TraceFormatError
from .._frame import assemble_frame
from .._rows import check_rows, fail_at_row, RowStatus
from .._source import Progress
from .._time import UNIT_NS, relative_seconds, time_resolution_s
from .clocks import concat_time, difference_s, time_ticks
from .columns import batches, csv_types, is_parquet
from .mapping import DURATIONS, INSTANTS, INTEGERS, LATENCY_OF, STRINGS, parse_mapping

__all__ = ["import_csv"]


def import_csv(path: str | Path, mapping: dict[str, str], time_unit: str = "s", filters: dict[str, str] | None = None,
               invalid: str = "error", progress: Progress | None = None) -> tuple[pd.DataFrame, dict]:
    """Import a CSV or Parquet request log through a column mapping, streaming.

    Parameters
    ----------
    path : str or Path
        CSV (header line first) or Parquet (by suffix ``.parquet``/``.pq`` or magic bytes).
    mapping : dict
        Field -> source column (see the module docstring; build it with :func:`parse_mapping`).
    time_unit : {"s", "ms", "us", "ns"}
        Unit of numeric time columns (instants and durations). Ignored for date-time
        strings and Arrow timestamp/duration types, whose unit is known.
    filters : dict, optional
        Source column -> value: keep only rows whose value (as text) equals it.
        Dictionary-encoded columns work.
    invalid : {"error", "flag", "drop"}
        Policy for an ok row with 0 output tokens.
    progress : callable, optional
        Called with bytes read (CSV only).

    Returns
    -------
    frame : pandas.DataFrame
        ``arrival_time_s`` relative to the first arrival; measured latencies from the
        duration columns or as instant minus send time; ``tpot_s`` = (E2E - TTFT)/(N - 1)
        when not given; ``request_id`` from the mapping or the 1-based source row.
    metadata : dict
        The mapping, the time unit, ``time_resolution_s`` of the arrival column (observed:
        a ``timestamp[s]`` column read back as ``timestamp[ms]`` reports 1 s),
        ``clocks`` of every instant column, and ``arrival_vs_send_warning`` when the
        injection time differs from the server's send time.

    Raises
    ------
    MappingError
        A bad mapping (usage error).
    TraceFormatError
        A missing column, a missing (null) value, a wrong type, NaN, negative tokens or
        latencies, duplicate request ids, mixed clocks in a latency (naming file, row,
        line and column).
    """
    path = Path(path)
    if time_unit not in UNIT_NS:
        raise MappingError(f"--time-unit {time_unit!r}: expected one of {', '.join(UNIT_NS)}")
    mapping = parse_mapping([f"{v}={k}" for k, v in mapping.items()])
    filters = dict(filters or {})
    if not path.exists():
        raise TraceFormatError(path, "no such file")
    parquet = is_parquet(path)
    lines = not parquet
    status = RowStatus(path, invalid, lines=lines)
    c_out0 = status.invalid("num_output_tokens is 0", mapping["num_output_tokens"],
                            ">= 1 output token for an ok request")
    times, ints, strs, rows = _read_columns(path, mapping, filters, time_unit, parquet, progress)
    n = rows.size
    tcols = {f: concat_time(path, parts, mapping[f]) for f, parts in times.items()}
    prompt = np.concatenate(ints.pop("num_prompt_tokens"))
    output = np.concatenate(ints.pop("num_output_tokens"))
    # statuses: the source's own, then ok rows with no output are invalid
    codes = _source_codes(status, strs.pop("status") if "status" in strs else None, n)
    codes[(codes == 0) & (output == 0)] = c_out0
    status.add(codes, rows=rows)
    # arrival and the latency origin
    arr_t = tcols["arrival_time_s"] if "arrival_time_s" in tcols else tcols["send_time"]
    send_t = tcols["send_time"] if "send_time" in tcols else arr_t
    origin = arr_t.ticks.min()
    arrival = relative_seconds(arr_t.ticks, arr_t.tick_ns, origin)
    clocks = {mapping[f]: tcols[f].clock() for f in INSTANTS if f in tcols}
    meta: dict[str, str] = {
        "source_format": "csv" if not parquet else "parquet",
        "source": str(path),
        "mapping": ", ".join(f"{v}={k}" for k, v in mapping.items()),
        "time_unit": time_unit,
        "clocks": ", ".join(f"{k}={v}" for k, v in clocks.items()),
        "time_origin": f"{arr_t.source} of the first request",
    }
    if filters:
        meta["filters"] = ", ".join(f"{k}={v}" for k, v in filters.items())
    if arr_t.ticks.dtype.kind == "i":
        meta["time_resolution_s"] = f"{time_resolution_s(arr_t.ticks - origin, int(arr_t.tick_ns)):g}"
    extra = _latencies(path, tcols, send_t, mapping, codes == 0, rows, lines)
    if "tpot_s" not in extra and "ttft_s" in extra and "e2e_s" in extra:
        extra["tpot_s"] = tpot_s(extra["ttft_s"], extra["e2e_s"], output)
    for fld, parts in ints.items():
        extra[fld] = np.concatenate(parts)
    ids = _request_ids(path, strs.pop("request_id"), mapping, rows, lines) if "request_id" in strs else None
    if "send_time" in tcols and "arrival_time_s" in tcols:
        warning = _arrival_vs_send(arr_t, send_t, arrival, ids, rows)
        if warning:
            meta["arrival_vs_send_warning"] = warning
    df, m = assemble_frame(arrival, prompt, output, status=status, codes=codes, rows=rows, request_ids=ids,
                           extra=extra)
    meta.update(m)
    return df, meta


def _read_columns(path: Path, mapping: dict, filters: dict, time_unit: str, parquet: bool,
                  progress: Progress | None) -> tuple[dict, dict, dict, np.ndarray]:
    """Stream the mapped columns of the rows that pass ``filters``: the parts of the time columns (ticks),
    of the integer ones (int64) and of the strings (Arrow), by field, and the 1-based source rows."""
    lines = not parquet
    cols = list(dict.fromkeys([*mapping.values(), *filters]))
    source = cols if parquet else csv_types(path, mapping, filters)
    times: dict[str, list] = {f: [] for f in (*INSTANTS, *DURATIONS) if f in mapping}
    ints: dict[str, list] = {f: [] for f in INTEGERS if f in mapping}
    strs: dict[str, list] = {f: [] for f in STRINGS if f in mapping}
    rows_parts = []
    nullable = tuple(c for c in filters) + ((mapping["status"],) if "status" in mapping else ())
    for row0, batch in batches(path, source, parquet, progress, nullable):
        names = batch.schema.names
        col = {n: batch.column(names.index(n)) for n in cols}
        keep = np.ones(batch.num_rows, bool)
        for c, v in filters.items():
            a = col[c]
            if pa.types.is_dictionary(a.type):
                a = a.cast(a.type.value_type)
            keep &= pc.fill_null(pc.equal(a.cast(pa.string()), v), False).to_numpy(zero_copy_only=False)
        idx = np.flatnonzero(keep)
        if idx.size == 0:
            continue
        rows = row0 + idx + 1
        take = pa.array(idx)
        for fld in (*times, *ints, *strs):
            a = col[mapping[fld]].take(take)
            if a.null_count and not (fld == "status"):
                i = int(np.flatnonzero(a.is_null().to_numpy(zero_copy_only=False))[0])
                fail_at_row(path, "missing value", int(rows[i]), column=mapping[fld], expected="a value in every row",
                            lines=lines)
            if fld in times:
                times[fld].append(time_ticks(path, a, mapping[fld], time_unit, rows, lines))
            elif fld in ints:
                ints[fld].append(_int_column(path, a, fld, mapping[fld], rows, lines))
            else:
                if pa.types.is_dictionary(a.type):
                    a = a.cast(a.type.value_type)
                strs[fld].append(a.cast(pa.string()))
        rows_parts.append(rows)
    if not rows_parts:
        what = " matching the filter" if filters else ""
        raise TraceFormatError(path, f"has no rows{what}", expected="one row per request")
    return times, ints, strs, np.concatenate(rows_parts)


def _int_column(path: Path, a: pa.Array, fld: str, column: str, rows: np.ndarray, lines: bool) -> np.ndarray:
    """Field ``fld`` (source ``column``) of ``rows`` as int64: whole numbers, tokens in their range."""
    if not pa.types.is_integer(a.type):
        if pa.types.is_floating(a.type):
            v = a.to_numpy(zero_copy_only=False)
            check_rows(path, ~np.isfinite(v) | (v != np.round(v)), 0, "is not a whole number",
                       column=column, expected="a whole number", lines=lines, rows=rows)
            a = a.cast(pa.int64(), safe=False)
        else:
            raise TraceFormatError(path, f"column has type {a.type}", column=column, expected="whole numbers")
    v = a.cast(pa.int64()).to_numpy()
    if fld == "num_prompt_tokens":
        check_rows(path, v < 1, 0, "is below 1", column=column, expected=">= 1 token", lines=lines, rows=rows)
    elif fld in ("num_output_tokens", "num_cached_tokens"):
        check_rows(path, v < 0, 0, "is negative", column=column, expected=">= 0", lines=lines, rows=rows)
    return v


def _source_codes(status: RowStatus, parts: list | None, n: int) -> np.ndarray:
    """The status code of each of the ``n`` rows from the source's status column (``parts``, None: none):
    ``ok`` (or null) is 0, a servecal status is kept, anything else is ``failed: <it>``."""
    codes = np.zeros(n, np.int16)
    if parts is None:
        return codes
    st = pc.fill_null(pa.chunked_array(parts).combine_chunks(), OK)
    for u in pc.unique(st).to_pylist():
        if u != OK:
            c = status.code(u) if u.startswith((FAILED, INVALID)) else status.failed(u)
            codes[pc.equal(st, u).to_numpy(zero_copy_only=False)] = c
    return codes


def _latencies(path: Path, tcols: dict, send_t, mapping: dict, ok: np.ndarray, rows: np.ndarray,
               lines: bool) -> dict[str, np.ndarray]:
    """The measured latencies, seconds: each instant of :data:`LATENCY_OF` minus the send time (refused
    on another clock), and the duration columns; NaN where the row is not ``ok``; a negative one refused."""
    extra: dict[str, np.ndarray] = {}
    for inst, lat in LATENCY_OF.items():
        if inst not in tcols:
            continue
        x = tcols[inst]
        if x.clock() != send_t.clock():
            raise TraceFormatError(
                path, f"columns '{x.source}' ({x.clock()} clock, smallest value {x.seconds_min():.6g} s) and "
                      f"'{send_t.source}' ({send_t.clock()} clock, smallest value {send_t.seconds_min():.6g} s) are on "
                      f"different clocks, so {lat} = {x.source} - {send_t.source} would be meaningless",
                column=x.source,
                expected="instants on one clock: map the send time that shares the latency columns' clock to send_time")
        extra[lat] = difference_s(x, send_t)
    for d in DURATIONS:
        if d in tcols:
            t = tcols[d]
            extra[d] = relative_seconds(t.ticks, t.tick_ns, 0)
    for name, v in extra.items():
        bad = ok & (v < 0)
        check_rows(path, bad, 0, f"{name} is negative", column=mapping.get(name) or name, expected=">= 0 s",
                   lines=lines, rows=rows)
    for name in list(extra):
        extra[name] = np.where(ok, extra[name], np.nan)
    return extra


def _request_ids(path: Path, parts: list, mapping: dict, rows: np.ndarray, lines: bool) -> pa.Array:
    """The request ids of the rows (Arrow strings); a duplicate refused, naming its row."""
    ids = pa.chunked_array(parts).combine_chunks()
    if len(pc.unique(ids)) != rows.size:
        dup = pd.Series(ids.to_numpy(zero_copy_only=False)).duplicated().to_numpy()
        i = int(np.flatnonzero(dup)[0])
        fail_at_row(path, f"duplicate request id {ids[i].as_py()!r}", int(rows[i]), column=mapping["request_id"],
                    expected="unique ids", lines=lines)
    return ids


def _arrival_vs_send(arr_t, send_t, arrival: np.ndarray, ids, rows: np.ndarray) -> str | None:
    """A warning when requests are injected at the arrival column more than 1 ms away from the send
    time the server saw (None: all within 1 ms)."""
    s = relative_seconds(send_t.ticks, send_t.tick_ns)
    early = s - arrival
    k = int(np.argmax(np.abs(early)))
    if not abs(early[k]) > 1e-3:
        return None
    n_diff = int((np.abs(early) > 1e-3).sum())
    who = f"request {ids[k].as_py()!r} (row {int(rows[k])})" if ids is not None else f"row {int(rows[k])}"
    return (f"{n_diff} request(s) are injected at '{arr_t.source}', not when the server saw them "
            f"('{send_t.source}'); largest: {who} enters {abs(early[k]):.6g} s "
            f"{'early' if early[k] > 0 else 'late'}")
