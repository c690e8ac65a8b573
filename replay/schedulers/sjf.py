"""``sjf``: shortest prompt first, with an aging bound so long prompts never starve."""
from __future__ import annotations

from .base import Batch, ReplicaState
from .chunked import ChunkedScheduler
from .keyed_queue import schedule_in_key_order


class SjfScheduler(ChunkedScheduler):
    """Shortest-job-first admission on top of decode-first chunked steps.

    Each step runs like ``chunked`` (running requests first, decode-first, preemption when
    blocks run out), but waiting requests are admitted shortest first: by the tokens they
    still have to prefill (the prompt for a new request, prompt + generated tokens for a
    recompute-preempted one), ties by arrival. A request that has waited longer than
    ``aging_s`` since its arrival goes ahead of all younger ones, the aged in arrival order,
    so no request waits much longer than ``aging_s`` plus the service of those ahead of it.

    Parameters
    ----------
    aging_s : float
        Aging bound, seconds (default 10 s).

    Notes
    -----
    Shortest-job-first on the part of the job known at arrival (the prefill). Fu et al.,
    "Efficient LLM Scheduling by Learning to Rank", NeurIPS'24, rank by predicted output
    length instead and show SJF-like orders cut latency under load but need starvation
    prevention; aging is the textbook remedy (Silberschatz, Galvin & Gagne, "Operating
    System Concepts", CPU scheduling: priority scheduling with aging).
    The head-of-line rule of ``chunked`` holds in SJF order: admission stops at the first
    request whose blocks are not free.
    """

    name = "sjf"
    implicit_decoders = True
    #: No closed-form decode runs: aging can reorder the queue mid-run and let another head
    #: fit (e.g. a short aged prompt overtaking a swapped-out request that needs many blocks).
    decode_runs = False

    def __init__(self, aging_s: float = 10.0):
        if not aging_s >= 0:
            raise ValueError(f"aging_s must be >= 0 seconds, not {aging_s}")
        self.aging_s = aging_s

    def schedule(self, now: float, state: ReplicaState) -> Batch:
        """``chunked``'s step with the waiting queue kept in SJF order (:class:`KeyedWaiting`:
        O(log n) per arrival and admission, the same order as :meth:`waiting_key`)."""
        return schedule_in_key_order(now, state, _shortest_key, aging_s=self.aging_s)

    def waiting_key(self, now: float):
        """Aged requests (waited > ``aging_s``) first by arrival, then shortest remaining prefill.

        The order :meth:`schedule` admits in (documents it; a subclass that overrides it and
        not ``schedule`` should derive from ``ChunkedScheduler``, which sorts by it)."""
        cutoff = now - self.aging_s

        def key(req):
            if req.arrival_time_s < cutoff:
                return (0, req.arrival_time_s, req.index)
            return (1, *_shortest_key(req))

        return key


def _shortest_key(req):
    """Order among requests that have not aged: remaining prefill, then arrival."""
    return (req.num_uncomputed_tokens, req.arrival_time_s, req.index)
