"""The replay report: measured vs predicted as one self-contained HTML file, or Markdown.

``write_report(result, "run.html")`` writes ONE file, its figures embedded as base64 PNG
(``data:`` URIs), so it can be attached to a pull request or mailed as it is.
``write_report(result, "run.md")`` writes ``run.md`` and its figures in the folder
``run_files/`` (``scatter.png``, ``cdf.png``, and ``timeseries.png``, ``steps.png`` when a
measured time series or the simulated steps are given), named after the report so that
reports of other names never overwrite each other's figures.

The report opens with what was run (trace, model, GPU, TP, engine settings, calibration,
servecal version: :func:`report_context`), then the verdict against the tolerances when
some were given, then the comparison table of :func:`replay.analysis.compare.compare`; nothing in
it is computed twice. Wide tables scroll sideways in HTML instead of being cut.

Every file is written atomically (temporary file in the same folder, then rename), so no
file is ever partial and no temporary is left behind. The figures are all drawn before any
is renamed and the text is written last: an error while drawing leaves the folder (and an
earlier report of the same name) untouched, and a report never refers to a missing figure.

This module assembles the report; the measured time series and the per-window errors are in
:mod:`.timeseries`, the figures in :mod:`.figures`, the Markdown/HTML rendering in :mod:`.render`.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np
import pandas as pd

from schemas.atomic import atomic_output, write_text_atomic

from ..analysis.compare import broken_tolerances, compare, err_cell
from ..errors import ConfigError, ReplayError
from .figures import STEP_COLUMNS, cdf_figure, scatter_figure
from .provenance import provenance_blocks
from .render import pct, render
from .sections import (ReportBody, benchmark_section, comparison_section, disagg_section, errors_over_time_section,
                       prediction_section, steps_section, timeseries_section, tolerance_section)
from .timeseries import (NUM_TIME_WINDOWS, TIMESERIES_COLUMNS, check_timeseries_span, errors_over_time,
                         read_timeseries, simulated_counts)

__all__ = ["REPORT_FORMATS", "NUM_TIME_WINDOWS", "TIMESERIES_COLUMNS", "check_timeseries_span", "errors_over_time",
           "FIGURE_NAMES", "figures_folder", "read_timeseries", "report_context", "report_format", "simulated_counts",
           "tolerance_verdict", "write_document", "write_report"]

#: Report formats by file suffix.
REPORT_FORMATS = {".md": "markdown", ".html": "html"}


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


def figures_folder(path: str | os.PathLike) -> Path | None:
    """The folder a report at ``path`` writes its figures into: ``<stem>_files`` beside a
    Markdown report; None for HTML (figures embedded) and other suffixes."""
    path = Path(path)
    return path.parent / _figures_name(path) if REPORT_FORMATS.get(path.suffix.lower()) == "markdown" else None


#: Every file a Markdown report may write into its figures' folder (the replay report's, and
#: those of the sweep, scheduler-comparison and plan reports, :mod:`.predictions`): the CLI
#: refuses, before any work, one of these names that exists there as other than a regular file.
FIGURE_NAMES = ("scatter.png", "cdf.png", "timeseries.png", "steps.png", "disagg_waits.png", "sweep.png",
                "schedulers.png", "front.png", "levels.png")


def _figures_name(path: Path) -> str:
    """The name of a Markdown report's figure folder, ``<stem>_files``."""
    return f"{path.stem}_files"


