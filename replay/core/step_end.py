"""A step's end, request by request: the tokens each emits, the requests it completes.

The engine (:meth:`~replay.core.engine.Engine._close_step`) calls one of these for the explicit
requests of the batch that ended (the implicit decoders advance by themselves,
:mod:`replay.schedulers.implicit_decoders`; speculative decodes in
:func:`replay.core.spec_decode.end_spec_step`). Requests that emit their last token get status
``"ok"``, their KV blocks freed, and are appended to ``done``.
"""
from __future__ import annotations

from schemas.status import OK
from schemas.step_record import around, step_features


def end_step(batch, kv, now: float, done: list) -> None:
    """Advance the requests of the one step of ``batch`` that ended at ``now`` (seconds).

    A request's computed tokens grow by what it fed; it emits a token when its computed
    tokens reach its prompt plus what it generated (a decode, or a prompt's last chunk; an
    intermediate chunk emits nothing).
    """
    for req, n in zip(batch.requests, batch.num_new_tokens):
        c = req.num_computed_tokens = req.num_computed_tokens + n
        g = req.num_generated_tokens
        if c < req.num_prompt_tokens + g:
            continue  # an intermediate prefill chunk emits nothing
        g = req.num_generated_tokens = g + 1
        if g == 1:
            req.first_token_time_s = now
        req.last_token_time_s = now
        if req.token_times_s is not None:
            req.token_times_s.append(now)
        if g == req.num_output_tokens:
            req.status = OK
            kv.free(req)
            done.append(req)


def end_run(batch, kv, now: float, done: list) -> None:
    """Advance the requests of a closed-form run of ``k`` steps (``batch.run_end_times_s``) that
    ended at ``now``: of decodes, each emitted one token per step; of prompt chunks (one
    request's, :meth:`~replay.core.decode_runs.DecodeRuns.plan_prefill`), none emitted any."""
    ends = batch.run_end_times_s
    k = len(ends)
    if batch.num_prefill_seqs:
        for req, n in zip(batch.requests, batch.num_new_tokens):
            req.num_computed_tokens += k * n
        return
    for req in batch.requests:
        req.num_computed_tokens += k
        req.num_generated_tokens += k
        req.last_token_time_s = now
        if req.token_times_s is not None:
            req.token_times_s.extend(ends)
        if req.num_generated_tokens == req.num_output_tokens:
            req.status = OK
            kv.free(req)
            done.append(req)


def allocate_run(batch, kv, k: int) -> None:
    """Take the KV blocks of ``k`` steps of ``batch`` at once, a closed-form run
    (:mod:`replay.core.decode_runs`): each decode's ``k`` new tokens, or the only request's next
    ``k`` chunks one by one, as step by step (:meth:`~replay.core.kv_cache.KVCache.allocate_chunks`)."""
    if batch.num_prefill_seqs:
        kv.allocate_chunks(batch.requests[0], batch.num_new_tokens[0], k)
    else:
        for r in batch.requests:
            kv.allocate(r, k)


def run_step_rows(rid: int, now: float, batch, durations, contexts, varying: str) -> list:
    """The step-trace rows of a closed-form run of ``batch`` starting at ``now`` (seconds), whose
    end times are ``batch.run_end_times_s``: each step the first one's features but the context
    (``varying``, one of ``contexts``) and its duration (seconds, ``durations``)."""
    before, after = around(step_features(batch), varying)
    starts = [now, *batch.run_end_times_s[:-1]]
    return [(rid, s, d) + before + (c,) + after for s, d, c in zip(starts, durations.tolist(), contexts.tolist())]
