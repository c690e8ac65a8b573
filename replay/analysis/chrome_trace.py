"""The simulated timeline as a Chrome / Perfetto trace (``replay --chrome-trace out.json``).

Open the file in https://ui.perfetto.dev or chrome://tracing. One process per replica
(``replica 0``, ...; with ``--scheduler disagg`` ``prefill 0``, ..., ``decode P``, ... named by
their replica ids, as in the step trace):

* thread ``steps``: one slice per step (name ``prefill``, ``decode`` or ``mixed``), its batch
  aggregates and request ids as args, plus a counter track of the step's tokens;
* threads ``requests k``: one slice per request from arrival to completion, with children
  ``queued`` (arrival to first scheduled), ``prefill`` (to first token) and ``decode`` (to
  the last token); requests that overlap in time go to different lanes. Disaggregated, a
  request's prefill-side slice (``queued``, ``prefill``, ``kv transfer``) lies on its prefill
  process and its decode-side slice (``decode queue``, ``decode``) on its decode process;
* a flow per request from its arrival to the step that first scheduled it and to the step
  that completed it.

A trace can be large (a million requests make gigabytes of JSON), so it is written as a
stream, event by event, never held whole in memory; ``.json.gz`` is written gzipped.
``window=(start, end)`` keeps the steps and requests of a span of simulated time, and
``max_requests`` keeps the first requests of the window (by arrival), ending the window at
the arrival of the first one left out (:data:`DEFAULT_MAX_REQUESTS` by default).
"""
from __future__ import annotations

import gzip
import heapq
import json
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from schemas.atomic import atomic_output
from schemas.metrics import step_kind
from schemas.status import OK
from schemas.step_record import FIELD_INDEX, KEPT_NAMES, STEP_WHERE_WHEN

from ..errors import ConfigError

_US = 1e6  # trace-event timestamps are microseconds
_STEPS_TID = 0
_LANE_TID0 = 1

#: Requests written by default (``--chrome-trace-max-requests``): about 70 MB of JSON.
DEFAULT_MAX_REQUESTS = 20_000
#: Events per write (the stream's chunk).
_CHUNK = 4096


@dataclass
class ChromeTraceSummary:
    """What :func:`write_chrome_trace` wrote.

    Attributes
    ----------
    num_requests : int
        Requests written.
    num_in_window : int
        Completed requests in the window (before the cap).
    num_steps : int
        Steps written.
    start_s, end_s : float
        The span written, simulated seconds (``end_s`` is where the cap cut the window).
    """

    num_requests: int
    num_in_window: int
    num_steps: int
    start_s: float
    end_s: float

    @property
    def cut(self) -> int:
        """Requests of the window left out by the cap."""
        return self.num_in_window - self.num_requests


def parse_window(text: str | None) -> tuple[float, float] | None:
    """``"START:END"`` (seconds; either may be empty) -> ``(start, end)``; None for None.

    Raises
    ------
    ConfigError
        Not ``START:END``, a value that is not a number, or ``END <= START``.
    """
    if text is None:
        return None
    lo, sep, hi = text.partition(":")
    try:
        if not sep:
            raise ValueError
        start = float(lo) if lo.strip() else -math.inf
        end = float(hi) if hi.strip() else math.inf
    except ValueError:
        raise ConfigError(f"--chrome-trace-window {text}: expected START:END in seconds of simulated time, "
                          "e.g. 100:160 (either side may be empty: 100: or :60)") from None
    if math.isnan(start) or math.isnan(end) or not end > start:
        raise ConfigError(f"--chrome-trace-window {text}: END must be greater than START")
    return start, end


def _process_names(engine) -> list[str]:
    if hasattr(engine, "process_names"):  # a pipelined engine: replicas, not their virtual engines
        return engine.process_names()
    p = getattr(engine, "num_prefill_replicas", None)
    n = len(engine.replicas)
    if p is None:
        return [f"replica {i}" for i in range(n)]
    return [f"prefill {i}" if i < p else f"decode {i}" for i in range(n)]


