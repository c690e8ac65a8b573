"""Closed-loop replay (``replay --concurrency N``): N clients, each sending its next request
when its previous one completes.

Benchmark clients often hold a fixed number of requests in flight instead of following
arrival times: LLMPerf (``--num-concurrent-requests``), GenAI-Perf (``--concurrency``) and
``vllm bench serve --max-concurrency``. Their traces carry no meaningful arrival times, so
the replay simulates the send times too. The engine is driven through its hooks
(:attr:`~replay.core.engine.Engine.on_request_done`, :meth:`~replay.core.engine.Engine.call_at`,
:meth:`~replay.core.engine.Engine.arrive`, :attr:`~replay.core.engine.Engine.arrival_bound`); batching,
KV accounting and token bookkeeping stay the engine's.
"""
from __future__ import annotations

from functools import partial

import numpy as np
import pandas as pd

from schemas.status import OK

from .engine import Engine
from ..config import ClosedLoopOptions
from .request import Request


class ClosedLoop:
    """``concurrency`` clients sending ``requests`` in trace order through ``engine``.

    Parameters
    ----------
    engine : Engine
        A fresh engine (or :class:`~replay.core.disagg.DisaggEngine`); its ``on_request_done`` and
        ``arrival_bound`` hooks are taken over.
    requests : list[Request]
        In trace order (their ``arrival_time_s`` is ignored and overwritten with the send time).
    concurrency : int
        Number of clients, >= 1.
    think_time_s : float
        Pause between a completion and the client's next send, seconds (default 0).
    frontend_s : ndarray of float64, shape (num trace rows,), or None
        Time from a client's send to the engine (the API server: tokenising, queueing before
        the engine), seconds, per trace row (``Request.index``); None: none
        (:func:`replay.simulate.frontend_delays`).
    stream_per_token_s : float
        Time to stream each output token after the first to the client, seconds (default 0).
    start_spread_s : float
        The clients' first sends are spread evenly over this many seconds, client ``i`` of
        ``m = min(concurrency, n)`` at ``i * start_spread_s / m`` (default 0: all at time 0).
        A workload of identical requests sent at once keeps its clients in lock step forever
        (they complete in the same step and send again together); real clients are staggered
        by the server's own variation, which a spread of their starts stands in for
        (:mod:`calibrate.aggregate_runs`).

    Attributes
    ----------
    min_step_s : float
        The shortest step any replica can take (one token, no context), seconds; it bounds
        how soon another replica can complete a request (see Notes).
    sent_at_s : dict[int, float]
        Each sent request's send time by ``Request.index``, seconds.

    Notes
    -----
    The first ``min(concurrency, n)`` requests are sent at time 0 (or spread over
    ``start_spread_s``). A request sent at ``s``
    reaches the engine at ``s + frontend_s`` (its ``arrival_time_s``, as in the open loop,
    where the trace's arrival is the send). Whenever a request emits its last token at
    ``t``, its client has it at ``t + stream_per_token_s * (num_output_tokens - 1)`` and
    sends the next request of the trace after ``think_time_s`` more; a request that is
    rejected (too long for the model or the KV cache) completes when it reaches the engine.
    So request ``k`` is sent when the earliest client becomes free, as in
    :func:`traces.importers.llmperf.closed_loop_arrivals`, and every front-end term of the
    open loop is kept (:func:`replay.core.result_columns.result_frame` adds them to the latencies).

    A send at ``t`` reaches the engine after every step ending at ``t`` has been processed
    (a client only sees the last token once the step that emitted it has ended), so the new
    request waits for the next step boundary of its replica, or starts at ``t`` on an idle one:
    with one client, requests run back to back with no queue wait. The order of equal-time
    step ends on different replicas does not matter, which keeps the result independent of
    closed-form decode runs (``--exact-steps``). A run must not pass a send to its replica,
    so it stops at :meth:`Engine.completion_bound_s`, the earliest time another replica could
    complete a request: its pending step end if that emits a last token, else that time plus
    :attr:`min_step_s` per output token its requests still owe (the bound assumes, like the
    runs themselves, that a step never takes less than a one-token step without context).
    The bound ignores the think time and the front end, which only make it earlier (runs
    shorter, still exact); a request on its way to the engine is a pending callback, a bound.

    Latencies stay relative to each request's own send time (``Request.arrival_time_s``);
    throughput over a long run satisfies Little's law, ``throughput * mean E2E = concurrency``
    (with zero think time).
    """

    def __init__(self, engine: Engine, requests: list[Request], concurrency: int, think_time_s: float = 0.0,
                 frontend_s: np.ndarray | None = None, stream_per_token_s: float = 0.0, start_spread_s: float = 0.0):
        ClosedLoopOptions(concurrency, think_time_s)  # raises for impossible values
        assert engine.on_request_done is None and engine.arrival_bound is None, "engine hooks already taken"
        self.engine, self.requests = engine, requests
        self.concurrency, self.think_time_s = int(concurrency), float(think_time_s)
        self.frontend_s, self.stream_per_token_s = frontend_s, float(stream_per_token_s)
        self.start_spread_s = float(start_spread_s)
        self.sent_at_s: dict[int, float] = {}
        self._next = 0        # index in requests of the next request to send
        self._scheduled = 0   # sends scheduled, not yet made
        #: The shortest step any replica can take, seconds: one token, no context.
        self.min_step_s = max(0.0, min(min(cm.step_time_s(1, 0, 0, 0), cm.step_time_s(0, 1, 0, 0))
                                       for cm in engine.cost_models))

    def run(self) -> list[Request]:
        """Simulate until every request has completed or been rejected; return ``requests``, updated."""
        eng = self.engine
        eng.on_request_done = self._client_free
        eng.arrival_bound = partial(eng.completion_bound_s, self.min_step_s)
        first = min(self.concurrency, len(self.requests))
        for i in range(first):
            self._schedule_send(i * self.start_spread_s / first)
        eng.run([])
        return self.requests

    def _schedule_send(self, time: float) -> None:
        if self._next + self._scheduled < len(self.requests):  # a useless send would only cut decode runs short
            self._scheduled += 1
            self.engine.call_at(time, self._send, after_step_ends=True)

    def _client_free(self, req: Request, now: float) -> None:
        """``req`` emitted its last token (or was rejected) at ``now``: its client sends the next
        request once it has streamed every token and thought."""
        stream = self.stream_per_token_s * max(req.num_output_tokens - 1, 0) if req.status == OK else 0.0
        self._schedule_send(now + stream + self.think_time_s)

    def _send(self, now: float) -> None:
        self._scheduled -= 1
        req = self.requests[self._next]
        self._next += 1
        self.sent_at_s[req.index] = now
        delay = 0.0 if self.frontend_s is None else float(self.frontend_s[req.index])
        req.arrival_time_s = now + delay
        if delay > 0:
            self.engine.call_at(req.arrival_time_s, partial(self._arrive, req), after_step_ends=True)
        else:
            self._arrive(req, now)

    def _arrive(self, req: Request, now: float) -> None:
        if self.engine.admit(req):
            self.engine.arrive(req, now)
        else:
            self._client_free(req, now)  # rejected: completed when it reached the engine


