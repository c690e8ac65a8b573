"""The simulator (imports ``schemas`` and ``traces``, never ``calibrate``).

Top to bottom (each part imports only the parts below it; checked by ``lint-imports``):

- ``cli/``: the ``replay`` command, ``replay plan`` and their progress bars.
- ``report/``: the HTML/Markdown report; ``plan/``: the deployment planner; ``sweep/``: grids of replays.
- ``analysis/``: what a replay's result means: measured vs predicted (``compare``, ``whatif_table``),
  latency metrics, queueing theory (Pollaczek-Khinchine), prediction bands (``bands``,
  ``band_tables``), the Chrome trace, the KV capacity read from a log.
- ``simulate``: ``replay_frame``, the library entry point.
- ``core/``: the discrete-event engine (``engine`` with ``engine_config``, ``events``,
  ``step_end``, ``decode_runs``, ``spec_decode``, ``request``, ``kv_cache``, ``routing``), its
  variants (``pipeline``, ``disagg``, ``closed_loop``) and the tables it returns
  (``result_columns``); ``schedulers/``: its policies (the contract: ``schedulers/base.py``);
  ``config``: ``ReplayConfig``, the options of a replay, one checked part per concern.
- ``cost/``: the step time: terms (``cost_terms``) folded into one model (``cost_model``)
  evaluated by one expression (``step_time``); KV blocks beside the weights (``kv_capacity``).
- Leaves every part uses: ``errors``; ``progress`` (where long work reports: a sink the
  command installs); ``text`` (terminal output); ``parallel``, ``ray_tasks`` (local processes
  or a Ray cluster running independent tasks).
"""
