"""The loops the built-in token-budget policies share (and user policies may reuse).

:func:`schedule_running`: the decode-first pass over the running requests, with preemption
(and the replica's implicit decoders, :mod:`.implicit_decoders`, when it has some);
:func:`admit_waiting`: chunked admission of the waiting queue, with prefix-cache hits.
"""
from __future__ import annotations

from ..core.kv_cache import KVCache
from .base import Batch, ReplicaState


def schedule_running(state: ReplicaState, batch: Batch, budget) -> tuple:
    """Decode-first pass over ``state.running`` (vLLM v1): the shared loop of token-budget schedulers.

    Running requests in admission order each feed what they still need (one token while
    decoding, the rest of the prompt otherwise), cut to the token ``budget``. A partial
    prefill is first capped at ``config.long_prefill_token_threshold`` (when positive); under
    speculative decoding (``config.num_speculative_tokens`` K > 0) a decode feeds
    ``min(K + 1, remaining output tokens)`` positions, cut to the budget (vLLM v1 truncates
    the drafts that do not fit). When a
    request's next blocks are not free, the most recently admitted running request is
    preempted (:meth:`ReplicaState.preempt`) until they are; a request that preempts itself
    is skipped.

    Parameters
    ----------
    state : ReplicaState
    batch : Batch
        Filled in place.
    budget : int or float
        Tokens left in the step (``math.inf`` for no limit).

    Returns
    -------
    budget : int or float
        Tokens left after the running requests.
    preempted : bool
        Whether any request was preempted (vLLM then admits no waiting request this step).
    """
    kv = state.kv
    running = state.running
    i = 0
    lazy = state.lazy
    if lazy is not None and lazy.count:
        if not lazy.schedule(kv, batch, budget):
            lazy.materialize_all(state)
        else:
            budget -= lazy.count
            i = lazy.count  # running[:count] are the implicit decoders
            if i == len(running):
                return budget, False
    preempted = False
    spec = state.config.num_speculative_tokens
    # Hot path: a decoding request on a plain paged cache feeds one token and takes a block
    # only when it crosses a block boundary; its bookkeeping is inlined (same result as the
    # general path below, which handles prefills, prefix caches, speculative decodes and preemption).
    plain = type(kv) is KVCache and not spec
    bs = kv.block_size
    reqs, nnt = batch.requests, batch.num_new_tokens
    num_dec = dec_ctx = 0
    while i < len(running) and budget > 0:
        req = running[i]
        c = req.num_computed_tokens
        if plain and req.num_generated_tokens and req.num_prompt_tokens + req.num_generated_tokens - c == 1:
            if c < req.num_blocks * bs:
                pass
            elif kv.num_free_blocks:
                kv.num_free_blocks -= 1
                req.num_blocks += 1
            else:
                c = -1  # no free block: take the general path (preemption)
            if c >= 0:
                reqs.append(req)
                nnt.append(1)
                num_dec += 1
                dec_ctx += c + 1
                budget -= 1
                i += 1
                continue
        n = req.num_uncomputed_tokens
        if spec and n == 1 and req.num_generated_tokens:  # a decode: its next token and up to K drafts
            n = min(spec + 1, req.num_output_tokens - req.num_generated_tokens)
        elif n > 1 and 0 < (threshold := state.config.long_prefill_token_threshold) < n:
            n = threshold  # a partial prefill, capped before the budget (NC-05)
        if n > budget:
            n = budget
        while not kv.try_allocate(req, n):
            victim = running[-1]
            state.preempt(victim)
            preempted = True
            if victim is req:
                break
        else:
            batch.add(req, n)
            budget -= n
            i += 1
    batch.num_decode_seqs += num_dec
    batch.decode_context_tokens += dec_ctx
    return budget, preempted


def admit_waiting(state: ReplicaState, batch: Batch, budget, now: float, whole_prompts: bool = False,
                  reserve_peak: bool = False):
    """Admit ``state.waiting`` in its current order, prompts chunked to fill the token ``budget``.

    Stops at the first request whose blocks are not free (head-of-line, as vLLM v1), when
    ``max_num_seqs`` requests run, or when the budget is spent. A request admitted the first
    time takes its prefix-cache hit (:meth:`KVCache.lookup`) and feeds only the rest. A chunk
    is capped at ``config.long_prefill_token_threshold`` (when positive) before the budget,
    except with ``whole_prompts``.

    Parameters
    ----------
    whole_prompts : bool
        Admit whole prompts only (vLLM v0, no chunking); a prompt longer than the budget
        is admitted alone into an empty batch, so every request eventually runs.
    reserve_peak : bool
        Take the blocks of the request's peak KV (prompt + output - 1 tokens) up front, as
        request-level batching does, so it never needs preemption.

    Returns
    -------
    budget : int
        Tokens left in the step (negative after an oversized whole prompt).
    """
    kv = state.kv
    waiting = state.waiting
    max_num_seqs = state.config.max_num_seqs
    threshold = state.config.long_prefill_token_threshold
    while waiting and budget > 0 and len(state.running) < max_num_seqs:
        req = waiting[0]
        hit = kv.lookup(req) if kv.enable_prefix_caching else 0
        need = req.num_prompt_tokens + req.num_generated_tokens - req.num_computed_tokens - hit  # uncomputed
        if whole_prompts:
            if need > budget and (batch.requests or batch.num_lazy_decodes):
                break
            n = need
        else:
            n = threshold if 0 < threshold < need else need  # the per-request cap first (NC-05)
            if n > budget:
                n = budget
        take = req.peak_kv_tokens - req.num_computed_tokens - hit if reserve_peak else n
        if not kv.try_allocate(req, take, hit):
            break
        waiting.popleft()
        state.admit(req, now)
        batch.add(req, n)
        budget -= n
    return budget
