"""The sections of the replay report (:func:`replay.report.write_report`), in the order it adds them:
each appends its blocks (:mod:`.render`) and figures to a :class:`ReportBody`."""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..analysis.compare import MAPE_MIN_MEAS_S, REL_ERR_FLOOR_S, compare, compared_rows, err_cell, ms_cell, table_cells
from .figures import disagg_waits_figure, png as png_bytes, steps_figure, timeseries_figure
from .provenance import with_band_columns
from .render import ms
from .step_terms import term_time_cells
from .timeseries import DISAGG_WAITS, NUM_TIME_WINDOWS, disagg_waits_over_time, errors_over_time, simulated_counts

#: Metrics and percentiles of the per-benchmark table.
BENCHMARK_METRICS = ("ttft", "tpot", "e2e")
BENCHMARK_PERCENTILES = (50, 90)


class ReportBody:
    """The report's blocks and its figures (PNG bytes by file name in ``folder``, the Markdown
    report's figures folder, named after it)."""

    def __init__(self, folder: str, blocks: list[tuple]):
        self.folder = folder
        self.blocks = blocks
        self.figures: list[tuple[str, bytes]] = []

    def figure(self, title: str, alt: str, name: str, fig) -> None:
        """Add ``fig`` as PNG ``name`` (under an ``h2`` heading ``title``, none when empty)."""
        png = png_bytes(fig)
        self.blocks.extend([("h2", title), ("img", alt, f"{self.folder}/{name}", png)] if title else
                           [("img", alt, f"{self.folder}/{name}", png)])
        self.figures.append((name, png))


def prediction_section(body: ReportBody, band, band_note: str | None) -> None:
    """The predicted percentiles with their 95 % bands (``band``: :class:`replay.analysis.bands.Band`)."""
    from ..analysis.band_tables import band_legend, prediction_cells

    body.blocks += [("h2", "Prediction"), ("table", *prediction_cells(band)),
                    ("p", f"Times in ms over the {band.point.get('n_ok', 0)} completed requests; throughput "
                          f"{band.cell('throughput_rps', fmt=lambda x: f'{x:.3f}')} requests/s. "
                          f"{band_legend(band, band_note)}.")]


def comparison_section(body: ReportBody, result_df: pd.DataFrame, table: pd.DataFrame,
                       differences: list[str] | None, band) -> None:
    """Measured vs predicted (``table``: :func:`replay.analysis.compare.compare` of ``result_df``), or baseline
    vs what-if under ``differences``, with the counts of requests compared and excluded."""
    n_compared = int(compared_rows(result_df).sum())
    counts = (f"Requests: {len(result_df)} in the result, {n_compared} compared (completed on both sides), "
              f"{len(result_df) - n_compared} excluded (failed in the measured run or not completed by the simulator).")
    if differences:
        from ..analysis.whatif_table import whatif_cells

        body.blocks += [("h2", "Baseline (measured) vs what-if"),
                        ("p", f"A what-if, not a validation: {'; '.join(differences)}. change_pXX = (what-if - "
                              "measured) / measured at that percentile (ms below 1 ms measured).")]
        if not table.empty:
            body.blocks.append(("table", *with_band_columns(*whatif_cells(table, wide=True), band)))
        body.blocks.append(("p", counts))
    elif table.empty:
        body.blocks += [("h2", "Measured vs predicted"),
                        ("p", "The trace has no measured latencies: the prediction above is all there is."),
                        ("p", counts)]
    else:
        body.blocks += [
            ("h2", "Measured vs predicted"), ("table", *with_band_columns(*table_cells(table), band)),
            ("p", "Times in ms. err_pXX = (predicted - measured) / measured at that percentile, or "
                  f"predicted - measured in ms where the measured value is below {REL_ERR_FLOOR_S * 1e3:g} ms; "
                  f"mape over measured values >= {MAPE_MIN_MEAS_S * 1e3:g} ms; bias = mean predicted - mean "
                  "measured; ks = Kolmogorov-Smirnov statistic; wass = Wasserstein-1 distance. Mean TPOT (tpot "
                  "row) weighs each request once, mean ITL (itl row, when token times exist on both sides) each "
                  "token gap once. " + counts)]


def benchmark_section(body: ReportBody, result_df: pd.DataFrame) -> None:
    """Each benchmark of a sweep (the ``benchmark`` column) compared on its own rows."""
    head, rows = benchmark_cells(result_df)
    body.blocks += [("h2", "Per benchmark"),
                    ("p", "Each benchmark of the sweep (the trace's benchmark column) compared on its own rows, as "
                          "the table above: measured and predicted p50/p90 in ms, err = (predicted - measured) / "
                          "measured."),
                    ("table", head, rows)]


