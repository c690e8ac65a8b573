"""The discrete-event engine: arrivals, steps of each replica, completions.

A heap of ``(time, priority, seq, event)`` drives the simulation; ``seq`` is a
per-engine counter, so equal times resolve deterministically: arrivals and callbacks
(:meth:`Engine.call_at`, e.g. a KV transfer done), then step ends, then callbacks scheduled
with ``after_step_ends=True`` (closed-loop sends, :mod:`replay.closed_loop`), then the wake-up
of an idle replica (so it sees every request that arrived at that instant).
At every step end of a replica its scheduler picks the next batch; the cost model gives
the step's duration; at the step's end tokens are emitted and requests completed.

Speed without changing a timestamp (``--exact-steps`` turns all of it off, and property
tests check the fast path against it):

* steadily decoding requests of the built-in policies are implicit
  (:class:`~replay.schedulers.base.LazyDecodes`), so a decode step costs O(1) for all of
  them, and a step of those alone repeats in place while nothing else can happen;
* for other policies, runs of identical decode steps are priced in one vectorised call
  (:meth:`Engine._start_decode_run`);
* a step whose end is the next event of the simulation is ended without a trip through
  the heap (:meth:`Engine._start_step`).

Speculative decoding (``SchedulerConfig.num_speculative_tokens`` K > 0): a decode verifies up
to ``K + 1`` positions and emits ``1 +`` the accepted drafts (:attr:`Engine.accept_drafts`),
all at the step's end. The implicit decoders and the closed-form decode runs assume one token
per decode and step, so both are off then (every step goes through the policy, as with
``--exact-steps``); the in-place step ends stay.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

from schemas.status import OK, REJECTED, RUNNING, because

from .cost_model import StepCostModel
from .errors import ConfigError, ReplayError
from .kv_cache import make_kv_cache
from .progress import bar as progress_bar
from .request import Request
from .schedulers.base import Batch, LazyDecodes, ReplicaState, Scheduler, SchedulerConfig

_ARRIVAL, _STEP_END, _WAKE = 0, 1, 3
#: A callback scheduled with :meth:`Engine.call_at` (e.g. a KV transfer done, replay.disagg). Arrivals
#: never enter the heap, so it shares their priority: it runs before step ends of the same instant.
_CALL = 0
#: A callback scheduled with ``call_at(..., after_step_ends=True)``: after the step ends of its
#: instant (whatever their order), before the wake-ups (so woken replicas see what it enqueues).
_LATE_CALL = 2
#: Shortest run of decode steps worth advancing in closed form (shorter ones go step by step).
_MIN_RUN = 8


@dataclass
class EngineConfig:
    """Per-replica engine settings.

    Attributes
    ----------
    num_gpu_blocks : int
        KV cache blocks per replica.
    block_size : int
        Tokens per KV block.
    max_model_len : int | None
        Longest prompt + output accepted; longer requests are rejected (vLLM's check).
    record_token_times : bool
        Keep every output token's time (needed for ITL); costs memory on big traces.
    record_steps : bool
        Keep one row per simulated step (the step trace of the replay).
    enable_prefix_caching : bool
        Share full prompt blocks between requests (vLLM v1 automatic prefix caching).
    hash_block_size : int | None
        Tokens per hash block of the requests' ``block_hashes`` (None: ``block_size``).
    preemption_mode : str
        ``"recompute"`` or ``"swap"`` (the victim's KV goes to host memory and back).
    swap_time_per_block_s : float
        Seconds to move one KV block over the host link; a step that swaps ``k`` blocks
        (out and in) lasts ``k * swap_time_per_block_s`` longer.
    record_step_requests : bool
        With ``record_steps``, keep the ids of each step's requests (``step_requests``).
    exact_steps : bool
        Simulate every step one by one through the event heap, every request explicit: no
        implicit decoders, no closed-form runs, no in-place step ends (the reference the
        fast path is tested against).
    spec_acceptance_rate : float
        Speculative decoding: probability in [0, 1] that one draft token is accepted, given
        that the drafts before it were (see :meth:`Engine.accept_drafts`).
    seed : int
        Seed of the engine's random draws (accepted drafts); one ``numpy.random.Generator``
        per replica, so a run is deterministic.
    """

    num_gpu_blocks: int
    block_size: int = 16
    max_model_len: int | None = None
    record_token_times: bool = False
    record_steps: bool = False
    enable_prefix_caching: bool = False
    hash_block_size: int | None = None
    preemption_mode: str = "recompute"
    swap_time_per_block_s: float = 0.0
    record_step_requests: bool = False
    exact_steps: bool = False
    spec_acceptance_rate: float = 0.0
    seed: int = 0


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
        :class:`replay.disagg.DisaggEngine` gives each pool its own).
    on_step_end : callable (rid, now) -> None, or None
        Hook called after a step's tokens are emitted, before the replica schedules again.
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
        if num_replicas < 1:
            raise ConfigError("--replicas must be >= 1")
        self.cost_model = cost_model
        self.cost_models: list[StepCostModel] = [cost_model] * num_replicas
        self.on_step_end = None
        self.on_request_done = None
        self.arrival_bound = None
        self.config = engine_config
        if engine_config.preemption_mode not in ("recompute", "swap"):
            raise ConfigError(f"--preemption-mode must be recompute or swap, not {engine_config.preemption_mode!r}")
        self.replicas = [ReplicaState(i, scheduler_config,
                                      make_kv_cache(engine_config.num_gpu_blocks, engine_config.block_size,
                                                    engine_config.enable_prefix_caching, engine_config.hash_block_size),
                                      preemption_mode=engine_config.preemption_mode)
                         for i in range(num_replicas)]
        self.schedulers: list[Scheduler] = [scheduler_factory() for _ in range(num_replicas)]
        self.router = router
        self._rr = 0
        self._heap: list = []
        self._seq = 0
        self._busy = [False] * num_replicas
        self._batches: list[Batch | None] = [None] * num_replicas
        self._run_blocker: list[Request | None] = [None] * num_replicas  # see _start_decode_run
        self._arrivals: list[Request] = []  # run()'s admitted requests, consumed in order
        self._next_arrival = 0
        self._next_list_arrival_s = math.inf  # arrival time of _arrivals[_next_arrival] (inf: none)
        self.steps: list[tuple] = []
        self.step_requests: list[list[str]] = []  # request ids of each recorded step (record_step_requests)
        self.num_steps = 0
        # speculative decoding (K draft tokens per decode; 0: off)
        self.spec_tokens = scheduler_config.num_speculative_tokens
        if self.spec_tokens < 0:
            raise ConfigError(f"--speculative-tokens must be >= 0, not {self.spec_tokens}")
        if not 0.0 <= engine_config.spec_acceptance_rate <= 1.0:
            raise ConfigError(f"--spec-acceptance-rate must be in [0, 1], not {engine_config.spec_acceptance_rate}")
        if scheduler_config.long_prefill_token_threshold < 0:
            raise ConfigError("--long-prefill-token-threshold must be >= 0 (0: no cap)")
        self._rngs = [np.random.default_rng([engine_config.seed, rid]) for rid in range(num_replicas)]
        self.accept_drafts = self.sample_accepted_drafts
        self.spec_counts: dict[int, list[int]] = {}
        #: decode positions of each recorded step (speculative decoding only; parallel to ``steps``)
        self.step_decode_tokens: list[int] = []

    # -- events -------------------------------------------------------------------------------
    def _push(self, time: float, kind: int, payload) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (time, kind, self._seq, payload))

    def call_at(self, time: float, fn, after_step_ends: bool = False) -> None:
        """Run ``fn(now)`` at simulation time ``time`` (seconds).

        By default before the step ends of that instant; with ``after_step_ends`` after all
        of them (every replica ending a step then has scheduled its next one) and before the
        wake-ups of idle replicas.
        """
        self._push(time, _LATE_CALL if after_step_ends else _CALL, fn)

    def arrive(self, req: Request, now: float) -> None:
        """Route an arriving ``req`` to a replica and queue it there at ``now`` (seconds)."""
        rid = self._route(req) if len(self.replicas) > 1 else 0
        req.replica_id = rid
        self.enqueue(rid, req, now)  # wakes after every arrival of this instant is queued

    def enqueue(self, rid: int, req: Request, now: float) -> None:
        """Put ``req`` in replica ``rid``'s waiting queue and wake the replica if it is idle.

        The wake-up runs after every event of the instant ``now`` (so the replica sees all of
        them). Arrivals come through here; :mod:`replay.disagg` hands transferred requests over too.
        """
        self.replicas[rid].waiting.append(req)
        self.wake(rid, now)

    def wake(self, rid: int, now: float) -> None:
        """Make an idle replica ``rid`` schedule at ``now`` (after the instant's other events)."""
        if not self._busy[rid]:
            self._busy[rid] = True
            self._push(now, _WAKE, rid)

    def rejection_reason(self, req: Request) -> str | None:
        """Why ``req`` can never run here (``None`` if it can).

        A request is rejected when prompt + output exceeds ``max_model_len`` (vLLM refuses
        it) or when its peak KV (prompt + output - 1 tokens) exceeds the whole cache.
        """
        total = req.num_prompt_tokens + req.num_output_tokens
        if self.config.max_model_len is not None and total > self.config.max_model_len:
            return because(REJECTED, "exceeds max_model_len")
        kv = self.replicas[0].kv
        if kv.blocks_for(req.peak_kv_tokens) > kv.num_gpu_blocks:
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
        if self.spec_tokens:
            self._check_spec_cost_models()
        arrivals = [req for req in requests if self.admit(req)]
        # Arrivals are consumed in order from a list (they are sorted), the heap holds only
        # step ends and wake-ups; an arrival goes first on a tie (priority 0).
        self._arrivals, self._next_arrival = arrivals, 0
        for rid, state in enumerate(self.replicas):
            state.lazy = LazyDecodes(state.kv.block_size) if self._lazy_decodes_ok(rid) else None
        # closed-form decode runs (_start_decode_run) price their steps together: only with a
        # deterministic, vectorised cost model
        # (one token per decode and step: not under speculative decoding)
        self._decode_runs_priced = [not self.config.exact_steps and not self.spec_tokens
                                    and getattr(cm, "supports_arrays", False) for cm in self.cost_models]
        heap, heappop = self._heap, heapq.heappop
        self._next_list_arrival_s = arrivals[0].arrival_time_s if arrivals else math.inf
        # a bar over arrivals and completions (None unless the CLI shows progress); the
        # counting wrappers shadow the two methods for this run only
        progress = progress_bar("replaying", 2 * len(arrivals))
        if progress is not None:
            self._arrive_next = _counted(self._arrive_next, progress)
            self._finish = _counted_finish(self._finish, progress)
        end_step, start_step, arrive_next = self._end_step, self._start_step, self._arrive_next
        try:
            while self._next_list_arrival_s < math.inf or heap:
                if not heap or self._next_list_arrival_s <= heap[0][0]:
                    arrive_next()
                    continue
                now, kind, _, rid = heappop(heap)
                if kind == _STEP_END:
                    end_step(rid, now)
                    if self.on_step_end is not None:
                        self.on_step_end(rid, now)
                elif kind == _CALL or kind == _LATE_CALL:
                    rid(now)  # the payload of a call_at event is its callback
                    continue
                start_step(rid, now)
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

    def _start_step(self, rid: int, now: float) -> None:
        """Start replica ``rid``'s next step at ``now`` (seconds), or idle it.

        The event loop's work up to the step's end is done here while nothing else is due
        first: the arrivals before the end (or at it: they come first) arrive, then, when the
        end is before everything in the heap (ties excluded), the step is ended
        (:attr:`on_step_end` called) and the next one started, without the trip through the
        heap. The event loop would do the same, in the same order. ``--exact-steps`` always
        takes the trip.
        """
        state = self.replicas[rid]
        lazy = state.lazy
        heap, step_time_s = self._heap, self.cost_models[rid].step_time_s
        inline, record = not self.config.exact_steps, self.config.record_steps
        hook = self.on_step_end
        spec = self.spec_tokens
        batch = None  # the step to start (None: to be scheduled)
        while True:
            swap_s = 0.0
            if batch is not None:
                pass  # the implicit decoders alone, again (LazyDecodes.repeat)
            elif (lazy is not None and lazy.count and lazy.count == len(state.running) and not state.waiting
                    and lazy.schedule(state.kv, batch := Batch(), state.config.max_num_batched_tokens)):
                pass  # only the implicit decoders can run: the policy's batch, without asking it (see LazyDecodes)
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
                if (not batch.num_prefill_seqs and self._decode_runs_priced[rid] and not swap_s
                        and state.num_preemptions == preemptions  # a preempting step is followed by a re-admission try
                        and len(batch.requests) == len(state.running)
                        and getattr(self.schedulers[rid], "decode_runs", False)):  # the policy's word, read every step
                    if self._start_decode_run(rid, state, batch, now):
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
                self.steps.append((rid, now, duration, batch.num_prefill_tokens, batch.num_prefill_seqs,
                                   batch.num_decode_seqs, batch.decode_context_tokens, batch.prefill_context_tokens))
                if self.config.record_step_requests:
                    self.step_requests.append([r.request_id for r in batch.requests])
                if spec:
                    self.step_decode_tokens.append(batch.num_decode_seqs + batch.num_spec_tokens)
            self.num_steps += 1
            end = now + duration
            if not end < math.inf:  # inf or NaN: the cost model's parameters are out of any range
                _not_finite(rid, now, duration)
            if inline:
                while self._next_list_arrival_s <= end and (not heap or self._next_list_arrival_s <= heap[0][0]):
                    self._arrive_next()  # what the event loop would do next
            if inline and (not heap or end < heap[0][0]) and end < self._next_list_arrival_s:
                if not (lazy is not None and hook is None and not batch.requests and not state.waiting
                        and lazy.count == len(state.running) and lazy.repeat(state.kv, batch, end)):
                    self._end_step(rid, end)
                    if hook is not None:
                        hook(rid, end)
                    batch = None
                now = end
                continue
            self._push(end, _STEP_END, rid)
            return

    def _start_decode_run(self, rid: int, state: ReplicaState, batch: Batch, now: float) -> bool:
        """Advance ``k > 1`` identical decode steps at once when nothing can change the batch.

        The scheduler (``decode_runs = True``) returned every running request as a decode,
        so until the next arrival (or :attr:`arrival_bound`), the first completion, or the KV
        cache running out, the same batch repeats with ``L_total`` growing by ``B`` per step. The steps' durations
        are computed together and their end times accumulated in the same order as the
        step-by-step path, so both give the same timestamps. Returns False when ``k = 1``.
        """
        blocker = self._run_blocker[rid]
        if (blocker is not None and blocker.status == RUNNING
                and blocker.num_output_tokens - blocker.num_generated_tokens < _MIN_RUN):
            return False  # a running request completes within _MIN_RUN steps: no run (O(1) check)
        reqs = batch.requests
        b = len(reqs)
        k = math.inf
        next_arrival = self._next_arrival_time_s()
        if next_arrival < math.inf:  # checked first: O(1), and most steps under load stop here
            # step times only grow within a run: this bounds the steps before the next arrival
            first = self.cost_models[rid].step_time_s(0, b, batch.decode_context_tokens, 0)
            if now + (_MIN_RUN - 1) * first >= next_arrival:
                return False
            if first > 0:  # no more steps than fit before the arrival at the first one's duration, plus one
                k = int((next_arrival - now) / first) + 2
        first_done = min(reqs, key=lambda r: r.num_output_tokens - r.num_generated_tokens)
        k = min(k, first_done.num_output_tokens - first_done.num_generated_tokens)
        if k < _MIN_RUN:
            self._run_blocker[rid] = first_done  # skip the O(B) scan until it completes
            return False
        kv = state.kv
        computed = np.fromiter((r.num_computed_tokens for r in reqs), np.int64, b)
        held = np.fromiter((r.num_blocks for r in reqs), np.int64, b)
        bs = kv.block_size

        def new_blocks(steps: int) -> int:
            return int(np.maximum(0, -(-(computed + steps) // bs) - held).sum())

        if new_blocks(k) > kv.num_free_blocks:  # stop before a step that would need preemption
            lo, hi = 1, k
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if new_blocks(mid) <= kv.num_free_blocks else (lo, mid - 1)
            k = lo
            if k <= 1:
                return False
        ctx = batch.decode_context_tokens + b * np.arange(k, dtype=np.int64)
        durations = self.cost_models[rid].step_time_s(np.zeros(k, np.int64), np.full(k, b, np.int64), ctx,
                                                      np.zeros(k, np.int64))
        ends = np.cumsum(np.concatenate(([now], durations)))[1:]
        if not ends[-1] < math.inf:
            _not_finite(rid, now, float(ends[-1] - now))
        if next_arrival < math.inf:  # the step ending at/after the next arrival is the last
            j = int(np.searchsorted(ends, next_arrival, side="left"))
            if j + 1 < k:
                k = j + 1
                if k <= 1:
                    return False
        ends, durations = ends[:k], durations[:k]
        for r in reqs:
            kv.allocate(r, k)
        batch.run_end_times_s = ends.tolist()
        self._busy[rid] = True
        self._batches[rid] = batch
        if self.config.record_steps:
            self.steps.extend((rid, s, d, 0, 0, b, int(c), 0) for s, d, c in
                              zip([now, *batch.run_end_times_s[:-1]], durations.tolist(), ctx[:k].tolist()))
            if self.config.record_step_requests:
                ids = [r.request_id for r in reqs]
                self.step_requests.extend([ids] * k)
        self.num_steps += k
        self._push(batch.run_end_times_s[-1], _STEP_END, rid)
        return True

    def _next_arrival_time_s(self) -> float:
        """Earliest time a request can still arrive, seconds (``inf``: none): the next of
        :meth:`run`'s list or :attr:`arrival_bound`, whichever is first."""
        t = self._next_list_arrival_s
        return t if self.arrival_bound is None else min(t, self.arrival_bound())

    def completion_bound_s(self, min_step_s: float = 0.0) -> float:
        """A time before which no request can complete on another replica, seconds (``inf``: none).

        Meant for a replica starting a step (its own step end is not pending yet). A pending
        callback or wake-up at ``T`` bounds at ``T``. A replica's pending step end ``X``
        bounds at ``X`` if the step emits some request's last token, else at
        ``X + s * min_step_s``, ``s`` the fewest steps a request it holds (batch, running or
        waiting) still needs after ``X``: a step emits at most one token per request (``K + 1``
        under speculative decoding) and lasts at least ``min_step_s``. Requests arriving later
        complete later still.

        Parameters
        ----------
        min_step_s : float
            A lower bound on the duration of any step, seconds (0: the step end itself).
        """
        bound = math.inf
        for time, kind, _, payload in self._heap:
            if time < bound:
                if kind != _STEP_END or min_step_s <= 0:
                    bound = time
                else:
                    left = self._tokens_left_after_step(payload)
                    steps = -(-left // (self.spec_tokens + 1)) if self.spec_tokens else left
                    bound = min(bound, time + min_step_s * steps)
        return bound

    def _tokens_left_after_step(self, rid: int) -> int:
        """Fewest output tokens a request held by replica ``rid`` must emit after its pending step."""
        state, batch = self.replicas[rid], self._batches[rid]
        if batch.run_end_times_s is not None:
            k = len(batch.run_end_times_s)
            left = min(r.num_output_tokens - r.num_generated_tokens - k for r in batch.requests)
        elif self.spec_tokens:  # a decode feeding n positions emits up to n tokens
            left = min(r.num_output_tokens - r.num_generated_tokens
                       - (n if r.num_generated_tokens and r.num_uncomputed_tokens == 1 else
                          r.num_computed_tokens + n >= r.num_prompt_tokens + r.num_generated_tokens)
                       for r, n in zip(batch.requests, batch.num_new_tokens))
        else:
            left = min(r.num_output_tokens - r.num_generated_tokens
                       - (r.num_computed_tokens + n >= r.num_prompt_tokens + r.num_generated_tokens)
                       for r, n in zip(batch.requests, batch.num_new_tokens))
        # the batch is part of running: when it is all of it only the waiting requests remain
        for queue in (state.waiting,) if len(batch.requests) == len(state.running) else (state.running, state.waiting):
            for r in queue:
                left = min(left, r.num_output_tokens - r.num_generated_tokens)
        return left

    def _lazy_decodes_ok(self, rid: int) -> bool:
        """Whether replica ``rid`` may keep steady decoders implicit (:class:`LazyDecodes`):
        a plain paged cache, recompute preemption, a policy that declares
        ``implicit_decoders = True`` on its own class (it reads running requests only through
        ``schedule_running`` and, with nothing waiting, schedules just that batch), no per-step
        request lists, no closed-loop hooks and no speculative decoding (a decode then emits a
        random number of tokens, not one per step)."""
        from .kv_cache import KVCache

        cfg = self.config
        return (not cfg.exact_steps and not self.spec_tokens and not cfg.record_step_requests
                and cfg.preemption_mode == "recompute"
                and self.arrival_bound is None and self.on_request_done is None
                and type(self.replicas[rid].kv) is KVCache
                and type(self.schedulers[rid]).__dict__.get("implicit_decoders", False))

    def _finish(self, state: ReplicaState, done: list[Request], now: float) -> None:
        """Drop the requests that emitted their last token at ``now`` from ``running``; call the hook."""
        for req in done:
            state.remove_running(req)
        if self.on_request_done is not None:
            for req in done:
                self.on_request_done(req, now)

    def _end_step(self, rid: int, now: float) -> None:
        state = self.replicas[rid]
        batch = self._batches[rid]
        kv = state.kv
        lazy = state.lazy
        # requests that emit their last token in this step (implicit decoders come back freed)
        done = lazy.end_step(state, batch, now) if lazy is not None else []
        if batch.run_end_times_s is not None:  # a closed-form run of identical decode steps
            ends = batch.run_end_times_s
            k = len(ends)
            for req in batch.requests:
                req.num_computed_tokens += k
                req.num_generated_tokens += k
                req.last_token_time_s = now
                if req.token_times_s is not None:
                    req.token_times_s.extend(ends)
                if req.num_generated_tokens == req.num_output_tokens:
                    req.status = OK
                    kv.free(req)
                    done.append(req)
        elif batch.requests and self.spec_tokens:
            self._end_spec_step(rid, batch, kv, now, done)
        elif batch.requests:
            for req, n in zip(batch.requests, batch.num_new_tokens):
                c = req.num_computed_tokens = req.num_computed_tokens + n
                g = req.num_generated_tokens
                if c < req.num_prompt_tokens + g:
                    continue  # an intermediate prefill chunk emits nothing
                g = req.num_generated_tokens = g + 1
                if g == 1:
                    req.first_token_time_s = now
                req.last_token_time_s = now
                if req.token_times_s is not None:
                    req.token_times_s.append(now)
                if g == req.num_output_tokens:
                    req.status = OK
                    kv.free(req)
                    done.append(req)
        if done:
            self._finish(state, done, now)
        if lazy is not None and lazy.count < len(state.running):
            lazy.admit_decoders(state)

    # -- speculative decoding ---------------------------------------------------------------------
    def _check_spec_cost_models(self) -> None:
        """Refuse a cost model that cannot price the draft positions (no ``num_decode_tokens``)."""
        import inspect

        for model in {id(cm): cm for cm in self.cost_models}.values():
            try:
                params = inspect.signature(model.step_time_s).parameters
            except (TypeError, ValueError):
                continue
            if "num_decode_tokens" not in params and not any(p.kind == p.VAR_KEYWORD for p in params.values()):
                raise ConfigError(f"--speculative-tokens: the cost model {type(model).__name__} has no "
                                  "num_decode_tokens argument, so it cannot price the verified draft tokens")

    def sample_accepted_drafts(self, rid: int, drafts: list) -> list:
        """Accepted draft tokens of the decodes of one step of replica ``rid``: for the ``i``-th,
        the leading successes of ``drafts[i]`` Bernoulli(``spec_acceptance_rate``) trials.

        vLLM's rejection sampler accepts a prefix of the drafts: the first rejected draft ends
        it (its position gets the target model's token instead, the "+ 1"). The count is
        ``min(G, drafts[i])`` with ``G`` geometric (failures before the first success at
        rate ``1 - A``), drawn from the replica's seeded generator, one draw per decode.

        Notes
        -----
        With per-draft acceptance ``A`` and ``K`` drafts, the mean tokens per verify step
        (vLLM's "mean acceptance length") is ``(1 - A^(K+1)) / (1 - A)`` and the fraction of
        drafts accepted (vLLM's "draft acceptance rate") ``A (1 - A^K) / (K (1 - A))``, below ``A``.
        """
        a = self.config.spec_acceptance_rate
        if a >= 1.0:
            return list(drafts)
        if a <= 0.0:
            return [0] * len(drafts)
        g = self._rngs[rid].geometric(1.0 - a, len(drafts)) - 1
        return np.minimum(g, drafts).tolist()

    def _end_spec_step(self, rid: int, batch: Batch, kv, now: float, done: list) -> None:
        """Emit the tokens of a step with speculative decodes (explicit requests only).

        A decode that fed ``n`` positions (its next token and ``n - 1`` drafts) emits ``1 + a``
        tokens, ``a`` the accepted drafts (:attr:`accept_drafts`), all at ``now``; its KV keeps
        the accepted positions (the rejected ones' slots are reused later, its blocks kept, as
        vLLM). A prefill chunk emits the first token (or nothing) as without speculation.
        """
        reqs, nnt = batch.requests, batch.num_new_tokens
        decodes = [i for i, r in enumerate(reqs) if r.num_generated_tokens and r.num_uncomputed_tokens == 1]
        accepted = [0] * len(reqs)
        verifying = [i for i in decodes if nnt[i] > 1]
        if verifying:
            drafts = [nnt[i] - 1 for i in verifying]
            got = self.accept_drafts(rid, drafts)
            counts = self.spec_counts
            for i, d, a in zip(verifying, drafts, got):
                if not 0 <= a <= d:
                    raise AssertionError(f"accept_drafts gave {a} accepted of {d} drafts")
                accepted[i] = a
                c = counts.get(reqs[i].index)
                if c is None:
                    counts[reqs[i].index] = [1, d, a]
                else:
                    c[0] += 1
                    c[1] += d
                    c[2] += a
        is_decode = [False] * len(reqs)
        for i in decodes:
            is_decode[i] = True
        for req, n, dec, a in zip(reqs, nnt, is_decode, accepted):
            g = req.num_generated_tokens
            if dec:
                e = 1 + a
                req.num_computed_tokens += e
            else:
                c = req.num_computed_tokens = req.num_computed_tokens + n
                if c < req.num_prompt_tokens + g:
                    continue  # an intermediate prefill chunk emits nothing
                e = 1
            g = req.num_generated_tokens = g + e
            if g == e:
                req.first_token_time_s = now
            req.last_token_time_s = now
            if req.token_times_s is not None:
                req.token_times_s.extend([now] * e)
            if g == req.num_output_tokens:
                req.status = OK
                kv.free(req)
                done.append(req)


def _counted(arrive_next, progress, every: int = 1024):
    """``arrive_next`` that advances ``progress`` by ``every`` arrivals at a time."""
    count = 0

    def counted() -> None:
        nonlocal count
        arrive_next()
        count += 1
        if count == every:
            progress.update(count)
            count = 0
    return counted


def _counted_finish(finish, progress):
    """``Engine._finish`` that advances ``progress`` by the requests completed."""
    def counted(state, done, now) -> None:
        finish(state, done, now)
        progress.update(len(done))
    return counted

def _not_finite(rid: int, now: float, duration: float):
    """Raise for a step whose duration is not a finite number of seconds."""
    raise ReplayError(f"a step of replica {rid} at t={now:.6g} s would last {duration!r} s: the cost model's "
                      "parameters are out of range (check the calibration's fitted values)")
