"""The engine's event heap: what runs first at one instant, and what the pending events bound.

The heap holds ``(time, priority, seq, payload)``; ``seq`` is a per-engine counter, so equal
times and priorities resolve in the order the events were pushed. Arrivals of
:meth:`~replay.core.engine.Engine.run`'s list never enter the heap (they are consumed in order
from the list, first on a tie); at one instant the rest run by priority:
"""
from __future__ import annotations

import math

from ..errors import ReplayError

#: A callback scheduled with :meth:`~replay.core.engine.Engine.call_at` (e.g. a KV transfer done,
#: :mod:`replay.core.disagg`); it shares the arrivals' rank, before the step ends of its instant.
#: The payload is the callback.
CALL = 0
#: The end of a replica's step (or closed-form run); the payload is the replica index.
STEP_END = 1
#: A callback scheduled with ``call_at(..., after_step_ends=True)`` (closed-loop sends): after
#: the step ends of its instant (whatever their order), before the wake-ups (so woken replicas
#: see what it enqueues).
LATE_CALL = 2
#: The wake-up of an idle replica, after everything else of its instant (so it sees every
#: request that arrived then); the payload is the replica index.
WAKE = 3


def completion_bound_s(heap: list, replicas: list, batches: list, spec_tokens: int, min_step_s: float) -> float:
    """A time before which no request can complete on another replica, seconds (``inf``: none).

    Meant for a replica starting a step (its own step end is not pending yet). A pending
    callback or wake-up at ``T`` bounds at ``T``. A replica's pending step end ``X``
    bounds at ``X`` if the step emits some request's last token, else at
    ``X + s * min_step_s``, ``s`` the fewest steps a request it holds (batch, running or
    waiting) still needs after ``X``: a step emits at most one token per request (``K + 1``
    under speculative decoding, ``K = spec_tokens``) and lasts at least ``min_step_s``.
    Requests arriving later complete later still.

    Parameters
    ----------
    heap : list
        The engine's pending events.
    replicas, batches : list
        Each replica's :class:`~replay.schedulers.base.ReplicaState` and pending batch.
    min_step_s : float
        A lower bound on the duration of any step, seconds (0: the step end itself).
    """
    bound = math.inf
    for time, kind, _, payload in heap:
        if time < bound:
            if kind != STEP_END or min_step_s <= 0:
                bound = time
            else:
                left = tokens_left_after_step(replicas[payload], batches[payload], spec_tokens)
                steps = -(-left // (spec_tokens + 1)) if spec_tokens else left
                bound = min(bound, time + min_step_s * steps)
    return bound


def tokens_left_after_step(state, batch, spec_tokens: int) -> int:
    """Fewest output tokens a request held by the replica of ``state`` must emit after its
    pending step ``batch`` (one token per decode and step; up to ``spec_tokens + 1`` under
    speculative decoding)."""
    if batch.run_end_times_s is not None:  # a run of decodes emits one token a step; of prompt chunks, none
        k = 0 if batch.num_prefill_seqs else len(batch.run_end_times_s)
        left = min(r.num_output_tokens - r.num_generated_tokens - k for r in batch.requests)
    elif spec_tokens:  # a decode feeding n positions emits up to n tokens
        left = min(r.num_output_tokens - r.num_generated_tokens
                   - (n if r.num_generated_tokens and r.num_uncomputed_tokens == 1 else
                      r.num_computed_tokens + n >= r.num_prompt_tokens + r.num_generated_tokens)
                   for r, n in zip(batch.requests, batch.num_new_tokens))
    else:
        left = min(r.num_output_tokens - r.num_generated_tokens
                   - (r.num_computed_tokens + n >= r.num_prompt_tokens + r.num_generated_tokens)
                   for r, n in zip(batch.requests, batch.num_new_tokens))
    # the batch is part of running: when it is all of it only the waiting requests remain
    for queue in (state.waiting,) if len(batch.requests) == len(state.running) else (state.running, state.waiting):
        for r in queue:
            left = min(left, r.num_output_tokens - r.num_generated_tokens)
    return left


def not_finite_step(rid: int, now: float, duration: float):
    """Raise :class:`~replay.errors.ReplayError` for a step of replica ``rid`` starting at ``now``
    whose duration (seconds) is not a finite number: the cost model's parameters are out of range."""
    raise ReplayError(f"a step of replica {rid} at t={now:.6g} s would last {duration!r} s: the cost model's "
                      "parameters are out of range (check the calibration's fitted values)")
