"""Per-request latency metrics from token timestamps, and the percentiles used everywhere.

Definitions (DESIGN.md, shared/cases/CASES.md conventions): TTFT = t_1 - t_arrival;
E2E = t_N - t_arrival; TPOT = (E2E - TTFT) / (N - 1), undefined (NaN) for N = 1;
ITL = the N - 1 gaps between consecutive tokens (never includes TTFT).
"""
from __future__ import annotations

import numpy as np

#: Percentiles reported by default.
PERCENTILES = (50, 90, 99)


def tpot_s(ttft_s, e2e_s, num_output_tokens):
    """Time per output token after the first, seconds (NaN where fewer than 2 tokens).

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


def itl_s(token_times_s) -> np.ndarray:
    """Inter-token latencies of one request: the N - 1 gaps between its N token times."""
    t = np.asarray(token_times_s, float)
    return np.diff(t) if t.size >= 2 else np.empty(0)


def from_token_times(arrival_time_s: float, token_times_s) -> dict:
    """TTFT, E2E, TPOT and ITL of one request from its absolute token times (seconds)."""
    t = np.asarray(token_times_s, float)
    if t.size == 0:
        return {"ttft_s": np.nan, "e2e_s": np.nan, "tpot_s": np.nan, "itl_s": np.empty(0)}
    ttft, e2e = t[0] - arrival_time_s, t[-1] - arrival_time_s
    return {"ttft_s": ttft, "e2e_s": e2e, "tpot_s": float(tpot_s(ttft, e2e, t.size)), "itl_s": itl_s(t)}


def mean_tpot_and_itl(token_times_per_request: list) -> tuple[float, float]:
    """Mean TPOT (each request weighted once) and mean ITL (each gap weighted once), seconds.

    Requests with one token have no TPOT and are left out of its mean (not counted as 0).
    """
    tpots, gaps = [], []
    for t in token_times_per_request:
        t = np.asarray(t, float)
        if t.size >= 2:
            tpots.append((t[-1] - t[0]) / (t.size - 1))
            gaps.append(np.diff(t))
    mean_tpot = float(np.mean(tpots)) if tpots else np.nan
    mean_itl = float(np.mean(np.concatenate(gaps))) if gaps else np.nan
    return mean_tpot, mean_itl


def percentile(values, q) -> float:
    """numpy's linear-interpolation percentile of the finite values (NaN if none).

    The same method is used on measured and predicted sides of every comparison.
    """
    v = np.asarray(values, float)
    v = v[np.isfinite(v)]
    return float(np.percentile(v, q)) if v.size else np.nan
