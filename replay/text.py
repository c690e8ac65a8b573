"""Plain-text output that fits a terminal: tables of at most :data:`WIDTH` columns, wrapped notes.

Console tables print a readable subset of their columns by default (``--wide`` prints every
column); :func:`render_table` drops the least important columns left, then shortens the
first column's labels, until the table fits. :func:`wrap` folds long prose lines.
"""
from __future__ import annotations

from schemas.text import WIDTH, wrap

__all__ = ["WIDTH", "render_table", "shorten", "wrap"]

_GAP = "  "


def _width(head: list[str], rows: list[list[str]], keep: list[int]) -> int:
    widths = [max(len(head[i]), *(len(r[i]) for r in rows)) if rows else len(head[i]) for i in keep]
    return sum(widths) + len(_GAP) * (len(widths) - 1)


def render_table(head: list[str], rows: list[list[str]], max_width: int | None = None,
                 drop_order: tuple[str, ...] = (), key: int = 0) -> str:
    """Right-aligned columns separated by two spaces.

    Parameters
    ----------
    head : list of str
        Column names.
    rows : list of list of str
        Cells, one list per row, as long as ``head``.
    max_width : int, optional
        Most characters per line (None: no limit). Columns named in ``drop_order`` are
        dropped, in that order, while the table is wider; then the first column's cells
        are shortened (``..`` in the middle).
    drop_order : tuple of str
        Names of columns that may be dropped, least important first.
    key : int
        When more than 0 and the table is still wider than ``max_width`` once the columns of
        ``drop_order`` are gone, it is printed as several tables, one under the other (a
        blank line between), each with the first ``key`` columns and as many of the others,
        in order, as fit.

    Returns
    -------
    str
        The header line and one line per row, no trailing newline.
    """
    keep = list(range(len(head)))
    if max_width is not None:
        for name in drop_order:
            if _width(head, rows, keep) <= max_width:
                break
            if name in head and head.index(name) in keep:
                keep.remove(head.index(name))
        over = _width(head, rows, keep) - max_width
        if over > 0 and 0 < key < len(keep) - 1:
            blocks: list[list[int]] = [[]]
            for i in keep[key:]:
                if blocks[-1] and _width(head, rows, keep[:key] + blocks[-1] + [i]) > max_width:
                    blocks.append([])
                blocks[-1].append(i)
            if len(blocks) > 1:
                return "\n\n".join(render_table([head[i] for i in keep[:key] + b],
                                                 [[r[i] for i in keep[:key] + b] for r in rows], max_width)
                                    for b in blocks)
        if over > 0 and rows:
            first = max(len(head[0]), *(len(r[0]) for r in rows))
            limit = max(len(head[0]), first - over, 6)
            rows = [[shorten(r[0], limit)] + r[1:] for r in rows]
    head = [head[i] for i in keep]
    rows = [[r[i] for i in keep] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    fmt = _GAP.join(f"{{:>{w}}}" for w in widths)
    return "\n".join([fmt.format(*head)] + [fmt.format(*r) for r in rows])


def shorten(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, ``..`` standing for its middle."""
    if len(text) <= limit:
        return text
    tail = (limit - 2) // 2
    return text[:limit - 2 - tail] + ".." + (text[-tail:] if tail else "")
