"""``fcfs``: vLLM v0 continuous batching, prefill-priority, whole prompts."""
from __future__ import annotations

from .base import Batch, ReplicaState


class FcfsScheduler:
    """vLLM v0's default policy (Yu et al., Orca, OSDI'22 iteration-level scheduling).

    A step is either prefill-only or decode-only. Whenever waiting requests can be
    admitted, the step prefills whole prompts in arrival order within the token budget
    (``max_num_batched_tokens``), ``max_num_seqs`` and the free KV blocks; otherwise every
    running request decodes one token, the most recently admitted being preempted
    (recompute) when blocks run out.

    Notes
    -----
    vllm/core/scheduler.py (v0) ``_schedule_default``; Vidur's ``vllm`` scheduler does the
    same (microsoft/vidur issue #17). A prompt longer than the budget is prefilled alone
    rather than refused, so every request eventually runs.
    """

    name = "fcfs"

    def schedule(self, now: float, state: ReplicaState) -> Batch:
        batch = Batch()
        budget = state.config.max_num_batched_tokens
        kv = state.kv
        waiting = state.waiting
        while waiting and len(state.running) < state.config.max_num_seqs:
            req = waiting[0]
            n = req.num_uncomputed_tokens
            if (n > budget and batch.requests) or not kv.can_allocate(req, n):
                break
            waiting.popleft()
            kv.allocate(req, n)
            state.admit(req, now)
            batch.add(req, n)
            budget -= n
        if batch.requests:
            return batch
        running = state.running
        i = 0
        while i < len(running):
            req = running[i]
            while not kv.can_allocate(req, 1):
                victim = running[-1]
                state.preempt(victim)
                if victim is req:
                    break
            else:
                kv.allocate(req, 1)
                batch.add(req, 1)
                i += 1
        return batch
