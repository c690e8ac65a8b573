"""Speculative decoding in the engine: the drafts a step accepts and the tokens it then emits.

With ``SchedulerConfig.num_speculative_tokens`` K > 0 a decode verifies up to ``K + 1``
positions (its next token and the drafts) and emits ``1 +`` the accepted drafts, all at the
step's end. The cost model must price the verified positions (:func:`check_cost_models`);
:func:`sample_accepted_drafts` draws the accepted counts, :func:`end_spec_step` emits them.
"""
from __future__ import annotations

import inspect

import numpy as np

from schemas.status import OK

from ..errors import ConfigError


def check_cost_models(cost_models) -> None:
    """Refuse a cost model that cannot price the draft positions (no ``num_decode_tokens``)."""
    for model in {id(cm): cm for cm in cost_models}.values():
        try:
            params = inspect.signature(model.step_time_s).parameters
        except (TypeError, ValueError):
            continue
        if "num_decode_tokens" not in params and not any(p.kind == p.VAR_KEYWORD for p in params.values()):
            raise ConfigError(f"--speculative-tokens: the cost model {type(model).__name__} has no "
                              "num_decode_tokens argument, so it cannot price the verified draft tokens")


def sample_accepted_drafts(rng: np.random.Generator, acceptance_rate: float, drafts: list) -> list:
    """Accepted draft tokens of the decodes of one step: for the ``i``-th, the leading successes
    of ``drafts[i]`` Bernoulli(``acceptance_rate``) trials.

    vLLM's rejection sampler accepts a prefix of the drafts: the first rejected draft ends
    it (its position gets the target model's token instead, the "+ 1"). The count is
    ``min(G, drafts[i])`` with ``G`` geometric (failures before the first success at
    rate ``1 - A``), drawn from ``rng`` (the replica's seeded generator), one draw per decode.

    Notes
    -----
    With per-draft acceptance ``A`` and ``K`` drafts, the mean tokens per verify step
    (vLLM's "mean acceptance length") is ``(1 - A^(K+1)) / (1 - A)`` and the fraction of
    drafts accepted (vLLM's "draft acceptance rate") ``A (1 - A^K) / (K (1 - A))``, below ``A``.
    """
    if acceptance_rate >= 1.0:
        return list(drafts)
    if acceptance_rate <= 0.0:
        return [0] * len(drafts)
    g = rng.geometric(1.0 - acceptance_rate, len(drafts)) - 1
    return np.minimum(g, drafts).tolist()


def end_spec_step(batch, kv, now: float, done: list, accept_drafts, counts: dict) -> None:
    """Emit the tokens of a step with speculative decodes (explicit requests only).

    A decode that fed ``n`` positions (its next token and ``n - 1`` drafts) emits ``1 + a``
    tokens, ``a`` the accepted drafts (``accept_drafts(drafts) -> accepted``), all at ``now``;
    its KV keeps the accepted positions (the rejected ones' slots are reused later, its blocks
    kept, as vLLM). A prefill chunk emits the first token (or nothing) as without speculation.
    Requests that emit their last token are freed and appended to ``done``; ``counts`` (by
    ``Request.index``) accumulates ``[verify steps, draft tokens, accepted tokens]``.
    """
    reqs, nnt = batch.requests, batch.num_new_tokens
    decodes = [i for i, r in enumerate(reqs) if r.num_generated_tokens and r.num_uncomputed_tokens == 1]
    accepted = [0] * len(reqs)
    verifying = [i for i in decodes if nnt[i] > 1]
    if verifying:
        drafts = [nnt[i] - 1 for i in verifying]
        got = accept_drafts(drafts)
        for i, d, a in zip(verifying, drafts, got):
            if not 0 <= a <= d:
                raise AssertionError(f"accept_drafts gave {a} accepted of {d} drafts")
            accepted[i] = a
            c = counts.get(reqs[i].index)
            if c is None:
                counts[reqs[i].index] = [1, d, a]
            else:
                c[0] += 1
                c[1] += d
                c[2] += a
    is_decode = [False] * len(reqs)
    for i in decodes:
        is_decode[i] = True
    for req, n, dec, a in zip(reqs, nnt, is_decode, accepted):
        g = req.num_generated_tokens
        if dec:
            e = 1 + a
            req.num_computed_tokens += e
        else:
            c = req.num_computed_tokens = req.num_computed_tokens + n
            if c < req.num_prompt_tokens + g:
                continue  # an intermediate prefill chunk emits nothing
            e = 1
        g = req.num_generated_tokens = g + e
        if g == e:
            req.first_token_time_s = now
        req.last_token_time_s = now
        if req.token_times_s is not None:
            req.token_times_s.extend([now] * e)
        if g == req.num_output_tokens:
            req.status = OK
            kv.free(req)
            done.append(req)
