"""The ``servecal``, ``traces`` and ``calibrate`` console scripts: their commands under the
Ctrl-C guard (:mod:`traces.console`, imported first: it holds a Ctrl-C from its first line).

``traces`` is the group :mod:`calibrate.umbrella` builds (``traces describe`` with the replay's
``--calibration`` view), the one ``servecal traces`` runs."""
from __future__ import annotations

from traces.console import run


def servecal() -> None:
    """``servecal``: every command, nested."""
    run(_servecal)


def traces() -> None:
    """``traces``."""
    run(_traces)


def calibrate() -> None:
    """``calibrate``."""
    run(_calibrate)


def _servecal():
    from .umbrella import main

    return main


def _traces():
    from .umbrella import traces_cli

    return traces_cli


def _calibrate():
    from .cli import main

    return main
