"""Reading JSON documents and JSON Lines files, and checking one JSON number."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Iterator

from ..errors import TraceFormatError
from ._source import MAX_INT64, Progress, first_line, open_binary, read_utf8_text, short_repr


def read_json(path: str | os.PathLike):
    """Load one JSON document.

    Raises
    ------
    TraceFormatError
        Missing or empty file, not UTF-8, or invalid JSON (naming the line).
    """
    text = read_utf8_text(Path(path), "a JSON document", fold=True)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(path, f"not valid JSON ({exc.msg})", line=exc.lineno,
                               expected="one complete JSON document", fold=True) from None
    except RecursionError:
        raise TraceFormatError(path, "JSON nested too deeply", expected="a JSON document nested at most a few hundred "
                                                                        "levels", fold=True) from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise TraceFormatError(path, f"not valid JSON ({first_line(exc)})",
                               expected="numbers of ordinary size", fold=True) from None


def iter_jsonl(path: str | os.PathLike, progress: Progress | None = None) -> Iterator[tuple[int, int, dict]]:
    """Yield ``(row, line, object)`` for each non-blank line of a JSON Lines file.

    Raises
    ------
    TraceFormatError
        Missing file, a line that is not one complete JSON object (e.g. truncated), not UTF-8.
    """
    path = Path(path)
    fh = open_binary(path)
    row = 0
    with fh:
        for lineno, raw in enumerate(fh, start=1):
            if progress is not None:
                progress(len(raw))
            if not raw.strip():
                continue
            row += 1
            try:
                obj = json.loads(raw.decode("utf-8-sig" if lineno == 1 else "utf-8"))
            except UnicodeDecodeError:
                raise TraceFormatError(path, "is not UTF-8 text", row=row, line=lineno) from None
            except json.JSONDecodeError as exc:
                raise TraceFormatError(path, f"not valid JSON ({exc.msg})", row=row, line=lineno,
                                       expected="one complete JSON object per line") from None
            except RecursionError:
                raise TraceFormatError(path, "JSON nested too deeply", row=row, line=lineno,
                                       expected="one flat JSON object per line") from None
            except ValueError as exc:  # e.g. an integer of more than 4300 digits
                raise TraceFormatError(path, f"not valid JSON ({first_line(exc)})", row=row, line=lineno,
                                       expected="numbers of ordinary size") from None
            if not isinstance(obj, dict):
                raise TraceFormatError(path, f"is a JSON {type(obj).__name__}, not an object", row=row, line=lineno)
            yield row, lineno, obj


def json_number(path, value, *, column: str, row: int | None = None, line: int | None = None,
                integer: bool = False, minimum: float | None = None, maximum: float | None = None):
    """Check one JSON value: a finite number (whole if ``integer``), at least ``minimum``, at most ``maximum``.

    Returns the value as int (``integer``) or float.

    Raises
    ------
    TraceFormatError
        Naming row, line and column: null, a string, a bool, NaN/inf, a fraction, too small.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TraceFormatError(path, f"value {value!r:.40} is not a number", row=row, line=line, column=column)
    if isinstance(value, float) and not math.isfinite(value):
        raise TraceFormatError(path, f"value {value!r} is not finite", row=row, line=line, column=column)
    if isinstance(value, int) and not -MAX_INT64 <= value < MAX_INT64:
        raise TraceFormatError(path, f"value {short_repr(value)} is out of range", row=row, line=line, column=column,
                               expected="a 64-bit integer")
    if integer:
        if value != int(value):
            raise TraceFormatError(path, f"value {value!r} is not a whole number", row=row, line=line, column=column)
        value = int(value)
        if not -MAX_INT64 <= value < MAX_INT64:  # e.g. 1e300 written as a float
            raise TraceFormatError(path, f"value {short_repr(value)} is out of range", row=row, line=line,
                                   column=column, expected="a 64-bit integer")
    else:
        try:
            value = float(value)
        except OverflowError:
            raise TraceFormatError(path, f"value {short_repr(value)} is out of range", row=row, line=line,
                                   column=column, expected="a finite number") from None
    if minimum is not None and value < minimum:
        raise TraceFormatError(path, f"value {value!r} is below {minimum:g}", row=row, line=line, column=column,
                               expected=f">= {minimum:g}")
    if maximum is not None and value > maximum:
        raise TraceFormatError(path, f"value {short_repr(value)} is above {maximum:g}", row=row, line=line,
                               column=column, expected=f"<= {maximum:g}")
    return value
