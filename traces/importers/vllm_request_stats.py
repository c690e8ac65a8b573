"""Import vLLM v1 per-request state timestamps (``RUN_requests.jsonl``)."""
from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import TraceFormatError
from ._json import json_number

_FIELDS = ("request_id", "input_toks", "output_toks", "arrival_time", "queued_ts", "scheduled_ts",
           "first_token_ts", "last_token_ts")


def import_vllm_request_stats(path: str | Path, arrival_clock: str = "engine") -> tuple[pd.DataFrame, dict]:
    """Read one JSON object per request with vLLM v1 ``RequestStateStats`` timestamps.

    Parameters
    ----------
    path : str or Path
        JSONL file; fields ``request_id``, ``input_toks``, ``output_toks``, ``arrival_time``
        (wall-clock epoch seconds) and ``queued_ts``, ``scheduled_ts``, ``first_token_ts``,
        ``last_token_ts`` (the engine's monotonic clock, seconds).
    arrival_clock : {"engine", "wall"}
        Which clock gives ``arrival_time_s``. ``engine`` (default) uses ``queued_ts``, the
        moment the engine saw the request, on the same clock as the measured latencies;
        ``wall`` uses ``arrival_time`` (the client side; it differs from the engine clock by
        an offset that wanders by 0.1-0.2 s within a run). Either way relative to the
        first request.

    Returns
    -------
    frame : pandas.DataFrame
        ``request_trace/1`` columns, sorted by arrival: ``queue_wait_s = scheduled - queued``,
        ``ttft_s = first_token - queued``, ``e2e_s = last_token - queued``,
        ``tpot_s = (last_token - first_token) / (output - 1)`` (NaN for one token).
    metadata : dict
        Source, clock used, the wall-clock origin, and the wall-minus-engine offset spread.

    Raises
    ------
    TraceFormatError
        Naming the file, line and field: bad JSON (e.g. a truncated line), a missing
        field, a non-numeric or negative value, timestamps out of order.
    """
    path = Path(path)
    if arrival_clock not in ("engine", "wall"):
        raise TraceFormatError(path, f"unknown arrival clock {arrival_clock!r}", expected="'engine' or 'wall'")
    try:
        fh = open(path, encoding="utf-8")
    except OSError as exc:
        raise TraceFormatError(path, f"cannot open ({exc.strerror})") from None
    rows = []
    with fh:
        lines = iter(fh)
        for lineno in itertools.count(1):
            try:
                line = next(lines)
            except StopIteration:
                break
            except UnicodeDecodeError:
                raise TraceFormatError(path, "is not UTF-8 text", line=lineno,
                                       expected="a JSONL file of vLLM request stats", fold=True) from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceFormatError(path, f"not valid JSON ({exc.msg})", line=lineno,
                                       expected="one complete JSON object per line", fold=True) from None
            except RecursionError:
                raise TraceFormatError(path, "JSON nested too deeply", line=lineno,
                                       expected="one flat JSON object per line", fold=True) from None
            except ValueError as exc:  # e.g. an integer of more than 4300 digits
                raise TraceFormatError(path, f"not valid JSON ({str(exc).splitlines()[0][:80]})", line=lineno,
                                       expected="numbers of ordinary size", fold=True) from None
            if not isinstance(obj, dict):
                raise TraceFormatError(path, "not a JSON object", line=lineno)
            rows.append(_row(path, lineno, obj))
    if not rows:
        raise TraceFormatError(path, "no requests", expected="one JSON object per line")
    df = pd.DataFrame(rows, columns=["line", *_FIELDS])
    arrival = df["queued_ts"] if arrival_clock == "engine" else df["arrival_time"]
    order = np.argsort(arrival.to_numpy(), kind="stable")
    df = df.iloc[order].reset_index(drop=True)
    arrival = arrival.iloc[order].reset_index(drop=True)
    dup = df["request_id"].duplicated()
    if dup.any():
        line = int(df.loc[dup, "line"].iloc[0])
        raise TraceFormatError(path, f"duplicate request_id {df.loc[dup, 'request_id'].iloc[0]!r}", line=line,
                               column="request_id")
    out = pd.DataFrame({
        "request_id": df["request_id"].astype(str),
        "arrival_time_s": arrival - arrival.iloc[0],
        "num_prompt_tokens": df["input_toks"].astype("int64"),
        "num_output_tokens": df["output_toks"].astype("int64"),
        "queue_wait_s": df["scheduled_ts"] - df["queued_ts"],
        "ttft_s": df["first_token_ts"] - df["queued_ts"],
        "e2e_s": df["last_token_ts"] - df["queued_ts"],
    })
    n = out["num_output_tokens"].to_numpy(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out["tpot_s"] = np.where(n >= 2, (df["last_token_ts"] - df["first_token_ts"]) / (n - 1), np.nan)
    offset = df["arrival_time"] - df["queued_ts"]
    meta = {
        "source_format": "vllm-request-stats",
        "source": str(path),
        "arrival_clock": arrival_clock,
        "wall_clock_origin_s": repr(float(df["arrival_time"].min())),
        "wall_minus_engine_offset_spread_s": f"{float(offset.max() - offset.min()):.6f}",
    }
    return out, meta


def _row(path: Path, lineno: int, obj: dict) -> tuple:
    vals = [lineno]
    for f in _FIELDS:
        if f not in obj:
            raise TraceFormatError(path, "missing field", line=lineno, column=f)
        v = obj[f]
        if f == "request_id":
            vals.append(str(v))
            continue
        if f in ("input_toks", "output_toks"):
            v = json_number(path, v, column=f, line=lineno, integer=True, minimum=1)
        else:
            v = json_number(path, v, column=f, line=lineno)
        vals.append(v)
    q, s, ft, lt = obj["queued_ts"], obj["scheduled_ts"], obj["first_token_ts"], obj["last_token_ts"]
    if not q <= s <= ft <= lt:
        raise TraceFormatError(path, "timestamps out of order", line=lineno,
                               expected="queued_ts <= scheduled_ts <= first_token_ts <= last_token_ts")
    return tuple(vals)