class _Lanes:
    """Interval partitioning of one process's request slices into lanes (threads)."""

    def __init__(self):
        self.busy: dict[int, list] = {}   # pid -> heap of (end time, lane)
        self.idle: dict[int, list] = {}   # pid -> heap of free lanes
        self.count: dict[int, int] = {}

    def take(self, pid: int, start: float, end: float, out: list) -> int:
        """A lane free at ``start`` (new lanes are named in ``out``); busy until ``end``."""
        b, free = self.busy.setdefault(pid, []), self.idle.setdefault(pid, [])
        while b and b[0][0] < start:
            heapq.heappush(free, heapq.heappop(b)[1])
        if free:
            lane = heapq.heappop(free)
        else:
            lane = self.count.get(pid, 0)
            self.count[pid] = lane + 1
            out.append(f'{{"ph":"M","name":"thread_name","pid":{pid},"tid":{_LANE_TID0 + lane},'
                       f'"args":{{"name":"requests {lane}"}}}}')
        heapq.heappush(b, (end, lane))
        return _LANE_TID0 + lane


def _x(name_json: str, cat: str, pid: int, tid: int, a: float, b: float, args: str = "") -> str:
    """A complete event (``X``) from ``a`` to ``b`` seconds; ``name_json`` already JSON."""
    extra = f',"args":{args}' if args else ""
    return (f'{{"ph":"X","name":{name_json},"cat":"{cat}","pid":{pid},"tid":{tid},"ts":{a * _US:.3f},'
            f'"dur":{(b - a) * _US:.3f}{extra}}}')


def iter_chrome_trace(engine, result: pd.DataFrame, window: tuple[float, float] | None = None,
                      max_requests: int | None = DEFAULT_MAX_REQUESTS, summary: dict | None = None,
                      progress=None):
    """The trace's events, one JSON object (text) at a time.

    Parameters
    ----------
    engine : replay.core.engine.Engine
        Run with ``record_steps`` and ``record_step_requests`` (``engine.steps``,
        ``engine.step_requests``); a :class:`~replay.core.disagg.DisaggEngine` adds its
        prefill/decode processes and KV transfers.
    result : pandas.DataFrame
        The replay result (``arrival_time_s``, ``pred_*`` columns, seconds), one row per
        trace row in the engine's order.
    window : (float, float), optional
        Simulated seconds ``(start, end)``: steps and requests that overlap it.
    max_requests : int or None
        Keep the first ``max_requests`` completed requests of the window by arrival and end
        the window at the arrival of the next one (None or 0: all).
    summary : dict, optional
        Filled with the fields of :class:`ChromeTraceSummary`.
    progress : replay.progress.Progress, optional
        Advanced by the steps and requests written.

    Yields
    ------
    str
        One trace event (Trace Event Format, timestamps in microseconds) per item.

    Raises
    ------
    ValueError
        If the engine did not record its steps' requests.
    """
    if len(engine.step_requests) != len(engine.steps):
        raise ValueError("the chrome trace needs an engine run with record_steps and record_step_requests")
    start, end = window if window is not None else (-math.inf, math.inf)
    rows, num_in_window, end = _requests_in_window(result, start, end, max_requests)
    for pid, name in enumerate(_process_names(engine)):
        yield f'{{"ph":"M","name":"process_name","pid":{pid},"tid":0,"args":{{"name":"{name}"}}}}'
        yield f'{{"ph":"M","name":"process_sort_index","pid":{pid},"tid":0,"args":{{"sort_index":{pid}}}}}'
        yield f'{{"ph":"M","name":"thread_name","pid":{pid},"tid":{_STEPS_TID},"args":{{"name":"steps"}}}}'
    steps, step_ids = engine.steps, engine.step_requests
    written = [k for k, (_, s, dur, *_) in enumerate(steps) if s <= end and s + dur >= start]
    yield from _step_events(steps, step_ids, written, progress)
    yield from _request_events(engine, result, rows, written, progress)
    if summary is not None:
        summary.update(num_requests=int(rows.size), num_in_window=num_in_window, num_steps=len(written),
                       start_s=float(start), end_s=float(end))


def _requests_in_window(result: pd.DataFrame, start: float, end: float,
                        max_requests: int | None) -> tuple[np.ndarray, int, float]:
    """The rows of the completed requests whose lifetime overlaps ``[start, end]`` (seconds), by
    arrival and cut to the first ``max_requests``; the count before the cut; the window's end
    (the arrival of the first request cut, else ``end``)."""
    ok = (result["pred_status"] == OK).to_numpy(bool)
    arrival = result["arrival_time_s"].to_numpy(float)
    done = arrival + result["pred_e2e_s"].to_numpy(float)
    rows = np.flatnonzero(ok & (arrival <= end) & (done >= start))
    rows = rows[np.argsort(arrival[rows], kind="stable")]
    num_in_window = int(rows.size)
    if max_requests and rows.size > max_requests:
        end = float(arrival[rows[max_requests]])  # the window ends where the first request left out arrives
        rows = rows[:max_requests]
    return rows, num_in_window, end


