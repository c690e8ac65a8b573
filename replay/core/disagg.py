"""Prefill/decode disaggregation (``--scheduler disagg``): two pools of instances and a KV link.

Prompts run on a pool of prefill instances, output tokens on a pool of decode instances;
when a prompt is done its KV cache moves to a decode instance over a link (DistServe,
Zhong et al., OSDI'24; Splitwise, Patel et al., ISCA'24). Each pool has its own scheduler
(:mod:`replay.schedulers.disagg`), KV cache, tensor-parallel degree and cost model; the
discrete-event loop, batching, KV accounting and token bookkeeping are the
:class:`~replay.core.engine.Engine`'s, reused through its hooks (per-replica cost models,
``on_step_end``, ``call_at``, ``enqueue``).
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from functools import partial

import numpy as np

from schemas.specs import ModelSpec
from schemas.status import OK, REJECTED, TRANSFERRING, WAITING, because

from ..cost.cost_model import Link, StepCostModel, kv_transfer_time_function
from .engine import Engine
from .engine_config import EngineConfig
from ..errors import ConfigError
from .kv_cache import make_kv_cache
from .request import Request
from .result_columns import transfer_columns
from .routing import RoundRobinRouter, replica_load
from ..schedulers.base import SchedulerConfig
from ..schedulers.disagg import FIRST_TOKEN_FROM, DecodeScheduler, PrefillScheduler

#: How a finished prompt's KV reaches a decode instance (``--kv-handoff``).
KV_HANDOFFS = ("pull", "prealloc", "push")
#: DistServe's decode side accepts a finished prompt only while the prompts it accepted and has not
#: yet batched hold less than this share of its KV blocks (``waiting_block_prop_threshold``, set to
#: 0.05 by its API server and examples; LLMServe/DistServe ``decoding_stage_scheduler.py``).
PULL_WAITING_SHARE = 0.05


@dataclass(slots=True)
class Transfer:
    """The KV transfer of one request and its hand-over to a decode instance.

    Attributes
    ----------
    prefill_replica_id, decode_replica_id : int
        Source and destination instances (decode ids are ``P .. P + D - 1``).
    start_time_s, end_time_s : float
        Absolute times the transfer starts (the prompt's last step ends) and ends, seconds.
    decode_admitted_time_s : float
        Absolute time the decode instance first admitted the request (NaN until then), seconds.
    """

    prefill_replica_id: int
    decode_replica_id: int
    start_time_s: float
    end_time_s: float
    decode_admitted_time_s: float = math.nan


class DisaggEngine(Engine):
    """Replays requests through P prefill instances and D decode instances joined by a link.

    Parameters
    ----------
    prefill_cost_model, decode_cost_model : StepCostModel
        Step time of one instance of each pool (each with its own tensor-parallel degree).
    scheduler_config : SchedulerConfig
        ``max_num_seqs`` and ``max_num_batched_tokens`` of every instance.
    engine_config : EngineConfig
        Engine settings; ``num_gpu_blocks`` is the KV cache of a prefill instance (with prefix
        caching when ``enable_prefix_caching``).
    decode_num_gpu_blocks : int
        KV blocks of a decode instance (no prefix caching: its KV comes over the link).
    model : ModelSpec
        Gives ``D_kv``, the KV bytes per token moved over the link.
    link : Link
        Interconnect between a prefill and a decode instance.
    prefill_replicas, decode_replicas : int
        P and D (>= 1). Instance ids: prefill ``0 .. P-1``, decode ``P .. P+D-1`` (step
        trace ``replica_id``).
    first_token_from : {"prefill", "decode"}
        Which instance emits output token 1 (see Notes).
    kv_handoff : {"pull", "prealloc", "push"}
        ``pull`` (DistServe, the default): a finished prompt waits, its KV still in the prefill
        instance's cache, until a decode instance has room for it (see Notes); ``prealloc`` (SGLang's
        decode-side pre-allocation, and vLLM/Dynamo P/D connectors where the decode side allocates
        first): an arriving request waits, in arrival order, until a decode instance's free blocks,
        less those reserved for requests it has not batched yet, hold its prompt; it is reserved there
        and only then queued for prefill, and its KV moves there as soon as its prompt ends;
        ``push``: its KV moves at once to the least-loaded decode instance, which holds it outside its
        cache until it admits the request (an unbounded receive buffer: no engine we know of; the
        replay before issue #34, kept to compare with).
    router : callable (Request, list[ReplicaState]) -> int, optional
        Chooses the prefill instance of an arrival among the P prefill instances (default:
        round robin). Decode instances are chosen least loaded.

    Attributes
    ----------
    transfers : dict[int, Transfer]
        By request index (row of the trace), every request whose KV moved.

    Notes
    -----
    A request's life, times absolute (DistServe section 2; Splitwise section 4):

    1. arrival -> admitted by a prefill instance: the prefill queue wait (``pred_queue_wait_s``);
    2. prefill: chunked prefill-only steps (:class:`~replay.schedulers.disagg.PrefillScheduler`)
       until the prompt's last chunk ends at ``t_p``;
    3. with ``kv_handoff="pull"`` the request waits from ``t_p`` in a queue of finished prompts
       (DistServe's "unaccepted" queue, first come first served) until a decode instance accepts
       it: when the prompts it accepted and has not batched yet hold less than
       :data:`PULL_WAITING_SHARE` of its blocks and its free blocks, less those accepted prompts'
       blocks, hold this prompt; its KV blocks stay allocated on the prefill instance meanwhile, so
       a prefill instance full of finished prompts admits no new one and the queue forms in front
       of prefill. DistServe's decode loop accepts only between its steps (``post_process``, after a
       step's output and before the next batch) or while idle, so a prompt that ends during a decode
       step waits for that step's end;
    4. KV transfer over ``link``, from ``t_s`` to ``t_x = t_s + T_transfer`` with the seed's
       (theory.md section 2)::

           T_transfer = L_prompt * D_kv / link_bw + link_latency

       With ``pull`` the decode loop migrates what it accepted one request at a time and awaits
       each (DistServe's ``_migrate_blocks``: a blocking call to every worker), so ``t_s`` is the
       acceptance or the end of the instance's previous migration and its stages' micro-batches
       (:meth:`_migration_start_s`), and it starts no step (a pipelined one admits no micro-batch into its
       first stage) before its last migration ends; ``pred_handoff_wait_s`` runs from ``t_p`` to ``t_s``.
       With ``prealloc`` and ``push`` the transfers run beside the decode steps and ``t_s`` is ``t_p``.
       The KV stays in the prefill instance's cache until ``t_x``; each transfer gets the whole link.
    5. decode queue: from ``t_x`` the request waits in the decode instance's queue
       (``pred_decode_queue_wait_s``) until that instance admits it, when its KV blocks
       (prompt + next token) are free and fewer than ``max_num_seqs`` run; the received KV
       is held outside the decode cache until then.
    6. decode: continuous batching (:class:`~replay.schedulers.disagg.DecodeScheduler`),
       one token per step, until the last token.

    With ``first_token_from="prefill"`` (DistServe) token 1 is emitted at ``t_p``:
    TTFT = prefill queue + prefill; the first inter-token gap holds the transfer, the decode
    queue and the first decode step. A one-token request ends at ``t_p`` and moves no KV.
    With ``first_token_from="decode"`` (vLLM's disaggregated prefill) the decode instance's
    first step feeds the last prompt token and emits token 1: TTFT = prefill queue + prefill
    + transfer + decode queue + that step. Either way every component counts once, and
    E2E = TTFT + the inter-token gaps.
    """

    def __init__(self, prefill_cost_model: StepCostModel, decode_cost_model: StepCostModel,
                 scheduler_config: SchedulerConfig, engine_config: EngineConfig, *, decode_num_gpu_blocks: int,
                 model: ModelSpec, link: Link, prefill_replicas: int = 1, decode_replicas: int = 1,
                 first_token_from: str = "prefill", router=None, kv_handoff: str = "pull"):
        if prefill_replicas < 1 or decode_replicas < 1:
            raise ConfigError("--prefill-replicas and --decode-replicas must be >= 1")
        if first_token_from not in FIRST_TOKEN_FROM:
            raise ConfigError(f"--first-token-from must be prefill or decode, not {first_token_from!r}")
        if decode_num_gpu_blocks < 1:
            raise ConfigError("the decode instances' KV cache must hold at least one block")
        if kv_handoff not in KV_HANDOFFS:
            raise ConfigError(f"--kv-handoff must be one of {', '.join(KV_HANDOFFS)}, not {kv_handoff!r}")
        p, d = prefill_replicas, decode_replicas
        super().__init__(prefill_cost_model, DecodeScheduler, scheduler_config, engine_config, p + d)
        self._prefill_router, self._prefill_states = router or RoundRobinRouter(), self.replicas[:p]
        self.num_prefill_replicas, self.num_decode_replicas = p, d
        self.model, self.link, self.first_token_from = model, link, first_token_from
        self._transfer_time_s = kv_transfer_time_function(model, link)  # the link's seconds for L prompt tokens
        self.prefill_cost_model, self.decode_cost_model = prefill_cost_model, decode_cost_model
        self.cost_models = [prefill_cost_model] * p + [decode_cost_model] * d
        self.prefill_schedulers = [PrefillScheduler(first_token_from) for _ in range(p)]
        self.schedulers = [*self.prefill_schedulers, *(DecodeScheduler(self._decode_inputs_pending) for _ in range(d))]
        for state in self.replicas[p:]:
            state.kv = make_kv_cache(decode_num_gpu_blocks, engine_config.block_size)
        self.transfers: dict[int, Transfer] = {}
        self._inbound = [0] * d          # transfers in flight to each decode instance
        self._unadmitted = [0] * d       # transferred requests each decode instance has not admitted yet
        self._num_in_flight = 0
        self.kv_handoff = kv_handoff
        self._unaccepted: deque = deque()  # pull: (request, prefill instance, time its prompt ended)
        self._accepted_blocks = [0] * d    # pull, prealloc: blocks accepted or reserved there, not batched yet
        self._handoff_wait: dict[int, float] = {}
        self._prealloc: deque = deque()    # prealloc: (request, arrival time) waiting for a reservation
        self._migrated_until_s = [-math.inf] * d  # pull: each decode entry's loop migrates KV until then, s
        self._step_ended = -1              # pull: the decode replica whose step end is being handled
        self._reserved_at: dict[int, int] = {}  # prealloc: request index -> decode instance (0-based in the pool)
        self.on_step_end = self._after_step

    def rejection_reason(self, req: Request) -> str | None:
        """Why ``req`` can never run (``None`` if it can): beyond ``max_model_len`` (as
        :meth:`Engine.rejection_reason`), its prompt's KV over a prefill instance's cache, or its peak KV
        (prompt + output - 1 tokens) over a decode instance's."""
        total = req.num_prompt_tokens + req.num_output_tokens
        if self.config.max_model_len is not None and total > self.config.max_model_len:
            return because(REJECTED, "exceeds max_model_len")
        pkv, dkv = self.replicas[0].kv, self.replicas[self.num_prefill_replicas].kv
        if pkv.blocks_for(req.num_prompt_tokens) > pkv.num_gpu_blocks:
            return because(REJECTED, "exceeds KV cache capacity (prefill instance)")
        if dkv.blocks_for(req.peak_kv_tokens) > dkv.num_gpu_blocks:
            return because(REJECTED, "exceeds KV cache capacity (decode instance)")
        return None

    # -- hooks ----------------------------------------------------------------------------------
    def _decode_inputs_pending(self) -> bool:
        """Whether a request could reach a decode instance before the next trace arrival, or (``prealloc``) an
        admission there is noted only at its step's end, not a run's (an arrival's reservation reads its blocks)."""
        return (self._num_in_flight > 0 or bool(self._unaccepted) or bool(self._prealloc)
                or any(self._busy[:self.num_prefill_replicas])
                or (self.kv_handoff == "prealloc" and any(self._unadmitted)))

    def _route(self, req: Request) -> int:
        """An arrival's prefill instance: the router's choice among the P prefill instances."""
        return self._prefill_router(req, self._prefill_states)

    def arrive(self, req: Request, now: float) -> None:
        """An arrival; with ``prealloc`` it first waits for a decode instance's reservation (:meth:`_reserve`)."""
        if self.kv_handoff != "prealloc":
            super().arrive(req, now)
            return
        self._prealloc.append((req, now))
        self._reserve(now)

    def _reserve(self, now: float) -> None:
        """``prealloc``: reserve, in arrival order, a decode instance (the least loaded of those whose free
        blocks, less the blocks reserved there, hold the prompt) for each waiting request, and queue it
        for prefill; stop at the first none can hold."""
        while self._prealloc:
            taken = self._take_head(self._prealloc, self._room, now)
            if taken is None:
                return
            (req, _), i = taken
            self._reserved_at[req.index] = i
            super().arrive(req, now)

    def _take_head(self, queue: deque, admits, now: float):
        """The head of ``queue`` (a tuple whose first item is the request and last the time it began
        waiting) with the least-loaded decode entry that ``admits(i, request)``, taken off the queue:
        its prompt's blocks counted there, its wait recorded; None when no entry admits it."""
        req, since = queue[0][0], queue[0][-1]
        open_ = [i for i in range(self.num_decode_replicas) if admits(i, req)]
        if not open_:
            return None
        i = open_[0] if len(open_) == 1 else min(open_, key=self._decode_load)
        entry = queue.popleft()
        self._accepted_blocks[i] += self.replicas[self.num_prefill_replicas + i].kv.blocks_for(req.num_prompt_tokens)
        self._handoff_wait[req.index] = now - since
        return entry, i

    def _room(self, i: int, req: Request) -> bool:
        """Whether decode instance ``i``'s free blocks, less those accepted or reserved there, hold ``req``'s prompt."""
        kv = self.replicas[self.num_prefill_replicas + i].kv
        return kv.blocks_for(req.num_prompt_tokens) <= kv.num_free_blocks - self._accepted_blocks[i]

    def _after_step(self, rid: int, now: float) -> None:
        """The step-end hook (:attr:`Engine.on_step_end`): :meth:`_hand_over` or :meth:`_after_decode_step`."""
        if rid < self.num_prefill_replicas:
            self._hand_over(rid, now)
        else:
            self._after_decode_step(rid, now)

    def _hand_over(self, rid: int, now: float) -> None:
        """Prefill instance ``rid``'s step ended at ``now``: the prompts it finished leave it (their KV moves, is
        queued to be pulled, or a reservation of a one-token request that ended here is released)."""
        p = self.num_prefill_replicas
        sched = self.prefill_schedulers[rid]
        if not sched.handed_over:
            return
        moving = [r for r in sched.handed_over if r.status != OK]  # OK: a one-token request ended here
        unused = [r for r in sched.handed_over if r.status == OK and r.index in self._reserved_at] \
            if self._reserved_at else []
        for req in unused:  # prealloc: a one-token request ended here, its reservation unused
            i = self._reserved_at.pop(req.index)
            self._accepted_blocks[i] -= self.replicas[p + i].kv.blocks_for(req.num_prompt_tokens)
        if unused:
            self._reserve(now)
        sched.handed_over = []
        if moving:
            state = self.replicas[rid]
            for req in moving:
                state.remove_running(req)
            for req in moving:
                if self.kv_handoff == "push":
                    self._start_transfer(req, rid, self._route_decode(), now)
                elif self.kv_handoff == "prealloc":
                    self._start_transfer(req, rid, p + self._reserved_at.pop(req.index), now)
                else:
                    self._unaccepted.append((req, rid, now))
            self._pull(now)

    def _after_decode_step(self, rid: int, now: float) -> None:
        """Decode instance ``rid``'s step ended at ``now``: the transferred requests it admitted are noted (their
        accepted blocks released), then, between its steps, it accepts finished prompts and reservations."""
        p = self.num_prefill_replicas
        self._step_ended = rid
        if self._unadmitted[rid - p]:
            for req in self._batches[rid].requests:  # type: ignore[union-attr]  # set: the step that just ended
                t = self.transfers.get(req.index)
                if t is not None and t.decode_admitted_time_s != t.decode_admitted_time_s:  # NaN: first time here
                    t.decode_admitted_time_s = req.last_scheduled_time_s
                    self._unadmitted[rid - p] -= 1
                    if self.kv_handoff != "push":
                        self._accepted_blocks[rid - p] -= self.replicas[rid].kv.blocks_for(req.num_prompt_tokens)
        if self._unaccepted:
            self._pull(now)
        self._step_ended = -1
        if self._prealloc:
            self._reserve(now)

    def _quiet_step_end(self, rid: int) -> bool:
        """Whether :meth:`_after_step` at the end of replica ``rid``'s step would change nothing now: a prefill
        instance's step hands no prompt over; on a decode instance no finished prompt or arrival waits for
        one (``_pull``, ``_reserve``) and the step admitted no transferred request (or holds no explicit one)."""
        p = self.num_prefill_replicas
        if rid < p:
            return not self.prefill_schedulers[rid].handed_over
        return (not self._unaccepted and not self._prealloc
                and not (self._unadmitted[rid - p] and self._batches[rid].requests))  # type: ignore[union-attr]

    def _accepts(self, i: int, req: Request) -> bool:
        """Whether decode instance ``i`` (0-based in the pool) accepts ``req`` now (DistServe's rule, Notes);
        the share is over the whole instance (:meth:`_instance_of`), the room in ``i``'s own cache."""
        p = self.num_prefill_replicas
        same = self._instance_of(i)
        if not self._between_steps(same):
            return False
        held = blocks = 0
        for j in same:
            held += self._accepted_blocks[j]
            blocks += self.replicas[p + j].kv.num_gpu_blocks
        return held < PULL_WAITING_SHARE * blocks and self._room(i, req)

    def _between_steps(self, entries: list[int]) -> bool:
        """Whether the decode instance of pool ``entries`` (0-based) is between steps: idle, or the step that
        ends now is its own. DistServe's decode loop accepts (and migrates) only there, after a step's
        output and before it schedules the next (``post_process``, Notes)."""
        p = self.num_prefill_replicas
        return self._step_ended - p in entries or all(self._batches[p + j] is None for j in entries)

    def _instance_of(self, i: int) -> list[int]:
        """The decode pool's entries (0-based) that share one scheduler with entry ``i``: itself."""
        return [i]

    def _pull(self, now: float) -> None:
        """Start the transfers of the finished prompts, in order, that a decode instance accepts now
        (the least-loaded one of those that accept); stop at the first no instance accepts."""
        if self._step_ended < 0 and None not in self._batches[self.num_prefill_replicas:]:
            return  # every decode instance is in a step: none accepts (_between_steps)
        while self._unaccepted:
            taken = self._take_head(self._unaccepted, self._accepts, now)
            if taken is None:
                return
            (req, src, _), i = taken
            self._start_transfer(req, src, self.num_prefill_replicas + i, now)

    def _decode_load(self, i: int) -> tuple[int, int]:
        """Decode instance ``i``'s (0-based in the pool) waiting + running + inbound requests, and ``i`` for ties."""
        return replica_load(self.replicas[self.num_prefill_replicas + i]) + self._inbound[i], i

    def _route_decode(self) -> int:
        """The decode instance with the fewest waiting + running + inbound requests (ties: lowest id)."""
        return self.num_prefill_replicas + min(range(self.num_decode_replicas), key=self._decode_load)

    def _start_transfer(self, req: Request, src: int, dst: int, now: float) -> None:
        i = dst - self.num_prefill_replicas
        start = now if self.kv_handoff != "pull" else self._migration_start_s(i, now)
        end = start + self._transfer_time_s(req.num_prompt_tokens)
        if self.kv_handoff == "pull":  # the decode loop waits for each migration in turn (Notes)
            self._handoff_wait[req.index] += start - now  # the loop's earlier migrations
            for j in self._instance_of(i):
                self._migrated_until_s[j] = end
            self._hold_loop(dst, end)
        self.transfers[req.index] = Transfer(src, dst, start, end)
        self._inbound[i] += 1
        self._num_in_flight += 1
        req.status = TRANSFERRING
        self.call_at(end, partial(self._end_transfer, req, src, dst))

    def _migration_start_s(self, i: int, now: float) -> float:
        """When decode entry ``i``'s loop starts a migration accepted at ``now``: after its previous one, s."""
        return max(now, self._migrated_until_s[i])

    def _hold_loop(self, rid: int, until_s: float) -> None:
        """Keep decode replica ``rid`` (its instance) from starting a step before ``until_s`` (seconds)."""
        self.loop_busy_until_s[rid] = until_s

    def _end_transfer(self, req: Request, src: int, dst: int, now: float) -> None:
        source = self.replicas[src]
        source.kv.free(req)  # the prefill instance frees the KV when the transfer ends
        if source.waiting:
            self.wake(src, now)  # the freed blocks may admit a waiting prompt
        i = dst - self.num_prefill_replicas
        self._inbound[i] -= 1
        self._unadmitted[i] += 1
        self._num_in_flight -= 1
        req.status = WAITING
        self.enqueue(dst, req, now)

    # -- results ---------------------------------------------------------------------------------
    def result_columns(self, num_rows: int) -> dict[str, np.ndarray]:
        """Per-request disaggregation columns of the replay result, by trace row
        (:func:`~replay.core.result_columns.transfer_columns` of :attr:`transfers`)."""
        return transfer_columns(self.transfers, self._handoff_wait, num_rows)
