"""Benchmark result JSON with per-request arrays (vLLM ``benchmark_serving``, SGLang ``bench_serving``).

The format family shared by :mod:`.vllm_bench` and :mod:`.sglang_bench`: arrays of prompt and
output lengths, TTFTs and inter-token gaps, one entry per request, and the arrival choices.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from schemas.metrics import tpot_s
from schemas.validate import token_time_limit_s

from ..errors import TraceFormatError
from ._frame import assemble_frame
from ._json import json_number
from ._rows import RowStatus
from ._source import first_line, short_repr


_BENCH_REQUIRED = ("input_lens", "output_lens", "ttfts", "itls", "errors")

ARRIVAL_CHOICES = ("auto", "recorded", "zero", "synth")


def bench_arrays_frame(path, result: dict, *, source_format: str, arrivals: str = "auto", seed: int = 0,
                       invalid: str = "error", row_offset_line: int | None = None) -> tuple[pd.DataFrame, dict]:
    """Convert one benchmark result with per-request arrays into a request trace.

    Parameters
    ----------
    path : str or Path
        The source (named in errors).
    result : dict
        ``input_lens``, ``output_lens``, ``ttfts`` (s), ``itls`` (list of s per request),
        ``errors`` ("" or null for success); optional ``start_times`` (client
        ``perf_counter`` s at send), ``latencies`` (E2E s), ``successes`` (bool),
        ``request_rate`` (number or "inf"), ``burstiness``, ``max_concurrency``.
    arrivals : {"auto", "recorded", "zero", "synth"}
        ``recorded``: ``start_times`` relative to the first. ``zero``: every request at 0
        (exact for ``request_rate=inf``). ``synth``: gamma gaps with shape ``burstiness``
        and mean ``1/request_rate``, seeded, first request at 0 (the benchmark's own
        sampler, not its draws). ``auto``: recorded if present, zero if the rate was
        inf, else an error asking for a choice.
    seed : int
        Seed of ``synth``.
    invalid : {"error", "flag", "drop"}
        A success with TTFT 0 and output > 0, or with 0 output tokens, is invalid (BR-17).
    row_offset_line : int, optional
        The line of a JSONL file holding ``result`` (named in errors).

    Returns
    -------
    frame, metadata

    Raises
    ------
    TraceFormatError
        Missing or unequal arrays, a bad value (naming the array and the 1-based request),
        unknown arrival times under ``auto``.
    """
    path = Path(path)
    line = row_offset_line
    arrays = _checked_arrays(path, result, line, arrivals)
    n = len(arrays["input_lens"])
    status = RowStatus(path, invalid, lines=False)
    prompt, output, ttft, e2e, codes, token_times, chunked = _read_requests(path, arrays, n, status)
    status.add(codes, 0)
    rate_f, burst = _rate_and_burstiness(path, result, line)
    meta = {"source_format": source_format, "source": str(path)}
    arrival = _arrival_times(path, result, arrays, arrivals, rate_f, burst, seed, line, meta)
    meta["request_rate"] = "inf" if math.isinf(rate_f) else repr(float(rate_f))
    meta["burstiness"] = repr(float(burst))
    for k in ("max_concurrency", "backend", "model_id", "date", "dataset_name"):
        if result.get(k) is not None:
            meta[k] = str(result[k])
    meta["e2e_source"] = "latencies" if "latencies" in arrays else "ttft + sum(itls)"
    meta["token_times_missing_multi_token_chunks"] = str(chunked)
    df, m = assemble_frame(arrival, prompt, output, status=status, codes=codes,
                           extra={"ttft_s": ttft, "e2e_s": e2e, "tpot_s": tpot_s(ttft, e2e, output),
                                  "token_times_s": token_times})
    return df, {**meta, **m}


def _checked_arrays(path: Path, result: dict, line: int | None, arrivals: str) -> dict[str, list]:
    """The per-request arrays of ``result`` (the required ones and the optional ones it has), checked to be
    lists of one common, non-zero length; ``arrivals`` checked to be a known choice."""
    for k in _BENCH_REQUIRED:
        if k not in result:
            raise TraceFormatError(path, f"has no per-request array '{k}'", line=line, column=k,
                                   expected="a result saved with per-request details (vLLM --save-detailed "
                                            "/ SGLang --output-details)")
    optional = [k for k in ("start_times", "latencies", "successes") if k in result and result[k] is not None]
    arrays = {k: result[k] for k in (*_BENCH_REQUIRED, *optional)}
    for k, v in arrays.items():
        if not isinstance(v, list):
            raise TraceFormatError(path, f"'{k}' is a {type(v).__name__}", line=line, column=k, expected="a list")
    n = len(arrays["input_lens"])
    for k, v in arrays.items():
        if len(v) != n:
            raise TraceFormatError(path, f"'{k}' has {len(v)} entries but 'input_lens' has {n}", line=line, column=k,
                                   expected="one entry per request in every array")
    if n == 0:
        raise TraceFormatError(path, "has no requests", line=line, expected="non-empty per-request arrays")
    if arrivals not in ARRIVAL_CHOICES:
        raise TraceFormatError(path, f"unknown arrivals choice {arrivals!r}", expected=" or ".join(ARRIVAL_CHOICES))
    return arrays


def _read_requests(path: Path, arrays: dict[str, list], n: int, status: RowStatus) -> tuple:
    """The ``n`` requests' columns: prompt and output tokens, TTFT and E2E (s, NaN unless a valid success),
    status codes, token times (s after arrival; None where the stream had multi-token chunks) and the
    count of such requests."""
    prompt = np.zeros(n, np.int64)
    output = np.zeros(n, np.int64)
    ttft = np.full(n, np.nan)
    e2e = np.full(n, np.nan)
    codes = np.zeros(n, np.int16)
    token_times = np.empty(n, dtype=object)
    chunked = 0
    c_ttft0 = status.invalid("success with ttft 0", "ttfts", "ttft > 0 for a request that produced tokens")
    c_out0 = status.invalid("success with 0 output tokens", "output_lens", ">= 1 token for a successful request")
    for i in range(n):
        r = i + 1
        prompt[i] = json_number(path, arrays["input_lens"][i], column="input_lens", row=r, integer=True, minimum=1)
        output[i] = json_number(path, arrays["output_lens"][i], column="output_lens", row=r, integer=True, minimum=0)
        err = arrays["errors"][i]
        ok = err in ("", None)
        if "successes" in arrays:
            ok = ok and bool(arrays["successes"][i])
        if not ok:
            codes[i] = status.failed(first_line(err) or 'unsuccessful')
            continue
        t, gaps = _ttft_and_gaps(path, arrays, i)
        if output[i] == 0:
            codes[i] = c_out0
            continue
        if t == 0:
            codes[i] = c_ttft0
            continue
        ttft[i] = t
        e2e[i] = _e2e(path, arrays, i, t, gaps)
        if gaps.size + 1 == output[i]:
            times = t + np.concatenate([[0.0], np.cumsum(gaps)])
            if times[-1] > token_time_limit_s(e2e[i]):
                # the client's latency ends before its own last chunk: the row contradicts itself
                codes[i] = status.invalid("ttft + sum(itls) is beyond the latency", "itls",
                                          "the last token by the request's latency (ttfts + sum(itls) <= latencies)")
                ttft[i] = e2e[i] = np.nan
                continue
            token_times[i] = times
        else:
            chunked += 1
    return prompt, output, ttft, e2e, codes, token_times, chunked


def _ttft_and_gaps(path: Path, arrays: dict[str, list], i: int) -> tuple[float, np.ndarray]:
    """Request ``i``'s TTFT and inter-token gaps, seconds."""
    r = i + 1
    t = json_number(path, arrays["ttfts"][i], column="ttfts", row=r, minimum=0)
    itl = arrays["itls"][i]
    if not isinstance(itl, list):
        raise TraceFormatError(path, f"itls entry is a {type(itl).__name__}", row=r, column="itls",
                               expected="a list of seconds")
    return t, np.array([json_number(path, g, column="itls", row=r, minimum=0) for g in itl], dtype=np.float64)


