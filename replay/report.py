"""The replay report: measured vs predicted as one self-contained HTML file, or Markdown.

``write_report(result, "run.html")`` writes ONE file, its figures embedded as base64 PNG
(``data:`` URIs), so it can be attached to a pull request or mailed as it is.
``write_report(result, "run.md")`` writes ``run.md`` and its figures in the folder
``run_files/`` (``scatter.png``, ``cdf.png``, and ``timeseries.png``, ``steps.png`` when a
measured time series or the simulated steps are given), named after the report so that
reports of other names never overwrite each other's figures.

The report opens with what was run (trace, model, GPU, TP, engine settings, calibration,
servecal version: :func:`report_context`), then the verdict against the tolerances when
some were given, then the comparison table of :func:`replay.compare.compare`; nothing in
it is computed twice. Wide tables scroll sideways in HTML instead of being cut.

Every file is written atomically (temporary file in the same folder, then rename), so no
file is ever partial and no temporary is left behind. The figures are all drawn before any
is renamed and the text is written last: an error while drawing leaves the folder (and an
earlier report of the same name) untouched, and a report never refers to a missing figure.
"""
from __future__ import annotations

import base64
import contextlib
import html
import io
import os
from pathlib import Path

import numpy as np
import pandas as pd

from schemas.atomic import atomic_output, write_text_atomic
from schemas.status import OK

from .compare import (MAPE_MIN_MEAS_S, REL_ERR_FLOOR_S, broken_tolerances, compare, compared_rows, err_cell,
                      format_table, metric_values, table_cells)
from .errors import ConfigError, ReplayError

#: Report formats by file suffix.
REPORT_FORMATS = {".md": "markdown", ".html": "html"}

#: Equal windows of arrival time in the errors-over-time table.
NUM_TIME_WINDOWS = 10

#: Columns a measured time series must have (vLLM's 1-second ``timeseries.csv``).
TIMESERIES_COLUMNS = ("t", "running", "waiting")

#: At most this many points per scatter panel (a seeded random subset beyond it).
MAX_SCATTER_POINTS = 20_000

_STEP_COLUMNS = ("step_start_time_s", "step_duration_s", "num_prefill_tokens", "num_decode_seqs")


class TimeseriesError(ReplayError):
    """A measured time-series file is unreadable or lacks a column (names file, column, row)."""


def report_format(path: str | os.PathLike) -> str:
    """``"markdown"`` or ``"html"`` from the report path's suffix.

    Raises
    ------
    ConfigError
        For any other suffix.
    """
    suffix = Path(path).suffix.lower()
    if suffix not in REPORT_FORMATS:
        raise ConfigError(f"--report {path}: unknown report format {suffix or '(no suffix)'!r}; "
                          f"use {' or '.join(REPORT_FORMATS)}")
    return REPORT_FORMATS[suffix]


def read_timeseries(source) -> pd.DataFrame:
    """A measured time series: columns ``t`` (seconds since trace start), ``running``, ``waiting``.

    Parameters
    ----------
    source : path or pandas.DataFrame
        A CSV such as vLLM's ``timeseries.csv`` (one row per 1 s tick: ``t, running,
        waiting, ...``), or a frame with those columns.

    Returns
    -------
    pandas.DataFrame
        ``t`` (float64, s), ``running`` and ``waiting`` (float64, request counts), sorted by ``t``.

    Raises
    ------
    TimeseriesError
        Missing file, not CSV, a missing column, or a non-numeric / NaN / negative value
        (the first bad row is named, counting the header as line 1).
    """
    where = "measured time series" if isinstance(source, pd.DataFrame) else str(source)
    if isinstance(source, pd.DataFrame):
        df = source
    else:
        try:
            df = pd.read_csv(source)
        except FileNotFoundError:
            raise TimeseriesError(f"{where}: no such file") from None
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
            raise TimeseriesError(f"{where}: not a CSV time series ({exc})") from None
    missing = [c for c in TIMESERIES_COLUMNS if c not in df.columns]
    if missing:
        raise TimeseriesError(f"{where}: missing column(s) {', '.join(missing)}; "
                              f"expected {', '.join(TIMESERIES_COLUMNS)} (vLLM's timeseries.csv)")
    out = {}
    for col in TIMESERIES_COLUMNS:
        v = pd.to_numeric(df[col], errors="coerce").to_numpy(float, na_value=np.nan)
        bad = np.flatnonzero(~np.isfinite(v) | (v < 0))
        if bad.size:
            raise TimeseriesError(f"{where}: column '{col}', line {bad[0] + 2}: {df[col].iloc[bad[0]]!r} "
                                  "is not a finite number >= 0")
        out[col] = v
    return pd.DataFrame(out).sort_values("t", kind="stable").reset_index(drop=True)


