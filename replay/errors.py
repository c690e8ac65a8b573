"""Errors of the simulator: bad options, bad calibration files, impossible configurations."""
from __future__ import annotations


class ReplayError(Exception):
    """Base class of replay errors; the CLI prints the message and exits 1 (or 2 for options)."""


class ConfigError(ReplayError, ValueError):
    """An option or a combination of options cannot be simulated (names the option).

    Attributes
    ----------
    options : tuple of str
        The settings at fault, by parameter name (``"pp"``, ``"pp_prefill"``), when known: a
        CLI that took some settings from a file blames the options alone (exit 2) when every
        one of these was typed (:func:`replay.cli.engine_settings.taken_settings_checked`).
    """

    def __init__(self, message: str = "", options: tuple = ()):
        super().__init__(message)
        self.options = tuple(options)


class TimeseriesError(ReplayError):
    """A measured time-series file is unreadable or lacks a column (names file, column, row)."""


class CalibrationFileError(ReplayError):
    """A calibration JSON is missing, malformed or of an unknown version (names the file)."""


class OptionError(ConfigError):
    """One option's value is outside its domain.

    Attributes
    ----------
    option : str
        The option as the command line spells it (``--max-num-seqs``).
    value
        The value given.
    expected : str
        What the option accepts (``>= 1``, ``in [0, 1]``).

    The message reads ``<option> must be <expected>, not <value>``.
    """

    def __init__(self, option: str, value, expected: str):
        self.option, self.value, self.expected = option, value, expected
        super().__init__(f"{option} must be {expected}, not {value}")

    def __reduce__(self):  # picklable (sweep points fail in worker processes)
        return type(self), (self.option, self.value, self.expected)