def _e2e(path: Path, arrays: dict[str, list], i: int, t: float, gaps: np.ndarray) -> float:
    """Request ``i``'s E2E latency, seconds: its ``latencies`` entry (not below TTFT ``t``), else ``t``
    plus the gaps."""
    if "latencies" not in arrays:
        return t + float(gaps.sum())
    e2e = json_number(path, arrays["latencies"][i], column="latencies", row=i + 1, minimum=0)
    if e2e < t * (1 - 1e-9):
        raise TraceFormatError(path, f"latency {float(e2e)!r} is below ttft {t!r}", row=i + 1, column="latencies",
                               expected="latencies >= ttfts")
    return e2e


def _rate_and_burstiness(path: Path, result: dict, line: int | None) -> tuple[float, float]:
    """The run's ``request_rate`` (requests/s, ``inf`` for all at once) and ``burstiness`` (default 1)."""
    rate = result.get("request_rate")
    rate_f = math.inf if rate in ("inf", None, float("inf")) else rate
    if not isinstance(rate_f, (int, float)) or isinstance(rate_f, bool) or not rate_f > 0:
        raise TraceFormatError(path, f"request_rate {short_repr(rate)[:40]} is not a positive number or 'inf'",
                               line=line, column="request_rate")
    if rate_f != math.inf:
        rate_f = json_number(path, rate_f, column="request_rate", line=line)  # in range: a float
    burst = result.get("burstiness", 1.0)
    if isinstance(burst, bool) or not isinstance(burst, (int, float)) or not burst > 0:
        raise TraceFormatError(path, f"burstiness {short_repr(burst)[:40]} is not a positive number", line=line,
                               column="burstiness")
    return rate_f, json_number(path, burst, column="burstiness", line=line)


