"""The two per-instance policies of ``disagg``: chunked prefill-only steps, continuous-batching decode.

:class:`replay.core.disagg.DisaggEngine` gives each prefill instance a :class:`PrefillScheduler`
and each decode instance a :class:`DecodeScheduler`; both are ``chunked`` (decode-first
token-budget batching) over the requests their instance holds, so no batching loop is
written twice. What makes them phase-specific is which requests reach them: a prefill
instance only ever holds requests that have not finished their prompt (the engine takes a
request away as soon as its prompt is done), a decode instance only requests whose prompt
KV came over the link.
"""
from __future__ import annotations

from ..core.request import Request
from .base import Batch, ReplicaState
from .chunked import ChunkedScheduler

#: Where the first output token is emitted (``--first-token-from``).
FIRST_TOKEN_FROM = ("prefill", "decode")


class PrefillScheduler(ChunkedScheduler):
    """Prefill instance: prompts in chunks within the token budget, never a decode.

    Each step runs like ``chunked`` over the instance's requests (unfinished prompts first,
    then waiting prompts cut to fill ``max_num_batched_tokens``, preemption when KV blocks
    run out). The requests whose prompt ends in this step are listed in :attr:`handed_over`;
    the engine takes them out of ``running`` at the step's end and starts their KV transfer.

    Parameters
    ----------
    first_token_from : {"prefill", "decode"}
        ``"prefill"`` (DistServe): the step that ends a prompt emits token 1 here.
        ``"decode"``: the prefill instance hands over the KV of the first L - 1 prompt
        tokens and the decode instance's first step feeds the last prompt token and emits
        token 1. The step still computes (and is charged for) the whole prompt.

    Attributes
    ----------
    handed_over : list[Request]
        Requests whose prompt ends in the step just scheduled.

    Notes
    -----
    ``"decode"`` follows vLLM's disaggregated prefill (KV connector): the prefill instance runs
    the prompt, the decode instance loads the prompt's KV minus the last token, recomputes
    that token and streams every output token, the first one included.
    """

    name = "disagg-prefill"
    #: A prefill instance never decodes, so it never has a run of decode steps.
    decode_runs = False

    def __init__(self, first_token_from: str = "prefill"):
        if first_token_from not in FIRST_TOKEN_FROM:
            raise ValueError(f"first_token_from must be one of {FIRST_TOKEN_FROM}, not {first_token_from!r}")
        self.first_token_from = first_token_from
        self.handed_over: list[Request] = []

    def schedule(self, now: float, state: ReplicaState) -> Batch:
        batch = super().schedule(now, state)
        done = []
        hold_last = self.first_token_from == "decode"
        for i, (req, n) in enumerate(zip(batch.requests, batch.num_new_tokens)):
            if req.num_computed_tokens + n == req.num_prompt_tokens + req.num_generated_tokens:  # the last chunk
                done.append(req)
                if hold_last:  # charged for n tokens (the aggregates), n - 1 handed over
                    batch.num_new_tokens[i] = n - 1
        self.handed_over = done
        return batch


class DecodeScheduler(ChunkedScheduler):
    """Decode instance: continuous batching of the requests whose KV has arrived.

    Each step runs like ``chunked``: the running requests decode one token each, then
    transferred requests waiting in arrival-at-the-instance order are admitted while their
    KV blocks (prompt + the next token) are free and fewer than ``max_num_seqs`` run. A request
    preempted here (recompute) recomputes its context on this instance, as vLLM does.

    Parameters
    ----------
    inputs_pending : callable () -> bool, optional
        True while a new request could still reach this instance before the next trace
        arrival (a KV transfer in flight, or a prefill step running). Closed-form runs of
        decode steps (:attr:`decode_runs`) are allowed only when it is False, since the
        engine bounds those runs by the next arrival only. None: always allowed.
    """

    name = "disagg-decode"
    implicit_decoders = True

    def __init__(self, inputs_pending=None):
        self._inputs_pending = inputs_pending

    @property
    def decode_runs(self) -> bool:
        """Whether the engine may advance a run of identical decode steps now (read at every step)."""
        return self._inputs_pending is None or not self._inputs_pending()
