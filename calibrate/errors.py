"""Errors of calibration: data that cannot be fitted, bad options."""
from __future__ import annotations


class CalibrationError(Exception):
    """Base class; the CLI prints the message and exits 1."""


class FitError(CalibrationError):
    """The data cannot support a fit (too few usable rows, no variation, solver failure)."""


class RunSpecError(CalibrationError, ValueError):
    """A run named on the command line (``FILE[#K][@START:END]``) that cannot be parsed: a
    usage error (the CLI exits 2)."""
