"""``static``: request-level (static) batching, as served before iteration-level scheduling."""
from __future__ import annotations

import math

from .base import Batch, ReplicaState
from .loops import admit_waiting, schedule_running


class StaticScheduler:
    """Request-level batching: a batch is formed when the replica is idle and runs to its end.

    When nothing runs, up to ``max_num_seqs`` waiting requests are taken in arrival order
    (while their prompts fit the token budget ``max_num_batched_tokens``; the first one
    always goes) and their whole prompts are prefilled in one step. Then every member
    decodes one token per step; a member leaves when it has all its tokens, and the next
    batch forms only when the last member has finished. Nothing joins a running batch.

    KV blocks for each member's peak (prompt + output - 1 tokens) are reserved at
    admission, as FasterTransformer allocates its cache for the maximum sequence length, so
    a static batch never preempts.

    Notes
    -----
    The request-level scheduling of NVIDIA FasterTransformer (Triton backend) and early
    Hugging Face serving, as described by Yu et al., "Orca: A Distributed Serving System for
    Transformer-Based Generative Models", OSDI'22, section 2.2 (the baseline iteration-level
    scheduling replaces). Simplifications: prompts are not padded to the longest one, and a
    finished member stops costing compute (FasterTransformer keeps computing padded slots),
    so step times are a lower bound; each token is reported when generated (streaming),
    not when the whole batch returns.
    """

    name = "static"
    implicit_decoders = True
    #: The batch in flight is decode-only, holds every running request and has its blocks
    #: reserved, so it repeats until a member completes: the engine may advance it in closed form.
    decode_runs = True

    def schedule(self, now: float, state: ReplicaState) -> Batch:
        batch = Batch()
        if state.running:  # the batch in flight decodes; its blocks are reserved, so no preemption
            schedule_running(state, batch, math.inf)
            return batch
        admit_waiting(state, batch, state.config.max_num_batched_tokens, now, whole_prompts=True, reserve_peak=True)
        return batch
