"""The scheduler contract: what a policy sees of a replica, what it returns, what it may declare.

A scheduler is any object with ``schedule(now, state) -> Batch`` (:class:`Scheduler` states
the whole contract, its three optional capability flags and their one lookup rule,
:func:`capability`). It sees a :class:`ReplicaState` and fills a :class:`Batch` under a
:class:`SchedulerConfig`. The loops the built-in token-budget policies share are in
:mod:`.loops`; the engine's implicit decoders (what ``implicit_decoders`` allows) in
:mod:`.implicit_decoders`.
"""
from __future__ import annotations

from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from schemas.status import RUNNING, SWAPPED, WAITING

from ..core.kv_cache import KVCache
from ..core.request import Request


class Batch:
    """The work of one step: requests and how many tokens each feeds.

    Aggregates are kept as requests are added (never re-summed):
    ``num_prefill_tokens``, ``num_prefill_seqs``, ``num_decode_seqs``,
    ``decode_context_tokens`` (sum of the decoding sequences' lengths, the seed's
    L_total), ``prefill_context_tokens`` (KV history the prefill chunks attend to) and
    ``num_spec_tokens`` (draft tokens the decodes verify besides their next token under
    speculative decoding: a decode feeding ``n`` positions adds ``n - 1``; 0 without it).
    """

    __slots__ = ("requests", "num_new_tokens", "num_prefill_tokens", "num_prefill_seqs",
                 "num_decode_seqs", "decode_context_tokens", "prefill_context_tokens", "run_end_times_s",
                 "num_lazy_decodes", "num_spec_tokens")

    def __init__(self):
        self.requests: list[Request] = []
        self.num_new_tokens: list[int] = []
        self.num_prefill_tokens = 0
        self.num_prefill_seqs = 0
        self.num_decode_seqs = 0
        self.decode_context_tokens = 0
        self.prefill_context_tokens = 0
        #: End times of a run of identical decode steps the engine advanced at once (None: one step).
        self.run_end_times_s = None
        #: Decodes of the replica's implicit decoders (:class:`LazyDecodes`), not in ``requests``.
        self.num_lazy_decodes = 0
        #: Draft positions verified by the decodes beyond their next token (speculative decoding).
        self.num_spec_tokens = 0

    def add(self, req: Request, num_new_tokens: int) -> None:
        """Add ``req`` feeding ``num_new_tokens`` tokens (1 for a decode; ``1 + drafts`` for a
        decode verifying draft tokens under speculative decoding)."""
        self.requests.append(req)
        self.num_new_tokens.append(num_new_tokens)
        c = req.num_computed_tokens
        if c >= req.num_prompt_tokens + req.num_generated_tokens - 1 and req.num_generated_tokens:  # is_decoding
            self.num_decode_seqs += 1
            self.decode_context_tokens += c + 1
            if num_new_tokens > 1:
                self.num_spec_tokens += num_new_tokens - 1
        else:
            self.num_prefill_tokens += num_new_tokens
            self.num_prefill_seqs += 1
            self.prefill_context_tokens += c

    @property
    def num_tokens(self) -> int:
        """Tokens fed in this step (prefill tokens + one per decode + verified draft tokens)."""
        return self.num_prefill_tokens + self.num_decode_seqs + self.num_spec_tokens

    @property
    def num_decode_tokens(self) -> int:
        """Positions the decodes feed: one each, plus the draft tokens they verify."""
        return self.num_decode_seqs + self.num_spec_tokens

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
    long_prefill_token_threshold : int
        Per-request cap on the prompt tokens one step feeds (vLLM v1's
        ``--long-prefill-token-threshold``), applied before the token budget, to requests
        admitted from the waiting queue and to partially prefilled running ones alike; 0: none.
        A cap at or above the budget changes nothing. The vLLM v0.11-era rule: the cap holds
        even when a single request is eligible (newer vLLM main drops it then; not modelled).
        Policies that admit whole prompts (``fcfs``, ``static``: vLLM v0 without chunked
        prefill, where the threshold does not chunk) ignore it.
    num_speculative_tokens : int
        Draft tokens ``K`` a decoding request proposes per step (speculative decoding); each
        decode then feeds (verifies) ``K + 1`` positions, the token budget counting all of
        them, never more than the request's remaining output tokens. 0: off.
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    long_prefill_token_threshold: int = 0
    num_speculative_tokens: int = 0


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
    preemption_mode : str
        ``"recompute"`` (drop the victim's KV) or ``"swap"`` (move it to host memory), as vLLM.
    num_swap_blocks : int
        KV blocks moved over the host link (out and in) by the step being scheduled; the
        engine adds their transfer time to that step and resets the count.
    """

    replica_id: int
    config: SchedulerConfig
    kv: KVCache
    waiting: deque = field(default_factory=deque)
    running: list = field(default_factory=list)
    num_preemptions: int = 0
    preemption_mode: str = "recompute"
    num_swap_blocks: int = 0
    lazy: "ImplicitDecoders | None" = None
    num_admissions: int = 0
    #: the admission numbers of ``running``, in its order (see remove_running)
    _running_numbers: list = field(default_factory=list, repr=False)

    def remove_running(self, req: Request) -> None:
        """Take ``req`` out of ``running`` in O(log n).

        ``running`` is in admission order, so ``req`` is found by bisecting the admission
        numbers :meth:`admit` gave (kept in a list of their own: no request is touched). When
        ``running`` was changed from outside (reordered or rebuilt), the search misses and a
        linear one is made instead, the numbers being read again.
        """
        running, numbers = self.running, self._running_numbers
        i = bisect_left(numbers, req.admission_number)
        if i < len(running) and running[i] is req and len(numbers) == len(running):
            del running[i]
            del numbers[i]
        else:
            running.remove(req)
            numbers[:] = [r.admission_number for r in running]

    def admit(self, req: Request, now: float) -> None:
        """Move ``req`` (already removed from ``waiting``, its blocks allocated) to ``running``.

        Its queue wait ends at ``now``. A swapped-out request's KV is swapped back in.
        """
        if req.first_scheduled_time_s != req.first_scheduled_time_s:  # NaN: first time
            req.first_scheduled_time_s = now
        req.last_scheduled_time_s = now
        if req.status == SWAPPED:
            self.num_swap_blocks += self.kv.blocks_for(req.num_computed_tokens)
        req.status = RUNNING
        self.num_admissions += 1
        req.admission_number = self.num_admissions
        self.running.append(req)
        self._running_numbers.append(self.num_admissions)

    def preempt(self, req: Request) -> None:
        """Preempt ``req``: free its blocks and put it at the front of ``waiting``.

        Recompute (default): its KV is dropped and its tokens so far are recomputed when
        re-admitted. Swap: its KV is copied to host memory (``num_swap_blocks``) and copied
        back at re-admission; nothing is recomputed. Its first-token time is kept either way.
        """
        assert req.lazy_step < 0, "an implicit decoder is never a preemption victim (it precedes the tail)"
        self.remove_running(req)
        if self.preemption_mode == "swap":
            self.num_swap_blocks += req.num_blocks
            self.kv.free(req)
            req.status = SWAPPED
        else:
            self.kv.free(req)
            # the dropped KV, plus the pending token of a decoding request (BR-08: 30 + 3 = 33); a
            # request preempted again mid-recompute counts only what it had recomputed so far
            req.num_recomputed_tokens += req.num_computed_tokens + (1 if req.is_decoding else 0)
            req.num_computed_tokens = 0
            req.status = WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)


class ImplicitDecoders(Protocol):
    """What the engine and the decode-first loop ask of a replica's implicit decoders: the decoding
    requests whose progress a step counter holds (:class:`~replay.schedulers.implicit_decoders.LazyDecodes`
    implements it; declared here so that the scheduler's contract comes first).

    Attributes
    ----------
    count : int
        Requests decoding implicitly (always ``running[:count]``).
    """

    count: int

    def schedule(self, kv: KVCache, batch: "Batch", budget) -> bool:
        """Add every implicit decoder to ``batch`` if the budget and the free blocks allow; whether it did."""
        ...

    def repeat(self, kv: KVCache, batch: "Batch", now: float) -> bool:
        """Reuse ``batch`` for the next step at ``now`` when nothing else changed; whether it could."""
        ...

    def materialize_all(self, state: "ReplicaState") -> None:
        """Make every implicit decoder an explicit running request again."""
        ...

    def end_step(self, state: "ReplicaState", batch: "Batch", now: float) -> list:
        """Advance the group by the step that ended at ``now``; the requests it finished."""
        ...

    def admit_decoders(self, state: "ReplicaState") -> None:
        """Take the running requests that now decode steadily into the group."""
        ...


class Scheduler(Protocol):
    """A batching policy: the whole contract between a policy and the engine.

    Implement :meth:`schedule`. The engine calls it whenever the replica is free to start a
    step (at every step end, and when an idle replica is woken by an arrival) and runs the
    batch it returns as one step, whose tokens are emitted at the step's end. It may reorder
    ``state.waiting``, admit requests with :meth:`ReplicaState.admit`, take KV blocks through
    ``state.kv`` and preempt with :meth:`ReplicaState.preempt`. The loops vLLM's policies
    share are in :mod:`replay.schedulers.loops`; :mod:`replay.schedulers.chunked` is a
    complete policy.

    Three capability flags, all optional (absent: false), let the engine skip calls whose
    answer it can predict; they change no timestamp, only the speed. A policy that declares
    none is asked at every step.

    ``decode_runs``
        When :meth:`schedule` returns a batch in which every running request decodes (no
        prefill), it would return the same batch again until a request arrives, one
        completes or the KV cache runs out; the engine may then advance such a run of steps
        in closed form (:mod:`replay.core.decode_runs`). Read at every such step, so it may be a
        property whose value changes (``disagg``'s decode instances).
    ``prefill_runs``
        When :meth:`schedule` returns a batch of one prompt chunk of the only running request
        and nothing waits, it would return that request's next chunk, of the same size, until a
        request arrives, the chunk is its prompt's last or the KV cache runs out; the engine may
        then advance such a run in closed form (:meth:`~replay.core.decode_runs.DecodeRuns.plan_prefill`).
        Read at every such step.
    ``implicit_decoders``
        :meth:`schedule` reads the running requests only through
        :func:`~replay.schedulers.loops.schedule_running` and, with nothing waiting, returns
        just the batch it gives; the engine may then keep steadily decoding requests implicit
        (:class:`~replay.schedulers.implicit_decoders.LazyDecodes`, their fields stale until
        made explicit) and run them alone without asking the policy. Read once, when a run
        starts.

    The lookup rule, one for both (:func:`capability`): a flag counts only when the
    scheduler declares it itself, on its own class (an attribute or a property) or on the
    instance, and its value is true. A flag inherited from a base class does not count: a
    subclass changes what the policy does (its ``schedule``, or a hook such as ``waiting_key``
    that the inherited ``schedule`` calls), so it must make the promise again itself.
    """

    def schedule(self, now: float, state: ReplicaState) -> Batch:
        """Pick the next step's batch at time ``now`` (seconds). An empty batch idles the replica."""
        ...


def capability(scheduler, flag: str) -> bool:
    """Whether ``scheduler`` declares the capability ``flag`` (``"decode_runs"``, ``"prefill_runs"``
    or ``"implicit_decoders"``): the engine's one lookup rule (see :class:`Scheduler`).

    The flag counts only when declared on the scheduler's own class or on the instance (not
    inherited); its value is then read from the instance (a property is evaluated).
    """
    if flag in type(scheduler).__dict__ or flag in getattr(scheduler, "__dict__", ()):
        return bool(getattr(scheduler, flag))
    return False
