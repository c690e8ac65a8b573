"""The simulator (imports ``schemas`` and ``traces``, never ``calibrate``).

- ``cost_terms``, ``cost_model``: the step time as terms folded into one model;
  ``kv_capacity``: KV blocks beside the weights.
- ``engine`` (with ``engine_config``, ``events``, ``step_end``, ``decode_runs``, ``spec_decode``,
  ``request``, ``kv_cache``, ``schedulers/``, ``routing``, ``closed_loop``, ``disagg``): the
  discrete-event engine, its policies (the contract: ``schedulers/base.py``) and its variants.
- ``config``: ``ReplayConfig``, the options of a replay, one checked part per concern;
  ``simulate``: ``replay_frame``, the library entry point; ``result_columns``: what it returns;
  ``sweep/``, ``parallel``, ``ray_tasks``: grids of replays on local processes or Ray.
- ``compare``, ``metrics``, ``queueing``, ``report/``, ``chrome_trace``: measured vs predicted,
  theory (Pollaczek-Khinchine), reports and timelines.
- ``cli/``: the ``replay`` command and its progress bars; ``text``: terminal output;
  ``progress``: where long work reports (a sink the command installs).
"""
