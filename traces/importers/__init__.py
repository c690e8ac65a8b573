"""One module per source format, each returning ``(frame, metadata)`` of a ``request_trace/1``
(or ``step_trace/1``, ``vllm_stats/1``) table, on helpers that know no format:

- ``_source``: opening a file, ``Progress``, short messages; ``_rows``: row status
  (ok / failed / invalid, the ``--invalid`` policy) and errors naming row and line;
- ``_csv``, ``_json``: reading CSV (streamed in Arrow batches) and JSON / JSON Lines;
- ``_time``: source clocks to seconds; ``_frame``: the sorted output frame;
- ``_bench_arrays``: the per-request-array result JSON of vllm_bench and sglang_bench;
- ``blis_header``: the YAML header of a BLIS TraceV2/v3 trace, for ``blis_observe``;
  ``block_hashes``: prefix-cache block hashes derived from prompt text (GuideLLM).
"""
