"""The scheduler interface: what a policy sees of a replica and what it returns.

A scheduler is any object with ``schedule(now, state) -> Batch``. It may reorder
``state.waiting``, admit requests with :meth:`ReplicaState.admit`, take KV blocks with
``state.kv`` and preempt with :meth:`ReplicaState.preempt`; the engine runs the batch it
returns as one step and emits tokens at the step's end.

The loops shared by the built-in token-budget policies live here:
:func:`schedule_running` (decode-first pass over the running requests, with preemption)
and :func:`admit_waiting` (chunked admission of the waiting queue, with prefix-cache hits).
"""
from __future__ import annotations

from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from schemas.status import OK, RUNNING, SWAPPED, WAITING

from ..kv_cache import KVCache
from ..request import Request


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
    lazy: "LazyDecodes | None" = None
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


class Scheduler(Protocol):
    """A batching policy. Implement ``schedule``; see :mod:`replay.schedulers.chunked`."""

    def schedule(self, now: float, state: ReplicaState) -> Batch:
        """Pick the next step's batch at time ``now`` (seconds). An empty batch idles the replica."""
        ...


def schedule_running(state: ReplicaState, batch: Batch, budget) -> tuple:
    """Decode-first pass over ``state.running`` (vLLM v1): the shared loop of token-budget schedulers.

    Running requests in admission order each feed what they still need (one token while
    decoding, the rest of the prompt otherwise), cut to the token ``budget``. A partial
    prefill is first capped at ``config.long_prefill_token_threshold`` (when positive); under
    speculative decoding (``config.num_speculative_tokens`` K > 0) a decode feeds
    ``min(K + 1, remaining output tokens)`` positions, cut to the budget (vLLM v1 truncates
    the drafts that do not fit). When a
    request's next blocks are not free, the most recently admitted running request is
    preempted (:meth:`ReplicaState.preempt`) until they are; a request that preempts itself
    is skipped.

    Parameters
    ----------
    state : ReplicaState
    batch : Batch
        Filled in place.
    budget : int or float
        Tokens left in the step (``math.inf`` for no limit).

    Returns
    -------
    budget : int or float
        Tokens left after the running requests.
    preempted : bool
        Whether any request was preempted (vLLM then admits no waiting request this step).
    """
    kv = state.kv
    running = state.running
    i = 0
    lazy = state.lazy
    if lazy is not None and lazy.count:
        if not lazy.schedule(kv, batch, budget):
            lazy.materialize_all(state)
        else:
            budget -= lazy.count
            i = lazy.count  # running[:count] are the implicit decoders
            if i == len(running):
                return budget, False
    preempted = False
    spec = state.config.num_speculative_tokens
    # Hot path: a decoding request on a plain paged cache feeds one token and takes a block
    # only when it crosses a block boundary; its bookkeeping is inlined (same result as the
    # general path below, which handles prefills, prefix caches, speculative decodes and preemption).
    plain = type(kv) is KVCache and not spec
    bs = kv.block_size
    reqs, nnt = batch.requests, batch.num_new_tokens
    num_dec = dec_ctx = 0
    while i < len(running) and budget > 0:
        req = running[i]
        c = req.num_computed_tokens
        if plain and req.num_generated_tokens and req.num_prompt_tokens + req.num_generated_tokens - c == 1:
            if c < req.num_blocks * bs:
                pass
            elif kv.num_free_blocks:
                kv.num_free_blocks -= 1
                req.num_blocks += 1
            else:
                c = -1  # no free block: take the general path (preemption)
            if c >= 0:
                reqs.append(req)
                nnt.append(1)
                num_dec += 1
                dec_ctx += c + 1
                budget -= 1
                i += 1
                continue
        n = req.num_uncomputed_tokens
        if spec and n == 1 and req.num_generated_tokens:  # a decode: its next token and up to K drafts
            n = min(spec + 1, req.num_output_tokens - req.num_generated_tokens)
        elif n > 1 and 0 < (threshold := state.config.long_prefill_token_threshold) < n:
            n = threshold  # a partial prefill, capped before the budget (NC-05)
        if n > budget:
            n = budget
        while not kv.can_allocate(req, n):
            victim = running[-1]
            state.preempt(victim)
            preempted = True
            if victim is req:
                break
        else:
            kv.allocate(req, n)
            batch.add(req, n)
            budget -= n
            i += 1
    batch.num_decode_seqs += num_dec
    batch.decode_context_tokens += dec_ctx
    return budget, preempted


