"""Import LLMPerf per-request results (``*_individual_responses.json``).

Format (ray-project/llmperf ``token_benchmark_ray.py`` and ``src/llmperf/common_metrics.py``;
the same files are published in ray-project/llmperf-leaderboard ``raw_data/individual``):
a JSON list with one object per completed request, in completion order::

    {"error_code": null, "error_msg": "", "ttft_s": 0.31, "end_to_end_latency_s": 2.53,
     "inter_token_latency_s": 0.0163, "request_output_throughput_token_per_s": 23.7,
     "number_input_tokens": 550, "number_output_tokens": 151, "number_total_tokens": 701}

Times are seconds at the client. ``number_output_tokens`` is re-counted by LLMPerf's
tokenizer from the text (not the engine's count; BR-03). ``inter_token_latency_s`` is
LLMPerf's own per-request mean, whose definition changed between versions (llmperf#99); it
is not imported: ``tpot_s`` is recomputed from E2E and TTFT. The file records **no send
times**: LLMPerf runs a closed loop of ``--num-concurrent-requests`` clients.
"""
from __future__ import annotations

import heapq
from pathlib import Path

import numpy as np
import pandas as pd

from schemas.metrics import tpot_s

from ..errors import TraceFormatError
from ._frame import assemble_frame
from ._json import json_number, read_json
from ._rows import RowStatus

__all__ = ["import_llmperf", "closed_loop_arrivals"]


def closed_loop_arrivals(e2e_s: np.ndarray, concurrency: int) -> np.ndarray:
    """Send times of a closed loop of ``concurrency`` clients, reconstructed from E2E.

    Request ``k`` (in file order) starts when the earliest client becomes free: the first
    ``concurrency`` requests at 0, then each at the end of the request that freed its
    client. Client think time and overhead are taken as 0.

    Parameters
    ----------
    e2e_s : ndarray of float64, shape (n,)
        End-to-end latency per request, seconds (0 for requests without one).
    concurrency : int

    Returns
    -------
    ndarray of float64, shape (n,)
        Seconds since the first send.
    """
    free = [0.0] * concurrency
    heapq.heapify(free)
    out = np.empty(len(e2e_s))
    for k, d in enumerate(e2e_s):
        t = heapq.heappop(free)
        out[k] = t
        heapq.heappush(free, t + float(d))
    return out


def import_llmperf(path: str | Path, concurrency: int, invalid: str = "error") -> tuple[pd.DataFrame, dict]:
    """Read LLMPerf's individual responses.

    Parameters
    ----------
    path : str or Path
        JSON list of per-request results.
    concurrency : int
        The run's ``--num-concurrent-requests`` (the file does not record it; the
        leaderboard's ``*_summary.json`` does, as ``num_concurrent_requests``).
    invalid : {"error", "flag", "drop"}
        A success with TTFT > E2E or without output tokens is invalid.

    Returns
    -------
    frame : pandas.DataFrame
        ``arrival_time_s`` reconstructed by :func:`closed_loop_arrivals` (an estimate:
        recorded as ``arrival_source`` in the metadata); ``ttft_s``, ``e2e_s`` as measured,
        ``tpot_s`` = (E2E - TTFT)/(N - 1). A request with an ``error_code`` is kept with
        ``status = 'failed: <code> <msg>'`` and NaN latencies. ``request_id`` = 1-based
        position in the file.
    metadata : dict
        ``concurrency``, ``arrival_source``, ``output_tokens_source``, counts.

    Raises
    ------
    TraceFormatError
        Not a JSON list of objects, a missing field, a non-numeric, negative or NaN value
        (naming the 1-based request and the field), concurrency < 1.
    """
    path = Path(path)
    if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
        raise TraceFormatError(path, f"concurrency {concurrency!r} is not a positive integer")
    obj = read_json(path)
    if isinstance(obj, dict):
        for key in ("individual_responses", "results"):
            if isinstance(obj.get(key), list):
                obj = obj[key]
                break
    if not isinstance(obj, list):
        raise TraceFormatError(path, f"is a JSON {type(obj).__name__}", expected="a list of per-request objects")
    if not obj:
        raise TraceFormatError(path, "has no requests", expected="a non-empty list of per-request objects")
    n = len(obj)
    status = RowStatus(path, invalid)
    c_order = status.invalid("ttft_s > end_to_end_latency_s", "ttft_s", "ttft_s <= end_to_end_latency_s")
    c_out0 = status.invalid("success with 0 output tokens", "number_output_tokens", ">= 1")
    prompt, output = np.zeros(n, np.int64), np.zeros(n, np.int64)
    ttft, e2e, busy = np.full(n, np.nan), np.full(n, np.nan), np.zeros(n)
    codes = np.zeros(n, np.int16)
    for i, rec in enumerate(obj):
        r = i + 1
        if not isinstance(rec, dict):
            raise TraceFormatError(path, f"request is a JSON {type(rec).__name__}", row=r, expected="an object")
        for f in ("number_input_tokens", "number_output_tokens", "ttft_s", "end_to_end_latency_s"):
            if f not in rec:
                raise TraceFormatError(path, "missing field", row=r, column=f)
        code = rec.get("error_code")
        if code not in (None, "", 0) or rec.get("error_msg"):
            codes[i] = status.failed(f"{code} {str(rec.get('error_msg') or '')[:100]}".rstrip())
            prompt[i] = json_number(path, rec["number_input_tokens"], column="number_input_tokens", row=r,
                                    integer=True, minimum=1)
            e = rec.get("end_to_end_latency_s")
            busy[i] = e if isinstance(e, (int, float)) and not isinstance(e, bool) and np.isfinite(e) and e > 0 else 0
            continue
        prompt[i] = json_number(path, rec["number_input_tokens"], column="number_input_tokens", row=r, integer=True,
                                minimum=1)
        output[i] = json_number(path, rec["number_output_tokens"], column="number_output_tokens", row=r, integer=True,
                                minimum=0)
        t = json_number(path, rec["ttft_s"], column="ttft_s", row=r, minimum=0)
        e = json_number(path, rec["end_to_end_latency_s"], column="end_to_end_latency_s", row=r, minimum=0)
        busy[i] = e
        if output[i] == 0:
            codes[i] = c_out0
        elif t > e:
            codes[i] = c_order
        else:
            ttft[i], e2e[i] = t, e
    status.add(codes, 0)
    arrival = closed_loop_arrivals(busy, concurrency)
    df, meta = assemble_frame(arrival, prompt, output, status=status, codes=codes,
                              extra={"ttft_s": ttft, "e2e_s": e2e, "tpot_s": tpot_s(ttft, e2e, output)})
    meta.update({
        "source_format": "llmperf",
        "source": str(path),
        "concurrency": str(concurrency),
        "arrival_source": (f"reconstructed closed loop: {concurrency} clients, each sends its next request when "
                           "its previous one ends (file order, zero think time); an estimate, not measured"),
        "output_tokens_source": "number_output_tokens (re-tokenised by LLMPerf, not the engine's count)",
    })
    return df, meta
