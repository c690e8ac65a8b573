"""The implicit decoders of a replica: steady decodes advanced in O(1) per step for all of them.

What a policy's ``implicit_decoders`` flag allows (:class:`~.base.Scheduler`): :class:`LazyDecodes`
holds the group and :func:`lazy_decodes_for` decides, when a run starts, whether a replica
gets one. The group owns the ``lazy_*`` fields of :class:`~replay.core.request.Request`: a
member's progress is implicit in the group's step counter and written back into its fields
(:meth:`LazyDecodes.materialize`) before anything else reads them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from schemas.status import OK

from ..core.kv_cache import KVCache
from ..core.request import Request
from .base import capability

if TYPE_CHECKING:
    from .base import Batch, ReplicaState


class LazyDecodes:
    """The decoding requests of a replica whose progress is implicit in its step counter.

    vLLM-style decode-first batching feeds every decoding request one token per step, so a
    request that decodes steadily needs no per-step bookkeeping: it joins at group step
    ``j`` with ``c0`` computed and ``g0`` generated tokens, and after group step ``s`` it
    has ``c0 + s - j + 1`` and ``g0 + s - j + 1``, its token times being the end times of the
    group's steps (the steps the group decodes in; vLLM v0's prefill-only steps are not).
    The group keeps what a step needs as aggregates: its size, the sum of its sequence
    lengths (grows by the size each step), how many cross a KV block boundary at each step
    (counted by ``(c0 - j) mod block_size``) and who finishes at which step. A step then
    costs O(1) for all of them instead of O(running requests).

    The implicit decoders are always ``running[:count]`` (decoders precede the requests
    still prefilling in admission order); a request joins when it is the next one and
    decodes, and every request is made explicit (:meth:`materialize`) before anything else
    reads it: at completion, before a preemption, or for all when a step cannot serve them
    together (token budget or free blocks short). Only for a plain paged cache with
    recompute preemption and policies that declare ``implicit_decoders``
    (:func:`lazy_decodes_for`). Such a policy, with nothing waiting, schedules just what
    :func:`~.loops.schedule_running` gives, so when the group is all of ``running`` the engine runs
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


def lazy_decodes_for(scheduler, state: ReplicaState) -> LazyDecodes | None:
    """The implicit decoders of a replica for one run, or None when it keeps every request explicit.

    A replica gets them when its policy declares ``implicit_decoders``
    (:func:`~.base.capability`), its cache is a plain paged one (not prefix caching: shared
    blocks) and preemption recomputes (a swap-out copies a victim's blocks). The engine asks
    only when the run allows them at all (not with ``--exact-steps``, speculative decoding
    or hooks that watch each completion).
    """
    if (state.preemption_mode == "recompute" and type(state.kv) is KVCache
            and capability(scheduler, "implicit_decoders")):
        return LazyDecodes(state.kv.block_size)
    return None
