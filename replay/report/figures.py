"""The report's figures, drawn with matplotlib on the Agg canvas (no pyplot state) and saved as PNG."""
from __future__ import annotations

import io

import numpy as np
import pandas as pd

from ..analysis.compare import metric_values

#: At most this many points per scatter panel (a seeded random subset beyond it).
MAX_SCATTER_POINTS = 20_000

#: Columns of the simulated step trace the steps figure draws.
STEP_COLUMNS = ("step_start_time_s", "step_duration_s", "num_prefill_tokens", "num_decode_seqs")


def _panels(k: int):
    """A figure of ``k`` panels: one row up to 4, else 3 per row; unused cells hidden. Returns (figure, k axes)."""
    ncols = k if k <= 4 else 3
    fig, axes = _figure(ncols, -(-k // ncols))
    for ax in axes[k:]:
        ax.set_visible(False)
    return fig, axes[:k]


def _figure(ncols: int, nrows: int = 1, width: float = 4.0, height: float = 3.6):
    """A figure on the Agg canvas (no pyplot, no global state) and its axes as a flat list."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * ncols, height * nrows))
    FigureCanvasAgg(fig)
    # fixed margins (inches): a layout engine would cost a second draw of every figure
    w, h = width * ncols, height * nrows
    fig.subplots_adjust(left=0.8 / w, right=1 - 0.2 / w, bottom=0.6 / h, top=1 - 0.4 / h,
                        wspace=0.45, hspace=0.35)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, list(axes.ravel())


def scatter_figure(result: pd.DataFrame, metrics: list[str]):
    """Per-request predicted vs measured, one panel per metric, milliseconds, with y = x."""
    pairs = []
    for label in metrics:
        m, p, paired = metric_values(result, label)
        if paired and m.size:
            pairs.append((label, m * 1e3, p * 1e3))
    if not pairs:
        return None
    fig, axes = _panels(len(pairs))
    rng = np.random.default_rng(0)
    for ax, (label, m, p) in zip(axes, pairs):
        shown = rng.choice(m.size, MAX_SCATTER_POINTS, replace=False) if m.size > MAX_SCATTER_POINTS else slice(None)
        ax.scatter(m[shown], p[shown], s=6, alpha=0.5)
        lo, hi = min(m.min(), p.min()), max(m.max(), p.max())
        ax.plot([lo, hi], [lo, hi], color="black", lw=0.8, label="y = x")
        if lo > 0 and hi / lo > LOG_SCALE_MIN_RATIO:
            _log_axes(ax)
        ax.set_xlabel(f"measured {label} (ms)")
        ax.set_ylabel(f"predicted {label} (ms)")
        shown = f", {MAX_SCATTER_POINTS} shown)" if m.size > MAX_SCATTER_POINTS else ")"
        ax.set_title(f"{label} (n = {m.size}" + shown)
        ax.legend(loc="upper left")
    return fig


#: A scatter panel gets log axes when its values span more than this ratio (1.5 decades).
LOG_SCALE_MIN_RATIO = 30.0


def _log_axes(ax) -> None:
    """Log scale on both axes, ticks labelled as plain numbers (100, 1000, not 10^2)."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    for axis, scale in ((ax.xaxis, ax.set_xscale), (ax.yaxis, ax.set_yscale)):
        scale("log")
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(NullFormatter())


def _ecdf(values_ms: np.ndarray, max_points: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    """Sorted values and their empirical CDF, thinned to at most ``max_points`` points."""
    x = np.sort(values_ms)
    y = np.arange(1, x.size + 1) / x.size
    if x.size > max_points:
        keep = np.unique(np.linspace(0, x.size - 1, max_points).astype(int))
        x, y = x[keep], y[keep]
    return x, y


def cdf_figure(result: pd.DataFrame, metrics: list[str]):
    """Empirical CDFs of measured and predicted, one panel per metric, milliseconds."""
    series = []
    for label in metrics:
        m, p, _ = metric_values(result, label)
        if m.size and p.size:
            series.append((label, m * 1e3, p * 1e3))
    if not series:
        return None
    fig, axes = _panels(len(series))
    for ax, (label, m, p) in zip(axes, series):
        for values, name in ((m, "measured"), (p, "predicted")):
            ax.step(*_ecdf(values), where="post", label=name)
        ax.set_xlabel(f"{label} (ms)")
        ax.set_ylabel("fraction of " + ("token gaps" if label == "itl" else "requests"))
        ax.set_ylim(0, 1)
        ax.set_title(label)
        ax.legend(loc="lower right")
    return fig


def timeseries_figure(ts: pd.DataFrame, running: np.ndarray, waiting: np.ndarray):
    """Measured vs simulated running and waiting requests per tick."""
    fig, axes = _figure(1, 2, width=9.0, height=2.8)
    for ax, col, sim in zip(axes, ("running", "waiting"), (running, waiting)):
        ax.plot(ts["t"], ts[col], label="measured")
        ax.plot(ts["t"], sim, label="simulated")
        ax.set_ylabel(f"{col} requests")
        ax.legend(loc="upper right")
    axes[-1].set_xlabel("time since trace start (s)")
    return fig


def disagg_waits_figure(win: pd.DataFrame, waits: tuple):
    """A disaggregated replay's waits (p50 per window of arrival time, ``waits``: (label, column)) next
    to its measured and predicted TTFT p50: where the queue forms."""
    fig, axes = _figure(1, 2, width=9.0, height=2.8)
    mid = (win["start_s"].to_numpy(float) + win["end_s"].to_numpy(float)) / 2
    for label, col in waits:
        axes[0].plot(mid, win[col].to_numpy(float) * 1e3, marker=".", label=label)
    axes[0].set_ylabel("p50 wait (ms)")
    axes[0].legend(loc="upper left", fontsize="small")
    for label, col in (("measured", "meas_ttft_p50"), ("predicted", "pred_ttft_p50")):
        axes[1].plot(mid, win[col].to_numpy(float) * 1e3, marker=".", label=label)
    axes[1].set_ylabel("TTFT p50 (ms)")
    axes[1].legend(loc="upper left", fontsize="small")
    for ax in axes:
        ax.set_xlabel("arrival time (s)")
    return fig


def steps_figure(steps: pd.DataFrame):
    """Simulated step durations and tokens per step over time."""
    fig, axes = _figure(1, 2, width=9.0, height=2.8)
    t = steps["step_start_time_s"].to_numpy(float)
    axes[0].plot(t, steps["step_duration_s"].to_numpy(float) * 1e3, ".", ms=2)
    axes[0].set_ylabel("step duration (ms)")
    tokens = steps["num_prefill_tokens"].to_numpy(float) + steps["num_decode_seqs"].to_numpy(float)
    axes[1].plot(t, tokens, ".", ms=2)
    axes[1].set_ylabel("tokens per step")
    axes[1].set_xlabel("simulated time (s)")
    return fig


def png(fig) -> bytes:
    """A figure as PNG bytes (100 dpi)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


#: Statistics the sweep figure draws, a panel each.
SWEEP_FIGURE_STATS = ("ttft_p90_s", "tpot_p90_s", "e2e_p90_s")
#: Statistics the scheduler figure draws, a panel each.
SCHEDULER_FIGURE_STATS = ("ttft_p90_s", "tpot_p90_s")


def _label(stat: str) -> str:
    """``"ttft_p90_s"`` -> ``"TTFT p90"``."""
    metric, q = stat.removesuffix("_s").rsplit("_p", 1)
    return f"{metric.upper()} p{q}"


def _ends(table: pd.DataFrame, stat: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Point, low and high of ``stat`` over the rows of a table with bands (ms); low = high =
    the point for rows without a band."""
    p = table[stat].to_numpy(float) * 1e3
    lo = table[f"{stat}_low"].to_numpy(float) * 1e3 if f"{stat}_low" in table else p
    hi = table[f"{stat}_high"].to_numpy(float) * 1e3 if f"{stat}_high" in table else p
    return p, lo, hi


def sweep_figure(table: pd.DataFrame, swept: list[str]):
    """A sweep's TTFT, TPOT and E2E p90 (ms) against its first swept option, the band filled
    around each line; a line per combination of the other swept options. Non-numeric values
    (schedulers) are placed in table order."""
    if table.empty or not swept:
        return None
    x_col, others = swept[0], swept[1:]
    values = list(dict.fromkeys(table[x_col]))
    numeric = all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) for v in values)
    fig, axes = _panels(len(SWEEP_FIGURE_STATS))
    groups = table.groupby(others, sort=False) if others else [((), table)]
    for key, part in groups:
        key = key if isinstance(key, tuple) else (key,)
        name = ", ".join(f"{o}={k:g}" if isinstance(k, float) else f"{o}={k}" for o, k in zip(others, key))
        x = part[x_col].to_numpy(float) if numeric else np.array([values.index(v) for v in part[x_col]], float)
        order = np.argsort(x, kind="stable")
        for ax, stat in zip(axes, SWEEP_FIGURE_STATS):
            p, lo, hi = (a[order] for a in _ends(part, stat))
            line, = ax.plot(x[order], p, marker="o", ms=3, label=name or "point")
            ax.fill_between(x[order], lo, hi, color=line.get_color(), alpha=0.25, lw=0)
    for ax, stat in zip(axes, SWEEP_FIGURE_STATS):
        ax.set_xlabel(x_col.replace("_", "-"))
        ax.set_ylabel(f"predicted {_label(stat)} (ms)")
        ax.set_title(f"{_label(stat)} and its 95 % band")
        if not numeric:
            ax.set_xticks(range(len(values)), [str(v) for v in values])
        if others:
            ax.legend(loc="upper left", fontsize="small")
    return fig


def scheduler_figure(table: pd.DataFrame):
    """A bar per scheduler of its TTFT and TPOT p90 (ms), the band as whiskers."""
    if table.empty:
        return None
    fig, axes = _panels(len(SCHEDULER_FIGURE_STATS))
    names = [str(s) for s in table["scheduler"]]
    x = np.arange(len(names))
    for ax, stat in zip(axes, SCHEDULER_FIGURE_STATS):
        p, lo, hi = _ends(table, stat)
        ax.bar(x, p, color="#4c72b0", alpha=0.8)
        ax.errorbar(x, p, yerr=[np.maximum(p - lo, 0), np.maximum(hi - p, 0)], fmt="none", ecolor="black",
                    capsize=5, lw=1)
        ax.set_xticks(x, names)
        ax.set_ylabel(f"predicted {_label(stat)} (ms)")
        ax.set_title(f"{_label(stat)}, whiskers: 95 % band")
    return fig


def front_figure(points: list[dict], limit: float, unit: str, key: str, answer: dict | None = None):
    """A plan's Pareto front: throughput per GPU (requests/s) against the first objective's
    statistic (``unit``), the band as error bars, the objective's limit as a line, the answer
    marked.

    ``points`` and ``answer`` are dicts ``label``, ``x``, ``y``, ``low``, ``high`` (``low``/``high``
    NaN: no band)."""
    if not points and answer is None:
        return None
    fig, (ax,) = _figure(1, width=7.0, height=4.5)
    if points:
        x = np.array([p["x"] for p in points], float)
        y = np.array([p["y"] for p in points], float)
        lo = np.array([p["low"] for p in points], float)
        hi = np.array([p["high"] for p in points], float)
        err = [np.where(np.isfinite(lo), np.maximum(y - lo, 0), 0), np.where(np.isfinite(hi), np.maximum(hi - y, 0), 0)]
        ax.errorbar(x, y, yerr=err, fmt="o-", capsize=4, label="Pareto front (point, 95 % band)")
        for p in points:
            ax.annotate(p["label"], (p["x"], p["y"]), textcoords="offset points", xytext=(5, 5), fontsize="small")
    if answer is not None:
        ax.plot([answer["x"]], [answer["y"]], marker="*", ms=16, color="tab:red", ls="none",
                label=f"answer: {answer['label']}")
    ax.axhline(limit, color="tab:gray", ls="--", lw=1, label=f"SLO {key} <= {limit:g} {unit}")
    ax.margins(x=0.2)  # room for the labels of the outermost points
    ax.set_xlabel("throughput per GPU at the target rate (requests/s)")
    ax.set_ylabel(f"predicted {key} ({unit})")
    ax.set_title(f"Pareto front: throughput per GPU vs {key}")
    ax.legend(loc="best", fontsize="small")
    return fig


def levels_figure(rows: pd.DataFrame):
    """Aggregates replayed level by level (``replay AGG --report``): per latency (TTFT, TPOT, E2E),
    its reported p50 and p90 (markers) and the predicted ones (lines) with their 95 % band filled,
    against the level; ``rows`` has ``level``, ``metric``, ``statistic``, ``reported_s``,
    ``predicted_s``, ``low_s`` and ``high_s`` (NaN without a band). None without such rows."""
    shown = rows[rows["statistic"].isin(("p50", "p90"))]
    if shown.empty:
        return None
    metrics = list(dict.fromkeys(shown["metric"]))
    fig, axes = _panels(len(metrics))
    for ax, metric in zip(axes, metrics):
        for stat, part in shown[shown["metric"] == metric].groupby("statistic", sort=True):
            x = part["level"].to_numpy(float)
            line, = ax.plot(x, part["predicted_s"].to_numpy(float) * 1e3, marker=".", label=f"{stat} predicted")
            ax.fill_between(x, part["low_s"].to_numpy(float) * 1e3, part["high_s"].to_numpy(float) * 1e3,
                            color=line.get_color(), alpha=0.2, lw=0)
            ax.plot(x, part["reported_s"].to_numpy(float) * 1e3, ls="none", marker="o", mfc="none",
                    color=line.get_color(), label=f"{stat} reported")
        ax.set_xticks(sorted(set(shown["level"].astype(int))))
        ax.set_xlabel("level (window)")
        ax.set_ylabel(f"{metric} (ms)")
        ax.set_title(f"{metric}: band is the 95 % one")
        ax.legend(loc="upper left", fontsize="small")
    return fig
