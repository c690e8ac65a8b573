"""The deployment a replay runs, resolved once before any engine is built.

:func:`resolve_deployment` turns a cost model (a calibration's), the options of a replay and
the trace's metadata into a :class:`Deployment`: the pools (the colocated replicas, or the
prefill and decode pools of ``--scheduler disagg``) with their cost models, TP/PP/DP and KV
blocks (and how those were derived), the KV link, the scheduling policy and the settings every
(virtual) engine runs with. :func:`replay.simulate.replay_frame` builds the engine from it and
nothing else; :func:`resolve_num_gpu_blocks` is the one rule that sizes a replica's KV cache.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from schemas.specs import GpuSpec, ModelSpec

from ..config import EngineOptions, ReplayConfig
from ..cost.cost_model import LINKS, Link, RooflineCostModel
from ..cost.kv_capacity import kv_capacity_blocks
from ..errors import ConfigError
from ..schedulers import get_scheduler_factory
from ..schedulers.base import Scheduler, SchedulerConfig
from .disagg_pools import resolve_pools
from .engine_config import EngineConfig


@dataclass(frozen=True)
class Pool:
    """One pool of identical replicas: the colocated replicas, or one pool of ``--scheduler disagg``.

    Attributes
    ----------
    cost_model : RooflineCostModel
        Prices one step of a replica (of one stage, when pipelined: :mod:`replay.core.pipeline`).
    replicas : int
        Replicas (``disagg``: instances) of the pool.
    tp, pp, dp : int
        A replica's tensor-parallel degree, pipeline stages and data-parallel ranks stepping in
        lock step (its cost model's).
    num_gpu_blocks : int
        KV blocks of one virtual engine: a replica's blocks (its DP ranks' together) // ``pp``
        (vLLM v0 gives each of a replica's ``pp`` virtual engines its share); >= 1.
    kv_how : str
        How ``num_gpu_blocks`` was derived, e.g. ``"--num-gpu-blocks 1000 x DP 2"`` or
        ``"63488 sized from h100-80gb memory at --gpu-memory-utilization 0.9 // PP 2"``.
    """

    cost_model: RooflineCostModel
    replicas: int
    tp: int
    pp: int
    dp: int
    num_gpu_blocks: int
    kv_how: str

    @property
    def num_gpus(self) -> int:
        """GPUs of the pool: replicas x TP x PP x DP."""
        return self.replicas * self.tp * self.pp * self.dp


@dataclass(frozen=True)
class Deployment:
    """What a replay runs on (:func:`resolve_deployment`).

    Attributes
    ----------
    prefill : Pool
        The replicas arrivals are routed to: the colocated replicas, or the prefill pool. Its
        cost model also prices the front end (:func:`replay.simulate.frontend_delays`).
    decode : Pool or None
        The decode pool of ``--scheduler disagg``; None colocated.
    link : Link or None
        The prefill-to-decode KV link (``disagg``); None colocated.
    policy : callable or None
        The colocated replicas' scheduler factory (:func:`replay.schedulers.get_scheduler_factory`);
        None for ``disagg``, whose pools have their own policies.
    scheduler_config : SchedulerConfig
        The limits of one (virtual) engine: ``max_num_seqs``, ``max_num_batched_tokens`` (x DP).
    engine_config : EngineConfig
        The settings of one (virtual) engine; its ``num_gpu_blocks`` is ``prefill.num_gpu_blocks``.
    pipelined : bool
        A pool has more than one pipeline stage (the engine then takes the exact path).
    """

    prefill: Pool
    decode: Pool | None
    link: Link | None
    policy: Callable[[], Scheduler] | None
    scheduler_config: SchedulerConfig
    engine_config: EngineConfig
    pipelined: bool

    @property
    def num_gpus(self) -> int:
        """GPUs of the deployment: every pool's (:attr:`Pool.num_gpus`)."""
        return self.prefill.num_gpus + (self.decode.num_gpus if self.decode is not None else 0)


def resolve_num_gpu_blocks(cfg: EngineOptions, model: ModelSpec, gpu: GpuSpec, tp: int, pp: int = 1) -> int:
    """KV blocks per replica (per DP rank): ``cfg.num_gpu_blocks`` or the cache that fits beside the weights
    (of ``tp x pp`` GPUs: each holds ``1 / pp`` of the layers, :func:`~replay.cost.kv_capacity.kv_capacity_blocks`).

    Raises
    ------
    ConfigError
        If the weights do not fit in GPU memory, or the cache holds no block.
    """
    if cfg.num_gpu_blocks is not None:
        return cfg.num_gpu_blocks
    try:
        blocks = kv_capacity_blocks(model, gpu, tp, cfg.gpu_memory_utilization, cfg.block_size, pp=pp,
                                    max_num_seqs=cfg.max_num_seqs)
    except ValueError as exc:
        raise ConfigError(f"{exc}; raise --tp, --pp or --gpu-memory-utilization, or give --num-gpu-blocks") from None
    except OverflowError:  # a spec with absurd sizes (e.g. a KV of inf bytes per token)
        blocks = 0
    if blocks < 1:
        raise ConfigError(f"the KV cache of {model.name} on {gpu.name} (TP={tp}) holds no block of {cfg.block_size} "
                          "tokens; check the model spec (layers, KV heads, head size) or give --num-gpu-blocks")
    return blocks


def resolve_deployment(cost_model: RooflineCostModel, cfg: ReplayConfig, metadata: dict | None = None) -> Deployment:
    """Every resolution a replay needs before its engine is built, in one record.

    Parameters
    ----------
    cost_model : RooflineCostModel
        The calibrated roofline: its ``tp``, ``pp`` and ``dp`` are the replicas' (``disagg``: the
        pools' defaults, :func:`replay.core.disagg_pools.resolve_pools`).
    cfg : ReplayConfig
    metadata : dict, optional
        The trace's ``servecal.*`` metadata: ``hash_block_tokens`` (or ``hash_block_size``),
        tokens per hash block of ``block_hashes``, when ``cfg.engine.hash_block_size`` is None
        (else 16).

    Returns
    -------
    Deployment
        A replica of ``dp`` lock-step ranks has ``dp`` times a rank's ``max_num_seqs``,
        ``max_num_batched_tokens`` and KV blocks (vLLM takes them per rank); a replica of ``pp``
        stages is ``pp`` virtual engines of ``1 / pp`` of its blocks each. The decode pool's
        blocks are a rank's (not multiplied by DP).

    Raises
    ------
    ConfigError
        In this order: bad pools or link (``disagg``) or pools of different TPs under swap
        preemption; an unknown scheduler (colocated); PP with DP; a KV cache that does not fit
        or holds no block per virtual engine (prefill or colocated, then decode).
    """
    eng, pools = cfg.engine, cfg.disagg
    policy = decode_model = link = None
    if pools is not None:
        # each pool with its own TP (BR-23); the prefill pool's sizes the cache and swap time below
        cost_model, decode_model, link = resolve_pools(cost_model, pools)
        if eng.preemption_mode == "swap" and cost_model.tp != decode_model.tp:
            raise ConfigError("--preemption-mode swap with --scheduler disagg needs --tp-prefill equal to --tp-decode")
    else:
        policy = get_scheduler_factory(cfg.scheduling.scheduler)
    # vLLM's data-parallel ranks of a MoE model step in lock step: the group is one replica with
    # every rank's limits and KV cache (term_base.ReplicaShape)
    dp, pp = getattr(cost_model, "dp", 1), getattr(cost_model, "pp", 1)
    if dp > 1 and pp > 1:
        raise ConfigError("--pp with --data-parallel-size is not modelled (DP ranks step in lock step here)",
                          options=("pp", "dp"))
    prefill = _pool(eng, cost_model, pools.prefill_replicas if pools is not None else cfg.scheduling.replicas, dp,
                    f"--pp {pp}: each of the {pp} virtual engines needs at least one KV block")
    decode = None
    if pools is not None and decode_model is not None:
        pp_decode = getattr(decode_model, "pp", 1)
        # a decode instance of DP ranks has their blocks together, as its limits are theirs (the prefill's config)
        decode = _pool(eng, decode_model, pools.decode_replicas, getattr(decode_model, "dp", 1),
                       f"--pp-decode {pp_decode}: each virtual engine needs at least one KV block")
    pipelined = pp > 1 or (decode is not None and decode.pp > 1)
    sched_cfg, engine_cfg = _engine_configs(prefill, cfg, metadata, pipelined)
    return Deployment(prefill, decode, link, policy, sched_cfg, engine_cfg, pipelined)


def _pool(eng: EngineOptions, cost_model: RooflineCostModel, replicas: int, kv_dp: int, too_few: str) -> Pool:
    """A pool of ``replicas`` replicas of ``cost_model``, each virtual engine with the KV blocks
    of ``kv_dp`` ranks // its ``pp`` (:func:`resolve_num_gpu_blocks`).

    Raises
    ------
    ConfigError
        As :func:`resolve_num_gpu_blocks`; ``too_few`` when a virtual engine gets no block.
    """
    tp, pp, dp = cost_model.tp, getattr(cost_model, "pp", 1), getattr(cost_model, "dp", 1)
    # each of vLLM v0's pp virtual engines has its own scheduler and 1/pp of the replica's blocks
    per_rank = resolve_num_gpu_blocks(eng, cost_model.model, cost_model.gpu, tp, pp)
    blocks = per_rank * kv_dp // pp
    if blocks < 1:
        raise ConfigError(too_few)
    how = (f"--num-gpu-blocks {per_rank}" if eng.num_gpu_blocks is not None else
           f"{per_rank} sized from {cost_model.gpu.name} memory at --gpu-memory-utilization "
           f"{eng.gpu_memory_utilization:g}")
    how += (f" x DP {kv_dp}" if kv_dp > 1 else "") + (f" // PP {pp}" if pp > 1 else "")
    return Pool(cost_model, replicas, tp, pp, dp, blocks, how)


def _engine_configs(pool: Pool, cfg: ReplayConfig, metadata: dict | None,
                    pipelined: bool) -> tuple[SchedulerConfig, EngineConfig]:
    """The scheduler's and the engine's settings of one (virtual) engine of ``pool``'s replicas
    (its KV blocks, its limits x DP, its swap time per block, s)."""
    eng, rec, cost_model, dp, pp = cfg.engine, cfg.record, pool.cost_model, pool.dp, pool.pp
    max_len = eng.max_model_len if eng.max_model_len is not None else cost_model.model.max_model_len
    meta = metadata or {}
    hash_block_size = eng.hash_block_size or int(meta.get("hash_block_tokens") or meta.get("hash_block_size") or 16)
    swap_time_per_block_s = 0.0
    if eng.preemption_mode == "swap":
        # each of the tp GPUs moves its share of the KV over its own host link
        swap_time_per_block_s = (eng.block_size * cost_model.model.kv_bytes_per_token
                                 / (LINKS[eng.swap_link].bandwidth_bytes_per_s * cost_model.tp))
        if pp > 1:  # each stage's GPUs move their layers' share, stages in parallel
            swap_time_per_block_s = swap_time_per_block_s / pp
    blocks = pool.num_gpu_blocks
    sched_cfg = SchedulerConfig(eng.max_num_seqs * dp, eng.max_num_batched_tokens * dp,
                                long_prefill_token_threshold=_chunk_cap(eng, dp),
                                num_speculative_tokens=eng.num_speculative_tokens)
    engine_cfg = EngineConfig(blocks, eng.block_size, max_len, rec.token_times, rec.steps or rec.step_requests,
                              enable_prefix_caching=eng.enable_prefix_caching, hash_block_size=hash_block_size,
                              preemption_mode=eng.preemption_mode, swap_time_per_block_s=swap_time_per_block_s,
                              record_step_requests=rec.step_requests, exact_steps=cfg.exact_steps or pipelined,
                              spec_acceptance_rate=eng.spec_acceptance_rate or 0.0, seed=eng.seed,
                              max_request_blocks=blocks // dp if dp > 1 else None)
    return sched_cfg, engine_cfg


def _chunk_cap(eng: EngineOptions, dp: int) -> int:
    """vLLM's per-request cap on the prompt tokens of one step (0: none). With ``dp`` DP ranks
    simulated as one replica of ``dp`` times their budget, a request's chunk still runs on one
    rank: capped at that rank's ``max_num_batched_tokens``."""
    if dp == 1:
        return eng.long_prefill_token_threshold
    return min(eng.long_prefill_token_threshold or eng.max_num_batched_tokens, eng.max_num_batched_tokens)
