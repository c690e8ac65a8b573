"""Progress bars on stderr: the sink the commands install for the library's long work.

A command turns them on for the work it runs with :func:`reporting` (off with ``--quiet``,
and always off when stderr is not a terminal, so pipes, files and tests see nothing); the
library asks for them through :func:`replay.progress.bar`, which reaches :func:`bar` here.

A bar appears only once its work has run for :data:`DELAY_S` (short work prints nothing),
redraws at most every :data:`REDRAW_S`, and only one bar is shown at a time: a bar asked
for while another is open (the replays of a sweep's points) is None.
"""
from __future__ import annotations

import contextlib
import sys
import time

import click

from ..progress import reporting_to

#: Seconds of work before a bar is drawn.
DELAY_S = 0.5
#: Least seconds between two redraws.
REDRAW_S = 0.2

_stream = None  # the terminal bars go to, while reporting
_open = False  # a bar is shown


@contextlib.contextmanager
def reporting(enabled: bool = True, stream=None):
    """Turn progress bars on for the block when ``enabled`` and ``stream`` (default stderr) is a terminal."""
    global _stream
    stream = sys.stderr if stream is None else stream
    before = _stream
    tty = bool(getattr(stream, "isatty", lambda: False)())
    _stream = stream if enabled and tty else None
    try:
        with reporting_to(bar if _stream is not None else None):
            yield
    finally:
        _stream = before


def active() -> bool:
    """Whether bars are on (a :func:`reporting` block with a terminal)."""
    return _stream is not None


def bar(label: str, total: int) -> "Bar | None":
    """A bar for ``total`` steps of work, or None when bars are off or another is open."""
    global _open
    if _stream is None or _open or total <= 0:
        return None
    _open = True
    return Bar(label, total, _stream)


class Bar:
    """One progress bar (click's), drawn on ``stream`` once the work has lasted :data:`DELAY_S`
    (a :class:`replay.progress.Progress`)."""

    def __init__(self, label: str, total: int, stream):
        self.label, self.total, self.stream = label, int(total), stream
        self.done = 0
        self._shown = 0
        self._t0 = self._last = time.monotonic()
        self._bar = None

    def update(self, n: int = 1) -> None:
        """``n`` more steps done."""
        self.done += n
        now = time.monotonic()
        if now - self._last < REDRAW_S or now - self._t0 < DELAY_S:
            return
        self._last = now
        if self._bar is None:
            self._bar = click.progressbar(length=self.total, label=self.label, file=self.stream, show_pos=False,
                                          show_eta=True, width=24)
            self._bar.__enter__()
        self._bar.update(min(self.done, self.total) - self._shown)
        self._shown = min(self.done, self.total)

    def close(self) -> None:
        """The work is over: finish the line of a drawn bar; release the slot."""
        global _open
        if self._bar is not None:
            self._bar.update(self.total - self._shown)  # the work is over
            self._bar.__exit__(None, None, None)
            self._bar = None
        _open = False
