"""Arrow schemas of the servecal tables and atomic Parquet I/O.

Every table is Parquet with key ``servecal.schema`` in the file metadata naming its
kind and version (``request_trace/1``, ``step_trace/1``, ``replay_result/1``,
``vllm_stats/1``).
Times are float64 seconds; token counts int64.
"""
from __future__ import annotations

import contextlib
import os
import re
import signal
import tempfile
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .errors import OutputError, SchemaError
from .kinds import REPLAY_RESULT, REQUEST_TRACE, STEP_TRACE, VLLM_STATS

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

#: Columns of a step trace (one row per forward pass of one replica).
STEP_COLUMNS: dict[str, tuple[pa.DataType, bool]] = {
    "replica_id": (_i64, True),
    "step_start_time_s": (_f64, True),
    "step_duration_s": (_f64, True),
    "num_prefill_tokens": (_i64, True),
    "num_prefill_seqs": (_i64, True),
    "num_decode_seqs": (_i64, True),
    "decode_context_tokens": (_i64, True),
    "prefill_context_tokens": (_i64, False),
}

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

COLUMNS_BY_KIND = {
    REQUEST_TRACE: REQUEST_COLUMNS,
    STEP_TRACE: STEP_COLUMNS,
    REPLAY_RESULT: {**REQUEST_COLUMNS, **PREDICTED_COLUMNS},
    VLLM_STATS: VLLM_STATS_COLUMNS,
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


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike):
    """Yield a temporary path beside ``path``; rename it to ``path`` only if the block succeeds.

    A failure (or an interrupt) never leaves a partial or overwritten output file. The
    result gets the usual permissions (0666 less the umask), not mkstemp's private 0600.

    Examples
    --------
    >>> with atomic_output("plot.png") as tmp:          # doctest: +SKIP
    ...     fig.savefig(tmp, format="png")
    """
    path = Path(path)
    check_writable(path)
    remove_stale_temp_files(path.parent)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=TEMP_SUFFIX, dir=path.parent)
    except OSError as exc:
        raise OutputError(f"{path}: cannot write ({exc.strerror})") from None
    os.close(fd)
    try:
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with _sigint_deferred() as pending:
            os.replace(tmp, path)
            last = _output_done(path)
        if pending and not last:
            raise KeyboardInterrupt
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise OutputError(f"{path}: cannot write ({exc.strerror or exc})") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


#: Suffix of the temporary files of :func:`atomic_output` (``.NAME.PID.XXXXXXXX.tmp``).
TEMP_SUFFIX = ".tmp"
_TEMP_RE = re.compile(r"^\..+?\.(?:(?P<pid>\d+)\.)?[a-z0-9_]{8}\.tmp$")
#: When this process started (its import of this module): older temp files are another run's.
_RUN_STARTED_S = time.time()


def remove_stale_temp_files(folder: str | os.PathLike) -> list[str]:
    """Remove the temporary files a killed servecal run left in ``folder``; return their names.

    Only files named as :func:`atomic_output` names them (``.NAME.PID.XXXXXXXX.tmp``, or
    ``.NAME.XXXXXXXX.tmp`` of older versions), last modified before this run started, and
    whose process is gone (a running servecal process keeps its own). Nothing else is touched;
    a file that cannot be removed is left as it is.
    """
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for e in entries:
        m = _TEMP_RE.match(e.name)
        if m is None:
            continue
        try:
            if not e.is_file(follow_symlinks=False) or e.stat(follow_symlinks=False).st_mtime >= _RUN_STARTED_S:
                continue
            pid = m.group("pid")
            if pid is not None and int(pid) != os.getpid() and _alive(int(pid)):
                continue
            os.unlink(e.path)
            removed.append(e.name)
        except (OSError, ValueError):
            continue
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


#: Outputs of the running command that are still to be written (see :func:`expect_outputs`).
_expected: set[str] | None = None


def expect_outputs(paths) -> None:
    """Declare the outputs the running command will write (None: not tracked).

    Once the last of them is renamed into place, a Ctrl-C no longer aborts the command: its
    work is done, so the interrupt is deferred until the command returns and the command
    exits with its own code. Called by :func:`traces.cli.support.user_errors`.
    """
    global _expected
    _expected = None if paths is None else {os.path.realpath(p) for p in paths}


