"""Validation of servecal tables: every broken rule, reported at once.

``validate(table, path)`` returns the table cast to its contract types or raises
:class:`~schemas.errors.ValidationError` naming the file, the column, the first offending
rows (0-based data rows) and the rule.
"""
from __future__ import annotations

from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .errors import Problem, ValidationError
from .status import OK
from .step_record import DERIVED_FEATURES, FEATURE_NAMES, KEPT_NAMES, derived_columns, feature_arrays
from .tables import (AGGREGATE_LATENCIES, AGGREGATE_LENGTHS, AGGREGATE_LEVEL_KINDS, AGGREGATE_STATISTICS,
                     AGGREGATE_TARGETS, COLUMNS_BY_KIND, REPLAY_RESULT, REQUEST_TRACE, STEP_TRACE, VLLM_STATS,
                     table_kind)

_MAX_ROWS = 5
#: Relative times must stay below this (31 years): larger values are absolute timestamps,
#: whose float64 spacing would swallow step durations (an epoch in us is ~1.7e15).
MAX_RELATIVE_TIME_S = 1e9

#: Durations (latencies, SLOs, steps) must stay below this too: longer is a unit error or garbage.
MAX_DURATION_S = 1e9
#: Token counts of one request or step above this (a billion) are garbage, not a workload.
MAX_TOKENS = 10 ** 9
#: Relative slack of the comparisons between measured times (float rounding of clocks).
_REL_TOL = 1e-9

#: Columns that must be > 0, >= 0, and >= 1 (numbers), by kind.
_POSITIVE: dict[str, tuple[str, ...]] = {STEP_TRACE: ("step_duration_s",)}
_NONNEG = {
    REQUEST_TRACE: ("arrival_time_s", "queue_wait_s", "ttft_s", "tpot_s", "e2e_s",
                    "num_cached_tokens", "slo_ttft_s", "slo_tpot_s", "replica_id"),
    STEP_TRACE: ("step_start_time_s", *FEATURE_NAMES, "replica_id"),
}
_NONNEG[REPLAY_RESULT] = _NONNEG[REQUEST_TRACE]
_NONNEG[VLLM_STATS] = ("t_s", "engine", "prompt_throughput_tokens_per_s", "generation_throughput_tokens_per_s",
                       "running", "waiting", "kv_cache_usage_frac", "prefix_cache_hit_rate_frac")
_NONNEG[AGGREGATE_TARGETS] = ("level", "value_s", "value_tokens")
_POSITIVE[AGGREGATE_TARGETS] = ("level_value", "num_requests")
_AT_LEAST_ONE = {REQUEST_TRACE: ("num_output_tokens", "num_prompt_tokens"),
                 REPLAY_RESULT: ("num_output_tokens", "num_prompt_tokens")}
#: Measured columns that may be null (a failed request has no latency).
_NULLABLE = {"queue_wait_s", "ttft_s", "tpot_s", "e2e_s", "token_times_s", "num_cached_tokens", "block_hashes",
             "replica_id", "priority", "status", "slo_ttft_s", "slo_tpot_s",
             # predictions are NaN for requests not simulated (failed in the trace, rejected)
             # and TPOT is NaN for one-token outputs
             "pred_queue_wait_s", "pred_ttft_s", "pred_tpot_s", "pred_e2e_s", "pred_token_times_s",
             "pred_arrival_time_s", "pred_kv_transfer_s", "pred_decode_queue_wait_s", "pred_handoff_wait_s",
             "pred_decode_replica_id",
             "pred_frontend_s", "pred_stream_s",
             # a vLLM stats line without a prefix-cache field
             "prefix_cache_hit_rate_frac",
             # an aggregate's row holds a percentile only for a quantile, one of the two values
             "quantile_pct", "value_s", "value_tokens"}


def _rows(mask: np.ndarray) -> tuple[tuple[int, ...], int]:
    idx = np.flatnonzero(mask)
    return tuple(int(i) for i in idx[:_MAX_ROWS]), int(idx.size)


