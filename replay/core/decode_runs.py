"""Closed-form runs: ``k`` identical steps of one replica priced in one call.

Decode runs: when a policy that declares ``decode_runs`` (:class:`~replay.schedulers.base.Scheduler`)
returns every running request as a decode, the same batch repeats, one token per request and
step, until the next arrival, the first completion or the KV cache running out. Prefill runs:
when a policy that declares ``prefill_runs`` returns one prompt chunk of the only running
request, with nothing waiting, the next steps feed its next chunks of the same size until the
next arrival, its prompt's last chunk or the KV cache running out. The engine
(:meth:`~replay.core.engine.Engine._start_run`) asks :meth:`DecodeRuns.plan` or
:meth:`DecodeRuns.plan_prefill` how many such steps to take at once and when they end, then
applies them in one go; the steps' durations are computed together and their end times
accumulated in the same order as the step-by-step path, so both give the same timestamps.
"""
from __future__ import annotations

import math

import numpy as np

from schemas.status import RUNNING

from ..schedulers.base import capability

#: Shortest run of decode steps worth advancing in closed form (shorter ones go step by step).
MIN_RUN = 8


class DecodeRuns:
    """The closed-form runs of one replica: its (vectorised) cost model and a memo.

    Parameters
    ----------
    cost_model : StepCostModel
        The replica's cost model; it must take arrays (``supports_arrays``).

    Attributes
    ----------
    blocker : Request or None
        A running request that completes within :data:`MIN_RUN` steps: while it runs, no
        run is worth planning, which :meth:`plan` sees in O(1) instead of scanning the batch.
    """

    __slots__ = ("cost_model", "blocker")

    def __init__(self, cost_model):
        self.cost_model = cost_model
        self.blocker = None

    def plan_batch(self, policy, batch, state, now: float, next_arrival_time_s) -> tuple | None:
        """The closed-form run ``batch``, starting at ``now`` (seconds) on a replica of ``state`` whose
        scheduler is ``policy``, can take, or None: of decodes when ``batch`` has no prompt and the policy
        declares ``decode_runs`` (:meth:`plan`; the policy's word, read every step), of prompt chunks when it
        is one chunk of a lone request, nothing waits and it declares ``prefill_runs`` (:meth:`plan_prefill`).

        Returns
        -------
        ends, durations, contexts, varying
            The plan's arrays and the step feature that varies along the run
            (``"decode_context_tokens"`` or ``"prefill_context_tokens"``).
        """
        if not batch.num_prefill_seqs and capability(policy, "decode_runs"):
            run, varying = self.plan(batch, state.kv, now, next_arrival_time_s), "decode_context_tokens"
        elif (len(batch.requests) == batch.num_prefill_seqs == 1 and not state.waiting
                and capability(policy, "prefill_runs")):
            run, varying = self.plan_prefill(batch, state.kv, now, next_arrival_time_s), "prefill_context_tokens"
        else:
            return None
        return None if run is None else (*run, varying)

    def plan(self, batch, kv, now: float, next_arrival_time_s) -> tuple | None:
        """The run the decode-only ``batch`` starting at ``now`` (seconds) can take, or None.

        ``next_arrival_time_s()`` gives the earliest time a request can still arrive
        (``inf``: none); it is called only once the O(1) checks pass. The run stops at the
        step that ends at or after that time, before the first completion and before a step
        that would need more KV blocks than are free (it would preempt).

        Returns
        -------
        ends, durations, contexts : numpy.ndarray
            The ``k >= 2`` steps' end times, durations (seconds) and decode context tokens.
            The end times may not be finite (the caller checks the last one).
        """
        blocker = self.blocker
        if (blocker is not None and blocker.status == RUNNING
                and blocker.num_output_tokens - blocker.num_generated_tokens < MIN_RUN):
            return None  # a running request completes within MIN_RUN steps: no run (O(1) check)
        reqs = batch.requests
        b = len(reqs)
        k = math.inf
        step_time_s = self.cost_model.step_time_s
        next_arrival = next_arrival_time_s()
        if next_arrival < math.inf:  # checked first: O(1), and most steps under load stop here
            # step times only grow within a run: this bounds the steps before the next arrival
            first = step_time_s(0, b, batch.decode_context_tokens, 0)
            if now + (MIN_RUN - 1) * first >= next_arrival:
                return None
            if first > 0:  # no more steps than fit before the arrival at the first one's duration, plus one
                k = int((next_arrival - now) / first) + 2
        first_done = min(reqs, key=lambda r: r.num_output_tokens - r.num_generated_tokens)
        k = min(k, first_done.num_output_tokens - first_done.num_generated_tokens)
        if k < MIN_RUN:
            self.blocker = first_done  # skip the O(B) scan until it completes
            return None
        computed = np.fromiter((r.num_computed_tokens for r in reqs), np.int64, b)
        held = np.fromiter((r.num_blocks for r in reqs), np.int64, b)
        bs = kv.block_size

        def new_blocks(steps: int) -> int:
            return int(np.maximum(0, -(-(computed + steps) // bs) - held).sum())

        if new_blocks(k) > kv.num_free_blocks:  # stop before a step that would need preemption
            lo, hi = 1, k
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if new_blocks(mid) <= kv.num_free_blocks else (lo, mid - 1)
            k = lo
            if k <= 1:
                return None
        ctx = batch.decode_context_tokens + b * np.arange(k, dtype=np.int64)
        durations = step_time_s(np.zeros(k, np.int64), np.full(k, b, np.int64), ctx, np.zeros(k, np.int64))
        return _until_arrival(now, durations, ctx, next_arrival)

    def plan_prefill(self, batch, kv, now: float, next_arrival_time_s) -> tuple | None:
        """The run of prompt chunks the ``batch`` starting at ``now`` (seconds) can take, or None.

        ``batch`` holds one chunk of ``n`` tokens of the replica's only running request and
        nothing waits (the caller checked). The run's steps each feed the next ``n`` tokens and
        none finishes the prompt (its last chunk, which emits the first token, is left to the
        step-by-step path); it stops at the step that ends at or after the next arrival
        (``next_arrival_time_s()``, as :meth:`plan`) and before a chunk whose KV blocks are not free.

        Returns
        -------
        ends, durations, contexts : numpy.ndarray
            The ``k >= 2`` steps' end times, durations (seconds) and prefill context tokens
            (the KV each chunk attends to). The end times may not be finite (the caller checks).
        """
        req, n = batch.requests[0], batch.num_new_tokens[0]
        c = req.num_computed_tokens
        k = min((req.num_prompt_tokens + req.num_generated_tokens - c - 1) // n,  # chunks before the last
                ((req.num_blocks + kv.num_free_blocks) * kv.block_size - c) // n)  # chunks whose blocks are free
        if k < MIN_RUN:
            return None
        step_time_s = self.cost_model.step_time_s
        next_arrival = next_arrival_time_s()
        if next_arrival < math.inf and now + (MIN_RUN - 1) * step_time_s(n, 0, 0, c, 1) >= next_arrival:
            return None  # step times only grow within a run (the context does)
        ctx = c + n * np.arange(k, dtype=np.int64)
        zeros = np.zeros(k, np.int64)
        durations = step_time_s(np.full(k, n, np.int64), zeros, zeros, ctx, np.ones(k, np.int64))
        return _until_arrival(now, durations, ctx, next_arrival)


def _until_arrival(now: float, durations: np.ndarray, contexts: np.ndarray, next_arrival: float) -> tuple | None:
    """End times of steps of ``durations`` from ``now``, accumulated one by one as the event loop
    does, cut after the step that ends at or after ``next_arrival`` (its last); None below 2 steps."""
    k = len(durations)
    ends = np.cumsum(np.concatenate(([now], durations)))[1:]
    if next_arrival < math.inf and ends[-1] < math.inf:  # the step ending at/after the next arrival is the last
        j = int(np.searchsorted(ends, next_arrival, side="left"))
        if j + 1 < k:
            k = j + 1
            if k <= 1:
                return None
    return ends[:k], durations[:k], contexts[:k]
