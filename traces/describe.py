"""What is in a trace: counts, arrival process, lengths, measured latencies."""
from __future__ import annotations

import numpy as np
import pandas as pd

from schemas.status import OK
from schemas.tables import AGGREGATE_TARGETS, MEASURED_METRICS, STEP_TRACE, VLLM_STATS


def describe_frame(kind: str, df: pd.DataFrame) -> dict:
    """Summary statistics of a trace.

    Returns a dict with ``kind``, ``n``; for request traces ``span_s``, ``mean_rate_rps``
    (n / (t_last - t_first)), ``interarrival_cv`` (std / mean of the gaps),
    ``index_of_dispersion`` (variance / mean of counts per 1 s window), token percentiles
    and measured latency percentiles (seconds) where present; for step traces, duration and
    batch percentiles; for aggregates (``aggregate_targets/1``), ``levels`` and per level ``K`` its
    load (``level_K``: kind and value, requests) and the mean, p50 and p90 it reports of each
    latency (seconds) and length (tokens), as ``level_K_<metric>``.
    """
    out: dict = {"kind": kind, "n": int(len(df))}
    q = [50, 90, 99]
    if kind == STEP_TRACE:
        for c in ("step_duration_s", "num_prefill_tokens", "num_decode_seqs", "decode_context_tokens"):
            out[c] = dict(zip([f"p{x}" for x in q], np.percentile(df[c].to_numpy(float), q)))
        return out
    if kind == VLLM_STATS:
        t = df["t_s"].to_numpy(float)
        out["span_s"] = float(t[-1] - t[0]) if len(t) else 0.0
        for c in ("running", "waiting", "kv_cache_usage_frac", "prompt_throughput_tokens_per_s",
                  "generation_throughput_tokens_per_s"):
            out[c] = dict(zip([f"p{x}" for x in q], np.percentile(df[c].to_numpy(float), q)))
        return out
    if kind == AGGREGATE_TARGETS:
        return {**out, **_describe_levels(df)}
    t = df["arrival_time_s"].to_numpy(float)
    span = float(t[-1] - t[0]) if len(t) else 0.0
    out["span_s"] = span
    out["mean_rate_rps"] = (len(t) / span) if span > 0 else float("nan")
    gaps = np.diff(t)
    out["interarrival_cv"] = float(gaps.std() / gaps.mean()) if gaps.size and gaps.mean() > 0 else float("nan")
    if span >= 2:
        counts = np.bincount(np.floor(t - t[0]).astype(np.int64))
        out["index_of_dispersion"] = float(counts.var() / counts.mean())
    else:
        out["index_of_dispersion"] = float("nan")
    for c in ("num_prompt_tokens", "num_output_tokens"):
        v = df[c].to_numpy(float)
        out[c] = {"mean": float(v.mean()), **dict(zip([f"p{x}" for x in q], np.percentile(v, q)))}
    for c in MEASURED_METRICS:
        if c in df and df[c].notna().any():
            v = df[c].to_numpy(float)
            v = v[np.isfinite(v)]
            out[c] = dict(zip([f"p{x}" for x in q], np.percentile(v, q)))
    if "status" in df:
        out["status_counts"] = df["status"].fillna(OK).value_counts().to_dict()
    return out


def _describe_levels(df: pd.DataFrame) -> dict:
    """The levels of an ``aggregate_targets/1`` table (:func:`describe_frame`)."""
    out: dict = {"levels": int(df["level"].nunique())}
    for k, rows in df.groupby("level", sort=True):
        first = rows.iloc[0]
        out[f"level_{k}"] = f"{first['level_kind'].replace('_', ' ')} {first['level_value']:g}, " \
                            f"{int(first['num_requests'])} requests"
        for metric, g in rows.groupby("metric", sort=False):
            column = "value_s" if metric.endswith("_s") else "value_tokens"
            stats = {("mean" if st == "mean" else f"p{q:g}"): float(v) for st, q, v in
                     zip(g["statistic"], g["quantile_pct"], g[column]) if st == "mean" or q in (50.0, 90.0)}
            if stats:
                out[f"level_{k}_{metric}"] = stats
    return out


def format_description(d: dict) -> str:
    """The description as aligned text (times in ms)."""
    lines = [f"kind: {d['kind']}", f"rows: {d['n']}"]
    for k in ("span_s", "mean_rate_rps", "interarrival_cv", "index_of_dispersion", "levels"):
        if k in d:
            lines.append(f"{k}: {d[k]:.4g}")
    for k, v in d.items():
        if isinstance(v, str) and k.startswith("level_"):
            lines.append(f"{k}: {v}")
    for k, v in d.items():
        if isinstance(v, dict) and k != "status_counts":
            ms = k.endswith("_s") and not k.endswith("_per_s")
            fmt = ".3f" if k.endswith("_frac") else ".1f"
            cells = ", ".join(f"{s}={x * 1e3:.1f} ms" if ms else f"{s}={x:{fmt}}" for s, x in v.items())
            lines.append(f"{k}: {cells}")
    if "status_counts" in d:
        lines.append("status: " + ", ".join(f"{k}={v}" for k, v in d["status_counts"].items()))
    return "\n".join(lines)


def plot_trace(df: pd.DataFrame, path, title: str = "") -> None:
    """Plot the arrival rate over time and the prompt/output length histograms, atomically.

    Parameters
    ----------
    df : pandas.DataFrame
        A ``request_trace/1`` frame.
    path : str or PathLike
        Output image; the format follows the suffix (``.png``, ``.pdf``, ``.svg``, ...).
        Written to a temporary file beside it, then renamed.
    title : str
        Figure title (e.g. the trace's file name).

    Notes
    -----
    The rate panel counts arrivals in equal bins (about 100 over the span, at least 1 s)
    and divides by the bin width (requests/s). Uses Matplotlib's Agg canvas directly, so
    no global backend is switched.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from schemas.atomic import atomic_output

    t = df["arrival_time_s"].to_numpy(float)
    span = float(t.max() - t.min()) if len(t) else 0.0
    width = max(1.0, span / 100.0)
    nbins = max(1, int(np.ceil(span / width)) if span > 0 else 1)
    counts, edges = np.histogram(t, bins=nbins, range=(t.min(), t.min() + nbins * width))
    fig = Figure(figsize=(10, 7), layout="constrained")
    FigureCanvasAgg(fig)
    gs = fig.add_gridspec(2, 2)
    ax = fig.add_subplot(gs[0, :])
    ax.stairs(counts / width, edges)
    ax.set_xlabel("time since trace start (s)")
    ax.set_ylabel(f"arrivals / s ({width:.3g} s bins)")
    ax.set_title(title or "arrival rate")
    for k, (col, label) in enumerate((("num_prompt_tokens", "prompt tokens"), ("num_output_tokens", "output tokens"))):
        a = fig.add_subplot(gs[1, k])
        v = df[col].to_numpy(float)
        a.hist(v, bins=50)
        a.set_xlabel(label)
        a.set_ylabel("requests")
        a.set_title(f"{label}: mean {v.mean():.0f}, p50 {np.median(v):.0f}")
    suffix = str(path).rsplit(".", 1)[-1].lower() if "." in str(path) else "png"
    with atomic_output(path) as tmp:
        fig.savefig(tmp, format=suffix)
