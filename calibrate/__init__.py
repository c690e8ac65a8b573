"""Fitting the cost model to measured traces (on top of everything else).

- ``step_fit``: least squares of step durations (step traces, kernel profiles).
- ``request_fit``: simulation in the loop on one or several request logs.
- ``runs``: request logs as runs (benchmarks of a sweep, time windows) and their errors.
- ``fitting``, ``identify``, ``summary``: the core both fits share (driver and variants;
  covariance and identifiability; the printer and the calibration file).
- ``cli``, ``demo``, ``umbrella``: ``calibrate``, ``servecal demo`` and ``servecal``.
"""
