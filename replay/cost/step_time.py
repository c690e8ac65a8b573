"""The step-time expression, written once for Python numbers and numpy arrays.

:class:`replay.cost.cost_model.RooflineCostModel` folds its terms (:mod:`replay.cost.cost_terms`) into
:class:`~replay.cost.term_base.Coefficients` and evaluates them with the function
:func:`step_time_function` returns: on Python numbers in the engine's hot path, on arrays
in the closed-form decode runs, the fits and the per-term components. Both go through the
same lines; only two operations are spelled apart (the fold's ``max``/``min``, which return
the same floats as numpy's, and the experts' ``miss ** N``, Python's ``pow`` on both), so
the paths agree bit for bit.

The features are the step record's (:data:`schemas.step_record.STEP_FEATURES`): the kept
ones are the arguments; a derived one a term prices (``Coefficients.per_feature``) is
computed here from them.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from schemas.step_record import DERIVED_FEATURES, KeptFeatures

from .term_base import PARTS

#: The folded step time, seconds, for a step of ``N > 0`` tokens (a step with none takes
#: 0 s), in Python syntax: the coefficients (:class:`~replay.cost.term_base.Coefficients`, names
#: without their ``_s`` unit) times the step's features ``P`` prefill tokens in ``S`` chunks,
#: ``D`` decodes feeding ``Q`` positions (``Q = D`` without speculative decoding), ``C_d``
#: the decodes' context and ``C_p`` the chunks' KV history; ``c_x``, ``m_x`` and ``serial_x``
#: the sums over the derived features ``x`` a term prices (``Coefficients.per_feature``; 0
#: without such a term) of their seconds per unit times the step's ``x``. docs/cost-model.md
#: quotes it and a test evaluates it against the code.
FORMULA = """\
N = P + Q
A = C_d + (Q - D) * (C_d / max(D, 1) + Q / (2 * max(D, 1))) + (P * C_p + P * P / 2) / max(S, 1)
C = C_d + C_p + (Q - D)
c = compute_per_token * N + compute + compute_per_pair * A + c_x
m = (memory + memory_per_context_token * C + memory_per_prefill_context_token * C_p + memory_per_seq * (S + D)
     + memory_expert * (1 - expert_miss ** N) + m_x)
