"""Import vLLM's serving-benchmark result JSON (per-request arrays).

Format: the file ``benchmarks/benchmark_serving.py --save-result`` (now ``vllm bench serve
--save-result --save-detailed``) writes, in vllm-project/vllm ``benchmarks/benchmark_serving.py``
and ``vllm/benchmarks/serve.py``::

    {"date": ..., "backend": ..., "model_id": ..., "request_rate": 10.0 | "inf",
     "burstiness": 1.0, "max_concurrency": null, "duration": ..., "completed": ...,
     "input_lens": [...], "output_lens": [...], "ttfts": [...], "itls": [[...], ...],
     "errors": ["", "ReadTimeout", ...],
     "start_times": [...], "latencies": [...]}            # newer versions only

One entry per request in send order. A failed request has a non-empty ``errors`` entry,
``output_lens`` 0 and ``ttfts`` 0.0 (BR-17). ``ttfts`` and ``itls`` are seconds measured
by the client: ``itls`` are the gaps between streamed chunks after the first (TTFT is
never an ITL). ``start_times`` (client ``time.perf_counter()`` when the request was sent,
after any ``--max-concurrency`` wait) exists only in recent versions; older files carry no
per-request send time, only ``request_rate`` and ``burstiness`` of the gamma sampler.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..errors import TraceFormatError
from ._bench_arrays import bench_arrays_frame
from ._json import read_json

__all__ = ["import_vllm_bench"]


def import_vllm_bench(path: str | Path, arrivals: str = "auto", seed: int = 0,
                      invalid: str = "error") -> tuple[pd.DataFrame, dict]:
    """Read a vLLM benchmark result JSON saved with per-request details.

    Parameters
    ----------
    path : str or Path
    arrivals : {"auto", "recorded", "zero", "synth"}
        Where ``arrival_time_s`` comes from. ``recorded``: ``start_times`` relative to the
        first. ``zero``: all at 0 — exact for ``request_rate=inf`` (the benchmark fires
        every request at once). ``synth``: gamma gaps with the run's ``request_rate`` and
        ``burstiness``, seeded by ``seed`` — a statistically equal but not identical
        arrival process, recorded as such. ``auto`` (default): recorded if present, else
        zero if the rate was inf, else an error asking for one of the others: we never
        invent arrival times silently.
    seed : int
    invalid : {"error", "flag", "drop"}
        A "success" with TTFT 0 and output > 0 (or 0 output tokens) is invalid (BR-17).

    Returns
    -------
    frame : pandas.DataFrame
        One row per request (failed ones kept with ``status = 'failed: <error>'``, NaN
        latencies). ``ttft_s``; ``e2e_s`` = ``latencies`` if saved, else TTFT + sum(ITL)
        (the last chunk's time); ``tpot_s`` = (E2E - TTFT) / (output - 1), NaN for one
        token; ``token_times_s`` = TTFT + cumulative ITLs when there is one chunk per
        output token, else null (multi-token chunks: per-token times unknown).
        ``request_id`` = 1-based position in the arrays.
    metadata : dict
        ``arrival_source`` (how arrivals were obtained), rate, burstiness, concurrency,
        backend, model, counts.

    Raises
    ------
    TraceFormatError
        Bad JSON, not an object, missing or unequal arrays, a bad value (naming array and
        request), unknown arrival times under ``auto``.
    """
    path = Path(path)
    obj = read_json(path)
    if not isinstance(obj, dict):
        raise TraceFormatError(path, f"is a JSON {type(obj).__name__}", expected="one JSON object (a benchmark result)")
    return bench_arrays_frame(path, obj, source_format="vllm-bench", arrivals=arrivals, seed=seed, invalid=invalid)
