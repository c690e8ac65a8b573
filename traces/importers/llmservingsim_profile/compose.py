"""The composition physics: operator times of one layer -> the time of one step.

Each row of ``attention.csv`` is one batch shape ``(prefill_chunk, kv_prefill,
n_decode, kv_decode)``: one prefill chunk of ``prefill_chunk`` tokens that sees
``kv_prefill`` tokens of history, plus ``n_decode`` decode requests holding
``kv_decode`` tokens of context each. Kinds: prefill-only (``n_decode = 0``),
decode-only (``prefill_chunk = 0``), mixed (both > 0). With

- ``T = prefill_chunk + n_decode`` tokens in the step and
- ``S = [prefill_chunk > 0] + n_decode`` sequences that reach the LM head,

the step time in microseconds is::

    t = L * ( 2*layernorm(T) + qkv_proj(T) + rotary_emb(T) + o_proj(T)
              + gate_up_proj(T) + act_fn(T) + down_proj(T) + attention(grid point) )
        + embedding(T) + final_layernorm(T) + lm_head(S) + sampler(S)

and ``step_duration_s = t * 1e-6``. ``L`` is ``num_layers``. ``op(T)`` is linear
interpolation (:func:`numpy.interp`) of ``dense.csv`` in ``tokens``, ``op(S)`` of
``per_sequence.csv`` in ``sequences``; ``attention`` is the grid point's own
``time_us``.

Assumptions, with their source:

- ``layernorm`` twice per layer: LLMServingSim's Llama catalog
  (``profiler/models/llama.yaml``) emits ``layernorm`` in ``pre_attn`` and again in
  ``post_attn`` (vLLM's input_layernorm and post_attention_layernorm), and its timing
  extraction (``profiler/core/hooks/timings.py``) divides the summed RMSNorm time
  by parent invocations times that occurrence count, i.e. the row is the mean of
  ONE call. ``final_layernorm`` is the model's last norm, once per step.
- ``lm_head`` and ``sampler`` run once per step on S rows: vLLM computes logits only
  at the last position of each scheduled sequence. A prefill chunk counts as one
  sequence whether or not it is the prompt's last chunk (vLLM V1 computes, then
  discards, the token of a partial prefill), so S = 1 + n_decode for a chunk.
- The profile has no tensor-parallel communication: for ``tp > 1`` the tables time
  one shard and no all-reduce is added. CPU time between steps (scheduling,
  detokenising) is not in the profile either, so these steps are GPU-only.
- Within a shape all decode requests share one ``kv_decode``. The profiler's skew
  tables (``skew.csv``, ``skew_fit.csv``, meta.yaml ``skew_*``), which correct for
  uneven decode contexts, are ignored, as are any other files in the folder.
- Points needing ``T`` or ``S`` outside the profiled range are never extrapolated
  (see the importer's ``strict``). On the published profiles this removes the mixed shapes with a
  2048-token chunk plus decodes (T > 2048), which also exceed the profiled engine's
  ``max_num_batched_tokens`` = 2048 and so cannot occur in it.
"""
from __future__ import annotations

import numpy as np

from ...errors import TraceError

#: Per-layer dense ops of a Llama decoder layer -> calls per layer. The profiler's
#: ``layernorm`` row is the mean of ONE RMSNorm call; Llama runs two per layer
#: (input_layernorm before attention, post_attention_layernorm after o_proj).
PER_LAYER_DENSE_CALLS: dict[str, int] = {
    "layernorm": 2,
    "qkv_proj": 1,
    "rotary_emb": 1,
    "o_proj": 1,
    "gate_up_proj": 1,
    "act_fn": 1,
    "down_proj": 1,
}

#: Dense ops that run once per step (not per layer), at all the step's tokens.
PER_STEP_DENSE = ("embedding", "final_layernorm")

#: Ops that run once per step on one row per sampled sequence.
PER_STEP_SEQUENCE = ("lm_head", "sampler")


def _interp(table: tuple[np.ndarray, np.ndarray], x: np.ndarray) -> np.ndarray:
    """Linear interpolation in the point count; refuses to extrapolate."""
    xp, fp = table
    if x.size and (x.min() < xp[0] or x.max() > xp[-1]):
        raise TraceError(f"point {x.min() if x.min() < xp[0] else x.max()} outside the profiled "
                         f"range [{xp[0]:g}, {xp[-1]:g}]")  # guarded by the caller's mask
    return np.interp(x, xp, fp)


def covered_range(tables: dict[str, tuple[np.ndarray, np.ndarray]]) -> tuple[int, int]:
    """The point range every table covers: [max of minima, min of maxima]."""
    return (int(max(t[0][0] for t in tables.values())),
            int(min(t[0][-1] for t in tables.values())))


def step_duration_s(dense: dict, per_seq: dict, attention_us: np.ndarray, tokens: np.ndarray,
                    seqs: np.ndarray, num_layers: int) -> np.ndarray:
    """The step time of each grid point, seconds (the formula above).

    Parameters
    ----------
    dense, per_seq : dict op -> (x sorted, time_us)
        The tables of ``dense.csv`` (x = tokens) and ``per_sequence.csv`` (x = sequences).
    attention_us : ndarray of float64
        Each grid point's own attention time, microseconds per layer.
    tokens, seqs : ndarray of float64
        ``T`` and ``S`` of each grid point, inside the tables' range.
    num_layers : int
        ``L``.
    """
    per_layer_us = attention_us.copy()
    for op, calls in PER_LAYER_DENSE_CALLS.items():
        per_layer_us += calls * _interp(dense[op], tokens)
    step_us = num_layers * per_layer_us
    for op in PER_STEP_DENSE:
        step_us += _interp(dense[op], tokens)
    for op in PER_STEP_SEQUENCE:
        step_us += _interp(per_seq[op], seqs)
    return step_us * 1e-6


#: The formula as one line of text (the ``composition`` metadata), built from the op lists.
COMPOSITION = (
    "t_us = L*(" + "+".join(f"{c}*{op}(T)" if c != 1 else f"{op}(T)" for op, c in PER_LAYER_DENSE_CALLS.items())
    + "+attention) + " + "+".join(f"{op}(T)" for op in PER_STEP_DENSE) + "+"
    + "+".join(f"{op}(S)" for op in PER_STEP_SEQUENCE) + "; T=prefill_chunk+n_decode, S=[prefill_chunk>0]+n_decode")
