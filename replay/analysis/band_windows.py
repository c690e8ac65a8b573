"""A long trace's band from windows of it: the confidence set's points replayed on a few slices of the
trace instead of the whole of it (issue #30: a band for under 2x one replay).

The parameters' part of a band (:func:`replay.analysis.bands.band_of_rows`) is the ratio by which a
point of the confidence set moves each statistic from the calibration's values. A ratio needs far
fewer requests than the statistic it scales: above :data:`WINDOWED_ABOVE` requests, each band point
and the calibration's values are replayed on :data:`NUM_WINDOWS` evenly spaced windows of the trace
(:func:`windows`), each scored after a warm-up that fills its queue and KV cache, the windows'
scored requests pooled, and the full replay's statistic multiplied by the pooled ratio
(:func:`scaled_rows`). A statistic is then ``s_full * s_window(point) / s_window(optimum)``; on a
stationary trace the ratio is the full replays' to within the windows' sampling noise (checked in
``tests/replay/test_band_windows.py``), on a trace whose load drifts it is the windows' average load's.
A closed loop is replayed whole (its sends depend on every earlier completion).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

#: Above this many requests a band's points are replayed on windows of the trace.
WINDOWED_ABOVE = 40_000
#: Windows per band replay, and requests scored in each.
NUM_WINDOWS = 4
WINDOW_REQUESTS = 4_000
#: Requests replayed before each window's scored ones and not scored (the queue and KV cache fill).
WARM_UP_REQUESTS = 2_000


def windowed(frame: pd.DataFrame, cfg) -> bool:
    """Whether the band of replaying ``frame`` under ``cfg`` takes windows: an open loop of more than
    :data:`WINDOWED_ABOVE` requests."""
    return len(frame) > WINDOWED_ABOVE and cfg.closed_loop.concurrency is None


def windows(num_requests: int) -> list[tuple[int, int, int]]:
    """Row positions ``(warm-up start, scored start, end)`` of :data:`NUM_WINDOWS` windows spread
    evenly over a trace of ``num_requests`` rows in arrival order (the first window starts at row 0
    with no warm-up; each later one scores :data:`WINDOW_REQUESTS` rows after
    :data:`WARM_UP_REQUESTS`)."""
    span = WARM_UP_REQUESTS + WINDOW_REQUESTS
    starts = np.linspace(0, num_requests - span, NUM_WINDOWS).astype(int)
    return [(int(s), int(s) + (WARM_UP_REQUESTS if s else 0), int(s) + span) for s in starts]


def window_frames(frame: pd.DataFrame) -> list[tuple[pd.DataFrame, int]]:
    """The windows of ``frame`` (sorted by arrival time): each slice with the number of its leading
    warm-up rows."""
    ordered = frame.sort_values("arrival_time_s", kind="stable")
    return [(ordered.iloc[w0:end], s0 - w0) for w0, s0, end in windows(len(ordered))]


def pooled(results: list[tuple[pd.DataFrame, int]]) -> pd.DataFrame:
    """The scored rows of each window's replay result, concatenated (``results``: result, warm-up rows)."""
    return pd.concat([res.iloc[warm:] for res, warm in results], ignore_index=True)


def scaled_rows(point: dict, optimum: dict, rows: list[dict], stats) -> list[dict]:
    """The full trace's prediction rows at the band points: for each statistic of ``stats``,
    ``point[s] * row[s] / optimum[s]`` (``point`` the full replay at the calibration's values,
    ``optimum`` the windows' at them, ``rows`` the windows' at each band point); NaN where the
    windows' value at the optimum is 0 or not finite."""
    out = []
    for row in rows:
        scaled = {}
        for s in stats:
            o, v = optimum.get(s, np.nan), row.get(s, np.nan)
            scaled[s] = point.get(s, np.nan) * v / o if np.isfinite(o) and o != 0 and np.isfinite(v) else np.nan
        out.append(scaled)
    return out


def _window_result(item) -> tuple[pd.DataFrame, int]:
    """One band replay of one window (``item``: frame, warm-up rows, metadata, cost model, cfg): its
    result and warm-up rows (module level: picklable for worker processes)."""
    from ..simulate import replay_frame

    frame, warm, metadata, cost_model, cfg = item
    return replay_frame(frame, cost_model, cfg, metadata)[0], warm


def windowed_rows(frame: pd.DataFrame, metadata: dict, replays: list, point: dict, row_of, stats,
                  mapper=None) -> list[dict]:
    """The full trace's prediction rows at each of ``replays`` but the first (``(kind, cost model, cfg)``,
    the first at the calibration's values), from their replays on the windows of ``frame``
    (:func:`window_frames`): :func:`scaled_rows` of ``point`` (the full replay's row at the
    calibration's values) by the pooled windows' ``row_of(result)`` (a prediction row); ``mapper``
    as :func:`replay.analysis.bands.predict_with_band`'s."""
    parts = window_frames(frame)
    items = [(w, warm, metadata, cm, cfg) for _, cm, cfg in replays for w, warm in parts]
    results = mapper(_window_result, items) if mapper is not None else [_window_result(i) for i in items]
    k = len(parts)
    rows = [row_of(pooled(results[j * k:(j + 1) * k])) for j in range(len(replays))]
    return scaled_rows(point, rows[0], rows[1:], stats)
