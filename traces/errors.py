"""Errors of the ``traces`` package.

Every problem with a user's trace or profile file is a :class:`TraceError`; the CLI maps
it to one message and exit code 1 (invalid data) without a traceback.
"""
from __future__ import annotations

import os

from schemas.text import wrap_error


class TraceError(Exception):
    """Base of trace errors."""


class TraceFormatError(TraceError):
    """A trace or profile file breaks a rule of its format.

    The message reads ``"<path>[, row R][ (line L)][, column 'c']: <rule>[; expected <expected>]"``.

    Parameters
    ----------
    path : str or os.PathLike
        The offending file (or folder).
    rule : str
        What is wrong, in a few words.
    row : int, optional
        1-based data row (header excluded), when the problem is in one row.
    column : str, optional
        The offending column.
    expected : str, optional
        What a valid value or file would look like.
    line : int, optional
        1-based line of the file (the header is line 1), keyword only.
    fold : bool, optional
        Fold the message so that ``Error: <message>`` fits 100 columns (keyword only): for
        a message that can be long (a parser's reason, a long ``expected``). Not the default,
        so that a caller matching ``"<path>, line L: <rule>"`` finds it on one line.

    Attributes
    ----------
    path, rule, row, column, expected, line
        The parameters, kept for callers that format their own messages.
    """

    def __init__(
        self,
        path: "str | os.PathLike",
        rule: str,
        row: int | None = None,
        column: str | None = None,
        expected: str | None = None,
        *,
        line: int | None = None,
        fold: bool = False,
    ):
        self.path = str(path)
        self.rule = rule
        self.row = row
        self.column = column
        self.expected = expected
        self.line = line
        where = self.path
        if row is not None:
            where += f", row {row}"
            if line is not None:
                where += f" (line {line})"
        elif line is not None:
            where += f", line {line}"
        if column is not None:
            where += f", column '{column}'"
        msg = f"{where}: {rule}"
        if expected:
            msg += f"; expected {expected}"
        super().__init__(wrap_error(msg) if fold else msg)


class DistError(TraceError):
    """A length distribution spec (``traces synth --prompt-tokens``) cannot be parsed."""


class MappingError(TraceError):
    """A ``--map`` option of ``traces import csv`` is malformed or names an unknown field (a usage error)."""
