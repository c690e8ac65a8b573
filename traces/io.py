"""Reading and writing validated servecal traces."""
from __future__ import annotations

import json
import os

import pandas as pd

from schemas.engine_settings import SETTINGS, problem
from schemas.tables import table_kind, table_metadata, read_table, to_table, write_table
from schemas.validate import validate

from .errors import TraceFormatError


def read_trace(path: str | os.PathLike, kind: str | None = None) -> tuple[str, pd.DataFrame, dict]:
    """Read and validate a servecal Parquet table.

    Parameters
    ----------
    path : path of a Parquet file written by servecal (or with its columns and metadata).
    kind : expected kind, optional; default the file's ``servecal.schema``.

    Returns
    -------
    kind : str
    frame : pandas.DataFrame
        Contract dtypes: float64 seconds, int64 tokens (nullable columns keep Arrow types).
    metadata : dict[str, str]
        The file's ``servecal.*`` metadata.

    Raises
    ------
    schemas.errors.SchemaError
        Unreadable file, or every rule the table breaks (ValidationError).
    """
    table = read_table(path)
    table = validate(table, str(path), kind)
    return table_kind(table), table.to_pandas(), table_metadata(table)


def write_trace(frame: pd.DataFrame, kind: str, path: str | os.PathLike, metadata: dict | None = None,
                source: str | None = None) -> None:
    """Validate ``frame`` as ``kind`` and write it atomically as Parquet.

    ``source`` (the file the frame was imported from) is named in validation messages,
    whose rows are then rows of the imported table.

    Raises
    ------
    schemas.errors.SchemaError
        If the frame breaks the contract (nothing is written).
    """
    table = to_table(kind, frame, metadata)
    table = validate(table, f"{source} (rows of the imported table)" if source else str(path), kind)
    write_table(table, path)


#: Engine settings a trace's metadata may supply, by vLLM's name (``in_trace`` in
#: :data:`schemas.engine_settings.SETTINGS`): whole numbers >= 1, gpu_memory_utilization, and
#: the scheduler's name (a built-in's: a trace never names a class to load).
TRACE_SETTINGS = {s.vllm or s.name: s for s in SETTINGS.values() if s.in_trace}


def recorded_engine_settings(metadata: dict, path) -> dict | None:
    """The engine settings an importer recorded in a trace's metadata, or None.

    Parameters
    ----------
    metadata : the trace's ``servecal.*`` metadata without the prefix (:func:`read_trace`'s).
    path : the trace, for the message.

    Returns
    -------
    dict of vLLM's names (``max_num_seqs``, ``max_num_batched_tokens``, ``block_size``,
    ``max_model_len``, ``num_gpu_blocks``, ``tensor_parallel_size``, ``data_parallel_size``,
    ``gpu_memory_utilization``; ``scheduler`` and the disaggregated pools' ``tp_prefill``,
    ``tp_decode``, ``pp_prefill``, ``pp_decode``) from the ``engine_settings`` key (JSON,
    written by ``traces import vllm-log``, ``blis-observe`` and ``distserve``); other keys
    there are not settings a replay takes.

    Raises
    ------
    TraceFormatError
        A setting that is not a whole number from 1 (a fraction in (0, 1] for
        ``gpu_memory_utilization``), or ``engine_settings`` that is not a JSON object.
    """
    raw = (metadata or {}).get("engine_settings")
    if not raw:
        return None
    try:
        settings = json.loads(raw)
    except (ValueError, RecursionError):
        settings = None
    if not isinstance(settings, dict):
        raise TraceFormatError(path, "metadata engine_settings is not a JSON object", column="engine_settings",
                               expected='{"max_num_seqs": 128, ...}')
    out = {}
    for key, value in settings.items():
        spec = TRACE_SETTINGS.get(key)
        if spec is None:
            continue
        if spec.type is str:
            ok = isinstance(value, str) and value.isidentifier() and problem(spec.name, value) is None
        else:
            number = (int,) if spec.type is int else (int, float)
            ok = (isinstance(value, number) and not isinstance(value, bool) and abs(value) < 2 ** 31
                  and problem(spec.name, value) is None)
        if not ok:
            raise TraceFormatError(path, f"metadata engine_settings: {key}={value!r:.40} is not a valid setting",
                                   column="engine_settings", expected="a whole number from 1 (a fraction in (0, 1] "
                                   "for gpu_memory_utilization, a built-in scheduler's name for scheduler)")
        out[key] = value
    return out or None


def validated_frame(frame: pd.DataFrame, kind: str, name: str) -> pd.DataFrame:
    """``frame`` checked as a ``kind`` table by the rules :func:`read_trace` checks a file by,
    returned with the contract's dtypes (float64 seconds, int64 tokens); ``name`` is what the
    messages call it (there is no file).

    Raises
    ------
    schemas.errors.SchemaError
        A column that cannot be cast to its type, or every rule the frame breaks
        (ValidationError), naming ``name``.
    """
    return validate(to_table(kind, frame), name, kind).to_pandas()
