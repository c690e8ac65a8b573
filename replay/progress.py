"""Progress of long work, reported to a sink a front end installs (nothing is drawn here).

Code that does long work (a large replay, a sweep, a big Chrome trace) asks :func:`bar` for
a :class:`Progress` and gets None when no sink is installed, or when the sink declines (a
terminal shows one bar at a time), so it pays nothing then. A front end installs its sink
for a block with :func:`reporting_to`; the ``replay`` command's sink draws bars on stderr
(:mod:`replay.cli.progress`):

>>> with reporting_to(sink):                   # the front end
...     b = bar("replaying", total=1_000_000)  # the engine
...     ...; b.update(1024); ...; b.close()
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Protocol


class Progress(Protocol):
    """What long work reports to: steps done, then the end."""

    def update(self, n: int = 1) -> None:
        """``n`` more steps done."""

    def close(self) -> None:
        """The work is over (whether or not every step was reported)."""


#: A sink: ``sink(label, total)`` -> a :class:`Progress` for ``total`` steps of work, or None.
Sink = Callable[[str, int], "Progress | None"]

_sink: Sink | None = None


@contextlib.contextmanager
def reporting_to(sink: Sink | None):
    """Report the block's long work to ``sink`` (None: to nothing)."""
    global _sink
    before, _sink = _sink, sink
    try:
        yield
    finally:
        _sink = before


def bar(label: str, total: int) -> Progress | None:
    """A :class:`Progress` for ``total`` steps of work, or None when nothing is reported."""
    if _sink is None or total <= 0:
        return None
    return _sink(label, total)


@contextlib.contextmanager
def optional_bar(label: str, total: int):
    """:func:`bar` as a context manager; yields the progress or None, closes it at the end."""
    b = bar(label, total)
    try:
        yield b
    finally:
        if b is not None:
            b.close()


def counting_calls(fn, progress: Progress, every: int = 1):
    """``fn`` that reports one step of ``progress`` per call, ``every`` calls at a time."""
    count = 0

    def counted(*args) -> None:
        nonlocal count
        fn(*args)
        count += 1
        if count == every:
            progress.update(count)
            count = 0
    return counted


def counting_items(fn, progress: Progress, arg: int = 0):
    """``fn`` that reports as many steps of ``progress`` per call as its argument ``arg`` holds."""
    def counted(*args) -> None:
        fn(*args)
        progress.update(len(args[arg]))
    return counted
