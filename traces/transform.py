"""Transformations of request traces: a time window, a faster or slower arrival rate."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from schemas.tables import MEASURED_METRICS

from .errors import TraceError

__all__ = ["slice_trace", "scale_trace", "rescaled_arrival_problem"]

#: Columns that describe how the measured run went; they do not survive a rate change.
_MEASURED = (*MEASURED_METRICS, "token_times_s")


def slice_trace(frame: pd.DataFrame, start_s: float, end_s: float) -> tuple[pd.DataFrame, dict[str, str]]:
    """The requests arriving in ``[start_s, end_s)``, arrivals rebased to ``start_s``.

    Parameters
    ----------
    frame : pandas.DataFrame
        A ``request_trace/1`` frame sorted by ``arrival_time_s``.
    start_s, end_s : float
        Window in seconds on the trace's clock; ``end_s`` may be ``inf``.

    Returns
    -------
    frame : pandas.DataFrame
        The rows in the window, in order, with ``arrival_time_s - start_s`` (so the first
        request arrives at its offset into the window, not necessarily at 0). Measured
        latencies are per request (relative to its own arrival) and are kept.
    metadata : dict
        ``slice_start_s``, ``slice_end_s``.

    Raises
    ------
    TraceError
        A negative start, ``end_s <= start_s``, NaN bounds, or an empty window.
    """
    if not (math.isfinite(start_s) and start_s >= 0) or math.isnan(end_s) or not end_s > start_s:
        raise TraceError(f"--start {start_s!r} --end {end_s!r}: expected 0 <= start < end")
    t = frame["arrival_time_s"].to_numpy(float)
    keep = (t >= start_s) & (t < end_s)
    if not keep.any():
        raise TraceError(f"no request arrives in [{start_s:g}, {end_s:g}) s; the trace spans "
                         f"[{t.min():g}, {t.max():g}] s")
    out = frame.loc[keep].reset_index(drop=True).copy()
    out["arrival_time_s"] = out["arrival_time_s"] - start_s
    return out, {"slice_start_s": repr(float(start_s)), "slice_end_s": repr(float(end_s))}


def scale_trace(frame: pd.DataFrame, rate_scale: float) -> tuple[pd.DataFrame, dict[str, str]]:
    """The same requests arriving ``rate_scale`` times as fast: ``arrival_time_s / rate_scale``.

    Parameters
    ----------
    frame : pandas.DataFrame
        A ``request_trace/1`` frame.
    rate_scale : float
        > 1 compresses time (more load), < 1 stretches it.

    Returns
    -------
    frame : pandas.DataFrame
        Arrivals divided by ``rate_scale``; lengths unchanged. The measured latencies
        (``queue_wait_s``, ``ttft_s``, ``tpot_s``, ``e2e_s``, ``token_times_s``) are
        dropped: they were measured under the original load and would be compared against
        a different workload.
    metadata : dict
        ``rate_scale`` and the dropped columns.

    Raises
    ------
    TraceError
        ``rate_scale`` not a finite number > 0.
    """
    if not (math.isfinite(rate_scale) and rate_scale > 0):
        raise TraceError(f"--rate-scale {rate_scale!r}: expected a finite number > 0")
    problem = rescaled_arrival_problem(frame["arrival_time_s"], rate_scale)
    if problem:
        raise TraceError(f"--rate-scale {rate_scale!r}: {problem}")
    out = frame.copy()
    out["arrival_time_s"] = out["arrival_time_s"].to_numpy(np.float64) / rate_scale
    dropped = [c for c in _MEASURED if c in out]
    out = out.drop(columns=dropped)
    return out, {"rate_scale": repr(float(rate_scale)), "measured_columns_dropped": ", ".join(dropped)}


def rescaled_arrival_problem(arrival_s, rate_scale: float, per_factor: float = 1.0,
                             unit: str = "") -> str | None:
    """Why arrival times divided by ``rate_scale`` cannot be replayed, or None: the last one
    would reach :data:`schemas.validate.MAX_RELATIVE_TIME_S` (1e9 s), where float64 spacing
    swallows step durations (beyond it, an infinity: requests that never arrive). The least
    factor allowed is given times ``per_factor`` in ``unit`` (a rate: the trace's own rate, `` req/s``)."""
    from schemas.validate import MAX_RELATIVE_TIME_S

    t = np.abs(np.asarray(arrival_s, dtype=np.float64))
    last = float(t.max()) if t.size else 0.0
    with np.errstate(over="ignore", divide="ignore"):
        scaled = last / rate_scale
    if scaled < MAX_RELATIVE_TIME_S:
        return None
    to = f"{scaled:.3g} s" if math.isfinite(scaled) else "infinity"
    return (f"stretches the trace's last arrival, {last:.6g} s, to {to}, beyond {MAX_RELATIVE_TIME_S:.0e} s "
            f"(float64 times would swallow the step durations); expected more than "
            f"{last / MAX_RELATIVE_TIME_S * per_factor:.3g}{unit}")