def send_times_column(num_rows: int, sent_at_s: dict[int, float]) -> np.ndarray:
    """The ``pred_arrival_time_s`` column of a closed-loop replay result.

    Parameters
    ----------
    sent_at_s : dict
        Send time by trace row, seconds (:attr:`ClosedLoop.sent_at_s`).

    Returns
    -------
    ndarray of float64, shape (num_rows,)
        Simulated send time of each trace row (the client's, before any front-end time),
        seconds since the first send; NaN for rows that were not simulated (failed in the trace).
    """
    out = np.full(num_rows, np.nan)
    for index, t in sent_at_s.items():
        out[index] = t
    return out


def on_send_times(result: pd.DataFrame) -> pd.DataFrame:
    """A replay result whose ``arrival_time_s`` is the simulated send time, when there is one.

    Rates computed over the predicted timeline (goodput, throughput:
    :func:`replay.analysis.metrics.goodput_rps`) need the predicted arrivals; a closed-loop result
    holds them in ``pred_arrival_time_s``. An open-loop result is returned as it is.
    """
    if "pred_arrival_time_s" not in result:
        return result
    # rows never sent (failed in the trace) have no send time; the first send is at 0
    return result.assign(arrival_time_s=result["pred_arrival_time_s"].fillna(0.0))
