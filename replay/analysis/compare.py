"""Measured vs predicted: the comparison table of a replay."""
from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from schemas.status import OK

from .metrics import PERCENTILES, itl_s, percentile

#: (measured column, predicted column, label) of every compared metric.
METRICS = (
    ("queue_wait_s", "pred_queue_wait_s", "queue_wait"),
    ("ttft_s", "pred_ttft_s", "ttft"),
    ("tpot_s", "pred_tpot_s", "tpot"),
    ("e2e_s", "pred_e2e_s", "e2e"),
)

#: (measured, predicted) per-token time columns (lists, seconds since arrival) behind the ``itl`` row.
TOKEN_TIME_COLUMNS = ("token_times_s", "pred_token_times_s")

#: Labels of the rows :func:`compare` can produce, in table order.
METRIC_LABELS = tuple(label for _, _, label in METRICS) + ("itl",)

#: Measured values below this many seconds are left out of the MAPE (1 ms).
MAPE_MIN_MEAS_S = 1e-3

#: A percentile's error is relative only where the measured value is at least this many
#: seconds (1 ms); below it (a queue wait of 0) it is the absolute error, in ms.
REL_ERR_FLOOR_S = MAPE_MIN_MEAS_S


def compared_rows(result: pd.DataFrame) -> pd.Series:
    """Rows present on both sides: measured ok (or no status) and simulated ok.

    A request that failed in the measured run is never compared, even when the simulator
    completed it (BR-17: its measured latencies, e.g. TTFT 0.0, are not latencies).
    """
    ok = result["pred_status"] == OK
    if "status" in result:
        ok &= result["status"].isna() | (result["status"] == OK)
    return ok


def _gaps(token_times) -> np.ndarray | None:
    """The N - 1 gaps of one request's token times (None when the request has no list)."""
    if token_times is None or np.ndim(token_times) != 1:
        return None
    return itl_s(token_times)


def metric_values(result: pd.DataFrame, metric: str, rows: pd.Series | None = None):
    """Measured and predicted values of one metric over the compared requests, seconds.

    Parameters
    ----------
    result : pandas.DataFrame
        A replay result.
    metric : str
        A label of :data:`METRIC_LABELS`.
    rows : pandas.Series of bool, optional
        Requests to use; default :func:`compared_rows`.

    Returns
    -------
    (meas, pred, paired) or None
        ``meas``, ``pred``: float64 arrays, seconds. For the per-request metrics they are
        aligned (one pair per request finite on both sides); TPOT only counts requests with
        at least 2 output tokens, whatever the measured column holds for the others (BR-03:
        TPOT is undefined for one token, never 0). For ``itl`` they are the pooled gaps
        between consecutive tokens of every request with token times on both sides: N - 1
        gaps for N tokens, TTFT never among them (BR-01); ``paired`` is True when every such
        request has as many gaps on both sides (so gap k faces gap k). None when a column
        is missing.
    """
    ok = compared_rows(result) if rows is None else rows
    if metric == "itl":
        meas_col, pred_col = TOKEN_TIME_COLUMNS
        if meas_col not in result or pred_col not in result:
            return None
        m_gaps, p_gaps = [], []
        for mt, pt in zip(result.loc[ok, meas_col], result.loc[ok, pred_col]):
            mg, pg = _gaps(mt), _gaps(pt)
            if mg is not None and pg is not None:
                m_gaps.append(mg)
                p_gaps.append(pg)
        if not m_gaps:
            return np.empty(0), np.empty(0), True
        paired = all(a.size == b.size for a, b in zip(m_gaps, p_gaps))
        return np.concatenate(m_gaps), np.concatenate(p_gaps), paired
    meas_col, pred_col = {label: (m, p) for m, p, label in METRICS}[metric]
    if meas_col not in result or pred_col not in result:
        return None
    m = result.loc[ok, meas_col].to_numpy(float, na_value=np.nan)
    p = result.loc[ok, pred_col].to_numpy(float, na_value=np.nan)
    keep = np.isfinite(m) & np.isfinite(p)
    if metric == "tpot" and "num_output_tokens" in result:
        keep &= result.loc[ok, "num_output_tokens"].to_numpy(float, na_value=np.nan) >= 2
    return m[keep], p[keep], True


