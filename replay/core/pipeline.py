"""Pipeline parallelism (vLLM ``--pipeline-parallel-size``): micro-batches in flight through stages.

A replica of ``tp x pp`` GPUs is ``pp`` stages, each holding ``1 / pp`` of the layers. The
engine models it as vLLM v0 runs it: the replica has ``pp`` **virtual engines**, each with its
own scheduler, waiting and running queues, ``max_num_seqs`` and ``1 / pp`` of the KV blocks
(``vllm/core/scheduler.py``: ``num_gpu_blocks //= pipeline_parallel_size``), and each keeps at
most one batch (micro-batch) in the pipeline: it schedules its next batch only when its last
one has left the last stage. So up to ``pp`` micro-batches are in flight, and a request is in
at most one of them. An arriving request goes to the virtual engine with the fewest unfinished
requests (``LLMEngine._add_processed_request``). Vidur (Agrawal et al., MLSys 2024) models the
same pipeline with ``num_pipeline_stages`` and its replica stage scheduler, DistServe (Zhong et
al., OSDI'24) with ``pp_prefill``/``pp_decode`` per pool.

The timeline of a micro-batch of ``N`` tokens whose stage time is ``t`` (the cost model's
:meth:`~replay.cost.cost_model.RooflineCostModel.step_time_s` of ``1 / pp`` of the layers) and whose
activation transfer between two stages is ``x = latency + N h b / bandwidth``
(:meth:`~replay.cost.cost_model.RooflineCostModel.pp_transfer_s`)::

    enter stage 1 at s_1 = when its virtual engine schedules it and stage 1 is free
    e_k = s_k + t,   s_k = max(e_(k-1) + x, when stage k is free)        k = 2 .. pp
    its tokens are emitted at e_pp (= s_1 + pp t + (pp - 1) x when no stage is busy)

Stage ``k`` is then busy until ``e_k``: a new micro-batch enters stage 1 as soon as it is free,
so with the pipeline full the replica completes one micro-batch per stage time (less the
bubble of the transfers: each virtual engine waits for its own batch, ``pp t + (pp - 1) x``).
A step-trace row of a pipelined replica is a micro-batch's pass through stage 1 (its start and
``t``), so the rows of a replica never overlap.

Host time: each stage pays the per-step and per-sequence host time of the micro-batch it runs
(``t_step_s``, ``t_seq_s``: the cost model's stage time holds them whole), as each stage's worker
runs its own forward pass and launches; the per-layer terms are divided by ``pp``. Charged once per
micro-batch on one serial driver instead, DistServe's decode (terms fitted on its 7.5 req/s PP 1
run) would make PP 2 0.63x PP 1's TPOT at 4.5 req/s, where its measured runs give 0.80 (42.7 ms
at 4 req/s against 53.1 ms; per stage: 0.80), and its 12 req/s PP 2 run's TTFT p90 -98 % instead
of -16 % (docs/disaggregation.md).

Every pipelined replay takes the exact path (``EngineConfig.exact_steps``: every step through
the event heap, every request explicit): the implicit decoders and the closed-form decode runs
assume a step ends ``duration`` after it starts, which a busy stage breaks. ``--exact-steps``
and the fast path then agree by construction.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from schemas.step_record import step_features

from .disagg import DisaggEngine
from .engine import Engine
from .events import STEP_END, WAKE, not_finite_step
from .routing import RoundRobinRouter, replica_load

if TYPE_CHECKING:
    from ..cost.cost_model import StepCostModel

    class PipelinedCostModel(StepCostModel, Protocol):
        """A cost model of a pipelined replica: a stage's step time and the transfer between stages."""

        def pp_transfer_s(self, num_tokens: int) -> float:
            """Time of one stage-to-stage activation transfer of ``num_tokens`` tokens, seconds."""
            ...

    # the mixin reads and overrides the engine's attributes and methods: typed as an Engine, a plain class at run time
    _EngineBase = Engine
else:
    _EngineBase = object


def _no_transfer(num_tokens: int) -> float:
    """The stage-to-stage transfer of a replica of one stage: none (0 s; no stage boundary)."""
    return 0.0


class _Sized:
    """``len()`` of one queue of several virtual engines at once (what a router reads of a
    pipelined replica), read anew each time (a policy may replace ``state.waiting``)."""

    __slots__ = ("members", "name")

    def __init__(self, members, name: str):
        self.members, self.name = members, name

    def __len__(self) -> int:
        return sum(len(getattr(m, self.name)) for m in self.members)


class _GroupKV:
    """The prefix-cache view of a pipelined replica: the best match among its virtual engines."""

    __slots__ = ("members",)

    def __init__(self, members):
        self.members = members

    def num_resident_prefix_blocks(self, req) -> int:
        return max(m.kv.num_resident_prefix_blocks(req) for m in self.members)


