"""A distribution known by its mass between points (histogram buckets, percentiles) and its exact mean.

A Prometheus histogram keeps, of the values it observed, the count at or below each bucket
bound and the exact sum; a benchmark's summary keeps some percentiles and the mean. Between
two known points of the CDF the values are not known. Prometheus' ``histogram_quantile`` and a
piecewise-linear inverse CDF take them as uniform over each segment, whose mean is then in
general not the exact one (up to half a segment's width off: vLLM's 1-2-5 length buckets and
its TPOT buckets hold most requests of a run in one bucket, bench/PROMETHEUS.md).

Here the density is the one of maximum entropy among those with the known mass in every
segment and the known mean: ``p(x) ∝ exp(λ x)`` inside each segment with one ``λ`` for all
(the exponential family that a mean constraint gives; Jaynes 1957, "Information theory and
statistical mechanics"; equivalently the I-projection of the piecewise-uniform density onto
the distributions with that mean, Csiszár 1975). ``λ = 0`` is the piecewise-uniform density,
kept exactly when its mean is already the known one. A mean outside what the segments allow
(below the mass-weighted lower edges or above the upper edges: inconsistent inputs, or a
value beyond the last finite bound) is approached as closely as they allow.

Within a segment ``[a, a + w]`` with ``t = λ w``, ``u = (x - a) / w`` has density
``t e^{t u} / (e^t - 1)`` on [0, 1], mean ``1 / (1 - e^{-t}) - 1 / t`` and inverse CDF
``log(1 + p (e^t - 1)) / t``.
"""
from __future__ import annotations

import numpy as np
from scipy.optimize import brentq

__all__ = ["segment_tilt", "tilted_quantiles"]

#: |t| below which a segment's formulas use their series at t = 0 (relative error < 1e-12).
_SMALL_T = 1e-6
#: The tilt, in units of 1 / (the span of the points), searched up to this magnitude.
_MAX_SPAN_TILT = 1e6


def _unit_mean(t: np.ndarray) -> np.ndarray:
    """Mean of ``u`` on [0, 1] with density ∝ ``e^{t u}`` (1/2 at t = 0), elementwise."""
    t = np.asarray(t, float)
    a = np.abs(t)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        pos = np.where(a < _SMALL_T, 0.5 + a / 12.0, 1.0 / -np.expm1(-a) - 1.0 / a)  # mean at |t|
    return np.where(t >= 0, pos, 1.0 - pos)


def _unit_quantile(t: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Inverse CDF at ``p`` in [0, 1] of ``u`` on [0, 1] with density ∝ ``e^{t u}``, elementwise."""
    t, p = np.broadcast_arrays(np.asarray(t, float), np.asarray(p, float))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        # t > 0: 1 + log(p + (1 - p) e^{-t}) / t, in logs (no overflow); t < 0: log1p(p expm1(t)) / t
        pos = 1.0 + np.logaddexp(np.log(p), np.log1p(-p) - t) / t
        neg = np.log1p(p * np.expm1(t)) / t
    return np.clip(np.where(np.abs(t) < _SMALL_T, p + t * p * (1.0 - p) / 2.0, np.where(t > 0, pos, neg)), 0.0, 1.0)


def segment_tilt(edges: np.ndarray, masses: np.ndarray, mean: float) -> float:
    """The ``λ`` (per unit of the values) of the maximum-entropy density with mass ``masses[k]``
    in ``[edges[k], edges[k + 1]]`` and mean ``mean`` (module docstring).

    Parameters
    ----------
    edges : array of K + 1 floats, non-decreasing (the values' unit: tokens, seconds).
    masses : array of K floats >= 0 summing to > 0 (normalized here).
    mean : float, the known mean, in the unit of ``edges``.

    Returns
    -------
    float
        0 when the piecewise-uniform mean is ``mean`` (to 1e-9 of the span) or the span is 0;
        otherwise the root of the mean's equation (scipy's ``brentq``), or the largest
        magnitude searched (``_MAX_SPAN_TILT`` / span) toward a mean the segments cannot reach.

    Raises
    ------
    ValueError
        Edges not non-decreasing, masses negative or all 0, a mean that is not finite.
    """
    x = np.asarray(edges, float)
    m = np.asarray(masses, float)
    if x.ndim != 1 or m.shape != (x.size - 1,) or np.any(np.diff(x) < 0) or np.any(m < 0) or not m.sum() > 0 \
            or not np.isfinite(mean) or not np.all(np.isfinite(x)):
        raise ValueError("segment_tilt: needs finite non-decreasing edges, masses >= 0 (one per segment, not all 0) "
                         "and a finite mean")
    m = m / m.sum()
    lo, w = x[:-1], np.diff(x)
    span = float(x[-1] - x[0])
    if span <= 0:
        return 0.0

    def excess(s: float) -> float:
        return float(np.sum(m * (lo + w * _unit_mean(s * w / span)))) - mean

    if abs(excess(0.0)) <= 1e-9 * span:
        return 0.0
    sign = 1.0 if excess(0.0) < 0 else -1.0
    s = 1.0
    while sign * excess(sign * s) < 0:
        if s >= _MAX_SPAN_TILT:
            return sign * s / span
        s *= 4.0
    return brentq(excess, min(0.0, sign * s), max(0.0, sign * s), xtol=1e-12, rtol=1e-12) / span


def tilted_quantiles(edges: np.ndarray, cum: np.ndarray, mean: float | None, p: np.ndarray) -> np.ndarray:
    """The values at cumulative probabilities ``p`` of the distribution with CDF ``cum[k]`` at
    ``edges[k]`` and mean ``mean`` (maximum entropy, module docstring; ``mean`` None: the
    piecewise-uniform one, linear inside each segment, as Prometheus' ``histogram_quantile``).

    Parameters
    ----------
    edges : array of K + 1 floats, non-decreasing (tokens, seconds, ...).
    cum : array of K + 1 floats, non-decreasing from ``cum[0]`` (the mass below ``edges[0]``,
        usually 0) to ``cum[-1]`` (the total): counts or fractions alike.
    mean : float or None, in the unit of ``edges``.
    p : array of floats in [0, 1], fractions of the total.

    Returns
    -------
    numpy array of the shape of ``p``, in the unit of ``edges``.

    Raises
    ------
    ValueError
        As :func:`segment_tilt`; ``cum`` of another length than ``edges`` or decreasing.
    """
    x, c = np.asarray(edges, float), np.asarray(cum, float)
    if c.shape != x.shape or np.any(np.diff(c) < 0) or not c[-1] > c[0]:
        raise ValueError("tilted_quantiles: cum must be non-decreasing, one per edge, with mass in some segment")
    frac = (c - c[0]) / (c[-1] - c[0])
    masses = np.diff(frac)
    lam = 0.0 if mean is None else segment_tilt(x, masses, mean)
    p = np.clip(np.asarray(p, float), 0.0, 1.0)
    # the segment holding p: the first whose upper CDF reaches it (p = 0: the first with mass)
    k = np.minimum(np.searchsorted(frac[1:], np.maximum(p, np.finfo(float).tiny), side="left"), masses.size - 1)
    within = np.where(masses[k] > 0, (p - frac[k]) / np.where(masses[k] > 0, masses[k], 1.0), 0.0)
    w = np.diff(x)[k]
    return x[k] + w * _unit_quantile(lam * w, np.clip(within, 0.0, 1.0))