def compare(result: pd.DataFrame, percentiles=PERCENTILES) -> pd.DataFrame:
    """One row per metric present on both sides, seconds.

    Columns: ``metric``, ``n`` (measured values: requests, or gaps for ``itl``),
    ``meas_mean_s``, ``pred_mean_s``, ``meas_pXX``, ``pred_pXX``, ``abs_err_pXX`` (signed,
    pred - meas, seconds), ``rel_err_pXX`` (signed, (pred - meas) / meas; NaN where the
    measured value is below :data:`REL_ERR_FLOOR_S`, 1 ms), ``mape``, ``n_mape``, ``bias_s`` (mean
    pred - mean meas), ``ks`` (two-sample Kolmogorov-Smirnov statistic) and ``wasserstein_s`` (scipy.stats).

    Rows: ``queue_wait``, ``ttft``, ``tpot``, ``e2e`` from the per-request columns, and
    ``itl`` when per-token times exist on both sides (``token_times_s`` measured,
    ``pred_token_times_s`` predicted, both relative to arrival). Mean TPOT (``tpot`` row:
    each request once) and mean ITL (``itl`` row: each gap once) are different numbers
    on purpose (docs/CASES.md conventions); both are reported, each on its own row.

    Notes
    -----
    * Only requests that completed on both sides are compared (:func:`compared_rows`:
      failed measured requests are excluded, BR-17).
    * Percentiles use numpy's linear method on both sides (BR-22), so they stay inside
      the observed range for n = 1, 2, 3.
    * ``mape`` = mean over requests (gaps, for ``itl``) of ``|pred - meas| / meas``, taken
      only over measured values >= :data:`MAPE_MIN_MEAS_S` (1 ms); ``n_mape`` counts them.
      Queue waits are often ~0 (the request is scheduled on arrival), where a relative
      error is meaningless and would dominate the mean. NaN when no value qualifies, or
      for ``itl`` when gaps cannot be paired (different gap counts on the two sides).
    """
    ok = compared_rows(result)
    rows = []
    for label in METRIC_LABELS:
        got = metric_values(result, label, ok)
        if got is None:
            continue
        m, p, paired = got
        if m.size == 0 or p.size == 0:
            continue
        row = {"metric": label, "n": int(m.size), "meas_mean_s": float(m.mean()), "pred_mean_s": float(p.mean())}
        for q in percentiles:
            mq, pq = percentile(m, q), percentile(p, q)
            row[f"meas_p{q}"] = mq
            row[f"pred_p{q}"] = pq
            row[f"abs_err_p{q}"] = pq - mq
            row[f"rel_err_p{q}"] = (pq - mq) / mq if mq >= REL_ERR_FLOOR_S else np.nan
        big = m >= MAPE_MIN_MEAS_S if paired else np.zeros(m.size, bool)
        row["mape"] = float(np.mean(np.abs(p[big] - m[big]) / m[big])) if big.any() else np.nan
        row["n_mape"] = int(big.sum())
        row["bias_s"] = row["pred_mean_s"] - row["meas_mean_s"]
        with np.errstate(divide="ignore", invalid="ignore"):  # only the statistic is used, not its p-value
            row["ks"] = float(stats.ks_2samp(m, p, method="asymp").statistic)
        row["wasserstein_s"] = float(stats.wasserstein_distance(m, p))
        rows.append(row)
    return pd.DataFrame(rows)


def err_cell(meas_s: float, pred_s: float) -> str:
    """The error of one statistic as printed: ``"-7.4%"`` (relative) where the measured value
    is at least :data:`REL_ERR_FLOOR_S` (1 ms), else the absolute error ``"+740.3 ms"``;
    ``"-"`` when either is missing."""
    if not (np.isfinite(meas_s) and np.isfinite(pred_s)):
        return "-"
    if meas_s >= REL_ERR_FLOOR_S:
        return f"{(pred_s - meas_s) / meas_s:+.1%}"
    return f"{(pred_s - meas_s) * 1e3:+.1f} ms"


def ms_cell(x_s: float) -> str:
    """Seconds as milliseconds for a narrow column: one decimal below 1 s, none above."""
    if not np.isfinite(x_s):
        return "-"
    ms = x_s * 1e3
    return f"{ms:.1f}" if abs(ms) < 1000 else f"{ms:.0f}"


