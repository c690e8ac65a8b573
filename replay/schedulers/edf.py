"""``edf``: earliest deadline first, deadlines from the requests' latency SLOs."""
from __future__ import annotations

import math

from ..core.request import Request
from .base import Batch, ReplicaState
from .chunked import ChunkedScheduler
from .keyed_queue import schedule_in_key_order


def next_token_deadline_s(req: Request) -> float:
    """Absolute time (seconds) by which ``req``'s next token is due under its SLOs.

    Before the first token: ``min(deadline_s, arrival + slo_ttft_s)``. After ``k`` tokens:
    ``first_token_time + k * slo_tpot_s`` (token ``k + 1`` meets the TPOT objective).
    ``inf`` when the request has no such objective.
    """
    if req.num_generated_tokens == 0:
        return min(req.deadline_s, req.arrival_time_s + req.slo_ttft_s)
    if math.isinf(req.slo_tpot_s):
        return math.inf
    return req.first_token_time_s + req.num_generated_tokens * req.slo_tpot_s


class EdfScheduler(ChunkedScheduler):
    """Earliest-deadline-first admission on top of decode-first chunked steps.

    Each step runs like ``chunked`` (running requests first, decode-first, preemption when
    blocks run out), but waiting requests are admitted by the deadline of their next token
    (:func:`next_token_deadline_s`): for a request not yet started, arrival + ``slo_ttft_s``;
    for a preempted one, its TPOT deadline. Ties and requests without SLOs (deadline
    ``inf``) go in arrival order, after every request with a deadline.

    Notes
    -----
    Liu & Layland, "Scheduling Algorithms for Multiprogramming in a Hard-Real-Time
    Environment", JACM 20(1), 1973 (EDF). The TTFT/TPOT objectives and goodput are those of
    Zhong et al., "DistServe", OSDI'24. SLOs come from the trace columns
    ``slo_ttft_s``/``slo_tpot_s`` or the replay options ``--slo-ttft-s``/``--slo-tpot-s``;
    ``Request.deadline_s``, when set, caps the first-token deadline. Under overload EDF can
    starve requests with late or no deadlines.
    """

    name = "edf"
    implicit_decoders = True
    #: A waiting request's deadline does not change while it waits, so the queue order, like
    #: ``chunked``'s, is fixed between arrivals and completions.
    decode_runs = True

    def schedule(self, now: float, state: ReplicaState) -> Batch:
        """``chunked``'s step with the waiting queue kept in deadline order (:class:`KeyedWaiting`:
        O(log n) per arrival and admission, the same order as :meth:`waiting_key`)."""
        return schedule_in_key_order(now, state, _deadline_key)

    def waiting_key(self, now: float):
        """Next-token deadline, then arrival (the order :meth:`schedule` admits in)."""
        return lambda req: (next_token_deadline_s(req), req.arrival_time_s, req.index)


def _deadline_key(req):
    return (next_token_deadline_s(req), req.arrival_time_s, req.index)