def _output_done(path) -> bool:
    """Record that ``path`` is in place; True when it was the command's last declared output."""
    if _expected is None:
        return False
    _expected.discard(os.path.realpath(path))
    if _expected:
        return False
    _hold_sigint()
    return True


_held = {"handler": None, "pending": False}


def _hold_sigint() -> None:
    """From now on until :func:`release_sigint`, a Ctrl-C is recorded, not raised."""
    if _held["handler"] is not None or threading.current_thread() is not threading.main_thread():
        return
    def note(signum, frame):
        _held["pending"] = True
    try:
        _held["handler"] = signal.signal(signal.SIGINT, note)
    except (ValueError, TypeError):
        _held["handler"] = None


def release_sigint() -> bool:
    """Restore Ctrl-C after :func:`_hold_sigint`; return whether one arrived meanwhile."""
    h, pending = _held["handler"], _held["pending"]
    _held["handler"], _held["pending"] = None, False
    if h is not None:
        signal.signal(signal.SIGINT, h)
    return pending


@contextlib.contextmanager
def _sigint_deferred():
    """Hold Ctrl-C during the rename (yields a list that is non-empty if one arrived)."""
    pending: list = []
    if threading.current_thread() is not threading.main_thread():
        yield pending
        return
    def note(signum, frame):
        pending.append(signum)
    was_holding = _held["handler"] is not None  # an output written after the last declared one
    try:
        old = signal.signal(signal.SIGINT, note)
    except (ValueError, TypeError):
        yield pending
        return
    try:
        yield pending
    finally:
        if _held["handler"] is not None and not was_holding:  # the last output: keep holding, remember the original
            _held["handler"] = old
            _held["pending"] = _held["pending"] or bool(pending)
            pending.clear()
        else:
            signal.signal(signal.SIGINT, old)  # the original, or the hold's own handler
            if was_holding:
                _held["pending"] = _held["pending"] or bool(pending)
                pending.clear()


def check_writable(path: str | os.PathLike) -> None:
    """Raise :class:`OutputError` unless ``path`` names a file in an existing, writable folder.

    Commands call it for every output before doing any work, so that a run with a bad
    second output does not replace its first one.
    """
    path = Path(path)
    if not path.name or path.is_dir():
        raise OutputError(f"{path}: is a directory; expected a file name")
    parent = path.parent
    if not parent.is_dir():
        raise OutputError(f"{path}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"{path}: folder {parent} is not writable")


def write_table(table: pa.Table, path: str | os.PathLike) -> None:
    """Write ``table`` to Parquet atomically (see :func:`atomic_output`)."""
    with atomic_output(path) as tmp:
        pq.write_table(table, tmp)


def write_text_atomic(text: str, path: str | os.PathLike) -> None:
    """Write ``text`` atomically (see :func:`atomic_output`)."""
    with atomic_output(path) as tmp:
        Path(tmp).write_text(text)


def table_kind(table: pa.Table) -> str | None:
    """The ``servecal.schema`` value of a table, or None when absent."""
    meta = table.schema.metadata or {}
    v = meta.get(SCHEMA_KEY)
    return v.decode("utf-8", "replace") if v else None


def table_metadata(table: pa.Table) -> dict[str, str]:
    """The ``servecal.*`` metadata of a table other than the schema key, without prefix."""
    meta = table.schema.metadata or {}
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
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise SchemaError(f"{path}: not a readable Parquet file ({first})") from None
    return _checked_metadata(table, path)


def _checked_metadata(table: pa.Table, path) -> pa.Table:
    """Refuse ``servecal.*`` metadata that is not UTF-8 text; drop unusable ``pandas`` metadata.

    The ``pandas`` key only tells ``to_pandas`` how to rebuild dtypes and the index; one that
    is not JSON describing the columns would make reading fail, and the data are complete
    without it.
    """
    try:
        table.schema.names  # decoded from the file's bytes
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
    if not isinstance(m, dict) or not isinstance(m.get("columns"), list) or not isinstance(m.get("index_columns"), list):
        return False
    cols = m["columns"]
    if not all(isinstance(c, dict) and isinstance(c.get("name", ""), (str, type(None))) for c in cols):
        return False
    if not all(isinstance(i, (str, dict)) for i in m["index_columns"]):
        return False
    listed = {c.get("field_name", c.get("name")) for c in cols}
    return all(i in names for i in m["index_columns"] if isinstance(i, str)) and set(names) <= listed
