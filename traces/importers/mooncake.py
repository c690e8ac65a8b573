"""Import Mooncake request traces (JSON Lines with prefix-block hashes).

Format (kvcache-ai/Mooncake, ``FAST25-release/traces/*.jsonl`` and the trace section of
its README; the same layout is read by ai-dynamo/dynamo's and vllm-project/guidellm's
Mooncake loaders)::

    {"timestamp": 0, "input_length": 1200, "output_length": 10, "hash_ids": [0, 1, 2]}

``timestamp`` is milliseconds since the first request, ``input_length`` and
``output_length`` are tokens, ``hash_ids`` are remapped hashes of the prompt's blocks of
**512 tokens**, a trailing partial block included: ``len(hash_ids) ==
ceil(input_length / 512)``. Equal ids in two requests mean a reusable prefix.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import TraceFormatError
from ._frame import assemble_frame
from ._json import iter_jsonl, json_number
from ._rows import RowStatus
from ._source import Progress
from ._time import relative_seconds, time_resolution_s

__all__ = ["import_mooncake", "MOONCAKE_BLOCK_TOKENS"]

#: Tokens per hash block in the published Mooncake traces.
MOONCAKE_BLOCK_TOKENS = 512


def import_mooncake(path: str | Path, block_tokens: int = MOONCAKE_BLOCK_TOKENS, invalid: str = "error",
                    progress: Progress | None = None) -> tuple[pd.DataFrame, dict]:
    """Read a Mooncake trace (one JSON object per line).

    Parameters
    ----------
    path : str or Path
    block_tokens : int
        Tokens per hash block (512 in the published traces).
    invalid : {"error", "flag", "drop"}
        What to do with a row whose ``hash_ids`` count is not ``ceil(input_length /
        block_tokens)`` (BR-14): stop (default), keep it with ``status = 'invalid:
        hash_ids count'`` (excluded from replay; the count is in the metadata), or leave it
        out.
    progress : callable, optional
        Called with bytes read.

    Returns
    -------
    frame : pandas.DataFrame
        ``arrival_time_s`` = (timestamp - first timestamp) / 1000, in seconds;
        ``block_hashes`` = ``hash_ids`` (list of int64; these are 512-token blocks, not
        the engine's: the replay maps them onto its own block size);
        ``request_id`` = 1-based record number. Sorted by arrival, ties in file order.
    metadata : dict
        ``hash_block_tokens``, ``time_resolution_s``, counts.

    Raises
    ------
    TraceFormatError
        Naming row, line and field: a truncated or non-JSON line, a missing field, a
        non-integer or negative value, input_length < 1, hash_ids that are not a list of
        integers, and (``invalid='error'``) a wrong hash_ids count; an empty file.
    """
    path = Path(path)
    if not isinstance(block_tokens, int) or block_tokens < 1:
        raise TraceFormatError(path, f"block size {block_tokens!r} is not a positive integer")
    status = RowStatus(path, invalid, lines=False)
    ts, inp, out, hashes, codes = [], [], [], [], []
    c_count = None
    any_float = False
    for row, line, obj in iter_jsonl(path, progress):
        for f in ("timestamp", "input_length", "output_length"):
            if f not in obj:
                raise TraceFormatError(path, "missing field", row=row, line=line, column=f)
        t = obj["timestamp"]
        any_float |= isinstance(t, float)
        # milliseconds; beyond 2**53 a float64 (and the arrival it becomes) loses whole milliseconds
        ts.append(json_number(path, t, column="timestamp", row=row, line=line, minimum=0, maximum=2.0 ** 53))
        n_in = json_number(path, obj["input_length"], column="input_length", row=row, line=line, integer=True,
                           minimum=1)
        n_out = json_number(path, obj["output_length"], column="output_length", row=row, line=line, integer=True,
                            minimum=1)
        inp.append(n_in), out.append(n_out)
        h, code = _hash_ids(path, obj.get("hash_ids"), n_in, block_tokens, status, row, line)
        c_count = code or c_count
        hashes.append(h)
        codes.append(code)
    if not ts:
        raise TraceFormatError(path, "has no requests", expected="one JSON object per line")
    codes_a = np.array(codes, np.int16)
    status.add(codes_a, 0)
    if any_float:
        t = np.array(ts, np.float64)
        arrival = relative_seconds(t, 1e6)
        res = "fractional milliseconds"
    else:
        t = np.array(ts, np.int64)
        arrival = relative_seconds(t, 1_000_000)
        res = f"{time_resolution_s(t - t.min(), 1_000_000):g}"
    extra = {}
    if any(h is not None for h in hashes):
        extra["block_hashes"] = np.array([None if h is None else np.array(h, np.int64) for h in hashes] + [None],
                                         dtype=object)[:-1]
    df, meta = assemble_frame(arrival, np.array(inp, np.int64), np.array(out, np.int64), status=status,
                              codes=codes_a, extra=extra)
    meta.update({
        "source_format": "mooncake",
        "source": str(path),
        "time_origin": "timestamp of the first request",
        "time_resolution_s": res,
        "hash_block_tokens": str(block_tokens),
        "num_invalid_hash_ids_count": str(int((codes_a == c_count).sum()) if c_count else 0),
    })
    return df, meta


def _hash_ids(path: Path, h, n_in: int, block_tokens: int, status: RowStatus, row: int, line: int) -> tuple:
    """A request's ``hash_ids`` (None: absent) checked, and its status code: invalid when their count is
    not ``ceil(n_in / block_tokens)`` (an error under the ``error`` policy), else 0."""
    code = 0
    if h is None:
        return h, code
    if not isinstance(h, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in h):
        raise TraceFormatError(path, "hash_ids is not a list of integers", row=row, line=line, column="hash_ids")
    need = math.ceil(n_in / block_tokens)
    if len(h) != need:
        code = status.invalid("hash_ids count", "hash_ids",
                              f"ceil(input_length / {block_tokens}) hash ids, a trailing partial block included")
        if status.policy == "error":
            raise TraceFormatError(
                path, f"hash_ids has {len(h)} id(s) but input_length {n_in} needs ceil({n_in}/{block_tokens})"
                      f" = {need}", row=row, line=line, column="hash_ids",
                expected=f"{need} hash id(s) (or --invalid flag to keep such rows marked, --invalid drop to "
                         "leave them out)")
    if any(x < 0 or x >= 2 ** 63 for x in h):
        raise TraceFormatError(path, "hash_ids has an id outside int64 >= 0", row=row, line=line, column="hash_ids")
    return h, code
