"""A window of Prometheus scrapes as its histograms observe it: every arrival up to the window's
end replayed, only the requests finished inside it matched.

A server's latency histograms observe a request when it is done with it: vLLM v1 observes
TTFT when the first token is out and E2E, per-request TPOT and the prompt and output lengths
when the request finishes (``vllm/v1/metrics/loggers.py``; SGLang likewise). A window's
increases are then the statistics of the requests that *finished* inside it, not of those that
arrived: in a burst, the first scrapes hold its earliest finishers (bench/PROMETHEUS.md: the
first 30 s of scrapes of a 300-request burst hold 78 requests; replayed alone from an idle
server, they inflated every fitted cost by 39 to 103 %).

So a window with its arrivals counted per scrape interval (``arrival_counts``) and the requests
held at each scrape (``requests_held``, ``[time_s, running, waiting]``; both written by
``traces import prometheus``, :mod:`traces.importers.prometheus_flow`) is replayed on

* the requests held at its first scrape (arrived before the window; what the server had done
  for them is not known: they are replayed from an idle server, all arriving at the workload's
  time 0) and every request counted as arriving inside it (:func:`replayed_requests`), at most
  :data:`traces.aggregate_workload.MAX_REQUESTS`;
* lengths drawn for all of them from the window's length histograms, which count only the
  finished requests: the requests still running or waiting at the window's end (the gauges
  at its last scrape) are *assumed* to have the same (maximum-entropy) length distribution as
  those that finished. In a burst this is biased: the earliest finishers are the shorter
  requests, so the unfinished ones are taken shorter than they are;

and only the requests the replay observes by the window's end (:func:`observed`: first token
out for TTFT, finished for TPOT and E2E) are matched, a set that moves with the cost model's
parameters, as the histograms' does with the server's speed. The window's end on the
synthesized workload's clock (:func:`observed_until_s`) is the replay's metadata
:data:`OBSERVED_UNTIL`. A window at whose last scrape the server held no request (a run
drained inside it) observed every request it saw: all of them are matched, as for a level
without the gauges, and a slow candidate's requests that finish after the window's end are
not dropped from the match.
"""
from __future__ import annotations

import json

import numpy as np

from schemas.text import wrap_error

from .errors import TraceError

__all__ = ["OBSERVED_UNTIL", "arrival_counts", "observed", "observed_until", "observed_until_s", "origin_s",
           "replayed_requests", "requests_held", "whole_counts"]

#: Metadata key of a level's replay: the window's end, seconds on its synthesized workload's clock.
OBSERVED_UNTIL = "histograms_observe_until_s"


def _level_entry(meta: dict, key: str, path, level: int, row_ok, in_order, expected: str) -> list | None:
    """Level ``level``'s list of rows of the metadata ``key`` (JSON, level number -> non-empty list
    of rows of three numbers), each row passing ``row_ok`` and each two consecutive ones
    ``in_order``; None when the file or the level has none. Raises TraceError naming the file,
    key and level, with ``expected``."""
    text = meta.get(key)
    if not text:
        return None
    try:
        rows = json.loads(text).get(str(level))
    except (ValueError, AttributeError):
        rows = "?"
    if rows is None:
        return None
    ok = isinstance(rows, list) and rows and all(
        isinstance(r, list) and len(r) == 3 and all(isinstance(x, (int, float)) and np.isfinite(x) for x in r)
        and row_ok(r) for r in rows)
    if not ok or not all(in_order(a, b) for a, b in zip(rows, rows[1:])):
        raise TraceError(wrap_error(f"{path}: metadata {key}, level {level}: expected JSON {expected}"))
    return rows


def arrival_counts(meta: dict, path, level: int) -> list | None:
    """The arrivals of level ``level`` counted over intervals, as a file's metadata states them
    (``arrival_counts``: JSON, level number -> list of ``[start_s, end_s, requests]``, seconds
    from the level's start, intervals in time order; ``traces import prometheus`` writes it):
    that list, or None when the file or the level has none.

    Raises
    ------
    TraceError
        Naming the file and the key: not JSON, or a level's entry not a non-empty list of three
        numbers each (start < end, requests >= 0, intervals in order).
    """
    return _level_entry(meta, "arrival_counts", path, level, lambda c: c[0] < c[1] and c[2] >= 0,
                        lambda a, b: a[1] <= b[0] + 1e-9,
                        '{"<level>": [[start_s, end_s, requests], ...]} with start < end, requests >= 0 '
                        "and the intervals in time order")


