"""Prose that fits a terminal: :data:`WIDTH` columns, long lines folded by :func:`wrap`.

It lives in ``schemas`` (the lowest package) so every message, errors among them, folds the
same way; :mod:`replay.text` (the console tables) re-exports it.
"""
from __future__ import annotations

import re
import textwrap

#: Columns of the default console output (``--wide`` lifts the limit for tables).
WIDTH = 100
#: Most columns :func:`wrap` leaves empty to break a line after a comma rather than at a space.
SLACK = WIDTH // 4


def wrap(text: str, width: int = WIDTH, indent: str = "  ") -> str:
    """Fold every line of ``text`` longer than ``width``; continuation lines indented.

    Lines are filled up to ``width``. They break after ``", "`` or ``"; "`` where that leaves
    the line at most :data:`SLACK` columns short (a setting or a count stays on one line),
    else at spaces.
    """
    out = []
    for line in text.splitlines() or [""]:
        if len(line) <= width:
            out.append(line)
            continue
        lead = line[:len(line) - len(line.lstrip())] + indent
        chunks = re.split(r"(?<=[,;]) ", line)
        folded = _fold(chunks[0], width, lead)
        out.extend(folded[:-1])
        cur = folded[-1]
        for chunk in chunks[1:]:
            if len(cur) + 1 + len(chunk) <= width:
                cur += " " + chunk
            elif width - len(cur) <= SLACK:  # break after the comma: the line is nearly full
                out.append(cur)
                folded = _fold(lead + chunk, width, lead)
                out.extend(folded[:-1])
                cur = folded[-1]
            else:
                # a break after the comma would leave the line short: fill it at spaces
                folded = _fold(cur + " " + chunk, width, lead)
                out.extend(folded[:-1])
                cur = folded[-1]
        out.append(cur)
    return "\n".join(out)


def _fold(line: str, width: int, lead: str) -> list[str]:
    if len(line) <= width:
        return [line]
    return textwrap.wrap(line, width, subsequent_indent=lead, break_long_words=False,
                         break_on_hyphens=False) or [line]


def wrap_error(message: str, prefix: str = "Error: ") -> str:
    """``message`` folded so that ``prefix + message`` (click's error line) fits :data:`WIDTH`."""
    return wrap(prefix + message)[len(prefix):]
