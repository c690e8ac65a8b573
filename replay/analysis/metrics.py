"""Per-request latency metrics from token timestamps, and the percentiles used everywhere.

Definitions (DESIGN.md, docs/CASES.md conventions): TTFT = t_1 - t_arrival;
E2E = t_N - t_arrival; TPOT = (E2E - TTFT) / (N - 1), undefined (NaN) for N = 1
(:func:`schemas.metrics.tpot_s`);
ITL = the N - 1 gaps between consecutive tokens (never includes TTFT).
"""
from __future__ import annotations

import numpy as np

from schemas.metrics import tpot_s
from schemas.status import OK


#: Percentiles reported by default.
PERCENTILES = (50, 90, 99)


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


def goodput_rps(result_df, slo_ttft_s: float | None, slo_tpot_s: float | None, prefix: str = "pred_") -> float:
    """Requests per second that completed and met every latency SLO.

    Parameters
    ----------
    result_df : pandas.DataFrame
        A replay result: ``arrival_time_s`` and ``{prefix}ttft_s``, ``{prefix}tpot_s``,
        ``{prefix}e2e_s`` (seconds, relative to arrival); completion is ``pred_status == "ok"``
        for the predicted side, a finite ``e2e_s`` (and ``status`` ok when present) for the
        measured side (``prefix=""``).
    slo_ttft_s, slo_tpot_s : float or None
        Objectives, seconds; None sets no objective on that metric.
    prefix : str
        ``"pred_"`` (default) for the replay's predictions, ``""`` for the measured columns.

    Returns
    -------
    float
        ``good / (last completion - first arrival)``, requests/s; 0.0 when nothing completed,
        NaN when that span is not positive.

    Notes
    -----
    Goodput as in DistServe (Zhong et al., OSDI'24): the rate of requests meeting their
    SLOs. A request meets the TTFT objective when ``ttft <= slo_ttft_s`` and the TPOT one when
    ``tpot <= slo_tpot_s``; a one-token request has no TPOT (NaN, BR-03) and cannot break it.
    The first arrival is over all rows of ``result_df``.
    """
    ttft = result_df[f"{prefix}ttft_s"].to_numpy(float, na_value=np.nan)
    tpot = result_df[f"{prefix}tpot_s"].to_numpy(float, na_value=np.nan)
    e2e = result_df[f"{prefix}e2e_s"].to_numpy(float, na_value=np.nan)
    arrival = result_df["arrival_time_s"].to_numpy(float)
    done = np.isfinite(e2e)
    status_col = "pred_status" if prefix else "status"
    if status_col in result_df:  # a measured row without status counts as ok
        done &= result_df[status_col].fillna(OK).eq(OK).to_numpy(bool)
    if not done.any():
        return 0.0
    good = done.copy()
    if slo_ttft_s is not None:
        good &= ttft <= slo_ttft_s
    if slo_tpot_s is not None:
        good &= np.isnan(tpot) | (tpot <= slo_tpot_s)
    span = float(np.max((arrival + e2e)[done]) - np.min(arrival))
    return float(good.sum()) / span if span > 0 else np.nan


def statistics(values: np.ndarray, pcts: np.ndarray, axis=None) -> np.ndarray:
    """Percentiles ``pcts`` of ``values`` (numpy's linear method), the mean where a percentile is
    NaN; along ``axis`` (NaN values ignored there: a resample)."""
    finite = ~np.isnan(pcts)
    if axis is None:
        out = np.full(pcts.shape, np.mean(values) if values.size else np.nan)
        out[finite] = np.percentile(values, pcts[finite]) if values.size else np.nan
        return out
    out = np.repeat(np.nanmean(values, axis=axis)[..., None], pcts.size, axis=-1)
    if finite.any():
        out[..., finite] = np.moveaxis(np.nanpercentile(values, pcts[finite], axis=axis), 0, -1)
    return out


def stat_label(pct: float) -> str:
    """``p50``, ``p99.9``, or ``mean`` for NaN."""
    return "mean" if np.isnan(pct) else f"p{pct:g}"


def window_values(done, metric: str, until_s: float | None) -> np.ndarray:
    """``pred_<metric>`` of the completed requests ``done`` (a replay result's rows), seconds: of
    those a window of Prometheus scrapes ending at ``until_s`` (seconds on the workload's clock)
    would have counted (:func:`traces.scrape_window.observed`: first token, or end, by then), or
    of all of them when ``until_s`` is None."""
    from traces.scrape_window import observed

    values = done[f"pred_{metric}"].to_numpy(float)
    if until_s is None:
        return values
    return values[observed(done["arrival_time_s"].to_numpy(float), done, metric, until_s)]


def window_percentiles(result, metadata: dict) -> dict:
    """For the replay of a window of Prometheus scrapes (``metadata`` with
    :data:`traces.scrape_window.OBSERVED_UNTIL`), ``{"ttft_p50_s": ..., ...}``: the :data:`PERCENTILES`
    of TTFT, TPOT and E2E over the completed requests its histograms would have counted
    (:func:`window_values`), seconds; ``{}`` for any other replay. A prediction row updated with it
    puts a band on the statistics the window's reported ones are compared with.

    ``result``: a replay result (``arrival_time_s``, ``pred_status``, ``pred_ttft_s``,
    ``pred_tpot_s``, ``pred_e2e_s``; seconds)."""
    from traces.scrape_window import observed_until

    until_s = observed_until(metadata or {})
    if until_s is None:
        return {}
    done = result[result["pred_status"] == OK]
    return {f"{m}_p{q}_s": percentile(window_values(done, f"{m}_s", until_s), q)
            for m in ("ttft", "tpot", "e2e") for q in PERCENTILES}
