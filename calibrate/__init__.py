"""Fitting the cost model to measured traces (on top of everything else).

- ``step_fit``: least squares of step durations (step traces, kernel profiles).
- ``request_fit``: simulation in the loop on one or several request logs.
- ``runs``: request logs as runs (benchmarks of a sweep, time windows) and their errors.
- ``fitting``, ``identify``, ``summary``: the core both fits share (driver and variants;
  covariance and identifiability; the printer and the calibration file).
- ``traces_fit``: :func:`fit_traces` (``calibrate.fit_traces``), the fit of ``calibrate fit``
  as a library call (the command prints around it).
- ``advise`` (with ``advise_candidates``, ``advise_design``, ``advise_commands``, ``advise_cli``): which
  benchmark run to measure next (``calibrate advise``).
- ``cli``, ``demo``, ``umbrella``: ``calibrate``, ``servecal demo`` and ``servecal``;
  ``console``: the ``servecal``, ``traces`` and ``calibrate`` console scripts.
"""


def __getattr__(name: str):
    """``calibrate.fit_traces`` (:func:`calibrate.traces_fit.fit_traces`), imported at its first
    use: ``servecal --help`` loads this package."""
    if name == "fit_traces":
        from .traces_fit import fit_traces

        return fit_traces
    raise AttributeError(f"module 'calibrate' has no attribute {name!r}")