def servecal_version() -> str:
    """The installed servecal's version ("unknown" when it is not installed as a distribution)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("servecal")
    except PackageNotFoundError:
        return "unknown"


def report_context(trace=None, calibration=None, cost_model=None, cfg=None, engine=None,
                   extra: dict | None = None, command: str | None = None) -> list[tuple[str, str]]:
    """What a report says was run: ``(label, value)`` pairs for its header.

    Parameters
    ----------
    trace, calibration : path, optional
        The replayed request trace and the calibration file.
    cost_model : replay.cost.cost_model.RooflineCostModel, optional
        Gives the model, the GPU and the TP degree.
    cfg : replay.config.ReplayConfig, optional
        Gives the scheduler and the engine settings.
    engine : replay.core.engine.Engine, optional
        The engine that ran: the KV blocks actually used (``--num-gpu-blocks`` or sized
        from GPU memory).
    extra : dict, optional
        More ``label: value`` lines, appended.
    command : str, optional
        The command line that ran (:func:`replay.cli.options.command_line`).

    Returns
    -------
    list of (str, str)
        ``command``, ``trace``, ``calibration``, ``model``, ``GPU``, ``TP``, ``scheduler``,
        ``engine``, ``servecal`` (those known), then ``extra``.
    """
    items = [("command", command)] if command else []
    if trace is not None:
        items.append(("trace", str(trace)))
    if calibration is not None:
        items.append(("calibration", str(calibration)))
    if cost_model is not None:
        items += [("model", cost_model.model.name), ("GPU", cost_model.gpu.name), ("TP", str(cost_model.tp))]
    if cfg is not None:
        eng, scheduling, closed = cfg.engine, cfg.scheduling, cfg.closed_loop
        sched = scheduling.scheduler
        if cfg.disagg is not None and cost_model is not None:
            from ..core.disagg_pools import describe_config

            sched += f": {describe_config(cost_model, cfg.disagg)}"
        elif scheduling.replicas != 1:
            sched += f" on {scheduling.replicas} replicas, router {scheduling.router}"
        items.append(("scheduler", sched))
        settings = [f"max_num_seqs={eng.max_num_seqs}", f"max_num_batched_tokens={eng.max_num_batched_tokens}"]
        blocks = eng.num_gpu_blocks
        if engine is not None and getattr(engine, "replicas", None):
            blocks = engine.replicas[0].kv.num_gpu_blocks
        if blocks is not None:
            settings.append(f"num_gpu_blocks={blocks}")
        settings += [f"block_size={eng.block_size}",
                     f"enable_prefix_caching={eng.enable_prefix_caching}", f"preemption_mode={eng.preemption_mode}"]
        if eng.max_model_len is not None:
            settings.append(f"max_model_len={eng.max_model_len}")
        if closed.concurrency is not None:
            settings.append(f"closed loop: concurrency={closed.concurrency}, think_time_s={closed.think_time_s:g}")
        items.append(("engine", ", ".join(settings)))
    items.append(("servecal", servecal_version()))
    items += [(str(k), str(v)) for k, v in (extra or {}).items()]
    return items


def tolerance_verdict(table: pd.DataFrame, tolerances: dict[str, float] | None):
    """The report's verdict: ``(kind, line, rows)`` with ``kind`` ``"pass"``, ``"fail"`` or
    ``"none"`` (no tolerance given), one line saying so, and a row per tolerance
    (check, bound, error, result) as :func:`replay.analysis.compare.broken_tolerances` judges it."""
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
            err = pct(r["mape"]).lstrip("+")
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
                 tolerances: dict[str, float] | None = None, band=None, differences: list[str] | None = None,
                 calibration=None, trace=None, band_note: str | None = None) -> list[Path]:
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
        The simulated step trace (:func:`replay.core.result_columns.steps_frame`). Adds step
        durations and tokens per step over time, and with its ``t_<term>_s`` columns where
        the time goes (:func:`replay.report.step_terms.term_time_cells`).
    context : list of (str, str), optional
        What was run, for the header (:func:`report_context`); default: the servecal version.
    tolerances : dict, optional
        ``{"ttft_p50": 0.1, ...}`` (``replay --tolerance``): adds the PASS/FAIL line and a
        table of every check.
    band : replay.analysis.bands.Band, optional
        The prediction's 95 % band: a table of the predicted percentiles with their bands
        (also the only latency table of a trace without measured latencies) and a
        ``band_pXX`` column beside each error of the comparison.
    band_note : str, optional
        Why ``band`` has no band, when it has none (default: the calibration has no band points).
    differences : list of str, optional
        What makes the replay a what-if (:func:`replay.cli.baseline.whatif_differences`): the
        comparison is then baseline (measured) vs what-if, its differences changes.
    calibration : schemas.calibration.Calibration, optional
        Adds its parameters with their 95 % intervals and, with ``trace`` (the replayed
        file), whether that trace was in its data (:func:`.provenance.in_sample`).

    Returns
    -------
    list of pathlib.Path
        The report, then the PNG files written (none for HTML).

    Raises
    ------
    ConfigError
        Unknown report suffix.
    replay.errors.TimeseriesError
        A bad measured time series.

    Notes
    -----
    The key table is :func:`replay.analysis.compare.compare`'s, formatted by
    :func:`replay.analysis.compare.table_cells` (milliseconds, signed percent errors, or ms where
    the measured value is below 1 ms). Figures are drawn on matplotlib's Agg canvas. PNGs
    are saved to temporary files first and renamed, then the text is written with
    :func:`schemas.atomic.write_text_atomic`.
    """
    path = Path(path)
    report_format(path)  # an unknown suffix fails before anything is drawn
    ts = read_timeseries(measured_timeseries) if measured_timeseries is not None else None
    if simulated_steps is not None:
        missing = [c for c in STEP_COLUMNS if c not in simulated_steps]
        if missing:
            raise ReplayError(f"simulated steps: missing column(s) {', '.join(missing)}")
    table = compare(result_df)
    metrics = list(table["metric"]) if not table.empty else []
    kind, line, checks = tolerance_verdict(table, tolerances)
    body = ReportBody(_figures_name(path), provenance_blocks(
        context or report_context(), [] if calibration is None else [(str(calibration), calibration)], trace))
    body.blocks.insert(1, ("verdict", kind, line))
    if band is not None:
        prediction_section(body, band, band_note)
    comparison_section(body, result_df, table, differences, band)
    if "benchmark" in result_df and not table.empty:
        benchmark_section(body, result_df)
    if checks:
        tolerance_section(body, checks)
    fig = scatter_figure(result_df, metrics)
    if fig is not None:
        body.figure("Per request: predicted vs measured", "scatter of predicted vs measured per request",
                    "scatter.png", fig)
    fig = cdf_figure(result_df, metrics)
    if fig is not None:
        body.figure("Distributions: measured and predicted CDFs", "CDFs of measured and predicted", "cdf.png", fig)
    if "ttft" in metrics:
        errors_over_time_section(body, result_df, differences)
    if "pred_handoff_wait_s" in result_df:
        disagg_section(body, result_df)
    if ts is not None:
        timeseries_section(body, result_df, ts)
    if simulated_steps is not None and len(simulated_steps):
        steps_section(body, simulated_steps)
    return write_document(body.blocks, body.figures, path, "servecal replay report")


def write_document(blocks: list[tuple], figures: list[tuple[str, bytes]], path: str | os.PathLike,
                   title: str) -> list[Path]:
    """Render ``blocks`` and write them to ``path`` (``.html``: one file, the figures embedded;
    ``.md``: the PNG ``figures`` into ``<stem>_files/`` first, then the text), every file
    atomically. Returns the report, then the PNG files written."""
    path = Path(path)
    fmt = report_format(path)
    text = render(blocks, fmt, title)
    if fmt == "html":
        write_text_atomic(text, path)
        return [path]
    written = _save_atomically(figures, path.parent / _figures_name(path))
    write_text_atomic(text, path)
    return [path] + written


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
