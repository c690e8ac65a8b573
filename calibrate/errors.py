"""Errors of calibration: data that cannot be fitted, bad options."""
from __future__ import annotations


class CalibrationError(Exception):
    """Base class; the CLI prints the message and exits 1."""


class FitError(CalibrationError):
    """The data cannot support a fit (too few usable rows, no variation, solver failure)."""
