"""The scheduler interface: what a policy sees of a replica and what it returns.

A scheduler is any object with ``schedule(now, state) -> Batch``. It may reorder
``state.waiting``, admit requests with :meth:`ReplicaState.admit`, take KV blocks with
``state.kv`` and preempt with :meth:`ReplicaState.preempt`; the engine runs the batch it
returns as one step and emits tokens at the step's end.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from ..kv_cache import KVCache
from ..request import Request


class Batch:
    """The work of one step: requests and how many tokens each feeds.

    Aggregates are kept as requests are added (never re-summed):
    ``num_prefill_tokens``, ``num_prefill_seqs``, ``num_decode_seqs``,
    ``decode_context_tokens`` (sum of the decoding sequences' lengths, the seed's
    L_total) and ``prefill_context_tokens`` (KV history the prefill chunks attend to).
    """

    __slots__ = ("requests", "num_new_tokens", "num_prefill_tokens", "num_prefill_seqs",
                 "num_decode_seqs", "decode_context_tokens", "prefill_context_tokens")

    def __init__(self):
        self.requests: list[Request] = []
        self.num_new_tokens: list[int] = []
        self.num_prefill_tokens = 0
        self.num_prefill_seqs = 0
        self.num_decode_seqs = 0
        self.decode_context_tokens = 0
        self.prefill_context_tokens = 0

    def add(self, req: Request, num_new_tokens: int) -> None:
        """Add ``req`` feeding ``num_new_tokens`` tokens (1 for a decode)."""
        self.requests.append(req)
        self.num_new_tokens.append(num_new_tokens)
        if req.is_decoding:
            self.num_decode_seqs += 1
            self.decode_context_tokens += req.num_computed_tokens + 1
        else:
            self.num_prefill_tokens += num_new_tokens
            self.num_prefill_seqs += 1
            self.prefill_context_tokens += req.num_computed_tokens

    @property
    def num_tokens(self) -> int:
        """Tokens fed in this step (prefill tokens + one per decode)."""
        return self.num_prefill_tokens + self.num_decode_seqs

    def __len__(self) -> int:
        return len(self.requests)


@dataclass
class SchedulerConfig:
    """Limits a scheduler works under, named as vLLM names them.

    Attributes
    ----------
    max_num_seqs : int
        Requests running at once.
    max_num_batched_tokens : int
        Token budget of one step.
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192


@dataclass
class ReplicaState:
    """What a scheduler sees of one replica.

    Attributes
    ----------
    replica_id : int
    config : SchedulerConfig
    kv : KVCache
    waiting : collections.deque[Request]
        Arrived requests not running, in arrival order (preempted ones go to the front).
    running : list[Request]
        Admitted requests in admission order (the last is preempted first).
    """

    replica_id: int
    config: SchedulerConfig
    kv: KVCache
    waiting: deque = field(default_factory=deque)
    running: list = field(default_factory=list)
    num_preemptions: int = 0

    def admit(self, req: Request, now: float) -> None:
        """Move ``req`` (already removed from ``waiting``) to ``running``; its queue wait ends at ``now``."""
        if req.first_scheduled_time_s != req.first_scheduled_time_s:  # NaN: first time
            req.first_scheduled_time_s = now
        req.last_scheduled_time_s = now
        req.status = "running"
        self.running.append(req)

    def preempt(self, req: Request) -> None:
        """Recompute preemption: drop ``req``'s KV, put it at the front of ``waiting``.

        Its first-token time is kept; its tokens so far are recomputed when re-admitted.
        """
        self.running.remove(req)
        self.kv.free(req)
        req.num_recomputed_tokens += req.num_tokens if req.num_generated_tokens else req.num_computed_tokens
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        req.status = "waiting"
        self.num_preemptions += 1
        self.waiting.appendleft(req)


class Scheduler(Protocol):
    """A batching policy. Implement ``schedule``; see :mod:`replay.schedulers.chunked`."""

    def schedule(self, now: float, state: ReplicaState) -> Batch:
        """Pick the next step's batch at time ``now`` (seconds). An empty batch idles the replica."""
        ...
