"""Arrow schemas of the servecal tables, and reading and writing them as Parquet.

Every table is Parquet with key ``servecal.schema`` in the file metadata naming its
kind and version (``request_trace/1``, ``step_trace/1``, ``replay_result/1``,
``vllm_stats/1``, ``aggregate_targets/1``).
Times are float64 seconds; token counts int64. Files are written atomically
(:mod:`schemas.atomic`).
"""
from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .atomic import atomic_output
from .errors import SchemaError
from .kinds import AGGREGATE_TARGETS, REPLAY_RESULT, REQUEST_TRACE, STEP_TRACE, VLLM_STATS
from .step_record import STEP_RECORD
from .text import wrap_error

SCHEMA_KEY = b"servecal.schema"

_f64, _i64, _str = pa.float64(), pa.int64(), pa.string()

#: Columns of a request trace: name -> (arrow type, required).
REQUEST_COLUMNS: dict[str, tuple[pa.DataType, bool]] = {
    "request_id": (_str, True),
    "arrival_time_s": (_f64, True),
    "num_prompt_tokens": (_i64, True),
    "num_output_tokens": (_i64, True),
    "queue_wait_s": (_f64, False),
    "ttft_s": (_f64, False),
    "tpot_s": (_f64, False),
    "e2e_s": (_f64, False),
    "token_times_s": (pa.list_(_f64), False),
    "num_cached_tokens": (_i64, False),
    "block_hashes": (pa.list_(_i64), False),
    "replica_id": (_i64, False),
    "priority": (_i64, False),
    "slo_ttft_s": (_f64, False),
    "slo_tpot_s": (_f64, False),
    "status": (_str, False),
}

#: Columns of a step trace (one row per forward pass of one replica): the step record
#: (:data:`schemas.step_record.STEP_RECORD`), seconds as float64, counts as int64.
STEP_COLUMNS: dict[str, tuple[pa.DataType, bool]] = {
    f.name: (_f64 if f.is_time else _i64, f.required) for f in STEP_RECORD}

#: Predicted columns a replay adds to the request trace.
PREDICTED_COLUMNS: dict[str, tuple[pa.DataType, bool]] = {
    "pred_queue_wait_s": (_f64, True),
    "pred_ttft_s": (_f64, True),
    "pred_tpot_s": (_f64, True),
    "pred_e2e_s": (_f64, True),
    "pred_replica_id": (_i64, True),
    "pred_num_preemptions": (_i64, True),
    "pred_status": (_str, True),
    "pred_token_times_s": (pa.list_(_f64), False),
    # optional, by feature: prefix caching, closed loop, disaggregation
    "pred_num_cached_tokens": (_i64, False),
    "pred_arrival_time_s": (_f64, False),
    "pred_decode_replica_id": (_i64, False),
    "pred_kv_transfer_s": (_f64, False),
    "pred_decode_queue_wait_s": (_f64, False),
    "pred_handoff_wait_s": (_f64, False),
    # time outside the engine (a fitted front end): before it, and after its last token
    "pred_frontend_s": (_f64, False),
    "pred_stream_s": (_f64, False),
    # speculative decoding
    "pred_num_draft_tokens": (_i64, False),
    "pred_num_accepted_tokens": (_i64, False),
    "pred_acceptance_length": (_f64, False),
}

#: Columns of a vLLM stats series: one row per periodic "Engine NNN: Avg prompt throughput: ..."
#: line of a vLLM server log (every 10 s by default; ``traces import vllm-log``). Throughputs
#: are vLLM's averages over the interval that ends at ``t_s``; the rest are instants.
VLLM_STATS_COLUMNS: dict[str, tuple[pa.DataType, bool]] = {
    "t_s": (_f64, True),                                   # s since the first stats line (or a trace's origin)
    "engine": (_i64, True),                                # vLLM's engine index (data-parallel rank)
    "prompt_throughput_tokens_per_s": (_f64, True),
    "generation_throughput_tokens_per_s": (_f64, True),
    "running": (_i64, True),                               # requests running
    "waiting": (_i64, True),                               # requests waiting
    "kv_cache_usage_frac": (_f64, True),                   # GPU KV cache usage, [0, 1]
    "prefix_cache_hit_rate_frac": (_f64, False),           # [0, 1]; null when the line has none
}

