"""Independent tasks on a Ray cluster (``--ray-address``): the points of a sweep, the starts of a fit.

Ray is imported when a function here is called, never at import time; without it installed
they raise a ConfigError naming ``pip install 'servecal[ray]'``.
"""
from __future__ import annotations

import contextlib

from .errors import ConfigError


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ConfigError("--ray-address needs Ray, which is not installed: pip install 'servecal[ray]'") from None
    return ray


@contextlib.contextmanager
def ray_session(address: str):
    """Ray connected to ``address`` for the body (started here unless it already runs, then
    stopped again), so that several :func:`map_on_ray` calls share one connection."""
    ray = _import_ray()
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, log_to_driver=False)
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


def check_ray() -> None:
    """Raise a ConfigError naming ``pip install 'servecal[ray]'`` when Ray is not installed."""
    _import_ray()


def map_on_ray(fn, shared, items: list, address: str, on_done=None) -> list:
    """``[fn(shared, item) for item in items]`` as tasks of the Ray cluster at ``address``.

    ``shared`` (the trace and settings) goes to the object store once, not once per item;
    results come back in ``items`` order. Ray is started here unless it already runs, and
    stopped again. ``on_done(k)``, when given, is called as ``k`` more tasks finish.

    Raises
    ------
    ConfigError
        Ray is not installed (the message names ``pip install 'servecal[ray]'``).
    """
    ray = _import_ray()
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, log_to_driver=False)
    try:
        ref = ray.put(shared)
        task = ray.remote(fn)
        refs = [task.remote(ref, item) for item in items]
        if on_done is not None:
            pending = refs
            while pending:
                ready, pending = ray.wait(pending, num_returns=len(pending), timeout=0.5)
                if ready:
                    on_done(len(ready))
        return ray.get(refs)
    finally:
        if started:
            ray.shutdown()
