"""``chunked``: vLLM v1 / Sarathi-Serve continuous batching with a token budget."""
from __future__ import annotations

from .base import Batch, ReplicaState
from .loops import admit_waiting, schedule_running


class ChunkedScheduler:
    """Decode-first continuous batching with chunked prefill (vLLM v1, Sarathi-Serve).

    Each step: running requests first, in admission order, each feeding what it still
    needs (one token while decoding, the rest of its prompt otherwise) within the token
    budget ``max_num_batched_tokens``; then waiting requests in order, their prompts cut
    into chunks to fill what is left of the budget, while fewer than ``max_num_seqs`` run.
    When a running request's next blocks are not free, the most recently admitted running
    request is preempted (``ReplicaState.preemption_mode``) until they are; no waiting request is admitted in a
    step that preempted. With prefix caching a request admitted the first time feeds only
    the tokens after its cache hit.

    Notes
    -----
    Follows vLLM v1's ``Scheduler.schedule`` (vllm/v1/core/sched/scheduler.py) and
    Agrawal et al., "Taming Throughput-Latency Tradeoff in LLM Inference with
    Sarathi-Serve", OSDI'24. A request's first token exists only after its last chunk.
    """

    name = "chunked"
    #: capability flags (what they promise, and the lookup rule: :class:`~.base.Scheduler`)
    implicit_decoders = True
    decode_runs = True
    prefill_runs = True

    def schedule(self, now: float, state: ReplicaState) -> Batch:
        batch = Batch()
        budget, preempted = schedule_running(state, batch, state.config.max_num_batched_tokens)
        if preempted or not state.waiting or budget <= 0 or len(state.running) >= state.config.max_num_seqs:
            return batch
        if len(state.waiting) > 1 and (key := self.waiting_key(now)) is not None:
            ordered = sorted(state.waiting, key=key)
            state.waiting.clear()
            state.waiting.extend(ordered)
        admit_waiting(state, batch, budget, now)
        return batch

    def waiting_key(self, now: float):
        """Sort key of ``state.waiting`` before admission at ``now``; ``None`` keeps queue order.

        The hook policies such as ``sjf`` and ``edf`` override; queue order is arrival order
        with preempted requests in front.
        """
        return None
