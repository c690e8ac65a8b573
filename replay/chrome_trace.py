"""The simulated timeline as a Chrome / Perfetto trace (``replay --chrome-trace out.json``).

Open the file in https://ui.perfetto.dev or chrome://tracing. One process per replica:

* thread ``steps``: one slice per step (name ``prefill``, ``decode`` or ``mixed``), its batch
  aggregates and request ids as args, plus a counter track of the step's tokens;
* threads ``requests k``: one slice per request from arrival to completion, with children
  ``queued`` (arrival to first scheduled), ``prefill`` (to first token) and ``decode`` (to
  the last token); requests that overlap in time go to different lanes;
* a flow per request from its arrival to the step that first scheduled it and to the step
  that completed it.
"""
from __future__ import annotations

import heapq
import json

import pandas as pd

from schemas.tables import write_text_atomic

_US = 1e6  # trace-event timestamps are microseconds
_STEPS_TID = 0
_LANE_TID0 = 1


def _step_name(num_prefill_tokens: int, num_decode_seqs: int) -> str:
    if num_prefill_tokens and num_decode_seqs:
        return "mixed"
    return "prefill" if num_prefill_tokens else "decode"


def chrome_trace_events(engine, result: pd.DataFrame) -> dict:
    """The trace-event JSON object of a replay.

    Parameters
    ----------
    engine : replay.engine.Engine
        Run with ``record_steps`` and ``record_step_requests`` (``engine.steps``,
        ``engine.step_requests``).
    result : pandas.DataFrame
        The replay result (``arrival_time_s``, ``pred_*`` columns, seconds).

    Returns
    -------
    dict
        ``{"traceEvents": [...], "displayTimeUnit": "ms"}`` in the Trace Event Format
        (Google, "Trace Event Format", the document Chrome's tracing and Perfetto import):
        complete events ``X``, counters ``C``, flow events ``s``/``t``/``f`` and metadata
        ``M``; timestamps in microseconds.

    Raises
    ------
    ValueError
        If the engine did not record its steps' requests.
    """
    if len(engine.step_requests) != len(engine.steps):
        raise ValueError("the chrome trace needs an engine run with record_steps and record_step_requests")
    events: list[dict] = []
    for rid in range(len(engine.replicas)):
        events.append({"ph": "M", "name": "process_name", "pid": rid, "tid": 0, "args": {"name": f"replica {rid}"}})
        events.append({"ph": "M", "name": "thread_name", "pid": rid, "tid": _STEPS_TID, "args": {"name": "steps"}})

    # steps; remember the first and the last step of every request (exact, from the recorded ids)
    first_step: dict[str, int] = {}
    last_step: dict[str, int] = {}
    for k, ((rid, start, dur, pf_tok, pf_seqs, dec_seqs, dec_ctx, pf_ctx), ids) in enumerate(
            zip(engine.steps, engine.step_requests)):
        for rq in ids:
            first_step.setdefault(rq, k)
            last_step[rq] = k
        events.append({"ph": "X", "name": _step_name(pf_tok, dec_seqs), "cat": "step", "pid": rid, "tid": _STEPS_TID,
                       "ts": start * _US, "dur": dur * _US,
                       "args": {"step": k, "num_prefill_tokens": pf_tok, "num_prefill_seqs": pf_seqs,
                                "num_decode_seqs": dec_seqs, "decode_context_tokens": dec_ctx,
                                "prefill_context_tokens": pf_ctx, "requests": ids}})
        events.append({"ph": "C", "name": "tokens", "pid": rid, "ts": start * _US,
                       "args": {"prefill_tokens": pf_tok, "decode_seqs": dec_seqs}})

    # requests on lanes (interval partitioning: a lane is reused once its last request ended)
    busy: dict[int, list] = {}  # replica -> heap of (end time, lane)
    idle: dict[int, list] = {}  # replica -> heap of free lanes
    num_lanes: dict[int, int] = {}
    for row in result.sort_values("arrival_time_s", kind="stable").itertuples(index=False):
        if row.pred_status != "ok":
            continue
        rq, rid, arrival = str(row.request_id), int(row.pred_replica_id), float(row.arrival_time_s)
        sched, first, done = (arrival + float(row.pred_queue_wait_s), arrival + float(row.pred_ttft_s),
                              arrival + float(row.pred_e2e_s))
        b, free = busy.setdefault(rid, []), idle.setdefault(rid, [])
        while b and b[0][0] < arrival:
            heapq.heappush(free, heapq.heappop(b)[1])
        if free:
            lane = heapq.heappop(free)
        else:
            lane = num_lanes.get(rid, 0)
            num_lanes[rid] = lane + 1
            events.append({"ph": "M", "name": "thread_name", "pid": rid, "tid": _LANE_TID0 + lane,
                           "args": {"name": f"requests {lane}"}})
        heapq.heappush(b, (done, lane))
        tid = _LANE_TID0 + lane
        args = {"num_prompt_tokens": int(row.num_prompt_tokens), "num_output_tokens": int(row.num_output_tokens),
                "ttft_s": float(row.pred_ttft_s), "e2e_s": float(row.pred_e2e_s),
                "num_preemptions": int(row.pred_num_preemptions)}
        events.append({"ph": "X", "name": rq, "cat": "request", "pid": rid, "tid": tid, "ts": arrival * _US,
                       "dur": (done - arrival) * _US, "args": args})
        for name, a, b in (("queued", arrival, sched), ("prefill", sched, first), ("decode", first, done)):
            if b > a:
                events.append({"ph": "X", "name": name, "cat": "request", "pid": rid, "tid": tid, "ts": a * _US,
                               "dur": (b - a) * _US})
        k0, k1 = first_step.get(rq), last_step.get(rq)
        if k0 is None:
            continue
        flow = {"name": rq, "cat": "request", "id": f"{rid}:{rq}", "pid": rid}
        events.append({**flow, "ph": "s", "tid": tid, "ts": arrival * _US})
        # bind to the middle of a step: its start is also the previous step's end
        mid = [(engine.steps[k][1] + engine.steps[k][2] / 2) * _US for k in (k0, k1)]
        if k1 != k0:
            events.append({**flow, "ph": "t", "tid": _STEPS_TID, "ts": mid[0]})
        events.append({**flow, "ph": "f", "bp": "e", "tid": _STEPS_TID, "ts": mid[1]})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"source": "servecal replay (simulated)"}}


def write_chrome_trace(path, engine, result: pd.DataFrame) -> None:
    """Write :func:`chrome_trace_events` as JSON to ``path`` atomically."""
    write_text_atomic(json.dumps(chrome_trace_events(engine, result), separators=(",", ":")), path)
