"""The step-time expression, written once for Python numbers and numpy arrays.

:class:`replay.cost_model.RooflineCostModel` folds its terms (:mod:`replay.cost_terms`) into
:class:`~replay.cost_terms.Coefficients` and evaluates them with the function
:func:`step_time_function` returns: on Python numbers in the engine's hot path, on arrays
in the closed-form decode runs, the fits and the per-term components. Both are the same
code; only two operations are spelled apart (:func:`_fold_scalar` / :func:`_fold_array`:
``max`` and ``min`` return the same floats as numpy's; the experts' ``miss ** N`` is
Python's ``pow`` on both), so the paths agree bit for bit.

The features are the step record's (:data:`schemas.step_record.STEP_FEATURES`).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

#: The folded step time, seconds, for a step of ``N > 0`` tokens (a step with none takes
#: 0 s), in Python syntax: the coefficients (:class:`~replay.cost_terms.Coefficients`, names
#: without their ``_s`` unit) times the step's features ``P`` prefill tokens in ``S`` chunks,
#: ``D`` decodes feeding ``Q`` positions (``Q = D`` without speculative decoding), ``C_d``
#: the decodes' context and ``C_p`` the chunks' KV history. The README quotes it and a test
#: evaluates it against the code.
FORMULA = """\
N = P + Q
A = C_d + (Q - D) * (C_d / max(D, 1) + Q / (2 * max(D, 1))) + (P * C_p + P * P / 2) / max(S, 1)
C = C_d + C_p + (Q - D)
c = compute_per_token * N + compute + compute_per_pair * A
m = (memory + memory_per_context_token * C + memory_per_prefill_context_token * C_p
     + memory_expert * (1 - expert_miss ** N))
step = fixed + per_seq * (S + D) + max(c, m) + overlap * min(c, m) + (comm + comm_per_token * N)"""


def _fold_scalar(c: float, m: float, overlap: float) -> float:
    """``max(c, m) + overlap min(c, m)`` of two floats."""
    return c + overlap * m if c > m else m + overlap * c


def _fold_array(c: np.ndarray, m: np.ndarray, overlap: float) -> np.ndarray:
    """``max(c, m) + overlap min(c, m)`` elementwise."""
    return np.maximum(c, m) + overlap * np.minimum(c, m)


def _pow_each(base: float, exponents: np.ndarray) -> np.ndarray:
    """``base ** n`` by Python's ``pow``, once per distinct ``n`` (numpy's may differ in the last bit)."""
    unique, inverse = np.unique(exponents, return_inverse=True)
    return np.array([base ** int(n) for n in unique])[inverse.reshape(np.shape(exponents))]


def step_time_function(coef, arrays: bool):
    """The step time of the folded coefficients ``coef``, as a function of the features.

    Parameters
    ----------
    coef : replay.cost_terms.Coefficients
    arrays : bool
        False: the function takes Python numbers (the engine's per step); True: int64 arrays
        of one shape (numpy broadcasting).

    Returns
    -------
    callable ``(p, s, d, cd, cp, q=None) -> seconds``
        :data:`FORMULA` of the features ``P, S, D, C_d, C_p, Q`` (``Q`` None: ``D``, one
        position per decode). The caller keeps ``S >= 1`` when ``P > 0``, ``Q >= D`` and
        ``Q = 0`` without decodes, and gives 0 s to a step with no tokens (the expression
        would price its fixed overheads).

    Notes
    -----
    The decode pairs: each of a sequence's ``Q / D`` positions attends to its context and
    the positions before it, ``(Q / D) C_d + (Q - D) Q / (2 D)`` (exact for equal verify
    lengths, as the prefill pairs are for equal chunks), written ``C_d + (Q - D) (C_d / D +
    Q / (2 D))`` so that ``Q = D`` gives exactly ``C_d`` (``C_d + 0.0``): passing ``Q = D``
    gives the floats of ``Q`` None. ``max(S, 1)`` and ``max(D, 1)`` are spelled
    ``S + (S == 0)``: the same for counts, on numbers and arrays alike.
    """
    fixed, per_seq, c_tok, c_0, c_pair, m_0, m_ctx, m_pctx, m_exp, miss, overlap, k_0, k_tok = coef.as_tuple()
    fold, pow_each = (_fold_array, _pow_each) if arrays else (_fold_scalar, pow)

    def step_time_s(p, s, d, cd, cp, q=None):
        if q is None:
            tokens, pairs, ctx = p + d, cd, cd + cp
        else:
            d1 = d + (d == 0)
            tokens, pairs, ctx = p + q, cd + (q - d) * (cd / d1 + q / (2 * d1)), cd + cp + (q - d)
        pairs = pairs + (p * cp + p * p / 2) / (s + (s == 0))
        c = c_tok * tokens + c_0 + c_pair * pairs
        m = m_0 + m_ctx * ctx + m_pctx * cp
        if m_exp:
            m = m + m_exp * (1.0 - pow_each(miss, tokens))
        return fixed + per_seq * (s + d) + fold(c, m, overlap) + (k_0 + k_tok * tokens)

    return step_time_s


def unfolded(coef):
    """``coef`` with ``overlap`` 1: compute and memory time add (``max + min = c + m``), so the
    step time is the sum of the terms' own times (:meth:`RooflineCostModel.eval_components`)."""
    return replace(coef, overlap=1.0)