class ReplicaGroupView:
    """What a router sees of one pipelined replica: its virtual engines' ``waiting``,
    ``running`` (sized together) and ``kv`` (the longest resident prefix among them)."""

    def __init__(self, replica_id: int, members: list):
        self.replica_id = replica_id
        self.members = members
        self.waiting = _Sized(members, "waiting")
        self.running = _Sized(members, "running")
        self.kv = _GroupKV(members)


class PipelineMixin(_EngineBase):
    """The pipeline over an :class:`~replay.core.engine.Engine`'s replicas (module docstring).

    The engine's replicas are the virtual engines; consecutive ones form a pipelined replica
    (a *group*). Set up by :meth:`_setup_pipeline`; overrides where a step starts and ends
    (:meth:`_start_step`), the routing of arrivals to a group then a virtual engine, and the
    replica id a request, a step row or a transfer reports (the group's).
    """

    def _setup_pipeline(self, groups: list[tuple[int, int, PipelinedCostModel]], arrival_groups: int,
                        router=None) -> None:
        """``groups``: ``(pp, virtual engines, cost model)`` per replica in replica-id order (the
        virtual engines are the next ``pp`` of :attr:`replicas`); arrivals go to the first
        ``arrival_groups`` of them, chosen by ``router`` (round robin by default)."""
        self.group_of: list[int] = []  # the replica (group) of each virtual engine
        self._stage_free: list[list[float]] = []  # per group, when each stage is free, s
        self._transfer_s: list[Callable[[int], float]] = []  # per group, tokens -> stage-to-stage transfer, s
        self._group_members: list[list[int]] = []  # per group, its virtual engines
        for g, (pp, count, cost_model) in enumerate(groups):
            first = len(self.group_of)
            self.group_of.extend([g] * count)
            self._group_members.append(list(range(first, first + count)))
            self._stage_free.append([float("-inf")] * pp)
            self._transfer_s.append(cost_model.pp_transfer_s if pp > 1 else _no_transfer)
        assert len(self.group_of) == len(self.replicas), "one group entry per virtual engine"
        self._views = [ReplicaGroupView(g, [self.replicas[v] for v in self._group_members[g]])
                       for g in range(arrival_groups)]
        self._group_router = router or RoundRobinRouter()

    def process_names(self) -> list[str]:
        """Names of the replicas (groups) for the Chrome trace."""
        return [f"replica {g}" for g in range(len(self._stage_free))]

    def _route(self, req) -> int:
        g = self._group_router(req, self._views) if len(self._views) > 1 else 0
        members = self._group_members[g]
        # vLLM v0: the virtual engine with the fewest unfinished requests (ties: the first)
        return min(members, key=lambda v: (replica_load(self.replicas[v]), v))

    def arrive(self, req, now: float) -> None:
        super().arrive(req, now)
        req.replica_id = self.group_of[req.replica_id]  # the replica, not its virtual engine

    def _start_step(self, rid: int, now: float, batch=None) -> None:
        """Schedule virtual engine ``rid``'s next micro-batch at ``now`` and push its exit from
        the last stage (module docstring); when stage 1 is busy, try again when it frees. ``batch``
        is always None (the exact path has no implicit decoders to repeat)."""
        g = self.group_of[rid]
        free = self._stage_free[g]
        if free[0] > now:  # stage 1 holds another virtual engine's micro-batch
            self._push(free[0], WAKE, rid)
            return
        state = self.replicas[rid]
        batch = self.schedulers[rid].schedule(now, state)
        swap_s = 0.0
        if state.num_swap_blocks:  # each stage's GPUs move their share of the KV during its pass
            swap_s = state.num_swap_blocks * self.config.swap_time_per_block_s
            state.num_swap_blocks = 0
        if not batch.requests:
            self._busy[rid] = False
            self._batches[rid] = None
            return
        step_time_s = self.cost_models[rid].step_time_s
        if self.spec_tokens:
            t = step_time_s(batch.num_prefill_tokens, batch.num_decode_seqs, batch.decode_context_tokens,
                            batch.prefill_context_tokens, batch.num_prefill_seqs,
                            num_decode_tokens=batch.num_decode_seqs + batch.num_spec_tokens)
        else:
            t = step_time_s(batch.num_prefill_tokens, batch.num_decode_seqs, batch.decode_context_tokens,
                            batch.prefill_context_tokens, batch.num_prefill_seqs)
        duration = t + swap_s
        end = now + duration  # the end of stage 1 (of the step, at pp 1)
        free[0] = end
        if len(free) > 1:
            x = self._transfer_s[g](batch.num_tokens)
            for k in range(1, len(free)):
                start = end + x
                if free[k] > start:
                    start = free[k]
                end = free[k] = start + duration
        self._batches[rid] = batch
        if self.config.record_steps:
            self.steps.append((g, now, duration) + step_features(batch))
            if self.config.record_step_requests:
                self.step_requests.append([r.request_id for r in batch.requests])
        self.num_steps += 1
        if not end < float("inf"):
            not_finite_step(g, now, end - now)
        self._push(end, STEP_END, rid)