def requests_held(meta: dict, path, level: int) -> list | None:
    """The requests level ``level``'s server held at each scrape, as a file's metadata states them
    (``requests_held``: JSON, level number -> list of ``[time_s, running, waiting]``, seconds
    from the level's start, requests; ``traces import prometheus`` writes it): that list, or
    None when the file or the level has none.

    Raises
    ------
    TraceError
        Naming the file and the key: not JSON, or a level's entry not a non-empty list of three
        numbers each (running, waiting >= 0; times in order).
    """
    return _level_entry(meta, "requests_held", path, level, lambda h: h[1] >= 0 and h[2] >= 0,
                        lambda a, b: a[0] < b[0],
                        '{"<level>": [[time_s, running, waiting], ...]} with running, waiting >= 0 and the '
                        "scrapes in time order")


def whole_counts(counts: list) -> np.ndarray:
    """The counts rounded to whole requests keeping their running total (int array, one per interval)."""
    req = np.asarray([c[2] for c in counts], float)
    return np.diff(np.rint(np.concatenate([[0.0], np.cumsum(req)]))).astype(np.int64)


def origin_s(counts: list) -> float:
    """Time 0 of a window's synthesized workload: the start of its first interval with a (rounded)
    arrival, seconds from the window's start."""
    return float(counts[int(np.argmax(whole_counts(counts) > 0))][0])


def replayed_requests(counts: list, held: list) -> int:
    """The requests a window's replay holds (module docstring): those held at its first scrape
    (running + waiting, rounded) and those counted as arriving inside it (rounded as
    :func:`_whole` rounds them)."""
    return int(np.rint(held[0][1] + held[0][2])) + int(whole_counts(counts).sum())


def observed_until_s(counts: list, held: list, arrival_s: np.ndarray, all_replayed: bool) -> float | None:
    """The window's end on its synthesized workload's clock (seconds after :func:`origin_s`): its
    last interval's end; when the workload holds only the first of the arrivals
    (``all_replayed`` False: more than ``MAX_REQUESTS``), the last replayed arrival's time
    instead (the later ones, not replayed, would have loaded the server until the end). None
    when the server held no request at the window's last scrape (``held[-1]``: running +
    waiting below 1/2): then every replayed request finished inside the window and the
    histograms counted them all, whenever the replay finishes them."""
    if held[-1][1] + held[-1][2] < 0.5:
        return None
    end = float(counts[-1][1]) - origin_s(counts)
    return end if all_replayed else min(end, float(np.max(arrival_s)))


def observed_until(meta: dict) -> float | None:
    """The :data:`OBSERVED_UNTIL` of a replay's metadata (seconds), None where it has none."""
    text = (meta or {}).get(OBSERVED_UNTIL)
    return None if text is None else float(text)


def observed(arrival_s, columns, metric: str, until_s: float) -> np.ndarray:
    """Which replayed requests a window's histogram of ``metric`` counted: those whose first token
    (``ttft_s``) or end (any other metric: TPOT, E2E) the replay puts at or before ``until_s``.

    Parameters
    ----------
    arrival_s : array of N floats, the requests' arrival times (seconds, the workload's clock).
    columns : mapping with ``pred_ttft_s`` and ``pred_e2e_s`` (N floats each, seconds; NaN for a
        request not completed): a replay's result or its columns.
    metric : str, ``ttft_s``, ``tpot_s``, ``e2e_s``, ...
    until_s : float, the window's end (:func:`observed_until_s`).

    Returns
    -------
    numpy bool array of N.
    """
    done_s = np.asarray(columns["pred_ttft_s" if metric == "ttft_s" else "pred_e2e_s"], float)
    with np.errstate(invalid="ignore"):
        return np.asarray(arrival_s, float) + done_s <= until_s
