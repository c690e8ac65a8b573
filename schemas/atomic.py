"""Atomic output files: written beside their target and renamed into place only on success.

A failure or a Ctrl-C never leaves a partial or overwritten output; temporary files a killed
run left are removed; once a command's last declared output is in place, Ctrl-C waits for
the command to return. No pyarrow here, so writers of plain files (calibrations, reports,
Chrome traces) and the CLI's error handling can use it cheaply.
"""
from __future__ import annotations

import contextlib
import os
import re
import signal
import stat
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from .errors import OutputError


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str]):
    """Yield a temporary path beside ``path``; rename it to ``path`` only if the block succeeds.

    A failure (or an interrupt) never leaves a partial or overwritten output file. The
    result gets the usual permissions (0666 less the umask), not mkstemp's private 0600.
    Only a regular file or a new name is ever replaced (:func:`check_writable`, checked
    again just before the rename): never a device, FIFO, socket, folder or symbolic link.

    Examples
    --------
    >>> with atomic_output("plot.png") as tmp:          # doctest: +SKIP
    ...     fig.savefig(tmp, format="png")
    """
    path = Path(path)
    check_writable(path)
    remove_stale_temp_files(path.parent)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=TEMP_SUFFIX, dir=path.parent)
    except OSError as exc:
        raise OutputError(f"{path}: cannot write ({exc.strerror})") from None
    os.close(fd)
    try:
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        kind = not_a_regular_file(path)  # made meanwhile (a long run): still never replaced
        if kind:
            raise OutputError(f"{path}: {kind}")
        with _sigint_deferred() as pending:
            os.replace(tmp, path)
            last = _output_done(path)
        if pending and not last:
            raise KeyboardInterrupt
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise OutputError(f"{path}: cannot write ({exc.strerror or exc})") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


#: Suffix of the temporary files of :func:`atomic_output` (``.NAME.PID.XXXXXXXX.tmp``).
TEMP_SUFFIX = ".tmp"

_TEMP_RE = re.compile(r"^\..+?\.(?:(?P<pid>\d+)\.)?[a-z0-9_]{8}\.tmp$")

#: When this process started (its import of this module): older temp files are another run's.
_RUN_STARTED_S = time.time()


def remove_stale_temp_files(folder: str | os.PathLike[str]) -> list[str]:
    """Remove the temporary files a killed servecal run left in ``folder``; return their names.

    Only files named as :func:`atomic_output` names them (``.NAME.PID.XXXXXXXX.tmp``, or
    ``.NAME.XXXXXXXX.tmp`` of older versions), last modified before this run started, and
    whose process is gone (a running servecal process keeps its own). Nothing else is touched;
    a file that cannot be removed is left as it is.
    """
    removed: list[str] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for e in entries:
        m = _TEMP_RE.match(e.name)
        if m is None:
            continue
        try:
            if not e.is_file(follow_symlinks=False) or e.stat(follow_symlinks=False).st_mtime >= _RUN_STARTED_S:
                continue
            pid = m.group("pid")
            if pid is not None and int(pid) != os.getpid() and _alive(int(pid)):
                continue
            os.unlink(e.path)
            removed.append(e.name)
        except (OSError, ValueError):
            continue
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


#: Outputs of the running command that are still to be written (see :func:`expect_outputs`).
_expected: set[str] | None = None


def expect_outputs(paths) -> None:
    """Declare the outputs the running command will write (None: not tracked).

    Once the last of them is renamed into place, a Ctrl-C no longer aborts the command: its
    work is done, so the interrupt is deferred until the command returns and the command
    exits with its own code. Called by :func:`traces.cli.support.user_errors`.
    """
    global _expected
    _expected = None if paths is None else {os.path.realpath(p) for p in paths}


def _output_done(path) -> bool:
    """Record that ``path`` is in place; True when it was the command's last declared output."""
    if _expected is None:
        return False
    _expected.discard(os.path.realpath(path))
    if _expected:
        return False
    _hold_sigint()
    return True


