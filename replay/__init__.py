"""The simulator (imports ``schemas`` and ``traces``, never ``calibrate``).

Top to bottom (each part imports only the parts below it; checked by ``lint-imports``):

- ``cli/``: the ``replay`` command, ``servecal plan`` and their progress bars; ``console``: the
  ``replay`` console script (the command under the Ctrl-C guard of ``traces.console``).
- ``report/``: the HTML/Markdown report; ``plan/``: the deployment planner; ``sweep/``: grids of replays.
- ``analysis/``: what a replay's result means: measured vs predicted (``compare``, ``whatif_table``),
  latency metrics, queueing theory (Pollaczek-Khinchine), prediction bands (``bands``,
  ``band_tables``), the Chrome trace, the KV capacity read from a log.
- ``simulate``: the library entry points: :func:`run` (``replay.run``: a trace file or frame with a
  calibration) and ``replay_frame`` (a frame with a cost model).
- ``core/``: the discrete-event engine (``engine`` with ``engine_config``, ``events``,
  ``step_end``, ``decode_runs``, ``spec_decode``, ``request``, ``kv_cache``, ``routing``), its
  variants (``pipeline``, ``disagg`` with ``disagg_pools``, ``closed_loop``), the deployment it
  is built from (``deployment``: pools, TP/PP/DP, KV blocks, link, resolved once) and the tables
  it returns (``result_columns``); ``schedulers/``: its policies (the contract: ``schedulers/base.py``);
  ``config``: ``ReplayConfig``, the options of a replay, one checked part per concern.
- ``cost/``: the step time: terms (``cost_terms``) folded into one model (``cost_model``)
  evaluated by one expression (``step_time``); KV blocks beside the weights (``kv_capacity``).
- Leaves every part uses: ``errors``; ``progress`` (where long work reports: a sink the
  command installs); ``text`` (terminal output); ``parallel``, ``ray_tasks`` (local processes
  or a Ray cluster running independent tasks).
"""


def __getattr__(name: str):
    """``replay.run`` (:func:`replay.simulate.run`), imported at its first use: numpy and pandas
    are not for ``replay --help``."""
    if name == "run":
        from .simulate import run

        return run
    raise AttributeError(f"module 'replay' has no attribute {name!r}")
