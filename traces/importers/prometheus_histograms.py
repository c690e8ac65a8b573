"""Histogram arithmetic on the increases of Prometheus histogram series (one window's).

The series of one histogram are the ``<name>_bucket`` series (label ``le``: the upper bound,
``+Inf`` the last; each counts the observations <= its bound), ``<name>_count`` and
``<name>_sum``. :func:`bucket_counts` sums them over label sets, :func:`histogram_quantile`
interpolates a percentile as Prometheus' ``histogram_quantile`` does (linearly inside the
bucket; the lowest bucket from 0; one in the ``+Inf`` bucket is the highest finite bound), and
:func:`histogram_percentiles` inside the bucket with the density of maximum entropy that has
the histogram's exact mean (``_sum / _count``, which ``histogram_quantile`` does not use:
:mod:`traces.binned`).
"""
from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from ..binned import tilted_quantiles
from ..errors import TraceFormatError

__all__ = ["bucket_counts", "histogram_percentiles", "histogram_quantile", "histogram_stats"]


def bucket_counts(inc: dict, name: str, where: str) -> tuple[list[tuple[float, float]], float, float] | None:
    """Summed over label sets of one group: (upper bound, cumulative count) pairs, count, sum."""
    buckets: dict[tuple, dict[float, float]] = defaultdict(dict)
    count = total = 0.0
    seen = False
    for (sname, labels), v in inc.items():
        if sname == f"{name}_bucket":
            le = dict(labels).get("le")
            try:
                bound = float(le) if le is not None else math.nan
            except ValueError:
                bound = math.nan
            if math.isnan(bound):
                raise TraceFormatError(where, f"bucket of {name} with le={le!r}", column=name,
                                       expected='le="<number>" or le="+Inf"')
            buckets[tuple(p for p in labels if p[0] != "le")][bound] = v
            seen = True
        elif sname == f"{name}_count":
            count += v
        elif sname == f"{name}_sum":
            total += v
    if not seen:
        return None
    bounds = None
    summed: dict[float, float] = defaultdict(float)
    for labels, b in buckets.items():
        if math.inf not in b:
            raise TraceFormatError(where, f"histogram {name}{dict(labels)} has no le=\"+Inf\" bucket", column=name,
                                   expected="every histogram to end with its +Inf bucket (a truncated scrape?)",
                                   fold=True)
        if bounds is not None and sorted(b) != bounds:
            raise TraceFormatError(where, f"histogram {name} has different buckets in different series", column=name,
                                   expected="the same bucket bounds in every series summed (--by-label to keep "
                                            "them apart)", fold=True)
        bounds = sorted(b)
        for bound, v in b.items():
            summed[bound] += v
    cum = sorted(summed.items())
    if any(c1 < c0 - 1e-6 * max(1.0, c0) for (_, c0), (_, c1) in zip(cum, cum[1:])) or \
            abs(cum[-1][1] - count) > 1e-6 * max(1.0, count):
        raise TraceFormatError(where, f"histogram {name}: the buckets' increases are not cumulative up to the "
                               f"count's ({', '.join(f'{c:g}' for _, c in cum[:6])}{' ...' if len(cum) > 6 else ''}; "
                               f"count {count:g})", column=name,
                               expected="each bucket counting the observations <= its bound, +Inf the count",
                               fold=True)
    return cum, count, total


def histogram_quantile(cum: list[tuple[float, float]], pct: float) -> tuple[float, float]:
    """``histogram_quantile``: (value, width of its bucket; 0 for the +Inf bucket's bound)."""
    n = cum[-1][1]
    rank = pct / 100.0 * n
    lower, below = 0.0, 0.0
    for bound, c in cum:
        if c >= rank and c > below:
            if math.isinf(bound):
                return lower, math.inf
            return lower + (bound - lower) * (rank - below) / (c - below), bound - lower
        if c > below:
            lower, below = bound, c
        else:
            lower = bound if not math.isinf(bound) else lower
    return lower, math.inf


def histogram_percentiles(cum: list[tuple[float, float]], mean: float, pcts) -> list[tuple[float, float]]:
    """Percentiles ``pcts`` (0-100) of a histogram of values >= 0 with cumulative counts ``cum``
    ((upper bound, count) pairs, ``+Inf`` last, as :func:`bucket_counts`) and exact ``mean``:
    per percentile (value, width of its bucket), in the unit of the bounds.

    The value lies in the bucket ``histogram_quantile`` puts it in; inside it, the density is the
    one of maximum entropy with every bucket's count and the mean (``exp(λ x)`` with one ``λ``:
    :func:`traces.binned.tilted_quantiles`), where ``histogram_quantile`` takes it uniform and its
    values' mean is not the measured one (bench/PROMETHEUS.md: vLLM's TPOT buckets put a run's
    p90 30 % high). With observations in the ``+Inf`` bucket, whose values the mean includes but
    no bound holds, the values are ``histogram_quantile``'s (the width of one there is inf).
    """
    out = [histogram_quantile(cum, pct) for pct in pcts]
    finite = [(b, c) for b, c in cum if not math.isinf(b)]
    n = cum[-1][1]
    if not finite or finite[-1][1] < n or n <= 0:
        return out
    edges = np.array([0.0] + [b for b, _ in finite])
    counts = np.array([0.0] + [c for _, c in finite])
    values = tilted_quantiles(edges, counts, mean, np.asarray(pcts, float) / 100.0)
    return [(float(v), width) for v, (_, width) in zip(values, out)]


def histogram_stats(inc: dict, name: str, where: str) -> dict | None:
    h = bucket_counts(inc, name, where)
    if h is None or h[1] <= 0:
        return None
    cum, count, total = h
    return {"cum": cum, "count": count, "mean": total / count}