class PipelineEngine(PipelineMixin, Engine):
    """:class:`~replay.core.engine.Engine` with ``num_replicas`` pipelined replicas of ``pp`` stages.

    ``engine_config.num_gpu_blocks`` is one virtual engine's cache (the replica's blocks
    ``// pp``) and ``engine_config.exact_steps`` must be set (module docstring); ``router``
    chooses the replica of an arrival among views of them (:class:`ReplicaGroupView`).
    """

    def __init__(self, cost_model, scheduler_factory, scheduler_config, engine_config, num_replicas: int = 1,
                 pp: int = 2, router=None):
        assert engine_config.exact_steps, "a pipelined replay takes the exact path"
        super().__init__(cost_model, scheduler_factory, scheduler_config, engine_config, num_replicas * pp)
        self._setup_pipeline([(pp, pp, cost_model)] * num_replicas, num_replicas, router)


class PipelineDisaggEngine(PipelineMixin, DisaggEngine):
    """:class:`~replay.core.disagg.DisaggEngine` whose prefill and/or decode instances are pipelined
    (``pp_prefill``, ``pp_decode`` stages; DistServe's per-pool pipeline parallelism).

    ``prefill_replicas`` and ``decode_replicas`` count instances; each has ``pp`` virtual engines
    (the block counts given are one virtual engine's). A finished prompt's KV goes to the decode
    virtual engine with the fewest waiting + running + inbound requests of those that accept it
    (:meth:`DisaggEngine._pull`, over virtual engines); the result and the step trace
    number instances as without pipelining (prefill ``0 .. P-1``, decode ``P .. P+D-1``).
    """

    def __init__(self, prefill_cost_model, decode_cost_model, scheduler_config, engine_config, *,
                 prefill_replicas: int = 1, decode_replicas: int = 1, pp_prefill: int = 1, pp_decode: int = 1,
                 router=None, **kwargs):
        assert engine_config.exact_steps, "a pipelined replay takes the exact path"
        super().__init__(prefill_cost_model, decode_cost_model, scheduler_config, engine_config,
                         prefill_replicas=prefill_replicas * pp_prefill, decode_replicas=decode_replicas * pp_decode,
                         **kwargs)
        self._setup_pipeline([(pp_prefill, pp_prefill, prefill_cost_model)] * prefill_replicas
                             + [(pp_decode, pp_decode, decode_cost_model)] * decode_replicas,
                             prefill_replicas, router)
        self.num_prefill_instances = prefill_replicas

    def process_names(self) -> list[str]:
        p = self.num_prefill_instances
        return [f"prefill {g}" if g < p else f"decode {g}" for g in range(len(self._stage_free))]

    def _instance_of(self, i: int) -> list[int]:
        """The virtual engines of decode entry ``i``'s instance: DistServe's pipelined decode instance
        has one scheduler over its pp batch queues, so its acceptance share is the instance's."""
        p = self.num_prefill_replicas
        g = self.group_of[p + i]
        return [j - p for j in range(p, len(self.replicas)) if self.group_of[j] == g]

    def _migration_start_s(self, i: int, now: float) -> float:
        """A pipelined decode instance migrates only once every stage has passed the micro-batches it
        holds: DistServe's ``_migrate_blocks`` is a call to every stage's worker (a Ray actor, running
        its calls in order, so after the ``step`` calls queued before it) and the loop awaits them all,
        so the pipeline drains before each migration (LLMServe/DistServe ``engine.py``/``worker.py``)."""
        free = self._stage_free[self.group_of[self.num_prefill_replicas + i]]
        return max(super()._migration_start_s(i, now), max(free))

    def _hold_loop(self, rid: int, until_s: float) -> None:
        """The instance's driver loop is busy until ``until_s``: no micro-batch enters its stage 1 before."""
        free = self._stage_free[self.group_of[rid]]
        free[0] = max(free[0], until_s)

    def _start_transfer(self, req, src: int, dst: int, now: float) -> None:
        super()._start_transfer(req, src, dst, now)
        t = self.transfers[req.index]
        t.prefill_replica_id, t.decode_replica_id = self.group_of[t.prefill_replica_id], \
            self.group_of[t.decode_replica_id]
