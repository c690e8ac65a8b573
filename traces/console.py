"""The Ctrl-C guard of the console scripts (``traces``, ``replay``, ``calibrate``, ``servecal``).

A console script runs ``from <module> import <func>; sys.exit(<func>())``. Pointing it at the
click groups directly leaves two gaps: a Ctrl-C during the second or so of start-up imports
(numpy, pandas, pyarrow, scipy, lmfit) prints a ``KeyboardInterrupt`` traceback, and click
maps a Ctrl-C to "Aborted!" with exit code 1, the code of invalid data. Each layer's entry
(``replay.console.main``; ``calibrate.console.servecal``, ``traces`` and ``calibrate``) imports
this module first, which imports nothing heavy and holds a Ctrl-C from its first line, and
passes :func:`run` a function that imports its own command when called (a direct reference,
resolved inside the layer that owns the command). :func:`run` maps:

* Ctrl-C at any moment -> one line on stderr, exit code 130 (128 + SIGINT), no traceback;
  an output not yet renamed into place is never left behind (:func:`schemas.atomic.atomic_output`);
* a Ctrl-C after the command's last output was renamed into place is deferred: the command
  finishes and exits with its own code (its work is complete; see
  :func:`schemas.atomic.atomic_output` and :func:`traces.cli.support.user_errors`);
* numerical RuntimeWarnings of numpy and the fitting libraries (``invalid value encountered
  in divide``, ``Mean of empty slice``, ...) are not printed: the data rules are checked by
  validation, which names the file and row; such warnings only repeat an arithmetic detail.
  The filter (:func:`schemas.quiet.quiet_warnings`) is passed on to worker processes through
  ``PYTHONWARNINGS``.

It sits in ``traces`` (the lowest package with a CLI) beside ``cli/``, not in it: importing
``traces.cli`` runs the ``traces`` group's imports (click and the commands), which would come
before the first line here and widen the start-up window in which a Ctrl-C is a traceback.
Not in ``schemas``: it maps click's exceptions, and the data layer imports no click.
"""
from __future__ import annotations

import os
import signal
import sys
from typing import TYPE_CHECKING, Callable

from schemas.quiet import quiet_warnings

if TYPE_CHECKING:
    import click

#: Exit code of a command interrupted by Ctrl-C (the shell's 128 + SIGINT).
EXIT_INTERRUPTED = 130
#: Ctrl-C that arrived while this module was being imported by a console script.
_pending: list = []


def _defer(signum, frame):
    _pending.append(signum)


def _started_as_console_script() -> bool:
    main = sys.modules.get("__main__")
    name = os.path.basename(getattr(main, "__file__", "") or "")
    return name.split(".")[0] in ("traces", "replay", "calibrate", "servecal")


# From the first line a console script runs, until run() takes over: a Ctrl-C is noted, not
# raised. (Before this line, the interpreter's own start-up handles it: a death by SIGINT.)
if _started_as_console_script() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _defer)

def _interrupted() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C while reporting changes nothing
    try:
        sys.stderr.write("\nAborted (interrupted): no partial output was left behind.\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    return EXIT_INTERRUPTED


def _invoke(load: Callable[[], "click.Command"]) -> int:
    quiet_warnings()
    cmd = load()
    import click

    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else None
    try:
        rv = cmd.main(args=sys.argv[1:], prog_name=prog, standalone_mode=False)
    except click.exceptions.Abort as exc:
        if isinstance(exc.__cause__, KeyboardInterrupt) or isinstance(exc.__context__, KeyboardInterrupt):
            return _interrupted()
        click.echo("Aborted!", err=True)
        return 1
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    # standalone_mode=False returns ctx.exit()'s code, or the command's return value (None)
    return rv if isinstance(rv, int) and not isinstance(rv, bool) else 0


def run(load: Callable[[], "click.Command"]) -> "None":
    """Run the click command ``load()`` returns as the process and exit with its code.

    ``load`` imports the command when called (after the guard took over), so a Ctrl-C during
    those imports is exit 130 too."""
    try:
        if signal.getsignal(signal.SIGINT) is _defer:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if _pending:
            raise KeyboardInterrupt
        code = _invoke(load)
    except SystemExit as exc:  # a command's own exit code (e.g. replay's 3 for a broken tolerance)
        code = exc.code
    except KeyboardInterrupt:
        code = _interrupted()
    # a Ctrl-C while the interpreter shuts down (buffers flushed, pools joined) must not print
    # a traceback either: the command is over and its exit code decided
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    sys.exit(code)

