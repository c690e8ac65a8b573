"""``fcfs``: vLLM v0 continuous batching, prefill-priority, whole prompts."""
from __future__ import annotations

import math

from .base import Batch, ReplicaState, admit_waiting, schedule_running


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
    #: Reads running requests only through ``schedule_running``, and with nothing waiting
    #: schedules just its batch: the engine may keep steady decoders implicit (``LazyDecodes``)
    #: and run them alone without asking. Declared per class, so subclasses opt in themselves.
    implicit_decoders = True
    #: A decode-only batch of every running request repeats until an arrival, a completion or
    #: a full KV cache: the engine may advance such runs in closed form.
    decode_runs = True

    def schedule(self, now: float, state: ReplicaState) -> Batch:
        batch = Batch()
        admit_waiting(state, batch, state.config.max_num_batched_tokens, now, whole_prompts=True)
        if batch.requests:
            return batch
        schedule_running(state, batch, math.inf)  # every running request decodes one token
        return batch
