"""The ``replay`` console script: ``replay``'s command under the Ctrl-C guard
(:mod:`traces.console`, imported first: it holds a Ctrl-C from its first line)."""
from __future__ import annotations

from traces.console import run


def main() -> None:
    """``replay``."""
    run(_command)


def _command():
    """The command, imported when the script runs (after the guard)."""
    from .cli import main as command

    return command