#: Columns of a benchmark's aggregate results (a summary without per-request rows: LLMPerf's
#: ``*_summary.json``, GuideLLM's metrics, ``vllm bench serve``/SGLang ``bench_serving``
#: results): one row per load level x metric x statistic (``traces import summary``).
AGGREGATE_COLUMNS: dict[str, tuple[pa.DataType, bool]] = {
    "level": (_i64, True),            # 0-based load level (benchmark) of the file; FILE#K picks it
    "level_kind": (_str, True),       # 'concurrency' (closed loop), 'poisson_rate' or 'constant_rate' (open loop)
    "level_value": (_f64, True),      # clients, or requests per second
    "num_requests": (_i64, True),     # completed requests the level's statistics are over
    "metric": (_str, True),           # ttft_s, tpot_s, e2e_s (latencies); num_prompt_tokens, num_output_tokens
    "statistic": (_str, True),        # 'quantile', 'mean', 'std', 'min', 'max'
    "quantile_pct": (_f64, False),    # the percentile, 0..100, for statistic 'quantile'; else null
    "value_s": (_f64, False),         # a latency statistic, seconds (null for a token count)
    "value_tokens": (_f64, False),    # a length statistic, tokens (null for a latency)
}

#: The metrics of an aggregate: latencies (``value_s``) and lengths (``value_tokens``).
AGGREGATE_LATENCIES = ("ttft_s", "tpot_s", "e2e_s")
AGGREGATE_LENGTHS = ("num_prompt_tokens", "num_output_tokens")
AGGREGATE_LEVEL_KINDS = ("concurrency", "poisson_rate", "constant_rate")
AGGREGATE_STATISTICS = ("quantile", "mean", "std", "min", "max")

COLUMNS_BY_KIND = {
    REQUEST_TRACE: REQUEST_COLUMNS,
    STEP_TRACE: STEP_COLUMNS,
    REPLAY_RESULT: {**REQUEST_COLUMNS, **PREDICTED_COLUMNS},
    VLLM_STATS: VLLM_STATS_COLUMNS,
    AGGREGATE_TARGETS: AGGREGATE_COLUMNS,
}

#: Measured latency columns shared by request traces and replay results.
MEASURED_METRICS = ("queue_wait_s", "ttft_s", "tpot_s", "e2e_s")


def arrow_schema(kind: str, columns: list[str]) -> pa.Schema:
    """The Arrow schema of ``kind`` restricted to ``columns`` (in that order), with metadata."""
    spec = COLUMNS_BY_KIND[kind]
    fields = [pa.field(c, spec[c][0]) for c in columns if c in spec]
    return pa.schema(fields, metadata={SCHEMA_KEY: kind.encode()})


def to_table(kind: str, data: "dict | object", extra_metadata: dict[str, str] | None = None) -> pa.Table:
    """Build a table of ``kind`` from a pandas DataFrame or a dict of columns.

    Known columns are cast to their contract type; unknown columns are kept as they are.
    ``extra_metadata`` (str -> str) is stored beside ``servecal.schema``.

    Raises
    ------
    SchemaError
        If a known column cannot be cast to its type (e.g. a float token count).
    """
    import pandas as pd

    if isinstance(data, pd.DataFrame):
        table = pa.Table.from_pandas(data, preserve_index=False)
    else:
        table = pa.table(data)
    spec = COLUMNS_BY_KIND[kind]
    fields = []
    for f in table.schema:
        fields.append(pa.field(f.name, spec[f.name][0]) if f.name in spec else f)
    try:
        table = table.cast(pa.schema(fields), safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise SchemaError(f"cannot store columns as {kind}: {exc}") from None
    meta = {SCHEMA_KEY: kind.encode()}
    for k, v in (extra_metadata or {}).items():
        meta[f"servecal.{k}".encode()] = str(v).encode()
    return table.replace_schema_metadata(meta)


def write_table(table: pa.Table, path: str | os.PathLike) -> None:
    """Write ``table`` to Parquet atomically (see :func:`schemas.atomic.atomic_output`)."""
    with atomic_output(path) as tmp:
        pq.write_table(table, tmp)


def table_kind(table: pa.Table) -> str | None:
    """The ``servecal.schema`` value of a table, or None when absent."""
    meta = table.schema.metadata or {}
    v = meta.get(SCHEMA_KEY)
    return v.decode("utf-8", "replace") if v else None


def table_metadata(table: pa.Table | pa.Schema) -> dict[str, str]:
    """The ``servecal.*`` metadata of a table (or of its schema alone, e.g. from
    ``pyarrow.parquet.read_schema``) other than the schema key, without prefix."""
    meta = (table if isinstance(table, pa.Schema) else table.schema).metadata or {}
    out = {}
    for k, v in meta.items():
        if k.startswith(b"servecal.") and k != SCHEMA_KEY:
            out[k.decode("utf-8", "replace")[len("servecal."):]] = v.decode("utf-8", "replace")
    return out


def read_table(path: str | os.PathLike) -> pa.Table:
    """Read a Parquet file.

    Raises
    ------
    SchemaError
        If the file does not exist or is not Parquet.
    """
    path = Path(path)
    if not path.exists():
        raise SchemaError(f"{path}: no such file")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError, ValueError, TypeError, IndexError, MemoryError) as exc:
        raise SchemaError(wrap_error(f"{path}: {parquet_reason(path, exc)}")) from None
    return _checked_metadata(table, path)


