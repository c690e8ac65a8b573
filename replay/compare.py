"""Measured vs predicted: the comparison table of a replay."""
from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from .metrics import PERCENTILES, percentile

#: (measured column, predicted column, label) of every compared metric.
METRICS = (
    ("queue_wait_s", "pred_queue_wait_s", "queue_wait"),
    ("ttft_s", "pred_ttft_s", "ttft"),
    ("tpot_s", "pred_tpot_s", "tpot"),
    ("e2e_s", "pred_e2e_s", "e2e"),
)


def compared_rows(result: pd.DataFrame) -> pd.Series:
    """Rows present on both sides: measured ok (or no status) and simulated ok."""
    ok = result["pred_status"] == "ok"
    if "status" in result:
        ok &= result["status"].isna() | (result["status"] == "ok")
    return ok


def compare(result: pd.DataFrame, percentiles=PERCENTILES) -> pd.DataFrame:
    """One row per metric present on both sides, seconds.

    Columns: ``metric``, ``n``, ``meas_pXX``, ``pred_pXX``, ``rel_err_pXX`` (signed,
    (pred - meas) / meas), ``mape`` (mean over requests of |pred - meas| / meas),
    ``bias_s`` (mean of pred - meas), ``ks`` (two-sample Kolmogorov-Smirnov statistic) and
    ``wasserstein_s`` (scipy.stats). Percentiles use numpy's linear method on both sides.
    Only requests that completed on both sides are compared.
    """
    ok = compared_rows(result)
    rows = []
    for meas_col, pred_col, label in METRICS:
        if meas_col not in result or pred_col not in result:
            continue
        m = result.loc[ok, meas_col].to_numpy(float)
        p = result.loc[ok, pred_col].to_numpy(float)
        keep = np.isfinite(m) & np.isfinite(p)
        m, p = m[keep], p[keep]
        if m.size == 0:
            continue
        row = {"metric": label, "n": int(m.size)}
        for q in percentiles:
            mq, pq = percentile(m, q), percentile(p, q)
            row[f"meas_p{q}"] = mq
            row[f"pred_p{q}"] = pq
            row[f"rel_err_p{q}"] = (pq - mq) / mq if mq != 0 else np.nan
        pos = m > 0
        row["mape"] = float(np.mean(np.abs(p[pos] - m[pos]) / m[pos])) if pos.any() else np.nan
        row["bias_s"] = float(np.mean(p - m))
        row["ks"] = float(stats.ks_2samp(m, p).statistic)
        row["wasserstein_s"] = float(stats.wasserstein_distance(m, p))
        rows.append(row)
    return pd.DataFrame(rows)


def format_table(table: pd.DataFrame, percentiles=PERCENTILES) -> str:
    """The comparison as text: milliseconds for times, percent for errors."""
    if table.empty:
        return "(no measured latencies to compare)"
    head = ["metric", "n"]
    for q in percentiles:
        head += [f"meas_p{q}_ms", f"pred_p{q}_ms", f"err_p{q}"]
    head += ["mape", "bias_ms", "ks", "wass_ms"]
    lines = []
    for _, r in table.iterrows():
        cells = [r["metric"], str(r["n"])]
        for q in percentiles:
            cells += [f"{r[f'meas_p{q}'] * 1e3:.1f}", f"{r[f'pred_p{q}'] * 1e3:.1f}", f"{r[f'rel_err_p{q}']:+.1%}"]
        cells += [f"{r['mape']:.1%}", f"{r['bias_s'] * 1e3:+.1f}", f"{r['ks']:.3f}", f"{r['wasserstein_s'] * 1e3:.1f}"]
        lines.append(cells)
    widths = [max(len(h), *(len(c[i]) for c in lines)) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    return "\n".join([fmt.format(*head)] + [fmt.format(*c) for c in lines])


def broken_tolerances(table: pd.DataFrame, tolerances: dict[str, float]) -> list[str]:
    """Messages for every ``metric_pXX`` (or ``metric_mape``) whose |error| exceeds its bound.

    ``tolerances`` maps e.g. ``"ttft_p50"`` to 0.1 (10 %).
    """
    broken = []
    by_metric = {r["metric"]: r for _, r in table.iterrows()}
    for key, bound in tolerances.items():
        metric, _, stat = key.rpartition("_")
        if metric not in by_metric:
            broken.append(f"{key}: metric '{metric}' has no measured values")
            continue
        col = "mape" if stat == "mape" else f"rel_err_{stat}"
        if col not in by_metric[metric]:
            broken.append(f"{key}: unknown statistic '{stat}' (use p50, p90, p99 or mape)")
            continue
        err = by_metric[metric][col]
        if not np.isfinite(err) or abs(err) > bound:
            broken.append(f"{key}: |{err:+.1%}| > {bound:.1%}")
    return broken