#: the SIGINT handler :func:`_hold_sigint` replaced (None: not holding) and whether a Ctrl-C came meanwhile
_held: dict[str, Any] = {"handler": None, "pending": False}


def _hold_sigint() -> None:
    """From now on until :func:`release_sigint`, a Ctrl-C is recorded, not raised."""
    if _held["handler"] is not None or threading.current_thread() is not threading.main_thread():
        return
    def note(signum, frame):
        _held["pending"] = True
    try:
        _held["handler"] = signal.signal(signal.SIGINT, note)
    except (ValueError, TypeError):
        _held["handler"] = None


def release_sigint() -> bool:
    """Restore Ctrl-C after :func:`_hold_sigint`; return whether one arrived meanwhile."""
    h, pending = _held["handler"], _held["pending"]
    _held["handler"], _held["pending"] = None, False
    if h is not None:
        signal.signal(signal.SIGINT, h)
    return pending


@contextlib.contextmanager
def _sigint_deferred():
    """Hold Ctrl-C during the rename (yields a list that is non-empty if one arrived)."""
    pending: list = []
    if threading.current_thread() is not threading.main_thread():
        yield pending
        return
    def note(signum, frame):
        pending.append(signum)
    was_holding = _held["handler"] is not None  # an output written after the last declared one
    try:
        old = signal.signal(signal.SIGINT, note)
    except (ValueError, TypeError):
        yield pending
        return
    try:
        yield pending
    finally:
        if _held["handler"] is not None and not was_holding:  # the last output: keep holding, remember the original
            _held["handler"] = old
            _held["pending"] = _held["pending"] or bool(pending)
            pending.clear()
        else:
            signal.signal(signal.SIGINT, old)  # the original, or the hold's own handler
            if was_holding:
                _held["pending"] = _held["pending"] or bool(pending)
                pending.clear()


def check_writable(path: str | os.PathLike[str]) -> None:
    """Raise :class:`OutputError` unless ``path`` names a regular file (or a new name) in an
    existing, writable folder.

    Commands call it for every output before doing any work, so that a run with a bad
    second output does not replace its first one; :func:`atomic_output` calls it again
    before it writes. An existing path that is not a regular file is refused, whatever the
    user's rights (root included): a device (``/dev/null``), a FIFO, a socket or a folder
    would be replaced by the rename, and a symbolic link is never written through nor
    replaced (see :func:`not_a_regular_file`).
    """
    given, path = os.fspath(path), Path(path)  # messages name the path as given (``./out``)
    if not path.name:
        raise OutputError(f"{given}: is a directory; expected a file name")
    kind = not_a_regular_file(path)
    if kind:
        raise OutputError(f"{given}: {kind}")
    parent = path.parent
    if not parent.is_dir():
        raise OutputError(f"{given}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"{given}: folder {parent} is not writable")


#: What an existing output path that is not a regular file is, by its ``stat.S_IFMT`` type.
_FILE_KINDS = {stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device", stat.S_IFIFO: "a FIFO (named pipe)",
               stat.S_IFSOCK: "a socket"}


def not_a_regular_file(path: str | os.PathLike[str]) -> str | None:
    """Why an output may not be written at ``path`` ("is a directory; ...", "is a symbolic
    link to ...; ...", "is a character device; ..."), or None when ``path`` is a regular
    file or does not exist. The path itself is looked at (``lstat``), never what a link
    points to; a path that cannot be looked at (a folder without search rights) is None
    here, refused by the folder checks of :func:`check_writable`.
    """
    try:
        mode = os.lstat(path).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a directory; expected a file name"
    if stat.S_ISLNK(mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        return f"is a symbolic link to {target}; expected a regular file or a new name, never a link"
    kind = _FILE_KINDS.get(stat.S_IFMT(mode), "a special file")
    return f"is {kind}; expected a regular file or a new name"


def write_text_atomic(text: str, path: str | os.PathLike[str]) -> None:
    """Write ``text`` atomically (see :func:`atomic_output`)."""
    with atomic_output(path) as tmp:
        Path(tmp).write_text(text)
