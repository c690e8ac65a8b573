"""Import SGLang's ``bench_serving`` output (JSON Lines, one benchmark run per line).

Format (sgl-project/sglang ``python/sglang/bench_serving.py``, ``--output-file``): every
run *appends* one JSON object to the file. With ``--output-details`` the object also holds
per-request arrays in send order, the layout SGLang adapted from vLLM's benchmark::

    {"backend": "sglang", "dataset_name": ..., "request_rate": 8.0, "max_concurrency": null,
     "duration": ..., "completed": ..., "mean_ttft_ms": ..., ...,
     "input_lens": [...], "output_lens": [...], "ttfts": [...], "itls": [[...], ...],
     "generated_texts": [...], "errors": ["", ...]}

A failed request has a non-empty ``errors`` entry and ``output_lens`` 0. ``output_lens``
holds the server's completion token count (``usage.completion_tokens`` when streamed), not
the re-tokenised one. Arrivals are Poisson (exponential gaps) at ``request_rate``; the
per-request send time is not saved (newer versions add ``start_times``, ``latencies`` and
``successes``, which are used when present).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..errors import TraceFormatError
from ._bench_arrays import bench_arrays_frame
from ._json import iter_jsonl

__all__ = ["import_sglang_bench"]


def import_sglang_bench(path: str | Path, run: int | None = None, arrivals: str = "auto", seed: int = 0,
                        invalid: str = "error") -> tuple[pd.DataFrame, dict]:
    """Read one run of an SGLang ``bench_serving`` JSONL output file.

    Parameters
    ----------
    path : str or Path
    run : int, optional
        1-based record (run) of the file to read; needed when several runs hold
        per-request arrays.
    arrivals, seed, invalid
        As in :func:`traces.importers.vllm_bench.import_vllm_bench`; ``synth`` draws
        exponential gaps unless the run records a ``burstiness``.

    Returns
    -------
    frame, metadata
        As for vLLM's result (``metadata['run']`` names the record read).

    Raises
    ------
    TraceFormatError
        A truncated or non-JSON line; no run with per-request arrays (saved without
        ``--output-details``); several such runs and no ``run``; ``run`` out of range;
        every error of :func:`~traces.importers._bench_arrays.bench_arrays_frame`.
    """
    path = Path(path)
    records = list(iter_jsonl(path))
    if not records:
        raise TraceFormatError(path, "has no runs", expected="one JSON object per line")
    if run is not None:
        if not 1 <= run <= len(records):
            raise TraceFormatError(path, f"has {len(records)} run(s); --run {run} is out of range",
                                   expected=f"1..{len(records)}")
        chosen = records[run - 1]
    else:
        detailed = [r for r in records if "input_lens" in r[2]]
        if not detailed:
            raise TraceFormatError(path, "has no run with per-request arrays", column="input_lens",
                                   expected="a run saved with --output-details")
        if len(detailed) > 1:
            rates = ", ".join(f"{r[0]}: request_rate={r[2].get('request_rate')}" for r in detailed)
            raise TraceFormatError(path, f"has {len(detailed)} runs with per-request arrays ({rates})",
                                   expected="--run N to pick one")
        chosen = detailed[0]
    row, line, obj = chosen
    df, meta = bench_arrays_frame(path, obj, source_format="sglang-bench", arrivals=arrivals, seed=seed,
                                  invalid=invalid, row_offset_line=line)
    meta["run"] = str(row)
    return df, meta
