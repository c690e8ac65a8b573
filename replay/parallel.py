"""Local worker processes that a Ctrl-C stops cleanly.

A Ctrl-C in a terminal reaches every process of the foreground group: the workers of a
``concurrent.futures`` or ``multiprocessing`` pool each print a ``KeyboardInterrupt``
traceback (during their start-up imports, or in the middle of a task) before the parent
reports anything. :func:`map_in_processes` starts its workers with SIGINT ignored (the
disposition is inherited through ``exec``, and Python keeps an inherited "ignore"), so only
the parent sees the interrupt; it then terminates the workers and lets the interrupt go on
(the console scripts exit with 130, see :mod:`traces.console`).
"""
from __future__ import annotations

import contextlib
import signal
import threading


def _init(initializer, initargs):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from schemas.quiet import quiet_warnings

    quiet_warnings()
    if initializer is not None:
        initializer(*initargs)


@contextlib.contextmanager
def worker_pool(workers: int, initializer=None, initargs: tuple = ()):
    """``workers`` spawned processes that ignore Ctrl-C, for the body; yields
    ``map(fn, items, done=None) -> list`` (in order; ``done(1)`` as each result arrives).

    On an exception or Ctrl-C in the parent the workers are terminated, else closed.
    """
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    main = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        pool = ctx.Pool(workers, initializer=_init, initargs=(initializer, initargs))
    finally:
        if main:
            signal.signal(signal.SIGINT, old)

    def mapper(fn, items, done=None) -> list:
        out = []
        for r in pool.imap(fn, list(items), chunksize=1):
            out.append(r)
            if done is not None:
                done(1)
        return out

    ok = False
    try:
        yield mapper
        ok = True
    finally:
        if ok:
            pool.close()
        else:
            pool.terminate()
        pool.join()


def map_in_processes(fn, items, workers: int, initializer=None, initargs: tuple = (), done=None) -> list:
    """``[fn(x) for x in items]`` on ``workers`` spawned processes that ignore Ctrl-C, in order
    (:func:`worker_pool`).

    Parameters
    ----------
    fn : callable
        A module-level function (pickled by reference).
    items : sequence
    workers : int
    initializer, initargs
        Run once in each worker before its first task.
    done : callable, optional
        Called with 1 as each result arrives (a progress bar's ``update``).

    Raises
    ------
    Exception
        The first task's exception, as the serial loop would raise it.
    KeyboardInterrupt
        On Ctrl-C, after the workers were terminated.
    """
    with worker_pool(workers, initializer, initargs) as mapper:
        return mapper(fn, items, done)
