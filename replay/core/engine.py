"""The discrete-event engine: arrivals, steps of each replica, completions.

A heap of ``(time, priority, seq, event)`` drives the simulation; equal times resolve
deterministically (``seq`` a per-engine counter; :mod:`replay.core.events`): arrivals
and callbacks (:meth:`Engine.call_at`, e.g. a KV transfer done), then step ends, then callbacks
scheduled with ``after_step_ends=True`` (closed-loop sends, :mod:`replay.core.closed_loop`), then
the wake-up of an idle replica (so it sees every request that arrived at that instant).
At each step end the replica's scheduler picks the next batch, the cost model prices it,
and at its end tokens are emitted and requests completed.

Speed without changing a timestamp (``--exact-steps`` turns all of it off, and property
tests check the fast path against it):

* steadily decoding requests of policies that declare ``implicit_decoders`` are implicit
  (:mod:`replay.schedulers.implicit_decoders`), so a decode step costs O(1) for all of
  them, and a step of those alone repeats in place while nothing else can happen;
* for policies that declare ``decode_runs``, runs of identical decode steps are priced in one
  vectorised call (:mod:`replay.core.decode_runs`); a step ending at the next event skips the heap.

Speculative decoding (``SchedulerConfig.num_speculative_tokens`` K > 0): a decode verifies up to ``K + 1``
positions and emits ``1 +`` the accepted drafts at the step's end (:attr:`Engine.accept_drafts`,
:mod:`replay.core.spec_decode`); the implicit decoders and closed-form decode runs are off then.
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from functools import partial

import numpy as np

from schemas.status import REJECTED, because
from schemas.step_record import step_features

from ..cost.cost_model import StepCostModel
from .decode_runs import DecodeRuns
from .engine_config import EngineConfig, check_settings
from .events import CALL, LATE_CALL, STEP_END, WAKE, completion_bound_s, not_finite_step
from .kv_cache import make_kv_cache
from ..progress import bar as progress_bar
from ..progress import counting_calls, counting_items
from .request import Request
from ..schedulers.base import Batch, ReplicaState, Scheduler, SchedulerConfig
from ..schedulers.implicit_decoders import lazy_decodes_for
from .spec_decode import check_cost_models, end_spec_step, sample_accepted_drafts
from .step_end import allocate_run, end_run, end_step, run_step_rows


class Engine:
    """Replays requests through ``num_replicas`` identical replicas.

    Parameters
    ----------
    cost_model : StepCostModel
    scheduler_factory : callable () -> Scheduler
        Builds one scheduler per replica.
    scheduler_config : SchedulerConfig
    engine_config : EngineConfig
    num_replicas : int
    router : callable (Request, list[ReplicaState]) -> int, optional
        Chooses the replica of an arriving request (default: round robin).

    Attributes
    ----------
    cost_models : list[StepCostModel]
        The cost model of each replica (all ``cost_model`` here; a subclass such as
        :class:`replay.core.disagg.DisaggEngine` gives each pool its own).
    on_step_end : callable (rid, now) -> None, or None
        Hook called after a step's tokens are emitted, before the replica schedules again.
    loop_busy_until_s : list[float]
        Per replica, seconds: its host loop does other work until then, and no step starts before
        (-inf: none; :class:`~replay.core.disagg.DisaggEngine`'s KV migrations).
    on_request_done : callable (Request, now) -> None, or None
        Hook called once per request when its last token is emitted (status ``"ok"``), at the
        end of that step (``now``, seconds), after the replica's ``running`` list dropped it.
    arrival_bound : callable () -> float, or None
        Earliest time (seconds) a request not in :meth:`run`'s list could still arrive (one
        a hook will hand to :meth:`arrive`); closed-form decode runs stop there. None: no
        such requests.
    accept_drafts : callable (rid, drafts) -> list[int]
        Speculative decoding: the accepted draft tokens of each decode of a step of replica
        ``rid`` that verified ``drafts[i]`` drafts (default :meth:`sample_accepted_drafts`;
        a test may put a fixed pattern here).
    spec_counts : dict[int, list[int]]
        Speculative decoding, per request (by ``Request.index``): ``[verify steps, draft
        tokens, accepted tokens]`` over its decodes that verified at least one draft.
    """

    def __init__(self, cost_model: StepCostModel, scheduler_factory, scheduler_config: SchedulerConfig,
                 engine_config: EngineConfig, num_replicas: int = 1, router=None):
        check_settings(engine_config, scheduler_config, num_replicas)
        self.cost_model = cost_model
        self.cost_models: list[StepCostModel] = [cost_model] * num_replicas
        self.on_step_end: Callable[[int, float], None] | None = None
        self.on_request_done: Callable[[Request, float], None] | None = None
        self.arrival_bound: Callable[[], float] | None = None
        self.config = engine_config
        self.replicas = [ReplicaState(i, scheduler_config,
                                      make_kv_cache(engine_config.num_gpu_blocks, engine_config.block_size,
                                                    engine_config.enable_prefix_caching, engine_config.hash_block_size),
                                      preemption_mode=engine_config.preemption_mode)
                         for i in range(num_replicas)]
        self.schedulers: list[Scheduler] = [scheduler_factory() for _ in range(num_replicas)]
        self.router, self._rr = router, 0
        self._heap: list = []  # (time, kind, seq, payload) events, seq counting pushes
        self._busy, self._seq = [False] * num_replicas, 0
        self.loop_busy_until_s = [-math.inf] * num_replicas
        self._batches: list[Batch | None] = [None] * num_replicas
        self._decode_runs: list[DecodeRuns | None] = [None] * num_replicas  # set by run()
        self._arrivals: list[Request] = []  # run()'s admitted requests, consumed in order
        self._next_arrival, self._next_list_arrival_s = 0, math.inf  # the next to arrive: index, time (inf: none)
        #: the recorded steps (``record_steps``): tuples in :data:`schemas.step_record.STEP_RECORD`'s order
        self.steps: list[tuple] = []
        self.step_requests: list[list[str]] = []  # request ids of each recorded step (record_step_requests)
        self.num_steps = 0
        self.spec_tokens = scheduler_config.num_speculative_tokens  # speculative decoding: K drafts (0: off)
        self._rngs = [np.random.default_rng([engine_config.seed, rid]) for rid in range(num_replicas)]
        self.accept_drafts = self.sample_accepted_drafts
        self.spec_counts: dict[int, list[int]] = {}

    def _push(self, time: float, kind: int, payload) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (time, kind, self._seq, payload))

    def call_at(self, time: float, fn, after_step_ends: bool = False) -> None:
        """Run ``fn(now)`` at simulation time ``time`` (seconds).

        By default before the step ends of that instant; with ``after_step_ends`` after all
        of them (every replica ending a step then has scheduled its next one) and before the
        wake-ups of idle replicas.
        """
        self._push(time, LATE_CALL if after_step_ends else CALL, fn)

    def arrive(self, req: Request, now: float) -> None:
        """Route an arriving ``req`` to a replica and queue it there at ``now`` (seconds)."""
        rid = self._route(req) if len(self.replicas) > 1 else 0
        req.replica_id = rid
        self.enqueue(rid, req, now)  # wakes after every arrival of this instant is queued

    def enqueue(self, rid: int, req: Request, now: float) -> None:
        """Put ``req`` in replica ``rid``'s waiting queue and wake the replica if it is idle.

        The wake-up runs after every event of the instant ``now`` (so the replica sees all of
        them). Arrivals come through here; :mod:`replay.core.disagg` hands transferred requests over too.
        """
        self.replicas[rid].waiting.append(req)
        self.wake(rid, now)

    def wake(self, rid: int, now: float) -> None:
        """Make an idle replica ``rid`` schedule at ``now`` (after the instant's other events)."""
        if not self._busy[rid]:
            self._busy[rid] = True
            self._push(now, WAKE, rid)

    def rejection_reason(self, req: Request) -> str | None:
        """Why ``req`` can never run here (``None`` if it can).

        A request is rejected when prompt + output exceeds ``max_model_len`` (vLLM refuses
        it) or when its peak KV (prompt + output - 1 tokens) exceeds the whole cache (one DP
        rank's share: ``EngineConfig.max_request_blocks``).
        """
        total = req.num_prompt_tokens + req.num_output_tokens
        if self.config.max_model_len is not None and total > self.config.max_model_len:
            return because(REJECTED, "exceeds max_model_len")
        kv = self.replicas[0].kv
        if kv.blocks_for(req.peak_kv_tokens) > (self.config.max_request_blocks or kv.num_gpu_blocks):
            return because(REJECTED, "exceeds KV cache capacity")
        return None

    def admit(self, req: Request) -> bool:
        """Prepare ``req`` to arrive; False (and ``req.status`` set) when it is rejected."""
        reason = self.rejection_reason(req)
        if reason:
            req.status = reason
            return False
        if self.config.record_token_times and req.token_times_s is None:
            req.token_times_s = []
        return True

    def run(self, requests: list[Request]) -> list[Request]:
        """Simulate until every request has finished or been rejected.

        ``requests`` must be sorted by arrival time. Returns the same list, updated.
        Requests that hooks hand to :meth:`arrive` meanwhile are simulated too (see
        :attr:`arrival_bound`).
        """
        cfg = self.config
        if self.spec_tokens:
            check_cost_models(self.cost_models)
        arrivals = [req for req in requests if self.admit(req)]
        # Arrivals are consumed in order from a sorted list, not the heap; an arrival goes first on a tie.
        self._arrivals, self._next_arrival = arrivals, 0
        # Implicit decoders and decode runs assume one token per decode and step (no speculative decoding);
        # implicit decoders leave the requests' fields stale (so not with per-step request lists or hooks
        # that see requests: closed loop); decode runs price their steps together (a vectorised cost model).
        fast = not cfg.exact_steps and not self.spec_tokens
        implicit = (fast and not cfg.record_step_requests and self.arrival_bound is None
                    and self.on_request_done is None)
        for rid, state in enumerate(self.replicas):
            state.lazy = lazy_decodes_for(self.schedulers[rid], state) if implicit else None
        self._decode_runs = [DecodeRuns(cm) if fast and getattr(cm, "supports_arrays", False) else None
                             for cm in self.cost_models]
        heap, heappop = self._heap, heapq.heappop
        self._next_list_arrival_s = arrivals[0].arrival_time_s if arrivals else math.inf
        # a bar over arrivals and completions (None unless the CLI shows progress), for this run only
        progress = progress_bar("replaying", 2 * len(arrivals))
        if progress is not None:
            self._arrive_next = counting_calls(self._arrive_next, progress, every=1024)  # type: ignore[method-assign]
            self._finish = counting_items(self._finish, progress, arg=1)  # type: ignore[method-assign]  # requests done
        close_step, start_step, arrive_next = self._close_step, self._start_step, self._arrive_next
        try:
            while self._next_list_arrival_s < math.inf or heap:
                if not heap or self._next_list_arrival_s <= heap[0][0]:
                    arrive_next()
                    continue
                now, kind, _, rid = heappop(heap)
                if kind == STEP_END:
                    start_step(rid, now, close_step(rid, now))
                elif kind == WAKE:
                    start_step(rid, now)
                else:
                    rid(now)  # the payload of a call_at (CALL, LATE_CALL) event is its callback
        finally:
            if progress is not None:
                progress.close()
                del self._arrive_next, self._finish
        self._arrivals = []  # the engine outlives the run: hold no request
        return requests

    def _arrive_next(self) -> None:
        """The next request of :meth:`run`'s list arrives (at its arrival time)."""
        arrivals, i = self._arrivals, self._next_arrival
        req, t = arrivals[i], self._next_list_arrival_s
        self._next_arrival = i = i + 1
        self._next_list_arrival_s = arrivals[i].arrival_time_s if i < len(arrivals) else math.inf
        self.arrive(req, t)

    def _route(self, req: Request) -> int:
        if self.router is not None:
            return self.router(req, self.replicas)
        self._rr = (self._rr + 1) % len(self.replicas)
        return (self._rr - 1) % len(self.replicas)

    def _start_step(self, rid: int, now: float, batch: Batch | None = None) -> None:
        """Start replica ``rid``'s next step at ``now`` (seconds), or idle it; ``batch`` is that step when
        it is already scheduled (the implicit decoders alone again, :meth:`_close_step`).

        The event loop's work up to the step's end is done here while nothing else is due
        first: the arrivals before the end (or at it: they come first) arrive, then, when the
        end is before everything in the heap (ties excluded), the step is ended
        (:meth:`_close_step`) and the next one started, without the trip through the
        heap. The event loop would do the same, in the same order. ``--exact-steps`` always
        takes the trip.
        """
        state = self.replicas[rid]
        lazy = state.lazy
        heap, step_time_s = self._heap, self.cost_models[rid].step_time_s
        inline, record = not self.config.exact_steps, self.config.record_steps
        spec = self.spec_tokens
        while True:
            swap_s = 0.0
            if batch is None and self.loop_busy_until_s[rid] > now:  # the host loop is busy
                return self._start_when_loop_free(rid)
            if batch is not None:
                pass  # the implicit decoders alone, again (LazyDecodes.repeat)
            elif (lazy is not None and lazy.count and lazy.count == len(state.running) and not state.waiting
                    and lazy.schedule(state.kv, fresh := Batch(), state.config.max_num_batched_tokens)):
                batch = fresh  # only the implicit decoders can run: the policy's batch, without asking it (LazyDecodes)
            else:
                preemptions = state.num_preemptions
                batch = self.schedulers[rid].schedule(now, state)
                if state.num_swap_blocks:  # swap preemption: KV copied over the host link during this step
                    swap_s = state.num_swap_blocks * self.config.swap_time_per_block_s
                    state.num_swap_blocks = 0
                if not batch.requests and not batch.num_lazy_decodes:
                    self._busy[rid] = False
                    self._batches[rid] = None
                    return
                if (self._decode_runs[rid] is not None and not swap_s
                        and state.num_preemptions == preemptions  # a preempting step is followed by a re-admission try
                        and len(batch.requests) == len(state.running)  # no implicit decoder
                        and (not batch.num_prefill_seqs or len(batch.requests) == 1)  # decodes, or one prompt's chunk
                        and self._start_run(rid, state, batch, now)):
                    return
            if spec:  # the decodes feed their drafts too: priced by positions (StepCostModel)
                duration = step_time_s(batch.num_prefill_tokens, batch.num_decode_seqs, batch.decode_context_tokens,
                                       batch.prefill_context_tokens, batch.num_prefill_seqs,
                                       num_decode_tokens=batch.num_decode_seqs + batch.num_spec_tokens) + swap_s
            else:
                duration = step_time_s(batch.num_prefill_tokens, batch.num_decode_seqs, batch.decode_context_tokens,
                                       batch.prefill_context_tokens, batch.num_prefill_seqs) + swap_s
            self._batches[rid] = batch  # the replica stays busy (set by wake() or the step that ends now)
            if record:
                self.steps.append((rid, now, duration) + step_features(batch))
                if self.config.record_step_requests:
                    self.step_requests.append([r.request_id for r in batch.requests])
            self.num_steps += 1
            end = now + duration
            if not end < math.inf:  # inf or NaN: the cost model's parameters are out of any range
                not_finite_step(rid, now, duration)
            if inline:
                while self._next_list_arrival_s <= end and (not heap or self._next_list_arrival_s <= heap[0][0]):
                    self._arrive_next()  # what the event loop would do next
            if inline and (not heap or end < heap[0][0]) and end < self._next_list_arrival_s:
                batch = self._close_step(rid, end)
                now = end
                continue
            self._push(end, STEP_END, rid)
            return

    def _start_when_loop_free(self, rid: int) -> None:
        """Replica ``rid`` starts no step now: it schedules again when its host loop is free."""
        self._batches[rid] = None
        self._push(self.loop_busy_until_s[rid], WAKE, rid)

    def _start_run(self, rid: int, state: ReplicaState, batch: Batch, now: float) -> bool:
        """Advance ``k > 1`` steps of ``batch`` at once, a closed-form run of decodes or of prompt chunks, as
        the policy's capability flags and :meth:`~replay.core.decode_runs.DecodeRuns.plan_batch` allow;
        False (nothing done) when they do not."""
        runs = self._decode_runs[rid]
        assert runs is not None  # the caller checked
        run = runs.plan_batch(self.schedulers[rid], batch, state, now, self._next_arrival_time_s)
        if run is None:
            return False
        ends, durations, ctx, varying = run
        if not ends[-1] < math.inf:
            not_finite_step(rid, now, float(ends[-1] - now))
        k = len(ends)
        allocate_run(batch, state.kv, k)
        batch.run_end_times_s = ends.tolist()
        self._busy[rid] = True
        self._batches[rid] = batch
        if self.config.record_steps:
            self.steps.extend(run_step_rows(rid, now, batch, durations, ctx, varying))
            if self.config.record_step_requests:
                ids = [r.request_id for r in batch.requests]
                self.step_requests.extend([ids] * k)
        self.num_steps += k
        self._push(batch.run_end_times_s[-1], STEP_END, rid)
        return True

    def _next_arrival_time_s(self) -> float:
        """Earliest time a request can still arrive, seconds (``inf``: none): the next of
        :meth:`run`'s list or :attr:`arrival_bound`, whichever is first."""
        t = self._next_list_arrival_s
        return t if self.arrival_bound is None else min(t, self.arrival_bound())

    def completion_bound_s(self, min_step_s: float = 0.0) -> float:
        """A time before which no request can complete on another replica, seconds (``inf``: none),
        from the pending events (:func:`replay.core.events.completion_bound_s`; ``min_step_s``: a
        lower bound on any step's duration, seconds)."""
        return completion_bound_s(self._heap, self.replicas, self._batches, self.spec_tokens, min_step_s)

    def _finish(self, state: ReplicaState, done: list[Request], now: float) -> None:
        """Drop the requests that emitted their last token at ``now`` from ``running``; call the hook."""
        for req in done:
            state.remove_running(req)
        if self.on_request_done is not None:
            for req in done:
                self.on_request_done(req, now)

    def _close_step(self, rid: int, end: float) -> Batch | None:
        """End replica ``rid``'s step at ``end`` (seconds). When its implicit decoders, alone in it and all of
        ``running``, can decode again in place (:meth:`LazyDecodes.repeat`) and :attr:`on_step_end` would change
        nothing (:meth:`_quiet_step_end`), the same batch is the next step: returned. Else the tokens are emitted
        (:mod:`replay.core.step_end`), the finished requests leave ``running``, the next decoders join the implicit
        ones, the hook is called, and None returned (the next step is to be scheduled)."""
        state, batch, hook = self.replicas[rid], self._batches[rid], self.on_step_end
        assert batch is not None  # a step end is pending only for a started step (set by _start_step)
        lazy = state.lazy
        if lazy is not None:
            if (not batch.requests and not state.waiting and lazy.count == len(state.running)
                    and (hook is None or self._quiet_step_end(rid)) and lazy.repeat(state.kv, batch, end)):
                return batch
            done = lazy.end_step(state, batch, end)  # implicit decoders that emitted their last token, freed
        else:
            done = []
        if batch.run_end_times_s is not None:  # a closed-form run of identical steps
            end_run(batch, state.kv, end, done)
        elif batch.requests and self.spec_tokens:
            end_spec_step(batch, state.kv, end, done, partial(self.accept_drafts, rid), self.spec_counts)
        elif batch.requests:
            end_step(batch, state.kv, end, done)
        if done:
            self._finish(state, done, end)
        if lazy is not None and lazy.count < len(state.running):
            lazy.admit_decoders(state)
        if hook is not None:
            hook(rid, end)
        return None

    def _quiet_step_end(self, rid: int) -> bool:
        """Whether :attr:`on_step_end` at replica ``rid``'s step end would change nothing now (a subclass knows)."""
        return False

    def sample_accepted_drafts(self, rid: int, drafts: list) -> list:
        """Accepted draft tokens of the decodes of one step of replica ``rid``
        (:func:`replay.core.spec_decode.sample_accepted_drafts` with the replica's seeded generator)."""
        return sample_accepted_drafts(self._rngs[rid], self.config.spec_acceptance_rate, drafts)