def simulated_counts(result: pd.DataFrame, t_s) -> tuple[np.ndarray, np.ndarray]:
    """Simulated running and waiting requests at instants ``t_s``.

    Parameters
    ----------
    result : pandas.DataFrame
        A replay result (``arrival_time_s``, ``pred_queue_wait_s``, ``pred_e2e_s``, ``pred_status``).
    t_s : array_like of float, shape (k,), seconds since trace start

    Returns
    -------
    running, waiting : numpy.ndarray of int64, shape (k,)
        ``waiting(t) = #{arrival <= t < first scheduled}``,
        ``running(t) = #{first scheduled <= t < completion}``, over requests the simulator
        completed (rejected and not-simulated requests never enter).

    Notes
    -----
    Built from the result's per-request times only, so a request preempted back to the
    waiting queue still counts as running until it completes.
    """
    ok = (result["pred_status"] == OK).to_numpy(bool)
    arrival = result["arrival_time_s"].to_numpy(float)[ok]
    scheduled = arrival + result["pred_queue_wait_s"].to_numpy(float)[ok]
    done = arrival + result["pred_e2e_s"].to_numpy(float)[ok]
    t = np.asarray(t_s, dtype=float)
    n_arrived, n_scheduled, n_done = (np.searchsorted(np.sort(x), t, side="right") for x in (arrival, scheduled, done))
    return (n_scheduled - n_done).astype(np.int64), (n_arrived - n_scheduled).astype(np.int64)


def errors_over_time(result: pd.DataFrame, num_windows: int = NUM_TIME_WINDOWS) -> pd.DataFrame:
    """TTFT p50 of measured and predicted per equal window of arrival time.

    Returns
    -------
    pandas.DataFrame
        One row per window: ``start_s``, ``end_s`` (arrival-time bounds, the last window
        closed), ``n``, ``meas_p50``, ``pred_p50`` (seconds) and ``rel_err_p50`` (signed),
        each from :func:`replay.compare.compare` on the window's requests (NaN when none).
    """
    arrival = result["arrival_time_s"].to_numpy(float)
    edges = np.linspace(arrival.min(), arrival.max(), num_windows + 1) if arrival.size else np.zeros(num_windows + 1)
    rows = []
    for i in range(num_windows):
        lo, hi = edges[i], edges[i + 1]
        inside = (arrival >= lo) & ((arrival < hi) if i < num_windows - 1 else (arrival <= hi))
        table = compare(result[inside], percentiles=(50,))
        ttft = table[table["metric"] == "ttft"] if not table.empty else table
        if len(ttft):
            r = ttft.iloc[0]
            rows.append((lo, hi, int(r["n"]), r["meas_p50"], r["pred_p50"], r["rel_err_p50"]))
        else:
            rows.append((lo, hi, 0, np.nan, np.nan, np.nan))
    return pd.DataFrame(rows, columns=["start_s", "end_s", "n", "meas_p50", "pred_p50", "rel_err_p50"])


# -- figures --------------------------------------------------------------------------------------

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


def _scatter_figure(result: pd.DataFrame, metrics: list[str]):
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


def _cdf_figure(result: pd.DataFrame, metrics: list[str]):
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


def _timeseries_figure(ts: pd.DataFrame, running: np.ndarray, waiting: np.ndarray):
    """Measured vs simulated running and waiting requests per tick."""
    fig, axes = _figure(1, 2, width=9.0, height=2.8)
    for ax, col, sim in zip(axes, ("running", "waiting"), (running, waiting)):
        ax.plot(ts["t"], ts[col], label="measured")
        ax.plot(ts["t"], sim, label="simulated")
        ax.set_ylabel(f"{col} requests")
        ax.legend(loc="upper right")
    axes[-1].set_xlabel("time since trace start (s)")
    return fig