def _step_events(steps: list, step_ids: list, written: list[int], progress):
    """A slice on the ``steps`` thread and a ``tokens`` counter per written step (indices ``written``)."""
    dumps = json.dumps
    pf_at, dec_at = FIELD_INDEX["num_prefill_tokens"], FIELD_INDEX["num_decode_seqs"]
    kinds = step_kind([steps[k][pf_at] for k in written], [steps[k][dec_at] for k in written]).tolist()
    features = ",".join(f'"{name}":{{}}' for name in KEPT_NAMES)  # the step's recorded features, in record order
    first = len(STEP_WHERE_WHEN)
    for n, k in enumerate(written, 1):
        step = steps[k]
        rid, s, dur = step[:first]
        in_step = step_ids[k]
        if in_step and type(in_step[0]) is not str:
            in_step = [str(i) for i in in_step]
        yield _x(f'"{kinds[n - 1]}"', "step", rid, _STEPS_TID, s, s + dur,
                 f'{{"step":{k},{features.format(*step[first:])},"requests":{dumps(in_step)}}}')
        yield (f'{{"ph":"C","name":"tokens","pid":{rid},"ts":{s * _US:.3f},'
               f'"args":{{"prefill_tokens":{step[pf_at]},"decode_seqs":{step[dec_at]}}}}}')
        if progress is not None and n % _CHUNK == 0:
            progress.update(_CHUNK)


def _first_last_steps(step_ids: list, written: list[int]) -> tuple[dict[str, int], dict[str, int]]:
    """The first and the last written step of every request id (str)."""
    # dict updates run in C: the last write wins
    last_step: dict[str, int] = {}
    first_step: dict[str, int] = {}
    for k in written:
        last_step.update(dict.fromkeys(step_ids[k], k))
    for k in reversed(written):
        first_step.update(dict.fromkeys(step_ids[k], k))
    return first_step, last_step


def _flow_events(steps: list, name: str, rq: str, pid: int, tid: int, a: float, k0: int, k1: int):
    """A request's flow (JSON name ``name``, id ``rq``, lane ``tid`` of process ``pid``) from its
    arrival ``a`` (seconds) to the middle of its first step ``k0`` and of its last step ``k1``
    (a step's middle: its start is also the previous step's end)."""
    fid = json.dumps(f"{pid}:{rq}")
    yield f'{{"ph":"s","name":{name},"cat":"request","id":{fid},"pid":{pid},"tid":{tid},"ts":{a * _US:.3f}}}'
    if k1 != k0:
        p0, s0, d0 = steps[k0][:3]
        yield (f'{{"ph":"t","name":{name},"cat":"request","id":{fid},"pid":{p0},"tid":{_STEPS_TID},'
               f'"ts":{(s0 + d0 / 2) * _US:.3f}}}')
    p1, s1, d1 = steps[k1][:3]
    yield (f'{{"ph":"f","bp":"e","name":{name},"cat":"request","id":{fid},"pid":{p1},"tid":{_STEPS_TID},'
           f'"ts":{(s1 + d1 / 2) * _US:.3f}}}')