def table_cells(table: pd.DataFrame, percentiles=PERCENTILES) -> tuple[list[str], list[list[str]]]:
    """Header and formatted cells of a :func:`compare` table, every column: milliseconds for
    times, errors as :func:`err_cell` (percent, or ms below the 1 ms floor).

    The one formatting of the comparison, shared by ``format_table(wide=True)`` and the report.
    """
    head = ["metric", "n", "meas_mean_ms", "pred_mean_ms"]
    for q in percentiles:
        head += [f"meas_p{q}_ms", f"pred_p{q}_ms", f"err_p{q}"]
    head += ["mape", "bias_ms", "ks", "wass_ms"]
    lines = []
    for _, r in table.iterrows():
        cells = [r["metric"], str(r["n"]), f"{r['meas_mean_s'] * 1e3:.1f}", f"{r['pred_mean_s'] * 1e3:.1f}"]
        for q in percentiles:
            cells += [f"{r[f'meas_p{q}'] * 1e3:.1f}", f"{r[f'pred_p{q}'] * 1e3:.1f}",
                      err_cell(r[f"meas_p{q}"], r[f"pred_p{q}"])]
        cells += ["-" if not np.isfinite(r["mape"]) else f"{r['mape']:.1%}", f"{r['bias_s'] * 1e3:+.1f}",
                  f"{r['ks']:.3f}", f"{r['wasserstein_s'] * 1e3:.1f}"]
        lines.append(cells)
    return head, lines


#: Percentiles of the default (narrow) comparison table.
NARROW_PERCENTILES = (50, 90)


def narrow_cells(table: pd.DataFrame, percentiles=NARROW_PERCENTILES) -> tuple[list[str], list[list[str]]]:
    """Header and cells of the default comparison: metric, n, measured / predicted / error at
    each of ``percentiles`` (ms), bias (ms) and the KS distance."""
    head = ["metric", "n"]
    for q in percentiles:
        head += [f"meas_p{q}", f"pred_p{q}", f"err_p{q}"]
    head += ["bias", "ks"]
    lines = []
    for _, r in table.iterrows():
        cells = [str(r["metric"]), str(r["n"])]
        for q in percentiles:
            m, p = r.get(f"meas_p{q}", np.nan), r.get(f"pred_p{q}", np.nan)
            cells += [ms_cell(m), ms_cell(p), err_cell(m, p)]
        bias = r["bias_s"] * 1e3
        cells += [f"{bias:+.1f}" if abs(bias) < 1000 else f"{bias:+.0f}", f"{r['ks']:.2f}"]
        lines.append(cells)
    return head, lines


def format_table(table: pd.DataFrame, percentiles=PERCENTILES, wide: bool = False) -> str:
    """The comparison as text: milliseconds for times, percent for errors.

    By default (``wide=False``) the columns a person reads first, within
    :data:`replay.text.WIDTH` (100) characters a line: p50 and p90 measured, predicted and
    their error, the bias and the KS distance. ``wide=True`` prints every column of
    :func:`table_cells` (means, every percentile, MAPE, Wasserstein).

    An error is relative, (pred - meas) / meas, where the measured value is at least
    :data:`REL_ERR_FLOOR_S` (1 ms), else the absolute error in ms (a measured queue wait of
    0 is not an infinite relative error).
    """
    from ..text import WIDTH, render_table, wrap

    if table.empty:
        return "(no measured latencies to compare)"
    floor = f"{REL_ERR_FLOOR_S * 1e3:g} ms"
    if wide:
        head, lines = table_cells(table, percentiles)
        text = render_table(head, lines)
        legend = (f"(err_pXX: (pred - meas) / meas of the percentile, or pred - meas in ms where meas < {floor}; "
                  f"mape: mean |pred - meas| / meas over requests measured >= {floor}; bias_ms: mean(pred) - "
                  "mean(meas); ks: Kolmogorov-Smirnov distance of the two distributions, 0 same to 1 disjoint; "
                  "wass_ms: Wasserstein (earth mover's) distance)")
    else:
        narrow = tuple(q for q in NARROW_PERCENTILES if q in percentiles) or tuple(percentiles)[:2]
        head, lines = narrow_cells(table, narrow)
        text = render_table(head, lines, WIDTH, drop_order=("ks", "bias"))
        legend = (f"(times in ms; err: (pred - meas) / meas, or pred - meas in ms where meas < {floor}; "
                  "bias: mean(pred) - mean(meas); ks: Kolmogorov-Smirnov distance, 0 same to 1 disjoint; "
                  "--wide: means, p99, mape, Wasserstein)")
    text += "\n" + wrap(legend, WIDTH)
    if {"tpot", "itl"} <= set(table["metric"]):
        text += ("\n(mean TPOT: tpot row, each request once; mean ITL: itl row, each token gap once)" if wide else
                 "\n(tpot row: each request once; itl row: each token gap once)")
    return text


