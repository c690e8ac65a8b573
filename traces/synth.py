"""Synthetic request traces: arrival processes and length distributions, seeded."""
from __future__ import annotations

import numpy as np
import pandas as pd

from .errors import DistError, TraceError


def parse_dist(spec: str):
    """Parse a length distribution: ``fixed:512``, ``lognormal:mean=512,sigma=0.5``,
    ``uniform:64,2048`` or ``empirical:TRACE.parquet[:column]``.

    Returns a function ``(rng, n, column) -> int64 array`` of lengths >= 1.

    Raises
    ------
    DistError
        Naming the spec and the expected forms.
    """
    kind, _, arg = spec.partition(":")
    #: Longest length a distribution may produce (tokens): beyond any model's context.
    limit = 1 << 24
    try:
        if kind == "fixed":
            v = int(arg)
            assert 1 <= v <= limit
            return lambda rng, n, col: np.full(n, v, np.int64)
        if kind == "uniform":
            lo, hi = (int(x) for x in arg.split(","))
            assert 1 <= lo <= hi <= limit
            return lambda rng, n, col: rng.integers(lo, hi + 1, n).astype(np.int64)
        if kind == "lognormal":
            kv = dict(p.split("=") for p in arg.split(","))
            mean, sigma = float(kv["mean"]), float(kv["sigma"])
            assert 0 < mean <= limit and 0 <= sigma <= 5 and set(kv) == {"mean", "sigma"}
            mu = np.log(mean) - sigma ** 2 / 2  # so that E[X] = mean

            def draw(rng, n, col):
                x = np.rint(rng.lognormal(mu, sigma, n))
                return np.clip(x, 1, limit).astype(np.int64)
            return draw
        if kind == "empirical":
            from schemas.tables import REQUEST_TRACE

            from .io import read_trace

            trace_kind, df, _ = read_trace(arg)
            if trace_kind != REQUEST_TRACE:
                raise DistError(f"length distribution {spec!r}: {arg} is a {trace_kind}; expected a request trace")
            return lambda rng, n, col: rng.choice(df[col].to_numpy(np.int64), n, replace=True)
    except (ValueError, KeyError, AssertionError, TypeError, OverflowError):
        pass
    raise DistError(f"length distribution {spec!r}: expected fixed:N, uniform:LO,HI (1 <= N <= {limit}), "
                    "lognormal:mean=M,sigma=S (sigma <= 5) or empirical:TRACE.parquet")


def synth_requests(num_requests: int, rate_rps: float, prompt_tokens: str = "lognormal:mean=512,sigma=0.8",
                   output_tokens: str = "lognormal:mean=256,sigma=0.8", arrival: str = "poisson",
                   cv: float = 1.0, seed: int = 0) -> pd.DataFrame:
    """A synthetic request trace (``request_trace/1`` columns, no measured latencies).

    Parameters
    ----------
    num_requests : int
    rate_rps : float
        Mean arrival rate, requests/s.
    prompt_tokens, output_tokens : str
        Length distributions (see :func:`parse_dist`).
    arrival : {"poisson", "gamma"}
        Poisson: exponential gaps. Gamma: gaps with coefficient of variation ``cv``
        (shape ``1/cv^2``), bursty when ``cv > 1``.
    seed : int
        Seed of the ``numpy.random.Generator``: same seed, same trace.

    Raises
    ------
    TraceError
        Non-positive count, rate or cv; unknown arrival process; bad distribution.
    """
    if num_requests < 1 or not rate_rps > 0 or not cv > 0:
        raise TraceError("--requests, --rate and --cv must be positive")
    rng = np.random.default_rng(seed)
    if arrival == "poisson":
        gaps = rng.exponential(1.0 / rate_rps, num_requests)
    elif arrival == "gamma":
        shape = 1.0 / cv ** 2
        gaps = rng.gamma(shape, 1.0 / (rate_rps * shape), num_requests)
    else:
        raise TraceError(f"--arrival {arrival!r}: expected poisson or gamma")
    t = np.cumsum(gaps)
    t -= t[0]
    return pd.DataFrame({
        "request_id": [f"synth-{i}" for i in range(num_requests)],
        "arrival_time_s": t,
        "num_prompt_tokens": parse_dist(prompt_tokens)(rng, num_requests, "num_prompt_tokens"),
        "num_output_tokens": parse_dist(output_tokens)(rng, num_requests, "num_output_tokens"),
    })
