"""The report's measured time series and what it is compared with: the simulated running and
waiting counts, and the TTFT error per window of arrival time."""
from __future__ import annotations

import numpy as np
import pandas as pd

from schemas.errors import text_reason
from schemas.text import wrap_error
from schemas.status import OK

from ..analysis.compare import compare
from ..errors import TimeseriesError

#: Equal windows of arrival time in the errors-over-time table.
NUM_TIME_WINDOWS = 10

#: Columns a measured time series must have (vLLM's 1-second ``timeseries.csv``).
TIMESERIES_COLUMNS = ("t", "running", "waiting")


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
        Any failure to read the file (missing, a folder, unreadable, not CSV, not compressed as
        its suffix says), no rows, a missing column, or a non-numeric / NaN / negative value
        (the first bad row is named, counting the header as line 1).
    """
    where = "measured time series" if isinstance(source, pd.DataFrame) else str(source)
    if isinstance(source, pd.DataFrame):
        df = source
    else:
        try:
            df = pd.read_csv(source)  # compression inferred from the suffix (.gz, .zip, ...)
        except FileNotFoundError:
            raise TimeseriesError(f"{where}: no such file") from None
        except IsADirectoryError:
            raise TimeseriesError(f"{where}: is a folder; expected a CSV file") from None
        except PermissionError as exc:
            raise TimeseriesError(f"{where}: cannot read ({exc.strerror})") from None
        except MemoryError:
            raise
        except Exception as exc:  # pandas, csv, gzip, zipfile, lzma, ... each fail in their own way
            raise TimeseriesError(wrap_error(
                f"{where}: not a CSV time series ({text_reason(source, exc)}); expected a CSV with columns "
                f"{', '.join(TIMESERIES_COLUMNS)} (compressed only when its name ends in .gz, .bz2, .xz, .zst "
                "or .zip)")) from None
    missing = [c for c in TIMESERIES_COLUMNS if c not in df.columns]
    if missing:
        raise TimeseriesError(f"{where}: missing column(s) {', '.join(missing)}; "
                              f"expected {', '.join(TIMESERIES_COLUMNS)} (vLLM's timeseries.csv)")
    if df.empty:
        raise TimeseriesError(f"{where}: has no rows; expected one row per tick ({', '.join(TIMESERIES_COLUMNS)})")
    out = {}
    for col in TIMESERIES_COLUMNS:
        v = pd.to_numeric(df[col], errors="coerce").to_numpy(float, na_value=np.nan)
        bad = np.flatnonzero(~np.isfinite(v) | (v < 0))
        if bad.size:
            raise TimeseriesError(f"{where}: column '{col}', line {bad[0] + 2}: {df[col].iloc[bad[0]]!r} "
                                  "is not a finite number >= 0")
        out[col] = v
    return pd.DataFrame(out).sort_values("t", kind="stable").reset_index(drop=True)


def check_timeseries_span(ts: pd.DataFrame, where: str, trace: pd.DataFrame) -> str | None:
    """Check that a measured time series lies on the trace's clock: some ticks within its span.

    The span is [0, the last measured completion] (``arrival_time_s + e2e_s``; the last arrival
    when the trace has no ``e2e_s``). A tick up to two tick spacings after it counts as inside:
    a tick reports the interval before it, and the series' origin is known to about a tick.

    Parameters
    ----------
    ts : pandas.DataFrame
        A time series from :func:`read_timeseries`.
    where : str
        Its file, for the messages.
    trace : pandas.DataFrame
        The request trace (``arrival_time_s``, optional ``e2e_s``, seconds).

    Returns
    -------
    str or None
        A warning when some ticks lie after the span (the trace has ``e2e_s``), else None.

    Raises
    ------
    TimeseriesError
        Every tick lies outside the span (e.g. wall-clock seconds instead of seconds since
        the trace's start): the comparison would be against an empty simulation.
    """
    t = ts["t"].to_numpy(float)
    arrival = trace["arrival_time_s"].to_numpy(float)
    if t.size == 0 or arrival.size == 0:
        return None
    ends = arrival + trace["e2e_s"].to_numpy(float) if "e2e_s" in trace else arrival
    end = float(np.nanmax(np.concatenate([arrival, ends[np.isfinite(ends)]])))
    gaps = np.diff(t)
    spacing = float(np.median(gaps[gaps > 0])) if (gaps > 0).any() else 1.0
    outside = (t < 0) | (t > end + 2 * spacing)
    if not outside.any():
        return None
    span = f"the trace's span [0, {end:.1f}] s"
    if outside.all():
        raise TimeseriesError(f"{where}: column 't': every tick ({t.min():.10g} to {t.max():.10g} s) lies "
                              f"outside {span}; expected seconds since the trace's start (a wall clock? "
                              "subtract the run's start time, or import the log with 'traces import vllm-log "
                              "--align-to TRACE --timeseries-csv')")
    if "e2e_s" not in trace:
        return None  # the trace's end is unknown: ticks after its last arrival may be its drain
    after = t[outside]
    return (f"warning: {where}: {after.size} of {t.size} ticks (t {after.min():.10g} to {after.max():.10g} s) lie "
            f"after {span}; they are compared with a simulation that has no request left there")


def simulated_counts(result: pd.DataFrame, t_s) -> tuple[np.ndarray, np.ndarray]:
    """Simulated running and waiting requests at instants ``t_s``.

    Parameters
    ----------
    result : pandas.DataFrame
        A replay result (``arrival_time_s``, ``pred_queue_wait_s``, ``pred_e2e_s``, ``pred_status``;
        ``pred_frontend_s`` and ``pred_stream_s`` when a front end was modelled).
    t_s : array_like of float, shape (k,), seconds since trace start

    Returns
    -------
    running, waiting : numpy.ndarray of int64, shape (k,)
        ``waiting(t) = #{arrival <= t < first scheduled}``,
        ``running(t) = #{first scheduled <= t < completion}``, over requests the simulator
        completed (rejected and not-simulated requests never enter), on the engine's clock
        as vLLM counts them: arrival at the engine after the front end, completion at the
        engine's last token (before the stream to the client).

    Notes
    -----
    Built from the result's per-request times only, so a request preempted back to the
    waiting queue still counts as running until it completes.
    """
    ok = (result["pred_status"] == OK).to_numpy(bool)
    def col(name):
        return result[name].to_numpy(float)[ok] if name in result else 0.0

    arrival = result["arrival_time_s"].to_numpy(float)[ok] + col("pred_frontend_s")
    scheduled = arrival + result["pred_queue_wait_s"].to_numpy(float)[ok]
    done = result["arrival_time_s"].to_numpy(float)[ok] + result["pred_e2e_s"].to_numpy(float)[ok] \
        - col("pred_stream_s")
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
        each from :func:`replay.analysis.compare.compare` on the window's requests (NaN when none).
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


#: The waits of a disaggregated replay, in the order a request meets them (result columns, seconds).
DISAGG_WAITS = (("prefill queue", "pred_queue_wait_s"), ("handoff", "pred_handoff_wait_s"),
                ("KV transfer", "pred_kv_transfer_s"), ("decode queue", "pred_decode_queue_wait_s"))


def disagg_waits_over_time(result: pd.DataFrame, num_windows: int = NUM_TIME_WINDOWS) -> pd.DataFrame:
    """Where a disaggregated replay's requests wait, per equal window of arrival time.

    Returns
    -------
    pandas.DataFrame
        One row per window: ``start_s``, ``end_s`` (arrival-time bounds, the last window closed),
        ``n``, the measured and predicted TTFT p50 (``meas_ttft_p50``, ``pred_ttft_p50``; NaN without
        a measured TTFT) and the p50 of each wait of :data:`DISAGG_WAITS` over the window's completed
        requests (seconds; NaN where none has it, e.g. a one-token request moves no KV).
    """
    from schemas.status import OK

    arrival = result["arrival_time_s"].to_numpy(float)
    ok = (result["pred_status"] == OK).to_numpy()
    edges = np.linspace(arrival.min(), arrival.max(), num_windows + 1) if arrival.size else np.zeros(num_windows + 1)

    def p50(col: str, rows) -> float:
        if col not in result:
            return float("nan")
        v = result.loc[rows, col].to_numpy(float, na_value=np.nan)
        v = v[np.isfinite(v)]
        return float(np.median(v)) if v.size else float("nan")

    out = []
    for i in range(num_windows):
        lo, hi = edges[i], edges[i + 1]
        rows = ok & (arrival >= lo) & ((arrival < hi) if i < num_windows - 1 else (arrival <= hi))
        out.append({"start_s": lo, "end_s": hi, "n": int(rows.sum()), "meas_ttft_p50": p50("ttft_s", rows),
                    "pred_ttft_p50": p50("pred_ttft_s", rows), **{col: p50(col, rows) for _, col in DISAGG_WAITS}})
    return pd.DataFrame(out)
