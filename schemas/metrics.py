"""Quantities derived from the contract's rows, defined once: a request's TPOT, a step's kind.

Numpy only (no Arrow), so the engine side can use them as cheaply as the importers.
"""
from __future__ import annotations

import numpy as np

#: The kinds of a step (``step_trace/1`` row): prompt tokens only, decodes only, or both.
PREFILL_ONLY = "prefill_only"
DECODE_ONLY = "decode_only"
MIXED = "mixed"
STEP_KINDS = (PREFILL_ONLY, DECODE_ONLY, MIXED)


def tpot_s(ttft_s, e2e_s, num_output_tokens):
    """Time per output token after the first, seconds: ``(E2E - TTFT) / (N - 1)``, NaN where N < 2.

    Parameters
    ----------
    ttft_s, e2e_s : array_like of float, seconds
    num_output_tokens : array_like of int
    """
    ttft_s, e2e_s = np.asarray(ttft_s, float), np.asarray(e2e_s, float)
    n = np.asarray(num_output_tokens, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = (e2e_s - ttft_s) / (n - 1)
    return np.where(n >= 2, out, np.nan)


def step_kind(num_prefill_tokens, num_decode_seqs) -> np.ndarray:
    """:data:`MIXED`, :data:`PREFILL_ONLY` or :data:`DECODE_ONLY` for each step (arrays of counts)."""
    pre, dec = np.asarray(num_prefill_tokens) > 0, np.asarray(num_decode_seqs) > 0
    return np.where(pre & dec, MIXED, np.where(pre, PREFILL_ONLY, DECODE_ONLY))
