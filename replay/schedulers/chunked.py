"""``chunked``: vLLM v1 / Sarathi-Serve continuous batching with a token budget."""
from __future__ import annotations

from .base import Batch, ReplicaState


class ChunkedScheduler:
    """Decode-first continuous batching with chunked prefill (vLLM v1, Sarathi-Serve).

    Each step: running requests first, in admission order, each feeding what it still
    needs (one token while decoding, the rest of its prompt otherwise) within the token
    budget ``max_num_batched_tokens``; then waiting requests in order, their prompts cut
    into chunks to fill what is left of the budget, while fewer than ``max_num_seqs`` run.
    When a running request's next blocks are not free, the most recently admitted running
    request is preempted (recompute) until they are; no waiting request is admitted in a
    step that preempted.

    Notes
    -----
    Follows vLLM v1's ``Scheduler.schedule`` (vllm/v1/core/sched/scheduler.py) and
    Agrawal et al., "Taming Throughput-Latency Tradeoff in LLM Inference with
    Sarathi-Serve", OSDI'24. A request's first token exists only after its last chunk.
    """

    name = "chunked"

    def schedule(self, now: float, state: ReplicaState) -> Batch:
        batch = Batch()
        budget = state.config.max_num_batched_tokens
        kv = state.kv
        running = state.running
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            n = min(req.num_uncomputed_tokens, budget)
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
        if preempted:
            return batch
        waiting = state.waiting
        while waiting and budget > 0 and len(running) < state.config.max_num_seqs:
            req = waiting[0]
            n = min(req.num_uncomputed_tokens, budget)
            if not kv.can_allocate(req, n):
                break
            waiting.popleft()
            kv.allocate(req, n)
            state.admit(req, now)
            batch.add(req, n)
            budget -= n
        return batch
