"""A waiting queue kept in priority order: O(log n) per arrival and per admission.

``sjf`` and ``edf`` admit the waiting request with the smallest key first. Sorting the whole
queue at every step costs O(n log n) per step, quadratic over a burst (20k simultaneous
arrivals: 23 s and 38 s where ``chunked`` took 1.4 s). :class:`KeyedWaiting` replaces the
replica's ``waiting`` deque with a sorted run (the queue found at the first step, sorted once)
and a heap (later arrivals): the engine's ``append`` (arrival), a preemption's
``appendleft`` and :func:`~replay.schedulers.loops.admit_waiting`'s ``waiting[0]`` /
``popleft()`` keep working, each in O(log n).

A request's key is computed when it enters the queue: it must not change while the request
waits (true of both policies: a waiting request computes nothing and emits nothing).
"""
from __future__ import annotations

import heapq
from collections import deque

from .base import Batch, ReplicaState
from .loops import admit_waiting, schedule_running


class KeyedWaiting:
    """The waiting requests of one replica, the head being the one with the smallest key.

    Parameters
    ----------
    key : callable
        ``key(req)`` -> a tuple, total order (end it with ``req.index``).
    items : iterable of Request
        Requests already waiting.
    aging_s : float, optional
        With aging, a request that arrived more than ``aging_s`` before :attr:`now` goes
        ahead of all others, the aged ones by (arrival, index) (``sjf``'s rule).

    Attributes
    ----------
    now : float
        The scheduling instant the aging rule is applied at (set by the policy each step).

    Notes
    -----
    Removal is lazy: a request taken out is marked, and dropped when it reaches the top of a
    heap. For aging, requests in arrival order (the engine appends arrivals in order) go to
    a FIFO, O(1); only one entering out of order (a preempted request) goes to a side heap.
    """

    __slots__ = ("_key", "_aging_s", "_heap", "_run", "_fifo", "_side", "_n", "_top", "now")

    def __init__(self, key, items=(), aging_s: float | None = None):
        self._key = key
        self._aging_s = aging_s
        # heap items are the key's fields followed by the entry [req, alive]: flat tuples
        # compare fastest, and the key ends with the unique index, so entries never compare
        self._heap: list = []
        self._run: list = []         # the queue found at the first step, sorted, smallest last
        self._fifo: deque = deque()  # (arrival, index, entry) in order, with aging
        self._side: list = []        # (arrival, index, entry) that came out of order
        self._n = 0
        self._top = None
        self.now = 0.0
        run = self._run
        for r in items:
            entry = [r, True]
            run.append((*key(r), entry))
            if aging_s is not None:
                self._age(r, entry)
        self._n = len(run)
        # one sort (C, O(n log n) once) and O(1) pops from its end: a burst that arrived
        # before the first step costs no heap operations; later arrivals go to the heap
        run.sort(reverse=True)

    def _age(self, req, entry) -> None:
        item = (req.arrival_time_s, req.index, entry)
        fifo = self._fifo
        if not fifo or fifo[-1][:2] <= item[:2]:
            fifo.append(item)
        else:
            heapq.heappush(self._side, item)

    # -- the deque operations the engine and the shared loops use ---------------------------

    def append(self, req) -> None:
        entry = [req, True]
        heapq.heappush(self._heap, (*self._key(req), entry))
        if self._aging_s is not None:
            self._age(req, entry)
        self._n += 1
        self._top = None

    appendleft = append  # a preempted request: its place follows from its key too

    def extend(self, reqs) -> None:
        for r in reqs:
            self.append(r)

    def _head(self):
        cached = self._top  # (entry, now): the head for this instant, until the queue changes
        if cached is not None and cached[1] == self.now and cached[0][1]:
            return cached[0]
        heap, run = self._heap, self._run
        while heap and not heap[0][-1][1]:
            heapq.heappop(heap)
        while run and not run[-1][-1][1]:
            run.pop()
        if heap and (not run or heap[0] < run[-1]):
            top = heap[0][-1]
        elif run:
            top = run[-1][-1]
        else:
            raise IndexError("the waiting queue is empty")
        if self._aging_s is not None:
            fifo, side = self._fifo, self._side
            while fifo and not fifo[0][2][1]:
                fifo.popleft()
            while side and not side[0][2][1]:
                heapq.heappop(side)
            first = fifo[0] if fifo else None
            if side and (first is None or side[0][:2] < first[:2]):
                first = side[0]
            if first is not None and first[0] < self.now - self._aging_s:
                top = first[2]
        self._top = (top, self.now)
        return top

    def __getitem__(self, i: int):
        if i != 0:
            raise IndexError("only the head (index 0) of a keyed waiting queue can be read")
        return self._head()[0]

    def popleft(self):
        entry = self._head()
        entry[1] = False
        self._n -= 1
        self._top = None
        return entry[0]

    def remove(self, req) -> None:
        for item in (*self._heap, *self._run):
            if item[-1][0] is req and item[-1][1]:
                item[-1][1] = False
                self._n -= 1
                self._top = None
                return
        raise ValueError("request not waiting")

    def clear(self) -> None:
        self._heap.clear()
        self._run.clear()
        self._fifo.clear()
        self._side.clear()
        self._n = 0
        self._top = None

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0

    def __iter__(self):
        """The waiting requests, in no particular order."""
        return (item[-1][0] for item in [*self._heap, *self._run] if item[-1][1])

    def __repr__(self) -> str:
        return f"KeyedWaiting({len(self)} requests)"


def schedule_in_key_order(now: float, state: ReplicaState, key, **queue_kw) -> Batch:
    """``chunked``'s step with the waiting queue kept in ``key`` order (:class:`KeyedWaiting`:
    O(log n) per arrival and admission); ``queue_kw`` go to :class:`KeyedWaiting`. The step
    of ``sjf`` and ``edf``."""
    batch = Batch()
    budget, preempted = schedule_running(state, batch, state.config.max_num_batched_tokens)
    if preempted or not state.waiting or budget <= 0 or len(state.running) >= state.config.max_num_seqs:
        return batch
    queue = state.waiting
    if type(queue) is not KeyedWaiting:
        queue = state.waiting = KeyedWaiting(key, queue, **queue_kw)
    queue.now = now
    admit_waiting(state, batch, budget, now)
    return batch
