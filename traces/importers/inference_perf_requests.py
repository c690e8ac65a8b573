"""Import inference-perf's ``per_request_lifecycle_metrics.json`` (one object per request).

Format (kubernetes-sigs/inference-perf ``inference_perf/reportgen/base.py``,
``build_per_request_lifecycle_entry``; the models in ``inference_perf/apis/base.py``,
``RequestLifecycleMetric``, ``InferenceInfo``, ``StreamedResponseMetrics``): a JSON list::

    [{"start_time": 3051.20, "end_time": 3053.84,          # seconds, the client's monotonic clock
      "request": "...", "response": "...",
      "info": {"request_metrics": {"text": {"input_tokens": 550}},
               "input_tokens": 550,                         # older releases' (and a kept mirror)
               "response_metrics": {"output_tokens": 151,
                                    "server_usage": {"prompt_tokens": 552, "completion_tokens": 150},
                                    "output_token_times": [3051.41, ...]}},
      "error": null or {"error_type": "...", "error_msg": "..."}}, ...]

Read per request: arrival = ``start_time`` minus the first; prompt tokens
``info.request_metrics.text.input_tokens`` (else ``info.input_tokens``); output tokens the
server's ``server_usage.completion_tokens`` when it sent one, else inference-perf's
``output_tokens``; TTFT = first ``output_token_times`` - ``start_time`` (streamed requests;
none otherwise); E2E = ``end_time`` - ``start_time``; TPOT = (E2E - TTFT)/(N - 1). A request
with an ``error`` is kept with ``status = 'failed: <error_type>'`` and no latencies. The
entries carry no stage: a run of several stages is one trace (``traces slice`` cuts it).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from schemas.metrics import tpot_s

from ..errors import TraceFormatError
from ._frame import assemble_frame
from ._json import json_number, read_json
from ._rows import RowStatus

__all__ = ["import_inference_perf_requests"]

_MAX_S = 100 * 365 * 86400.0


def _dig(obj, *keys):
    for k in keys:
        obj = obj.get(k) if isinstance(obj, dict) else None
    return obj


def _count(path: Path, r: int, obj: dict, prefix: str, places: tuple, expected: str, minimum: int) -> int:
    """The token count of entry ``r`` at the first of ``places`` (key paths under ``obj``, named
    ``prefix.key...`` in errors) that holds one, checked as an integer >= ``minimum``.

    Raises
    ------
    TraceFormatError
        Naming the file, the entry and the field: none of the places holds a count, or it is not one.
    """
    for keys in places:
        value = _dig(obj, *keys)
        if value is not None:
            return json_number(path, value, column=".".join((prefix, *keys)), row=r, integer=True, minimum=minimum)
    raise TraceFormatError(path, "missing field", row=r, column=".".join((prefix, *places[0])), expected=expected)


def _request(path: Path, rec, r: int) -> tuple[float, float, int, int | None, float | None, str | None]:
    """(start s, end s, prompt tokens, output tokens, first token time s, error) of entry ``r``."""
    if not isinstance(rec, dict):
        raise TraceFormatError(path, f"request is a JSON {type(rec).__name__}", row=r, expected="an object")
    for f in ("start_time", "end_time", "info"):
        if f not in rec:
            raise TraceFormatError(path, "missing field", row=r, column=f,
                                   expected="an inference-perf per-request entry (start_time, end_time, info, error)")
    start = json_number(path, rec["start_time"], column="start_time", row=r, minimum=0, maximum=_MAX_S * 100)
    end = json_number(path, rec["end_time"], column="end_time", row=r, minimum=0, maximum=_MAX_S * 100)
    info = rec["info"] if isinstance(rec["info"], dict) else {}
    prompt = _count(path, r, info, "info", (("request_metrics", "text", "input_tokens"), ("input_tokens",)),
                    "the prompt's token count", minimum=1)
    error = rec.get("error")
    if error:
        return start, end, prompt, None, None, str(_dig(error, "error_type") or error)[:100]
    resp = info.get("response_metrics") if isinstance(info.get("response_metrics"), dict) else info
    output = _count(path, r, resp, "info.response_metrics", (("server_usage", "completion_tokens"), ("output_tokens",)),
                    "the output's token count", minimum=0)
    times = resp.get("output_token_times")
    first = None
    if isinstance(times, list) and times:
        first = json_number(path, times[0], column="info.response_metrics.output_token_times", row=r, minimum=0,
                            maximum=_MAX_S * 100)
    return start, end, prompt, output, first, None


def import_inference_perf_requests(path: str | Path, invalid: str = "error") -> tuple[pd.DataFrame, dict]:
    """Read ``per_request_lifecycle_metrics.json`` into a request trace.

    Parameters
    ----------
    path : str or Path
    invalid : {"error", "flag", "drop"}
        A success that ends before it starts, whose first token is outside it, or without
        output tokens, is invalid.

    Returns
    -------
    frame : pandas.DataFrame
        ``request_trace/1``: ``arrival_time_s``, tokens, ``ttft_s``, ``e2e_s``, ``tpot_s``
        (seconds); ``request_id`` = 1-based position in the file.
    metadata : dict
        ``source_format`` (``inference-perf``), ``source``, ``arrival_source``,
        ``output_tokens_source``, row counts.

    Raises
    ------
    TraceFormatError
        Naming the file, the request (1-based) and the field: not a JSON list, no requests, a
        missing field, a value that is not a number or out of range.
    """
    path = Path(path)
    obj = read_json(path)
    if not isinstance(obj, list):
        raise TraceFormatError(path, f"is a JSON {type(obj).__name__}",
                               expected="inference-perf's per_request_lifecycle_metrics.json: a list of requests")
    if not obj:
        raise TraceFormatError(path, "has no requests", expected="a non-empty list of per-request entries")
    n = len(obj)
    status = RowStatus(path, invalid)
    c_order = status.invalid("end_time before start_time, or the first token outside them", "end_time",
                             "start_time <= first output_token_times <= end_time")
    c_out0 = status.invalid("success with 0 output tokens", "info.response_metrics.output_tokens", ">= 1")
    start, prompt, output = np.zeros(n), np.zeros(n, np.int64), np.zeros(n, np.int64)
    ttft, e2e = np.full(n, np.nan), np.full(n, np.nan)
    codes = np.zeros(n, np.int16)
    server_counts = 0
    for i, rec in enumerate(obj):
        t0, t1, prompt[i], n_out, first, error = _request(path, rec, i + 1)
        start[i] = t0
        if error is not None:
            codes[i] = status.failed(error)
            continue
        output[i] = n_out or 0
        server_counts += _dig(rec, "info", "response_metrics", "server_usage", "completion_tokens") is not None
        if n_out == 0:
            codes[i] = c_out0
        elif t1 < t0 or (first is not None and not t0 <= first <= t1):
            codes[i] = c_order
        else:
            e2e[i] = t1 - t0
            ttft[i] = np.nan if first is None else first - t0
    status.add(codes, 0)
    df, meta = assemble_frame(start - start.min(), prompt, output, status=status, codes=codes,
                              extra={"ttft_s": ttft, "e2e_s": e2e, "tpot_s": tpot_s(ttft, e2e, output)})
    meta.update({
        "source_format": "inference-perf",
        "source": str(path),
        "arrival_source": "recorded: start_time (s, the client's clock) relative to the first",
        "output_tokens_source": f"server_usage.completion_tokens for {server_counts}, inference-perf's "
                                f"output_tokens (client tokenizer) for the other successes",
    })
    return df, meta