def _request_events(engine, result: pd.DataFrame, rows: np.ndarray, written: list[int], progress):
    """The requests of ``rows`` on lanes with their parts and flows; disaggregated, the decode side
    of each on its decode process (after all the prefill sides)."""
    first_step, last_step = _first_last_steps(engine.step_requests, written)
    steps, dumps = engine.steps, json.dumps
    transfers = getattr(engine, "transfers", None) or {}
    lanes, meta = _Lanes(), []
    # Python numbers (their repr is JSON), not numpy scalars
    ids = result["request_id"].astype(str).to_numpy()
    queue = result["pred_queue_wait_s"].to_numpy(float).tolist()
    ttft = result["pred_ttft_s"].to_numpy(float).tolist()
    e2e = result["pred_e2e_s"].to_numpy(float).tolist()
    replica = result["pred_replica_id"].to_numpy(np.int64).tolist()
    prompt = result["num_prompt_tokens"].to_numpy(np.int64).tolist()
    output = result["num_output_tokens"].to_numpy(np.int64).tolist()
    preempt = result["pred_num_preemptions"].to_numpy(np.int64).tolist()
    arrival_list = result["arrival_time_s"].to_numpy(float).tolist()
    decode_side = []
    for n, i in enumerate(rows.tolist(), 1):
        rq, pid, a = ids[i], replica[i], arrival_list[i]
        sched, first, fin = a + queue[i], a + ttft[i], a + e2e[i]
        name = dumps(rq)
        t = transfers.get(i)
        tid = lanes.take(pid, a, t.end_time_s if t is not None else fin, meta)
        yield from meta
        meta.clear()
        args = (f'{{"num_prompt_tokens":{prompt[i]},"num_output_tokens":{output[i]},"ttft_s":{ttft[i]!r},'
                f'"e2e_s":{e2e[i]!r},"num_preemptions":{preempt[i]}')
        if t is None:
            yield _x(name, "request", pid, tid, a, fin, args + "}")
            parts = (("queued", a, sched), ("prefill", sched, first), ("decode", first, fin))
        else:
            yield _x(name, "request", pid, tid, a, t.end_time_s,
                     args + f',"decode_replica_id":{t.decode_replica_id},'
                            f'"kv_transfer_s":{t.end_time_s - t.start_time_s!r}}}')
            parts = (("queued", a, sched), ("prefill", sched, t.start_time_s),
                     ("kv transfer", t.start_time_s, t.end_time_s))
            decode_side.append((t.end_time_s, i, t))
        for part, x, y in parts:
            if y > x:
                yield _x(f'"{part}"', "request", pid, tid, x, y)
        k0 = first_step.get(rq)  # (step ids are the request ids as str)
        if k0 is not None:
            yield from _flow_events(steps, name, rq, pid, tid, a, k0, last_step[rq])
        if progress is not None and n % _CHUNK == 0:
            progress.update(_CHUNK)

    decode_side.sort(key=lambda x: x[0])
    for x_end, i, t in decode_side:
        pid, fin = t.decode_replica_id, arrival_list[i] + e2e[i]
        admitted = t.decode_admitted_time_s if t.decode_admitted_time_s == t.decode_admitted_time_s else x_end
        tid = lanes.take(pid, x_end, fin, meta)
        yield from meta
        meta.clear()
        yield _x(dumps(ids[i]), "request", pid, tid, x_end, fin, f'{{"prefill_replica_id":{t.prefill_replica_id}}}')
        for part, x, y in (("decode queue", x_end, admitted), ("decode", admitted, fin)):
            if y > x:
                yield _x(f'"{part}"', "request", pid, tid, x, y)


def chrome_trace_events(engine, result: pd.DataFrame, window=None, max_requests: int | None = None) -> dict:
    """The trace-event JSON object of a replay, in memory (small replays and tests).

    Returns
    -------
    dict
        ``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}`` in the Trace
        Event Format (Google, "Trace Event Format", the document Chrome's tracing and
        Perfetto import): complete events ``X``, counters ``C``, flow events ``s``/``t``/``f``
        and metadata ``M``; timestamps in microseconds. See :func:`iter_chrome_trace`.
    """
    events = [json.loads(e) for e in iter_chrome_trace(engine, result, window, max_requests)]
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"source": "servecal replay (simulated)"}}


def write_chrome_trace(path, engine, result: pd.DataFrame, window: tuple[float, float] | None = None,
                       max_requests: int | None = DEFAULT_MAX_REQUESTS) -> ChromeTraceSummary:
    """Write the trace of a replay to ``path`` as a stream, atomically; gzipped when it ends in ``.gz``.

    Parameters
    ----------
    path : path
        ``.json`` (or anything else: plain JSON) or ``.json.gz`` (gzip, level 3).
    engine, result, window, max_requests
        See :func:`iter_chrome_trace`.

    Returns
    -------
    ChromeTraceSummary
        What was written (the caller warns when the cap cut requests).
    """
    from ..progress import optional_bar

    summary: dict = {}
    total = len(engine.steps) + int((result["pred_status"] == OK).sum())
    with atomic_output(path) as tmp, optional_bar("chrome trace", total) as bar:
        gz = str(path).endswith(".gz")
        with (gzip.open(tmp, "wt", compresslevel=3, encoding="utf-8") if gz else
              open(tmp, "w", encoding="utf-8")) as fh:
            fh.write('{"displayTimeUnit":"ms","otherData":{"source":"servecal replay (simulated)"},"traceEvents":[\n')
            chunk: list[str] = []
            sep = ""
            for event in iter_chrome_trace(engine, result, window, max_requests, summary, bar):
                chunk.append(event)
                if len(chunk) >= _CHUNK:
                    fh.write(sep + ",\n".join(chunk))
                    sep = ",\n"
                    chunk.clear()
            if chunk:
                fh.write(sep + ",\n".join(chunk))
            fh.write("\n]}\n")
    return ChromeTraceSummary(**summary)

