"""Routers: which replica an arriving request goes to.

A router is any callable ``router(req, replicas) -> int`` taking the arriving
:class:`~replay.core.request.Request` and the list of :class:`~replay.schedulers.base.ReplicaState`
and returning a replica id; the engine calls it once per arrival. Built in, by name
(:data:`ROUTERS`): ``round_robin``, ``least_loaded``, ``prefix_affinity``.
"""
from __future__ import annotations

from ..errors import ConfigError
from .request import Request


def replica_load(state) -> int:
    """Requests on a replica: waiting + running."""
    return len(state.waiting) + len(state.running)


class RoundRobinRouter:
    """Replicas in turn: 0, 1, ..., n - 1, 0, ... (the engine's default; stateful, one per engine)."""

    def __init__(self):
        self._next = 0

    def __call__(self, req: Request, replicas: list) -> int:
        rid = self._next % len(replicas)
        self._next = rid + 1
        return rid


def least_loaded(req: Request, replicas: list) -> int:
    """The replica with the fewest waiting + running requests; ties go to the lowest id.

    Notes
    -----
    Join-the-shortest-queue (JSQ) counted in requests, deterministic (no power-of-two
    sampling); it ignores request sizes and cache contents.
    """
    return min(range(len(replicas)), key=lambda i: (replica_load(replicas[i]), i))


def prefix_affinity(req: Request, replicas: list) -> int:
    """The replica whose KV cache holds the longest prefix of ``req``'s prompt blocks.

    Ties (and no replica holding any of it) go to the least loaded, then the lowest id.

    Notes
    -----
    Prefix-cache-aware routing as in SGLang's router (cache-aware load balancing) and
    llm-d's prefix-cache scorer: the match length is the number of leading full blocks
    of the prompt resident in the replica's cache
    (:meth:`~replay.core.kv_cache.KVCache.num_resident_prefix_blocks`), so it needs prefix
    caching on (``--enable-prefix-caching``) and ``block_hashes`` in the trace; without them
    every match is 0 and this is :func:`least_loaded`. Requests arriving at the same instant
    see the caches as they are, before any of them has been scheduled.
    """
    return min(range(len(replicas)),
               key=lambda i: (-replicas[i].kv.num_resident_prefix_blocks(req), replica_load(replicas[i]), i))


#: Built-in routers: name -> zero-argument factory of a router callable.
ROUTERS = {
    "round_robin": RoundRobinRouter,
    "least_loaded": lambda: least_loaded,
    "prefix_affinity": lambda: prefix_affinity,
}


def get_router(name: str):
    """A new router callable for the built-in ``name``.

    Raises
    ------
    ConfigError
        Unknown name.
    """
    try:
        return ROUTERS[name]()
    except KeyError:
        raise ConfigError(f"--router {name}: unknown; built in: {', '.join(ROUTERS)}") from None
