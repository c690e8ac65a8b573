"""Errors of the simulator: bad options, bad calibration files, impossible configurations."""
from __future__ import annotations


class ReplayError(Exception):
    """Base class of replay errors; the CLI prints the message and exits 1 (or 2 for options)."""


class ConfigError(ReplayError, ValueError):
    """An option or a combination of options cannot be simulated (names the option)."""


class CalibrationFileError(ReplayError):
    """A calibration JSON is missing, malformed or of an unknown version (names the file)."""
