"""``fcfs``: vLLM v0 continuous batching, prefill-priority, whole prompts."""
from __future__ import annotations

import math

from .base import Batch, ReplicaState
from .loops import admit_waiting, schedule_running


class FcfsScheduler:
    """vLLM v0's default policy (Yu et al., Orca, OSDI'22 iteration-level scheduling).

    A step is either prefill-only or decode-only. Whenever waiting requests can be
    admitted, the step prefills whole prompts in arrival order within the token budget
    (``max_num_batched_tokens``), ``max_num_seqs`` and the free KV blocks; otherwise every
    running request decodes one token, the most recently admitted being preempted
    (``ReplicaState.preemption_mode``) when blocks run out. With prefix caching a prompt
    admitted the first time is prefilled from its cache hit on.

    Notes
    -----
    vllm/core/scheduler.py (v0) ``_schedule_default``; Vidur's ``vllm`` scheduler does the
    same (microsoft/vidur issue #17). A prompt longer than the budget is prefilled alone
    rather than refused, so every request eventually runs.
    """

    name = "fcfs"
    implicit_decoders = True
    decode_runs = True

    def schedule(self, now: float, state: ReplicaState) -> Batch:
        batch = Batch()
        admit_waiting(state, batch, state.config.max_num_batched_tokens, now, whole_prompts=True)
        if batch.requests:
            return batch
        schedule_running(state, batch, math.inf)  # every running request decodes one token
        return batch
