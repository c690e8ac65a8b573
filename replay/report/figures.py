"""The report's figures, drawn with matplotlib on the Agg canvas (no pyplot state) and saved as PNG."""
from __future__ import annotations

import io

import numpy as np
import pandas as pd

from ..compare import metric_values

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
        ax.set_title(f"{label} (n = {m.size}" + (f", {MAX_SCATTER_POINTS} shown)" if m.size > MAX_SCATTER_POINTS else ")"))
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