step = fixed + serial_x + per_seq * (S + D) + max(c, m) + overlap * min(c, m) + (comm + comm_per_token * N)"""


def _pow_each(base: float, exponents: np.ndarray) -> np.ndarray:
    """``base ** n`` by Python's ``pow``, once per distinct ``n`` (numpy's may differ in the last bit)."""
    unique, inverse = np.unique(exponents, return_inverse=True)
    return np.array([base ** int(n) for n in unique])[inverse.reshape(np.shape(exponents))]


def feature_arrays(p, s, d, cd, cp, q) -> tuple:
    """A step's features as arrays, in :func:`step_time_function`'s order ``P, S, D, C_d, C_p, Q``:
    ``S`` None made one chunk with prefill tokens (``Q`` None stays: one position per decode).

    Raises
    ------
    ValueError
        ``Q`` below ``D``, or above 0 without decodes.
    """
    p, d, cd, cp = (np.asarray(v) for v in (p, d, cd, cp))
    if q is not None:
        q = np.asarray(q)
        if np.any(q < d) or np.any((q > 0) & (d == 0)):
            raise ValueError("num_decode_tokens must be >= num_decode_seqs (and 0 without decodes)")
    s = (p > 0).astype(np.int64) if s is None else np.asarray(s)
    return p, s, d, cd, cp, q


def step_time_function(coef):
    """The step time of the folded coefficients ``coef``, as a function of the step's features.

    Parameters
    ----------
    coef : replay.cost.term_base.Coefficients

    Returns
    -------
    callable
        ``(num_prefill_tokens, num_decode_seqs, decode_context_tokens, prefill_context_tokens=0,
        num_prefill_seqs=None, num_decode_tokens=None) -> seconds``: the signature of
        :meth:`replay.cost.cost_model.StepCostModel.step_time_s`, on Python numbers (a float; the
        engine's, per step) or numpy arrays of one shape (a float64 array). :data:`FORMULA` of
        the features; ``num_prefill_seqs`` None counts one chunk with prefill tokens,
        ``num_decode_tokens`` None one position per decode; a step with no tokens takes 0 s.
        It raises ``ValueError`` for ``num_decode_tokens`` below ``num_decode_seqs`` or above
        0 without decodes.

    Notes
    -----
    The decode pairs: each of a sequence's ``Q / D`` positions attends to its context and
    the positions before it, ``(Q / D) C_d + (Q - D) Q / (2 D)`` (exact for equal verify
    lengths, as the prefill pairs are for equal chunks), written ``C_d + (Q - D) (C_d / D +
    Q / (2 D))`` so that ``Q = D`` gives exactly ``C_d`` (``C_d + 0.0``): passing ``Q = D``
    gives the floats of ``Q`` None. ``max(S, 1)`` and ``max(D, 1)`` are spelled
    ``S + (S == 0)``: the same for counts, on numbers and arrays alike. Numbers and arrays go
    through the same lines; the fold's ``max``/``min`` and the experts' ``pow`` are spelled
    for each (the same floats), and the engine's per-step call costs one Python call.
    """
    fixed, per_seq, c_tok, c_0, c_pair, m_0, m_ctx, m_pctx, m_seq, m_exp, miss, overlap, k_0, k_tok = coef.as_tuple()
    derived = _priced_derived(coef)

    def step_time_s(num_prefill_tokens, num_decode_seqs, decode_context_tokens, prefill_context_tokens=0,
                    num_prefill_seqs=None, num_decode_tokens=None):
        p, d, cd, cp, s, q = (num_prefill_tokens, num_decode_seqs, decode_context_tokens, prefill_context_tokens,
                              num_prefill_seqs, num_decode_tokens)
        tokens = p + (d if q is None else q)
        scalar = tokens.__class__ is int or not isinstance(tokens, np.ndarray)
        if not scalar:
            p, s, d, cd, cp, q = feature_arrays(p, s, d, cd, cp, q)
            tokens = p + (d if q is None else q)
        elif q is not None and (q < d or (q and not d)):
            raise ValueError(f"num_decode_tokens={q} must be >= num_decode_seqs={d} (and 0 without decodes)")
        elif tokens <= 0:
            return 0.0
        elif s is None:
            s = 1 if p > 0 else 0
        if q is None:
            pairs, ctx = cd, cd + cp
        else:
            d1 = d + (d == 0)
            pairs, ctx = cd + (q - d) * (cd / d1 + q / (2 * d1)), cd + cp + (q - d)
        pairs = pairs + (p * cp + p * p / 2) / (s + (s == 0))
        c = c_tok * tokens + c_0 + c_pair * pairs
        m = m_0 + m_ctx * ctx + m_pctx * cp
        if m_seq:
            m = m + m_seq * (s + d)
        if m_exp:
            m = m + m_exp * (1.0 - (miss ** tokens if scalar else _pow_each(miss, tokens)))
        start = fixed
        if derived:
            x = KeptFeatures._make((p, s, d, cd, cp, d if q is None else q))
            for derive, k_c, k_m, k_serial in derived:
                value = derive(x)
                c, m, start = c + k_c * value, m + k_m * value, start + k_serial * value
        if scalar:
            body = c + overlap * m if c > m else m + overlap * c
        else:
            body = np.maximum(c, m) + overlap * np.minimum(c, m)
        t = start + per_seq * (s + d) + body + (k_0 + k_tok * tokens)
        return t if scalar else np.where(tokens > 0, t, 0.0)

    return step_time_s


def _priced_derived(coef) -> tuple:
    """``(derive, compute, memory, serial)`` for each derived feature ``coef`` prices: its
    function and its seconds per unit in each of :data:`~replay.cost.term_base.PARTS`
    (:attr:`~replay.cost.term_base.Coefficients.per_feature`), in record order."""
    k = coef.per_feature
    return tuple((f.derive, *(k.get((part, f.name), 0.0) for part in PARTS))
                 for f in DERIVED_FEATURES if any((part, f.name) in k for part in PARTS))


def unfolded(coef):
    """``coef`` with ``overlap`` 1: compute and memory time add (``max + min = c + m``), so the
    step time is the sum of the terms' own times (:meth:`RooflineCostModel.eval_components`)."""
    return replace(coef, overlap=1.0)
