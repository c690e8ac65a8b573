"""Flow balance over a window of scrapes: the requests that arrived in each scrape interval and
the requests the server held (running or waiting) at each scrape.

vLLM and SGLang count no arrivals. Their gauges ``num_requests_running`` and
``num_requests_waiting`` (SGLang ``num_running_reqs``, ``num_queue_reqs``) are the requests held
at a scrape, and the histograms' ``_count`` grows by the requests finished in an interval, so
the requests that arrived in the interval between scrapes k-1 and k are (conservation of
requests: what came in is what went out plus what the server holds more)::

    arrived_k = finished_k + held_k - held_{k-1},   held = running + waiting

(at least 0: a gauge sampled a moment off can make it negative).
"""
from __future__ import annotations

__all__ = ["flow_balance"]


def flow_balance(n: float, finished: list[float], times: list[float], gauges: dict) -> tuple[float, float, list | None,
                                                                                               list | None]:
    """The arrivals of a window of scrapes, and the requests held at each scrape.

    Parameters
    ----------
    n : float
        Requests finished over the window (the E2E histogram's ``_count`` increase).
    finished : list of K floats
        Requests finished in each of the window's K scrape intervals.
    times : list of K + 1 floats
        The scrapes' unix times (seconds), in order.
    gauges : dict
        Gauge kind (``running``, ``waiting``, ...) -> its value at each scrape (K + 1 floats,
        requests) where every scrape has it.

    Returns
    -------
    arrived : float
        Requests that arrived over the window (the sum of the counts; ``n`` without counts).
    rate : float
        Their rate, requests per second of the intervals in which some arrived (a burst and its
        drain in one window read as the burst's rate); without counts ``n`` over the window.
    counts : list of ``[start_s, end_s, requests]`` or None
        Per interval, seconds from the window's first scrape (module docstring); None without
        both gauges at every scrape or with no arrival at all.
    held : list of ``[time_s, running, waiting]`` or None
        Per scrape, seconds from the window's first scrape, requests; None when ``counts`` is.
    """
    running, waiting = gauges.get("running", []), gauges.get("waiting", [])
    if len(running) != len(times) or len(waiting) != len(times):
        return n, n / (times[-1] - times[0]), None, None
    total = [r + w for r, w in zip(running, waiting)]
    per = [max(f + b - a, 0.0) for f, a, b in zip(finished, total, total[1:])]
    if sum(per) <= 0:
        return n, n / (times[-1] - times[0]), None, None
    active = sum(t1 - t0 for t0, t1, x in zip(times, times[1:], per) if x > 0)
    counts = [[t0 - times[0], t1 - times[0], x] for t0, t1, x in zip(times, times[1:], per)]
    held = [[t - times[0], r, w] for t, r, w in zip(times, running, waiting)]
    return sum(per), sum(per) / active, counts, held
