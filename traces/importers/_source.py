"""Opening a source file, and the small pieces every reader reports with.

A missing file, a folder or an unreadable file is one :class:`~traces.errors.TraceFormatError`;
``first_line`` and ``short_repr`` keep quoted messages and values short; ``MAX_INT64`` is the
range of a whole number in any format; ``Progress`` is the callback a reader feeds with bytes read.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..errors import TraceFormatError


#: Integers must lie in [-2**63, 2**63) (int64).
MAX_INT64 = 2 ** 63

#: Called with the number of bytes read since the last call (a progress bar's update).
Progress = Callable[[int], None]


def open_binary(path: Path):
    """``path`` opened for reading bytes; a missing file or a folder is a :class:`TraceFormatError`."""
    try:
        return open(path, "rb")
    except IsADirectoryError:
        raise TraceFormatError(path, "is a directory", expected="a file") from None
    except OSError as exc:
        raise TraceFormatError(path, f"cannot open ({exc.strerror or exc})") from None


def first_line(text: str, limit: int = 120) -> str:
    """The last non-blank line of a (library's) message, at most ``limit`` characters."""
    s = str(text).strip().splitlines()
    s = s[-1].strip() if s else ""
    return s[:limit]


def short_repr(value) -> str:
    """A number as text, at most 24 characters (a 400-digit integer is not repeated whole)."""
    text = repr(value)
    return text if len(text) <= 24 else f"{text[:10]}...{text[-4:]} ({len(text)} digits)"


def read_utf8_text(path: Path, expected: str, fold: bool = False) -> str:
    """The whole file as text (UTF-8, a BOM dropped).

    Raises
    ------
    TraceFormatError
        Missing or empty file (``expected`` says what it should hold), or not UTF-8 text.
    """
    with open_binary(path) as fh:
        raw = fh.read()
    if not raw.strip():
        raise TraceFormatError(path, "empty file", expected=expected)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise TraceFormatError(path, "is not UTF-8 text", expected=f"{expected} in UTF-8", fold=fold) from None