def admit_waiting(state: ReplicaState, batch: Batch, budget, now: float, whole_prompts: bool = False,
                  reserve_peak: bool = False):
    """Admit ``state.waiting`` in its current order, prompts chunked to fill the token ``budget``.

    Stops at the first request whose blocks are not free (head-of-line, as vLLM v1), when
    ``max_num_seqs`` requests run, or when the budget is spent. A request admitted the first
    time takes its prefix-cache hit (:meth:`KVCache.lookup`) and feeds only the rest. A chunk
    is capped at ``config.long_prefill_token_threshold`` (when positive) before the budget,
    except with ``whole_prompts``.

    Parameters
    ----------
    whole_prompts : bool
        Admit whole prompts only (vLLM v0, no chunking); a prompt longer than the budget
        is admitted alone into an empty batch, so every request eventually runs.
    reserve_peak : bool
        Take the blocks of the request's peak KV (prompt + output - 1 tokens) up front, as
        request-level batching does, so it never needs preemption.

    Returns
    -------
    budget : int
        Tokens left in the step (negative after an oversized whole prompt).
    """
    kv = state.kv
    waiting = state.waiting
    max_num_seqs = state.config.max_num_seqs
    threshold = state.config.long_prefill_token_threshold
    while waiting and budget > 0 and len(state.running) < max_num_seqs:
        req = waiting[0]
        hit = kv.lookup(req) if kv.enable_prefix_caching else 0
        need = req.num_prompt_tokens + req.num_generated_tokens - req.num_computed_tokens - hit  # uncomputed
        if whole_prompts:
            if need > budget and (batch.requests or batch.num_lazy_decodes):
                break
            n = need
        else:
            n = threshold if 0 < threshold < need else need  # the per-request cap first (NC-05)
            if n > budget:
                n = budget
        take = req.peak_kv_tokens - req.num_computed_tokens - hit if reserve_peak else n
        if not kv.try_allocate(req, take, hit):
            break
        waiting.popleft()
        state.admit(req, now)
        batch.add(req, n)
        budget -= n
    return budget


