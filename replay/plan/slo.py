"""The service-level objectives of a plan: percentile latencies and a goodput, and the check
of a prediction (or of its band's worst end) against them.

``--slo ttft_p90=2s,tpot_p90=50ms,goodput=0.9`` reads as: the 90th percentile of TTFT at most
2 s, that of TPOT at most 50 ms, and at least 90 % of the requests meeting the per-request
latency objectives (DistServe's SLO attainment, Zhong et al., OSDI'24, section 2.2).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ..analysis.bands import Band
from ..analysis.compare import SCHEDULER_TABLE_METRICS
from ..errors import ConfigError
from ..analysis.metrics import PERCENTILES

#: Units of a latency objective, in seconds.
UNITS = {"s": 1.0, "ms": 1e-3}
#: The latency keys: ``{metric}_p{q}`` (metric of :data:`replay.analysis.compare.SCHEDULER_TABLE_METRICS`).
LATENCY_KEYS = tuple(f"{m}_p{q}" for m in SCHEDULER_TABLE_METRICS for q in PERCENTILES)
#: The key of the goodput objective: the least fraction of requests meeting their latency SLOs.
GOODPUT = "goodput"

_VALUE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-z%]*)\s*$")


@dataclass(frozen=True)
class Slo:
    """What a deployment must meet.

    Attributes
    ----------
    latency_s : dict[str, float]
        ``{metric}_p{q}`` -> most seconds (e.g. ``{"ttft_p90": 2.0}``), in the order given.
    goodput : float | None
        Least fraction of the requests (in (0, 1]) that complete meeting the per-request
        objectives :attr:`slo_ttft_s` and :attr:`slo_tpot_s` (SLO attainment); None: none.
    """

    latency_s: dict = field(default_factory=dict)
    goodput: float | None = None

    def _per_request(self, metric: str) -> float | None:
        """The per-request objective of ``metric``: its highest-percentile key's limit."""
        keys = [k for k in self.latency_s if k.startswith(metric + "_p")]
        return self.latency_s[max(keys, key=lambda k: int(k.rsplit("_p", 1)[1]))] if keys else None

    @property
    def slo_ttft_s(self) -> float | None:
        """TTFT a request must meet to count in the goodput, seconds (the limit of the
        highest TTFT percentile given), or None."""
        return self._per_request("ttft")

    @property
    def slo_tpot_s(self) -> float | None:
        """TPOT a request must meet to count in the goodput, seconds, or None."""
        return self._per_request("tpot")

    @property
    def primary(self) -> str:
        """The statistic the Pareto front and ties are judged on: the first latency key."""
        return next(iter(self.latency_s))

    def describe(self) -> str:
        """``ttft_p90 <= 2 s, tpot_p90 <= 50 ms, goodput >= 90 %``."""
        parts = [f"{k} <= {fmt_seconds(v)}" for k, v in self.latency_s.items()]
        if self.goodput is not None:
            parts.append(f"goodput >= {self.goodput:.0%}")
        return ", ".join(parts)

    def violations(self, stats: dict, attainment: float) -> list[str]:
        """What ``stats`` (``{key}_s`` seconds, :func:`replay.analysis.bands.prediction_row` names) and
        ``attainment`` (fraction of the requests meeting the per-request objectives) break,
        e.g. ``["ttft_p90 2.41 s > 2 s"]``; empty when every objective holds. A NaN statistic
        (no completed request) breaks its objective."""
        out = []
        for key, limit in self.latency_s.items():
            v = stats.get(f"{key}_s", math.nan)
            if not v <= limit:
                out.append(f"{key} {fmt_seconds(v)} > {fmt_seconds(limit)}")
        if self.goodput is not None and not attainment >= self.goodput:
            out.append(f"goodput {attainment:.1%} < {self.goodput:.0%}")
        return out

    def band_violations(self, band: Band, attainment_low: float) -> list[str]:
        """:meth:`violations` of the band's worst end: the highest latency of every
        objective, the lowest attainment."""
        return self.violations(band.high, attainment_low)


def fmt_seconds(v: float) -> str:
    """``2 s``, ``50 ms``, ``1.23 s``: a latency in the unit that reads best."""
    if not math.isfinite(v):
        return "n/a"
    if abs(v) < 1.0:
        return f"{v * 1e3:.3g} ms"
    return f"{v:.3g} s"


def parse_slo(texts) -> Slo:
    """``["ttft_p90=2s,tpot_p90=50ms", "goodput=0.9"]`` -> :class:`Slo`.

    Keys: :data:`LATENCY_KEYS` with a unit of :data:`UNITS` (``2s``, ``50ms``; a value > 0),
    and ``goodput`` as a fraction (``0.9``) or a percentage (``90%``), in (0, 1].

    Raises
    ------
    ConfigError
        One line naming the first bad part: an unknown key, a missing or unknown unit, a value
        out of range, a key given twice, no latency objective at all, or a goodput with no
        TTFT or TPOT objective to count requests against.
    """
    latency: dict[str, float] = {}
    goodput = None
    parts = [p.strip() for t in texts for p in str(t).split(",") if p.strip()]
    if not parts:
        raise ConfigError("--slo: give at least one objective, e.g. --slo ttft_p90=2s,tpot_p90=50ms")
    for part in parts:
        key, sep, value = (s.strip() for s in part.partition("="))
        key = key.lower()
        if not sep or not value:
            raise ConfigError(f"--slo {part!r}: expected KEY=VALUE, e.g. ttft_p90=2s")
        if key != GOODPUT and key not in LATENCY_KEYS:
            raise ConfigError(f"--slo {key!r}: unknown objective; known: {{ttft,tpot,e2e,queue_wait}}_p{{50,90,99}}, "
                              "goodput")
        if key in latency or (key == GOODPUT and goodput is not None):
            raise ConfigError(f"--slo {key}: given more than once")
        m = _VALUE.match(value.lower())
        if key == GOODPUT:
            if m is None or m.group(2) not in ("", "%"):
                raise ConfigError(f"--slo goodput={value}: expected a fraction (0.9) or a percentage (90%)")
            g = float(m.group(1)) / (100.0 if m.group(2) == "%" else 1.0)
            if not 0 < g <= 1:
                raise ConfigError(f"--slo goodput={value}: expected a fraction in (0, 1]")
            goodput = g
            continue
        if m is None or m.group(2) not in UNITS:
            raise ConfigError(f"--slo {key}={value}: expected a number with a unit, s or ms (e.g. 2s, 50ms)")
        seconds = float(m.group(1)) * UNITS[m.group(2)]
        if not 0 < seconds < math.inf:
            raise ConfigError(f"--slo {key}={value}: expected a latency > 0")
        latency[key] = seconds
    if not latency:
        raise ConfigError("--slo: give a latency objective too (e.g. ttft_p90=2s), which goodput counts")
    slo = Slo(latency, goodput)
    if goodput is not None and slo.slo_ttft_s is None and slo.slo_tpot_s is None:
        raise ConfigError("--slo goodput counts requests meeting TTFT/TPOT: give a ttft_pQ or tpot_pQ objective")
    return slo


def attainment(row: dict, num_requests: int) -> float:
    """Fraction of ``num_requests`` that completed meeting the per-request objectives, from a
    :func:`replay.analysis.bands.prediction_row`: ``goodput_rps / throughput_rps * n_ok / num_requests``
    (both rates share the row's span, so this counts requests exactly)."""
    if not num_requests or not row.get("throughput_rps"):
        return 0.0
    return float(row["goodput_rps"] / row["throughput_rps"] * row["n_ok"] / num_requests)