def _steps_figure(steps: pd.DataFrame):
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


# -- the document ---------------------------------------------------------------------------------

def _md_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _html_table(head: list[str], rows: list[list[str]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>\n" for r in rows)
    # a wide table scrolls sideways in its own box instead of being cut or widening the page
    return f"<div class=\"scroll\"><table>\n<thead><tr>{th}</tr></thead>\n<tbody>\n{body}</tbody>\n</table></div>"


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;color:#222;
     max-width:84em;margin:1.5em auto;padding:0 1.2em;line-height:1.45}
h1{font-size:1.5em;margin:0 0 .4em}
h2{font-size:1.15em;margin:1.8em 0 .5em;padding-bottom:.2em;border-bottom:1px solid #ddd}
p{max-width:60em}
.scroll{overflow-x:auto;max-width:100%;margin:.5em 0}
table{border-collapse:collapse;font-size:.9em;font-variant-numeric:tabular-nums}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right;white-space:nowrap}
th{background:#f2f4f7}
td:first-child,th:first-child{text-align:left}
dl.meta{display:grid;grid-template-columns:max-content 1fr;gap:.15em 1.2em;margin:.5em 0 1em;font-size:.92em}
dl.meta dt{font-weight:600;color:#444}
dl.meta dd{margin:0;font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;overflow-wrap:anywhere}
.verdict{padding:.55em 1em;border-radius:4px;font-weight:600;margin:1em 0}
.pass{background:#e7f5ec;color:#1d6b36;border:1px solid #9fd4b0}
.fail{background:#fdecea;color:#a0251b;border:1px solid #efaaa2}
.none{background:#f3f3f3;color:#555;border:1px solid #ddd;font-weight:normal}
figure{margin:.8em 0}
figure img{max-width:100%;height:auto;display:block}
"""


def _render(blocks: list[tuple], fmt: str, title: str) -> str:
    """Markdown or HTML from blocks ``("h2", text)``, ``("p", text)``, ``("table", head, rows)``,
    ``("meta", [(label, value), ...])``, ``("verdict", "pass" | "fail" | "none", text)`` and
    ``("img", alt, file, png_bytes)`` (Markdown links ``file``; HTML embeds the bytes)."""
    if fmt == "markdown":
        out = [f"# {title}"]
        for b in blocks:
            if b[0] == "h2":
                out.append(f"## {b[1]}")
            elif b[0] == "p":
                out.append(b[1])
            elif b[0] == "table":
                out.append(_md_table(b[1], b[2]))
            elif b[0] == "meta":
                out.append(_md_table(["", ""], [[f"**{k}**", v.replace("|", "\\|")] for k, v in b[1]]))
            elif b[0] == "verdict":
                out.append(f"**{b[2]}**" if b[1] != "none" else b[2])
            else:
                out.append(f"![{b[1]}]({b[2]})")
        return "\n\n".join(out) + "\n"
    out = ["<!DOCTYPE html>", "<html lang=\"en\"><head><meta charset=\"utf-8\">",
           "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">",
           f"<title>{html.escape(title)}</title>", f"<style>{_CSS}</style>", "</head><body>",
           f"<h1>{html.escape(title)}</h1>"]
    for b in blocks:
        if b[0] == "h2":
            out.append(f"<h2>{html.escape(b[1])}</h2>")
        elif b[0] == "p":
            out.append(f"<p>{html.escape(b[1])}</p>")
        elif b[0] == "table":
            out.append(_html_table(b[1], b[2]))
        elif b[0] == "meta":
            out.append("<dl class=\"meta\">" + "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>"
                                                        for k, v in b[1]) + "</dl>")
        elif b[0] == "verdict":
            out.append(f"<p class=\"verdict {b[1]}\">{html.escape(b[2])}</p>")
        else:
            data = base64.b64encode(b[3]).decode("ascii")
            out.append(f"<figure><img alt=\"{html.escape(b[1])}\" src=\"data:image/png;base64,{data}\"></figure>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _ms(x: float) -> str:
    return "-" if not np.isfinite(x) else f"{x * 1e3:.1f}"


def _pct(x: float) -> str:
    return "-" if not np.isfinite(x) else f"{x:+.1%}"


def servecal_version() -> str:
    """The installed servecal's version ("unknown" when it is not installed as a distribution)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("servecal")
    except PackageNotFoundError:
        return "unknown"


def report_context(trace=None, calibration=None, cost_model=None, cfg=None, engine=None,
                   extra: dict | None = None) -> list[tuple[str, str]]:
    """What a report says was run: ``(label, value)`` pairs for its header.

    Parameters
    ----------
    trace, calibration : path, optional
        The replayed request trace and the calibration file.
    cost_model : replay.cost_model.RooflineCostModel, optional
        Gives the model, the GPU and the TP degree.
    cfg : replay.simulate.ReplayConfig, optional
        Gives the scheduler and the engine settings.
    engine : replay.engine.Engine, optional
        The engine that ran: the KV blocks actually used (``--num-gpu-blocks`` or sized
        from GPU memory).
    extra : dict, optional
        More ``label: value`` lines, appended.

    Returns
    -------
    list of (str, str)
        ``trace``, ``calibration``, ``model``, ``GPU``, ``TP``, ``scheduler``, ``engine``,
        ``servecal`` (those known), then ``extra``.
    """
    items = []
    if trace is not None:
        items.append(("trace", str(trace)))
    if calibration is not None:
        items.append(("calibration", str(calibration)))
    if cost_model is not None:
        items += [("model", cost_model.model.name), ("GPU", cost_model.gpu.name), ("TP", str(cost_model.tp))]
    if cfg is not None:
        sched = cfg.scheduler
        if cfg.scheduler == "disagg" and cost_model is not None:
            from .disagg import describe_config

            sched += f": {describe_config(cost_model, cfg)}"
        elif cfg.replicas != 1:
            sched += f" on {cfg.replicas} replicas, router {cfg.router}"
        items.append(("scheduler", sched))
        settings = [f"max_num_seqs={cfg.max_num_seqs}", f"max_num_batched_tokens={cfg.max_num_batched_tokens}"]
        blocks = cfg.num_gpu_blocks
        if engine is not None and getattr(engine, "replicas", None):
            blocks = engine.replicas[0].kv.num_gpu_blocks
        if blocks is not None:
            settings.append(f"num_gpu_blocks={blocks}")
        settings += [f"block_size={cfg.block_size}",
                     f"enable_prefix_caching={cfg.enable_prefix_caching}", f"preemption_mode={cfg.preemption_mode}"]
        if cfg.max_model_len is not None:
            settings.append(f"max_model_len={cfg.max_model_len}")
        if cfg.concurrency is not None:
            settings.append(f"closed loop: concurrency={cfg.concurrency}, think_time_s={cfg.think_time_s:g}")
        items.append(("engine", ", ".join(settings)))
    items.append(("servecal", servecal_version()))
    items += [(str(k), str(v)) for k, v in (extra or {}).items()]
    return items


def tolerance_verdict(table: pd.DataFrame, tolerances: dict[str, float] | None):
    """The report's verdict: ``(kind, line, rows)`` with ``kind`` ``"pass"``, ``"fail"`` or
    ``"none"`` (no tolerance given), one line saying so, and a row per tolerance
    (check, bound, error, result) as :func:`replay.compare.broken_tolerances` judges it."""
    if not tolerances:
        return "none", "No --tolerance given: no pass/fail verdict.", []
    rows, failed = [], []
    by_metric = {r["metric"]: r for _, r in table.iterrows()}
    for key, bound in tolerances.items():
        broken = broken_tolerances(table, {key: bound})
        metric, _, stat = key.rpartition("_")
        r = by_metric.get(metric)
        if r is None:
            err = "-"
        elif stat == "mape":
            err = _pct(r["mape"]).lstrip("+")
        else:
            err = err_cell(r.get(f"meas_{stat}", np.nan), r.get(f"pred_{stat}", np.nan))
        rows.append([key, f"{bound:.1%}", err, "FAIL" if broken else "pass"])
        if broken:
            failed.append(key)
    if failed:
        return "fail", f"FAIL: {len(failed)} of {len(tolerances)} tolerances broken ({', '.join(failed)}).", rows
    return "pass", f"PASS: all {len(tolerances)} errors within their tolerances.", rows


def write_report(result_df: pd.DataFrame, path: str | os.PathLike, measured_timeseries=None,
                 simulated_steps: pd.DataFrame | None = None, context: list[tuple[str, str]] | None = None,
                 tolerances: dict[str, float] | None = None) -> list[Path]:
    """Write the measured-vs-predicted report of a replay and its figures.

    Parameters
    ----------
    result_df : pandas.DataFrame
        A replay result (``replay_result/1`` columns: the trace's measured latencies and the
        ``pred_*`` columns, seconds).
    path : path
        ``.html`` (one self-contained file, figures embedded) or ``.md`` (Markdown; figures
        in the folder ``<stem>_files/`` beside it).
    measured_timeseries : path or pandas.DataFrame, optional
        The measured 1-second time series (``t``, ``running``, ``waiting``; see
        :func:`read_timeseries`), with ``t`` on the trace's clock (seconds since its first
        arrival). Adds the simulated running/waiting counts plotted against it.
    simulated_steps : pandas.DataFrame, optional
        The simulated step trace (:func:`replay.simulate.steps_frame`). Adds step durations
        and tokens per step over time.
    context : list of (str, str), optional
        What was run, for the header (:func:`report_context`); default: the servecal version.
    tolerances : dict, optional
        ``{"ttft_p50": 0.1, ...}`` (``replay --tolerance``): adds the PASS/FAIL line and a
        table of every check.

    Returns
    -------
    list of pathlib.Path
        The report, then the PNG files written (none for HTML).

    Raises
    ------
    ConfigError
        Unknown report suffix.
    TimeseriesError
        A bad measured time series.

    Notes
    -----
    The key table is :func:`replay.compare.compare`'s, formatted by
    :func:`replay.compare.table_cells` (milliseconds, signed percent errors, or ms where
    the measured value is below 1 ms). Figures are drawn on matplotlib's Agg canvas. PNGs
    are saved to temporary files first and renamed, then the text is written with
    :func:`schemas.atomic.write_text_atomic`.
    """
    path = Path(path)
    fmt = report_format(path)
    ts = read_timeseries(measured_timeseries) if measured_timeseries is not None else None
    if simulated_steps is not None:
        missing = [c for c in _STEP_COLUMNS if c not in simulated_steps]
        if missing:
            raise ReplayError(f"simulated steps: missing column(s) {', '.join(missing)}")
    table = compare(result_df)
    metrics = list(table["metric"]) if not table.empty else []
    folder = f"{path.stem}_files"  # Markdown's figures, named after the report
    blocks: list[tuple] = [("meta", list(context) if context else report_context())]
    figures: list[tuple[str, object]] = []  # (file name in the folder, figure)

    def figure(title: str, alt: str, name: str, fig) -> None:
        png = _png(fig)
        blocks.extend([("h2", title), ("img", alt, f"{folder}/{name}", png)] if title else
                      [("img", alt, f"{folder}/{name}", png)])
        figures.append((name, png))

    kind, line, checks = tolerance_verdict(table, tolerances)
    blocks.append(("verdict", kind, line))

    n_compared = int(compared_rows(result_df).sum())
    counts = (f"Requests: {len(result_df)} in the result, {n_compared} compared (completed on both sides), "
              f"{len(result_df) - n_compared} excluded (failed in the measured run or not completed by the simulator).")
    blocks.append(("h2", "Measured vs predicted"))
    if table.empty:
        blocks += [("p", format_table(table)), ("p", counts)]
    else:
        blocks += [("table", *table_cells(table)),
                   ("p", "Times in ms. err_pXX = (predicted - measured) / measured at that percentile, or "
                         f"predicted - measured in ms where the measured value is below {REL_ERR_FLOOR_S * 1e3:g} ms; "
                         f"mape over measured values >= {MAPE_MIN_MEAS_S * 1e3:g} ms; bias = mean predicted - mean "
                         "measured; ks = Kolmogorov-Smirnov statistic; wass = Wasserstein-1 distance. Mean TPOT (tpot "
                         "row) weighs each request once, mean ITL (itl row, when token times exist on both sides) each "
                         "token gap once. " + counts)]
    if checks:
        blocks += [("h2", "Tolerances"), ("table", ["check", "bound", "error", "result"], checks),
                   ("p", f"A percentile below {REL_ERR_FLOOR_S * 1e3:g} ms measured is judged against "
                         f"{REL_ERR_FLOOR_S * 1e3:g} ms: its bound allows that fraction of {REL_ERR_FLOOR_S * 1e3:g} ms.")]

    fig = _scatter_figure(result_df, metrics)
    if fig is not None:
        figure("Per request: predicted vs measured", "scatter of predicted vs measured per request", "scatter.png", fig)
    fig = _cdf_figure(result_df, metrics)
    if fig is not None:
        figure("Distributions: measured and predicted CDFs", "CDFs of measured and predicted", "cdf.png", fig)

    if "ttft" in metrics:
        win = errors_over_time(result_df)
        rows = [[f"{i + 1}", f"{r.start_s:.1f}-{r.end_s:.1f}", str(r.n), _ms(r.meas_p50), _ms(r.pred_p50),
                 err_cell(r.meas_p50, r.pred_p50)] for i, r in enumerate(win.itertuples())]
        blocks += [("h2", "Errors over time"),
                   ("p", f"TTFT p50 in {NUM_TIME_WINDOWS} equal windows of arrival time (compared requests only)."),
                   ("table", ["window", "arrivals (s)", "n", "meas_p50_ms", "pred_p50_ms", "err_p50"], rows)]

    if ts is not None:
        running, waiting = simulated_counts(result_df, ts["t"].to_numpy())
        rows = []
        for col, sim in (("running", running), ("waiting", waiting)):
            meas = ts[col].to_numpy(float)
            rows.append([col, f"{meas.mean():.1f}", f"{sim.mean():.1f}", f"{meas.max():.0f}", f"{sim.max():.0f}",
                         f"{np.mean(np.abs(sim - meas)):.1f}"])
        blocks += [("h2", "Running and waiting requests over time"),
                   ("p", f"Measured: the {len(ts)} ticks of the time series. Simulated at the same ticks: waiting = "
                         "arrived and not yet scheduled, running = scheduled and not yet completed.")]
        figure("", "running and waiting requests, measured and simulated", "timeseries.png",
               _timeseries_figure(ts, running, waiting))
        blocks.append(("table", ["requests", "meas_mean", "sim_mean", "meas_max", "sim_max", "mean_abs_diff"], rows))

    if simulated_steps is not None and len(simulated_steps):
        d = simulated_steps["step_duration_s"].to_numpy(float)
        blocks += [("h2", "Simulated steps"),
                   ("p", f"{d.size} steps; duration mean {_ms(d.mean())} ms, p50 {_ms(np.percentile(d, 50))} ms, "
                         f"p99 {_ms(np.percentile(d, 99))} ms, max {_ms(d.max())} ms.")]
        figure("", "simulated step durations and tokens per step", "steps.png", _steps_figure(simulated_steps))

    text = _render(blocks, fmt, "servecal replay report")
    if fmt == "html":
        write_text_atomic(text, path)
        return [path]
    written = _save_atomically(figures, path.parent / folder)
    write_text_atomic(text, path)
    return [path] + written


def _png(fig) -> bytes:
    """A figure as PNG bytes (100 dpi)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def _save_atomically(figures: list[tuple[str, bytes]], folder: Path) -> list[Path]:
    """Write every PNG to a temporary file in ``folder``, then rename them all; on error remove
    the temporaries (and ``folder`` when this call made it). Returns the paths written."""
    from schemas.errors import OutputError

    if not figures:
        return []
    made = not folder.exists()
    try:
        folder.mkdir(exist_ok=True)
    except OSError as exc:
        raise OutputError(f"{folder}: cannot create the folder for the report's figures ({exc.strerror})") from None
    try:
        with contextlib.ExitStack() as stack:
            for name, png in figures:
                with open(stack.enter_context(atomic_output(folder / name)), "wb") as fh:
                    fh.write(png)
    except BaseException:
        if made:
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    return [folder / name for name, _ in figures]