def benchmark_cells(result_df: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """The per-benchmark table of a replay result with a ``benchmark`` column (a GuideLLM
    sweep): a row per benchmark (in order of first appearance), :func:`replay.analysis.compare.compare`
    on its rows, measured, predicted and error of p50 and p90 of TTFT, TPOT and E2E (ms)."""
    head = ["benchmark", "n"] + [f"{m}_{side}_p{q}" for m in BENCHMARK_METRICS for q in BENCHMARK_PERCENTILES
                                 for side in ("meas", "pred", "err")]
    rows = []
    for name, part in result_df.groupby("benchmark", sort=False, dropna=False):
        t = compare(part.reset_index(drop=True), percentiles=BENCHMARK_PERCENTILES)
        by = {r["metric"]: r for r in t.to_dict("records")} if not t.empty else {}
        n = by["ttft"]["n"] if "ttft" in by else 0
        cells = [str(name), str(n)]
        for m in BENCHMARK_METRICS:
            r = by.get(m)
            for q in BENCHMARK_PERCENTILES:
                meas, pred = (r[f"meas_p{q}"], r[f"pred_p{q}"]) if r is not None else (np.nan, np.nan)
                cells += [ms_cell(meas), ms_cell(pred), err_cell(meas, pred)]
        rows.append(cells)
    return head, rows


def tolerance_section(body: ReportBody, checks: list[list[str]]) -> None:
    """Every ``--tolerance`` check (:func:`replay.report.tolerance_verdict`'s rows)."""
    body.blocks += [("h2", "Tolerances"), ("table", ["check", "bound", "error", "result"], checks),
                    ("p", f"A percentile below {REL_ERR_FLOOR_S * 1e3:g} ms measured is judged against "
                          f"{REL_ERR_FLOOR_S * 1e3:g} ms: its bound allows that fraction of "
                          f"{REL_ERR_FLOOR_S * 1e3:g} ms.")]


def errors_over_time_section(body: ReportBody, result_df: pd.DataFrame, differences: list[str] | None) -> None:
    """TTFT p50 error (the what-if's change under ``differences``) in equal windows of arrival time."""
    win = errors_over_time(result_df)
    rows = [[f"{i + 1}", f"{r.start_s:.1f}-{r.end_s:.1f}", str(r.n), ms(r.meas_p50), ms(r.pred_p50),
             err_cell(r.meas_p50, r.pred_p50)] for i, r in enumerate(win.itertuples())]
    head = ["window", "arrivals (s)", "n", "meas_p50_ms", "pred_p50_ms", "err_p50"]
    if differences:
        from ..analysis.whatif_table import whatif_head

        head = whatif_head(head)
    body.blocks += [("h2", "Changes over time" if differences else "Errors over time"),
                    ("p", f"TTFT p50 in {NUM_TIME_WINDOWS} equal windows of arrival time (compared requests only)."),
                    ("table", head, rows)]


def disagg_section(body: ReportBody, result_df: pd.DataFrame) -> None:
    """Where a disaggregated replay's requests wait over the run: the prefill queue, the handoff (a finished
    prompt waiting for room on the decode side), the KV transfer and the decode queue, next to TTFT."""
    win = disagg_waits_over_time(result_df)
    rows = [[f"{i + 1}", f"{r['start_s']:.1f}-{r['end_s']:.1f}", str(r["n"]), ms(r["meas_ttft_p50"]),
             ms(r["pred_ttft_p50"]), *(ms(r[col]) for _, col in DISAGG_WAITS)]
            for i, r in enumerate(win.to_dict("records"))]
    head = ["window", "arrivals (s)", "n", "meas_ttft_p50_ms", "pred_ttft_p50_ms",
            *(f"{label.replace(' ', '_')}_p50_ms" for label, _ in DISAGG_WAITS)]
    body.blocks += [("h2", "Where the queue forms (disaggregated pools)"),
                    ("p", f"Per equal window of arrival time ({NUM_TIME_WINDOWS}), the median of each wait a request "
                          "meets: the prefill queue, the handoff (its prompt done, waiting for room on a decode "
                          "instance, its KV still on the prefill side; before the prefill with --kv-handoff prealloc), "
                          "the KV transfer and the decode queue.")]
    body.figure("", "the waits of the disaggregated pools and TTFT over arrival time", "disagg_waits.png",
                disagg_waits_figure(win, DISAGG_WAITS))
    body.blocks.append(("table", head, rows))


def timeseries_section(body: ReportBody, result_df: pd.DataFrame, ts: pd.DataFrame) -> None:
    """The measured running and waiting counts (time series ``ts``) next to the simulated ones."""
    running, waiting = simulated_counts(result_df, ts["t"].to_numpy())
    rows = []
    for col, sim in (("running", running), ("waiting", waiting)):
        meas = ts[col].to_numpy(float)
        rows.append([col, f"{meas.mean():.1f}", f"{sim.mean():.1f}", f"{meas.max():.0f}", f"{sim.max():.0f}",
                     f"{np.mean(np.abs(sim - meas)):.1f}"])
    body.blocks += [("h2", "Running and waiting requests over time"),
                    ("p", f"Measured: the {len(ts)} ticks of the time series. Simulated at the same ticks: waiting = "
                          "arrived and not yet scheduled, running = scheduled and not yet completed.")]
    body.figure("", "running and waiting requests, measured and simulated", "timeseries.png",
                timeseries_figure(ts, running, waiting))
    body.blocks.append(("table", ["requests", "meas_mean", "sim_mean", "meas_max", "sim_max", "mean_abs_diff"], rows))


def steps_section(body: ReportBody, simulated_steps: pd.DataFrame) -> None:
    """The simulated steps' durations and tokens over time, and where their time goes by cost term."""
    d = simulated_steps["step_duration_s"].to_numpy(float)
    body.blocks += [("h2", "Simulated steps"),
                    ("p", f"{d.size} steps; duration mean {ms(d.mean())} ms, p50 {ms(np.percentile(d, 50))} ms, "
                          f"p99 {ms(np.percentile(d, 99))} ms, max {ms(d.max())} ms.")]
    body.figure("", "simulated step durations and tokens per step", "steps.png", steps_figure(simulated_steps))
    by_term = term_time_cells(simulated_steps)
    if by_term is not None:
        body.blocks += [("h2", "Where the time goes"),
                        ("p", "The simulated steps' time by cost term (each term alone, compute and memory added; "
                              "overlap: the time they hide under each other)."), ("table", *by_term)]
