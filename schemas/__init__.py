"""The data contract, below everything else (imports nothing of servecal's).

- ``tables``, ``validate``: the Parquet tables (request_trace/1, step_trace/1,
  replay_result/1, vllm_stats/1), their schemas and the checks that name file, row, column.
- ``atomic``: output files renamed into place only on success (no pyarrow).
- ``cost_params``: the cost model's parameters, declared once (unit, range, default).
- ``metrics``: quantities derived from rows, defined once (a request's TPOT, a step's kind).
- ``status``: the status vocabulary (``ok``, ``failed: ...``, ``rejected: ...``, a request's
  states in a replay), named once.
- ``calibration``: the calibration file (calibration/3) that ``calibrate`` writes.
- ``spec_types``, ``gpu_types``, ``hf_config``, ``dtypes``, ``spec_catalog`` (re-exported by
  ``specs``):
  model, GPU and link specs, Hugging Face configs, the built-in catalog (``catalog/``).
- ``errors``: the error types (the command-line error mapping is
  :mod:`traces.cli.support`; the console scripts' Ctrl-C guard :mod:`traces.console`).
"""