def _arrival_times(path: Path, result: dict, arrays: dict[str, list], arrivals: str, rate_f: float, burst: float,
                   seed: int, line: int | None, meta: dict) -> np.ndarray:
    """The arrival times (s from the first) under the ``arrivals`` choice (see :func:`bench_arrays_frame`);
    says in ``meta`` where they came from."""
    n = len(arrays["input_lens"])
    choice = arrivals
    if choice == "auto":
        if "start_times" in arrays:
            choice = "recorded"
        elif math.isinf(rate_f):
            choice = "zero"
        else:
            raise TraceFormatError(
                path, f"has no per-request send times ('start_times') and request_rate is {rate_f:g}/s, so the "
                      "arrival times are unknown", line=line, column="start_times",
                expected="--arrivals synth (gamma gaps with the run's rate and burstiness, seeded) or --arrivals zero")
    if choice == "recorded":
        if "start_times" not in arrays:
            raise TraceFormatError(path, "has no 'start_times'", line=line, column="start_times",
                                   expected="a result from a benchmark version that saves start_times, or "
                                            "--arrivals zero/synth")
        st = np.array([json_number(path, v, column="start_times", row=i + 1) for i, v in
                       enumerate(arrays["start_times"])])
        meta["arrival_source"] = "recorded: start_times (client perf_counter at send), relative to the first"
        return st - st.min()
    if choice == "zero":
        meta["arrival_source"] = "zero: every request at t=0 (the benchmark sent them all at once)"
        if result.get("max_concurrency"):
            meta["arrival_warning"] = (f"max_concurrency={result['max_concurrency']}: the client held requests "
                                       "back, so t=0 is when they were created, not when the server saw them")
        return np.zeros(n)
    if math.isinf(rate_f):
        raise TraceFormatError(path, "request_rate is inf: nothing to synthesise", line=line,
                               column="request_rate", expected="--arrivals zero")
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(float(burst), 1.0 / (rate_f * float(burst)), n - 1)
    meta["arrival_source"] = (f"synthesized: gamma gaps, shape={float(burst):g}, mean={1 / rate_f:g} s, "
                              f"seed={seed} (not the run's own draws)")
    return np.concatenate([[0.0], np.cumsum(gaps)])