def broken_tolerances(table: pd.DataFrame, tolerances: dict[str, float]) -> list[str]:
    """Messages for every ``metric_pXX`` (or ``metric_mape``) whose |error| exceeds its bound.

    ``tolerances`` maps e.g. ``"ttft_p50"`` to 0.1 (10 %). A percentile's error is relative
    to the measured value, or to :data:`REL_ERR_FLOOR_S` (1 ms) where the measured value is
    below it: a measured queue wait of 0 allows ``bound`` x 1 ms, not nothing and not anything.
    """
    broken = []
    by_metric = {r["metric"]: r for _, r in table.iterrows()}
    floor_ms = REL_ERR_FLOOR_S * 1e3
    for key, bound in tolerances.items():
        metric, _, stat = key.rpartition("_")
        if metric not in by_metric:
            broken.append(f"{key}: metric '{metric}' has no request with both a measured and a predicted value")
            continue
        r = by_metric[metric]
        if stat != "mape" and f"meas_{stat}" not in r:
            broken.append(f"{key}: unknown statistic '{stat}' (use p50, p90, p99 or mape)")
            continue
        if stat == "mape":
            err = r["mape"]
            if not np.isfinite(err) or abs(err) > bound:
                broken.append(f"{key}: |{err:+.1%}| > {bound:.1%}")
            continue
        meas, pred = r[f"meas_{stat}"], r[f"pred_{stat}"]
        if not (np.isfinite(meas) and np.isfinite(pred)):
            broken.append(f"{key}: no value to compare")
        elif meas >= REL_ERR_FLOOR_S:
            err = (pred - meas) / meas
            if abs(err) > bound:
                broken.append(f"{key}: |{err:+.1%}| > {bound:.1%}")
        elif abs(pred - meas) > bound * REL_ERR_FLOOR_S:
            broken.append(f"{key}: |{(pred - meas) * 1e3:+.1f} ms| > {bound:.1%} of the {floor_ms:g} ms floor "
                          f"(measured {meas * 1e3:.2f} ms)")
    return broken


# -- several schedulers on one trace (replay --compare-schedulers) ---------------------------------

#: Metrics of :func:`scheduler_table`, in column order (labels of :data:`METRICS`).
SCHEDULER_TABLE_METRICS = ("ttft", "tpot", "e2e", "queue_wait")


def scheduler_table(results: dict, slo_ttft_s: float | None = None, slo_tpot_s: float | None = None,
                    percentiles=PERCENTILES) -> pd.DataFrame:
    """Predicted latency percentiles and goodput of the same trace under several schedulers.

    Parameters
    ----------
    results : dict[str, pandas.DataFrame]
        Scheduler name -> its replay result (``pred_*`` columns, seconds), in table order.
    slo_ttft_s, slo_tpot_s : float or None
        Objectives of the goodput, seconds (None: no objective on that metric, so with
        neither the goodput is the completion rate).
    percentiles : sequence of int

    Returns
    -------
    pandas.DataFrame
        One row per scheduler: ``scheduler``, ``n_ok`` (completed requests),
        ``{metric}_p{q}_s`` for the metrics of :data:`SCHEDULER_TABLE_METRICS` (seconds, over
        the completed requests; TPOT over those with >= 2 output tokens, BR-03) and
        ``goodput_rps`` (:func:`replay.analysis.metrics.goodput_rps`, requests/s).
    """
    from .metrics import goodput_rps

    pred_col = {label: p for _, p, label in METRICS}
    rows = []
    for name, res in results.items():
        ok = res["pred_status"] == OK
        row = {"scheduler": name, "n_ok": int(ok.sum())}
        for label in SCHEDULER_TABLE_METRICS:
            values = res.loc[ok, pred_col[label]].to_numpy(float, na_value=np.nan)  # TPOT of 1 token is NaN
            for q in percentiles:
                row[f"{label}_p{q}_s"] = percentile(values, q)
        row["goodput_rps"] = goodput_rps(res, slo_ttft_s, slo_tpot_s)
        rows.append(row)
    return pd.DataFrame(rows)