def _problem(rule: str, column: str | None, mask: np.ndarray, expected: str) -> Problem:
    rows, n = _rows(mask)
    return Problem(rule=f"{rule} ({n} row(s))", column=column, rows=rows, expected=expected, num_rows=n)


def _cast(col: pa.ChunkedArray, name: str, typ: pa.DataType, problems: list[Problem]):
    """Cast one column to its contract type, recording why it cannot be."""
    if col.type == typ:
        return col
    if pa.types.is_timestamp(col.type) or pa.types.is_date(col.type) or pa.types.is_duration(col.type):
        problems.append(Problem(rule=f"has type {col.type}", column=name,
                                expected=f"{typ} seconds relative to the trace start, no units or time zone "
                                         "(convert with 'traces import csv --time-unit')"))
        return None
    if pa.types.is_integer(typ) and pa.types.is_floating(col.type):
        arr = col.to_numpy(zero_copy_only=False)
        finite = np.isfinite(arr)
        frac = finite & (arr != np.round(arr))
        if frac.any():
            problems.append(_problem("has non-integer values", name, frac, "whole token counts (int64)"))
            return None
        if (~finite).any():
            problems.append(_problem("is NaN or missing", name, ~finite, "a value in every row"))
            return None
    try:
        return col.cast(typ, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        problems.append(Problem(rule=f"has type {col.type}", column=name, expected=str(typ)))
        return None


def validate(table: pa.Table, path: str, kind: str | None = None) -> pa.Table:
    """Check ``table`` against its schema and return it cast to the contract types.

    Parameters
    ----------
    table : pyarrow.Table
    path : str
        Named in every message.
    kind : str, optional
        ``request_trace/1``, ``step_trace/1`` or ``replay_result/1``; default: from the
        table's ``servecal.schema`` metadata.

    Raises
    ------
    ValidationError
        With every problem: missing column, wrong type, NaN/null, negative or zero
        duration, duplicate ``request_id``, unsorted arrivals, ``ttft_s > e2e_s``,
        ``num_output_tokens < 1``, ...
    """
    kind = kind or table_kind(table)
    if kind not in COLUMNS_BY_KIND:
        raise ValidationError(path, [Problem(rule=f"file metadata 'servecal.schema' is {kind!r}",
                                             expected=f"one of {', '.join(COLUMNS_BY_KIND)} "
                                                      "(import foreign formats with 'traces import')")])
    problems: list[Problem] = []
    cols = _cast_columns(table, COLUMNS_BY_KIND[kind], problems)
    if table.num_rows == 0:
        problems.append(Problem(rule="has no rows", expected="at least one row"))
    num = partial(_numbers, cols)
    _sign_rules(kind, cols, num, table.num_rows, problems)
    _magnitude_rules(num, problems)
    if kind in (REQUEST_TRACE, REPLAY_RESULT):
        _request_rules(cols, num, problems)
    if kind == AGGREGATE_TARGETS and not problems:
        _aggregate_rules(table.select(list(cols)).to_pandas(), problems)
    if kind == STEP_TRACE and not problems:
        _derived_rules(num, problems)
    if problems:
        raise ValidationError(path, problems)
    out = table
    for name, c in cols.items():
        out = out.set_column(out.schema.get_field_index(name), pa.field(name, c.type), c)
    return out.replace_schema_metadata({**(table.schema.metadata or {}), b"servecal.schema": kind.encode()})


def _cast_columns(table: pa.Table, spec: dict, problems: list[Problem]) -> dict:
    """The columns of ``spec`` (name -> (type, required)) in ``table``, cast to their types; a missing
    required column, a failed cast and a null or NaN where none is allowed added to ``problems``."""
    missing = [c for c, (_, req) in spec.items() if req and c not in table.column_names]
    for c in missing:
        problems.append(Problem(rule="missing required column", column=c, expected=str(spec[c][0])))
    cols = {}
    for name in table.column_names:
        if name not in spec:
            continue
        cast = _cast(table.column(name), name, spec[name][0], problems)
        if cast is None:
            continue
        cols[name] = cast
        nulls = cast.is_null().to_numpy(zero_copy_only=False)
        if pa.types.is_floating(cast.type):
            nulls |= np.isnan(cast.to_numpy(zero_copy_only=False).astype(float))
        if name not in _NULLABLE and nulls.any():
            problems.append(_problem("is NaN or missing", name, nulls, "a value in every row"))
    return cols


def _numbers(cols: dict, name: str) -> np.ndarray | None:
    """Column ``name`` as floats (None: absent or not numeric)."""
    c = cols.get(name)
    if c is None or not (pa.types.is_integer(c.type) or pa.types.is_floating(c.type)):
        return None
    return c.to_numpy(zero_copy_only=False).astype(float)


def _sign_rules(kind: str, cols: dict, num, num_rows: int, problems: list[Problem]) -> None:
    """The positive, non-negative and at-least-one columns of ``kind`` (``num``: a column as floats)."""
    for name in _POSITIVE.get(kind, ()):
        v = num(name)
        if v is not None and (bad := v <= 0).any():
            problems.append(_problem("is zero or negative", name, bad, "> 0"))
    for name in _NONNEG.get(kind, ()):
        v = num(name)
        if v is not None and (bad := v < 0).any():
            problems.append(_problem("is negative", name, bad, ">= 0"))
    not_ok = _not_ok_rows(cols, num_rows)
    for name in _AT_LEAST_ONE.get(kind, ()):
        v = num(name)
        if v is None:
            continue
        bad = v < 1
        if name == "num_output_tokens":
            # a failed or invalid request (status set and not 'ok') may have produced no token
            bad &= ~not_ok
        if bad.any():
            problems.append(_problem("is below 1", name, bad, ">= 1 token (0 only with a status other than 'ok')"
                                     if name == "num_output_tokens" else ">= 1 token"))


def _magnitude_rules(num, problems: list[Problem]) -> None:
    """Times that look absolute or in the wrong unit, infinite times and implausible token counts."""
    for name in ("arrival_time_s", "step_start_time_s"):
        v = num(name)
        if v is not None and (bad := np.abs(v) >= MAX_RELATIVE_TIME_S).any():
            problems.append(_problem(f"is {MAX_RELATIVE_TIME_S:.0e} s or more (an absolute timestamp?)", name, bad,
                                     "seconds since the trace start (rebase: subtract the first value)"))
    for name in ("arrival_time_s", "step_start_time_s", "ttft_s", "e2e_s", "queue_wait_s", "tpot_s",
                 "step_duration_s", "slo_ttft_s", "slo_tpot_s"):
        v = num(name)
        if v is not None and (bad := np.isinf(v)).any():
            problems.append(_problem("is infinite", name, bad, "a finite number of seconds"))
        elif v is not None and name not in ("arrival_time_s", "step_start_time_s") and \
                (bad := np.abs(np.nan_to_num(v)) >= MAX_DURATION_S).any():
            problems.append(_problem(f"is {MAX_DURATION_S:.0e} s or more", name, bad,
                                     "a duration in seconds (not milliseconds or an absolute time)"))
    for name in ("num_prompt_tokens", "num_output_tokens", "num_cached_tokens", *FEATURE_NAMES):
        v = num(name)
        if v is not None and (bad := np.nan_to_num(v) > MAX_TOKENS).any():
            problems.append(_problem(f"is above {MAX_TOKENS:.0e}", name, bad, "a plausible count of tokens"))


def _derived_rules(num, problems: list[Problem]) -> None:
    """A step trace's derived feature columns (:data:`~schemas.step_record.DERIVED_FEATURES`), where
    present, hold what their ``derive`` gives from the row's kept features (the fits and the step
    time use the derived value: a file that says otherwise is refused, not silently overridden)."""
    given = {f.name: v for f in DERIVED_FEATURES if (v := num(f.name)) is not None}
    if not given:
        return
    derived = derived_columns(feature_arrays({n: v for n in KEPT_NAMES if (v := num(n)) is not None}))
    for name, v in given.items():
        if (bad := v != derived[name]).any():
            row = int(np.argmax(bad))
            problems.append(_problem("differs from its value derived from the row's other features", name, bad,
                                     f"the derived value (row {row}: {derived[name][row]}), or no column"))


def _aggregate_rules(df, problems: list[Problem]) -> None:
    """An aggregate's rows: known names, a percentile exactly for a quantile, the value in the
    column of its metric's unit, one description per level, no statistic given twice."""
    for name, allowed in (("level_kind", AGGREGATE_LEVEL_KINDS), ("statistic", AGGREGATE_STATISTICS),
                          ("metric", AGGREGATE_LATENCIES + AGGREGATE_LENGTHS)):
        if (bad := ~df[name].isin(allowed).to_numpy()).any():
            problems.append(_problem("is not a known name", name, bad, f"one of {', '.join(allowed)}"))
    q = df["quantile_pct"].to_numpy(float) if "quantile_pct" in df else np.full(len(df), np.nan)
    is_q = (df["statistic"] == "quantile").to_numpy()
    bad = (is_q & ~((q >= 0) & (q <= 100))) | (~is_q & ~np.isnan(q))
    if bad.any():
        problems.append(_problem("does not fit the statistic", "quantile_pct", bad,
                                 "a percentile in [0, 100] for statistic 'quantile', null otherwise"))
    for col, metrics in (("value_s", AGGREGATE_LATENCIES), ("value_tokens", AGGREGATE_LENGTHS)):
        v = df[col].to_numpy(float) if col in df else np.full(len(df), np.nan)
        mine = df["metric"].isin(metrics).to_numpy()
        bad = (mine & ~np.isfinite(v)) | (~mine & ~np.isnan(v))
        if bad.any():
            problems.append(_problem("does not fit the metric", col, bad,
                                     f"a finite value for {', '.join(metrics)}, null for the other metrics"))
    per_level = df.groupby("level")[["level_kind", "level_value", "num_requests"]].nunique()
    if (per_level > 1).any(axis=None):
        bad = df["level"].isin(per_level.index[(per_level > 1).any(axis=1)]).to_numpy()
        problems.append(_problem("describes one level twice", "level", bad,
                                 "one level_kind, level_value and num_requests per level"))
    dup = df.assign(q=df.get("quantile_pct")).duplicated(["level", "metric", "statistic", "q"], keep=False)
    if dup.any():
        problems.append(_problem("repeats a statistic", "statistic", dup.to_numpy(),
                                 "each level x metric x statistic (x quantile) once"))


def _not_ok_rows(cols, n: int) -> np.ndarray:
    """Rows whose ``status`` is set and is not ``ok`` (failed or invalid in the source)."""
    st = cols.get("status")
    if st is None:
        return np.zeros(n, bool)
    return pc.fill_null(pc.not_equal(st, OK), False).to_numpy(zero_copy_only=False)


def _has_duplicates(ids: pa.ChunkedArray) -> bool:
    """Whether ``ids`` repeats a value, without Python strings (10^7 ids in well under 1 GB).

    Ids that are all decimal integers (what the importers generate) are checked as sorted
    int64; distinct integers come from distinct strings. Anything else ("007" and "7" as
    the same integer, non-numeric ids) gets Arrow's exact hash-based check.
    """
    try:
        as_int = pc.cast(ids, pa.int64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        as_int = None
    if as_int is not None and as_int.null_count == 0 and len(as_int) > 1:
        v = np.sort(as_int.to_numpy())
        if not (v[1:] == v[:-1]).any():
            return False
    return len(pc.unique(ids)) != len(ids)


def _request_rules(cols, num, problems: list[Problem]) -> None:
    if "request_id" in cols:
        ids = cols["request_id"]
        # fast path in Arrow (no Python strings): only a table with duplicates pays for pandas
        if _has_duplicates(ids):
            arr = ids.to_numpy(zero_copy_only=False)
            import pandas as pd

            d = pd.Series(arr).duplicated(keep=False).to_numpy()
            problems.append(_problem("has duplicate values", "request_id", d, "unique request ids"))
    arr = num("arrival_time_s")
    if arr is not None and arr.size > 1:
        bad = np.concatenate([[False], np.diff(arr) < 0])
        if bad.any():
            problems.append(_problem("is not sorted", "arrival_time_s", bad, "non-decreasing arrival times"))
    cached, prompt = num("num_cached_tokens"), num("num_prompt_tokens")
    if cached is not None and prompt is not None:
        with np.errstate(invalid="ignore"):
            bad = cached > prompt
        if bad.any():
            problems.append(_problem("num_cached_tokens > num_prompt_tokens", "num_cached_tokens", bad,
                                     "at most the prompt's tokens cached"))
    for name, ref in (("token_times_s", "e2e_s"), ("pred_token_times_s", "pred_e2e_s")):
        if name in cols:
            _token_time_rules(cols[name], name, num(ref), ref, problems)
    ttft, e2e, qw = num("ttft_s"), num("e2e_s"), num("queue_wait_s")
    with np.errstate(invalid="ignore"):
        if ttft is not None and e2e is not None and (bad := ttft > e2e * (1 + 1e-12)).any():
            problems.append(_problem("ttft_s > e2e_s", "ttft_s", bad, "ttft_s <= e2e_s"))
        if qw is not None and ttft is not None and (bad := qw > ttft * (1 + 1e-12)).any():
            problems.append(_problem("queue_wait_s > ttft_s", "queue_wait_s", bad, "queue_wait_s <= ttft_s"))


def token_time_limit_s(e2e_s):
    """The latest a token may come for a request of end-to-end latency ``e2e_s`` (seconds):
    ``e2e_s`` plus float rounding (1e-9 relative and 1 ns)."""
    return e2e_s + np.abs(e2e_s) * _REL_TOL + 1e-9


def _token_time_rules(col: pa.ChunkedArray, name: str, e2e: np.ndarray | None, e2e_name: str,
                      problems: list[Problem]) -> None:
    """Per-token times: finite, >= 0, non-decreasing, and the last at most ``e2e_s``.

    ``col`` is list<float64> (seconds after arrival, one per output token); null rows are
    fine (times unknown). Checked on the flattened values, without Python lists.
    """
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if len(arr) == 0:
        return
    offsets = arr.offsets.to_numpy()
    offsets = offsets - offsets[0]
    values = arr.flatten().to_numpy(zero_copy_only=False).astype(float)
    lengths = np.diff(offsets)
    row_of = np.repeat(np.arange(len(arr)), lengths)
    n = len(arr)

    def rows_where(mask_values):
        m = np.zeros(n, bool)
        m[row_of[mask_values]] = True
        return m

    if (bad := ~np.isfinite(values)).any():
        problems.append(_problem("has NaN or infinite times", name, rows_where(bad), "finite seconds after arrival"))
        return
    if (bad := values < 0).any():
        problems.append(_problem("has negative times", name, rows_where(bad), "seconds after arrival (>= 0)"))
    if values.size > 1:
        dec = np.zeros(values.size, bool)
        dec[1:] = (np.diff(values) < 0) & (row_of[1:] == row_of[:-1])
        if dec.any():
            problems.append(_problem("is decreasing", name, rows_where(dec), "non-decreasing token times"))
    if e2e is not None:
        has = lengths > 0
        last = np.full(n, np.nan)
        last[has] = values[offsets[1:][has] - 1]
        with np.errstate(invalid="ignore"):
            bad = last > token_time_limit_s(e2e)
        if bad.any():
            problems.append(_problem(f"last token time > {e2e_name}", name, bad,
                                     f"every token by {e2e_name} (the last token)"))
