"""Built-in schedulers and the loader of user schedulers.

``get_scheduler_factory(name)`` accepts a built-in name, ``package.module:ClassName``
(importable from the current directory too), or a name registered in the
``servecal.schedulers`` entry-point group.

``disagg`` (``--scheduler disagg``) is not one replica's policy but two pools of instances,
each with its own policy (:mod:`.disagg`); :func:`replay.simulate.replay_frame` builds it
(:class:`replay.core.disagg.DisaggEngine`).
"""
from __future__ import annotations

import importlib
import os
import sys
from importlib.metadata import entry_points

from ..errors import ConfigError
from .base import Batch, ReplicaState, Scheduler, SchedulerConfig
from .chunked import ChunkedScheduler
from .edf import EdfScheduler
from .fcfs import FcfsScheduler
from .sjf import SjfScheduler
from .static import StaticScheduler

#: Built-in schedulers by name.
BUILTIN = {
    "chunked": ChunkedScheduler,
    "fcfs": FcfsScheduler,
    "static": StaticScheduler,
    "sjf": SjfScheduler,
    "edf": EdfScheduler,
}


def get_scheduler_factory(name: str):
    """A zero-argument callable that builds a scheduler named ``name``.

    Raises
    ------
    ConfigError
        Unknown name, unimportable module, or a class without ``schedule``.
    """
    if name in BUILTIN:
        return BUILTIN[name]
    if name == "disagg":
        raise ConfigError("--scheduler disagg is a prefill pool and a decode pool, not one replica's policy: "
                          "replay it with replay.simulate.replay_frame (or replay.core.disagg.DisaggEngine)")
    if ":" in name:
        mod, _, attr = name.partition(":")
        if os.getcwd() not in sys.path:  # a module beside the user's trace, as uvicorn does
            sys.path.insert(0, os.getcwd())
        try:
            cls = getattr(importlib.import_module(mod), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"--scheduler {name}: cannot load ({exc})") from None
    else:
        eps = [ep for ep in entry_points(group="servecal.schedulers") if ep.name == name]
        if not eps:
            raise ConfigError(f"--scheduler {name}: unknown; built in: {', '.join(sorted(BUILTIN))}, "
                              "disagg, or give package.module:ClassName")
        cls = eps[0].load()
    if not callable(getattr(cls, "schedule", None)):
        raise ConfigError(f"--scheduler {name}: {cls!r} has no schedule(now, state) method")
    return cls


def check_scheduler_names(names: list, option: str) -> None:
    """Refuse a list of scheduler names with repeats or names that cannot be loaded.

    ``disagg`` (a cluster of pools, not a single-replica policy) is accepted.

    Raises
    ------
    ConfigError
        Naming ``option`` and the bad name.
    """
    repeated = sorted({str(n) for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"{option}: {', '.join(repeated)} given more than once")
    for name in names:
        if name != "disagg":
            try:
                get_scheduler_factory(name)
            except ConfigError as exc:
                raise ConfigError(f"{option}: {exc}") from None


__all__ = ["check_scheduler_names", "Batch", "ReplicaState", "Scheduler", "SchedulerConfig", "get_scheduler_factory",
           "BUILTIN"]