class LazyDecodes:
    """The decoding requests of a replica whose progress is implicit in its step counter.

    vLLM-style decode-first batching feeds every decoding request one token per step, so a
    request that decodes steadily needs no per-step bookkeeping: it joins at group step
    ``j`` with ``c0`` computed and ``g0`` generated tokens, and after group step ``s`` it
    has ``c0 + s - j + 1`` and ``g0 + s - j + 1``, its token times being the end times of the
    group's steps (the steps the group decodes in; vLLM v0's prefill-only steps are not). The group keeps what a step needs as aggregates: its size, the sum of its
    sequence lengths (grows by the size each step), how many cross a KV block boundary at
    each step (counted by ``(c0 - j) mod block_size``) and who finishes at which step. A
    step then costs O(1) for all of them instead of O(running requests).

    The implicit decoders are always ``running[:count]`` (decoders precede the requests
    still prefilling in admission order); a request joins when it is the next one and
    decodes, and every request is made explicit (:meth:`materialize`) before anything else
    reads it: at completion, before a preemption, or for all when a step cannot serve them
    together (token budget or free blocks short). Only for a plain paged cache with
    recompute preemption and policies that declare ``implicit_decoders = True`` (see
    ``Engine``). Such a policy, with nothing waiting, schedules just what
    :func:`schedule_running` gives, so when the group is all of ``running`` the engine runs
    it alone without asking the policy, and :meth:`repeat` goes on in place while nothing
    else can change.
    """

    __slots__ = ("count", "context_tokens", "crossing", "finishing", "step_index", "step_end_times_s")

    def __init__(self, block_size: int):
        self.count = 0
        self.context_tokens = 0  # sum of (computed + 1) of the members: their decode context next step
        self.crossing = [0] * block_size
        #: members by the group step of their last token, each list in joining order (the clock
        #: advances one step at a time and a member finishes at or after its joining step)
        self.finishing: dict[int, list[Request]] = {}
        self.step_index = 0  # steps the group decoded in (its own clock)
        self.step_end_times_s: list[float] = []

    def schedule(self, kv, batch: Batch, budget) -> bool:
        """Add every member's decode to ``batch`` and take the blocks they cross into.

        Returns False (and changes nothing) when the budget or the free blocks are short.
        """
        need = self.crossing[(-self.step_index) % kv.block_size]
        if self.count > budget or need > kv.num_free_blocks:
            return False
        kv.num_free_blocks -= need
        batch.num_lazy_decodes = self.count
        batch.num_decode_seqs += self.count
        batch.decode_context_tokens += self.context_tokens
        return True

    def repeat(self, kv, batch: Batch, now: float) -> bool:
        """End the step of ``batch``, in which the group decoded alone, at ``now``, and put the
        group's next decode in the same ``batch``, when nothing else changes: no member emits
        its last token in this step and the blocks the group crosses into next are free.

        The same as :meth:`end_step` then :meth:`schedule` into a new batch; the caller
        guarantees that no request arrives by ``now`` and that the group is all of ``running``
        (so the policy would schedule it alone again). Returns False and changes nothing otherwise.
        """
        step = self.step_index
        need = self.crossing[(-(step + 1)) % kv.block_size]
        if step in self.finishing or need > kv.num_free_blocks:
            return False
        self.step_end_times_s.append(now)
        self.step_index = step + 1
        self.context_tokens += self.count
        kv.num_free_blocks -= need
        batch.decode_context_tokens = self.context_tokens
        return True

    def materialize(self, req: Request, bs: int) -> None:
        """Write ``req``'s implicit progress into its fields and take it out of the group."""
        n = self.step_index - req.lazy_step
        reserved, c0 = req.lazy_reserved, req.lazy_computed
        req.num_computed_tokens = c0 + n
        req.num_generated_tokens = req.lazy_generated + n
        if not reserved:  # it took a block at each boundary it crossed
            req.num_blocks = -(-req.num_computed_tokens // bs)
        if n:
            req.last_token_time_s = self.step_end_times_s[-1]
            if req.token_times_s is not None:
                req.token_times_s.extend(self.step_end_times_s[req.lazy_step:self.step_index])
        self.count -= 1
        self.context_tokens -= req.num_computed_tokens + 1
        if not reserved:
            self.crossing[(c0 - req.lazy_step) % bs] -= 1
        req.lazy_step = -1

    def materialize_all(self, state: "ReplicaState") -> None:
        """Make every member explicit (before a step the group cannot serve, or a preemption)."""
        bs = state.kv.block_size
        for req in state.running[:self.count]:
            self.materialize(req, bs)
        assert self.count == 0 and self.context_tokens == 0
        self.finishing.clear()

    def end_step(self, state: "ReplicaState", batch: Batch, now: float) -> list:
        """Advance the group by the step that ended at ``now``; return the members that finished.

        Finished members are explicit again (status ``ok``, blocks freed); then the requests
        now decoding right after the group join it.
        """
        if not batch.num_lazy_decodes:
            return []  # a step without the group (e.g. vLLM v0's prefill-only steps): no progress
        self.step_end_times_s.append(now)
        self.step_index += 1
        self.context_tokens += batch.num_lazy_decodes
        done = self.finishing.pop(self.step_index - 1, None)
        if done is None:
            return []
        bs = state.kv.block_size
        for req in done:
            self.materialize(req, bs)
            req.status = OK
            state.kv.free(req)
        return done

    def admit_decoders(self, state: "ReplicaState") -> None:
        """Make the requests that decode right after the group implicit from the next step on
        (the group stays a prefix of ``running``).

        A joining request's blocks must be exactly what its tokens need (it then takes one at
        each block boundary) or already cover its peak (request-level reservation); the first
        request that is not decoding or has other blocks stops the joining.
        """
        running, bs = state.running, state.kv.block_size
        j, finishing = self.step_index, self.finishing
        while self.count < len(running):
            req = running[self.count]
            c, g = req.num_computed_tokens, req.num_generated_tokens
            if not (g and g < req.num_output_tokens and c == req.num_prompt_tokens + g - 1):
                return  # not decoding (yet), or done
            exact = req.num_blocks == -(-c // bs)
            if not exact and req.num_blocks < -(-req.peak_kv_tokens // bs):
                return
            req.lazy_step, req.lazy_computed, req.lazy_generated = j, c, g
            req.lazy_reserved = not exact
            self.count += 1
            self.context_tokens += c + 1
            if exact:
                self.crossing[(c - j) % bs] += 1
            last = j + req.num_output_tokens - g - 1
            bucket = finishing.get(last)
            if bucket is None:
                finishing[last] = [req]
            else:
                bucket.append(req)