def parquet_reason(path, exc: BaseException, import_hint: bool = True) -> str:
    """Why pyarrow could not read ``path`` as Parquet, for the user: a file that is not Parquet
    at all (no ``PAR1`` magic) is to be imported first (``import_hint``); a damaged one gets
    pyarrow's reason, its first line, shortened at a word."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
            f.seek(0, os.SEEK_END)
            f.seek(max(f.tell() - 4, 0))
            tail = f.read(4)
    except OSError:
        head = tail = b"PAR1"
    if (head != b"PAR1" or tail != b"PAR1") and not import_hint:
        return "not a Parquet file (no PAR1 magic bytes at its start and end)"
    if head != b"PAR1" or tail != b"PAR1":
        return (f"not a Parquet file; import it first: a CSV request log with 'traces import csv {path} "
                "-o run.parquet --map ...', a benchmark's results with 'traces import <format> FILE -o "
                "run.parquet' (the formats: traces import --help)")
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if len(first) > 200:
        first = first[:200].rsplit(" ", 1)[0] + " ..."
    return f"not a readable Parquet file ({first})"


def _checked_metadata(table: pa.Table, path) -> pa.Table:
    """Refuse ``servecal.*`` metadata that is not UTF-8 text; drop unusable ``pandas`` metadata.

    The ``pandas`` key only tells ``to_pandas`` how to rebuild dtypes and the index; one that
    is not JSON describing the columns would make reading fail, and the data are complete
    without it.
    """
    try:
        _ = table.schema.names  # decoded from the file's bytes: a bad name raises here
    except UnicodeDecodeError:
        raise SchemaError(f"{path}: has column names that are not UTF-8 text; expected a file written by "
                          "servecal (re-import the source with 'traces import')") from None
    meta = table.schema.metadata or {}
    for k, v in meta.items():
        if not k.startswith(b"servecal."):
            continue
        try:
            k.decode("utf-8"), v.decode("utf-8")
        except UnicodeDecodeError:
            name = k.decode("utf-8", "replace")
            raise SchemaError(f"{path}: file metadata key {name!r} is not UTF-8 text; expected a file written by "
                              "servecal (re-import the source with 'traces import')") from None
    if b"pandas" in meta and not _usable_pandas_metadata(meta[b"pandas"], table.column_names):
        table = table.replace_schema_metadata({k: v for k, v in meta.items() if k != b"pandas"})
    return table


def _usable_pandas_metadata(raw: bytes, names: list[str]) -> bool:
    import json

    try:
        m = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return False
    if (not isinstance(m, dict) or not isinstance(m.get("columns"), list)
            or not isinstance(m.get("index_columns"), list)):
        return False
    cols = m["columns"]
    if not all(isinstance(c, dict) and isinstance(c.get("name", ""), (str, type(None))) for c in cols):
        return False
    if not all(isinstance(i, (str, dict)) for i in m["index_columns"]):
        return False
    listed = {c.get("field_name", c.get("name")) for c in cols}
    return all(i in names for i in m["index_columns"] if isinstance(i, str)) and set(names) <= listed
