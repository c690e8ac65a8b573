"""Replay a request trace through the engine: the library entry points behind ``replay``.

:func:`run` replays a trace file or frame with a calibration (``replay.run``);
:func:`replay_frame` replays a validated frame with a cost model. The options are a
:class:`~replay.config.ReplayConfig`; the columns of the result are built in
:mod:`replay.core.result_columns`.
"""
from __future__ import annotations

import contextlib
import gc
from operator import attrgetter

import numpy as np
import pandas as pd

from schemas.specs import GpuSpec, ModelSpec

from .core.closed_loop import ClosedLoop, send_times_column
from .config import EngineOptions, ReplayConfig
from .cost.cost_model import LINKS, StepCostModel
from .core.disagg import DisaggEngine
from .core.disagg_pools import resolve_pools
from .core.engine import Engine
from .core.engine_config import EngineConfig
from .errors import ConfigError
from .cost.kv_capacity import kv_capacity_blocks
from .core.pipeline import PipelineDisaggEngine, PipelineEngine
from .core.request import Request
from .core.trace_requests import TraceRequests
from .core.result_columns import predicted_columns, result_frame, spec_columns
from .core.routing import get_router
from .schedulers import get_scheduler_factory
from .schedulers.base import SchedulerConfig


def resolve_num_gpu_blocks(cfg: EngineOptions, model: ModelSpec, gpu: GpuSpec, tp: int, pp: int = 1) -> int:
    """KV blocks per replica: ``cfg.num_gpu_blocks`` or the cache that fits beside the weights
    (of ``tp x pp`` GPUs: each holds ``1 / pp`` of the layers, :func:`~replay.cost.kv_capacity.kv_capacity_blocks`).

    Raises
    ------
    ConfigError
        If the weights do not fit in GPU memory.
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


@contextlib.contextmanager
def _gc_paused():
    """Pause Python's cyclic garbage collector, then restore its state.

    A replay allocates a million requests that live to its end, and allocation-triggered
    collections would traverse all of them many times (measured: 1.9 s of 3.8 s building 1M
    requests); they hold no reference cycles, so reference counting frees them.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def replay_frame(df: pd.DataFrame | TraceRequests, cost_model: StepCostModel, cfg: ReplayConfig,
                 metadata: dict | None = None) -> tuple[pd.DataFrame, Engine]:
    """Replay a request trace; return the replay result and the engine (steps, counters).

    Parameters
    ----------
    df : pandas.DataFrame or TraceRequests
        A validated request trace (``request_trace/1`` columns), sorted by arrival time; or its
        rows read once for many replays (:class:`~replay.core.trace_requests.TraceRequests`,
        whose ``frame`` is the trace), the same replay at less cost per call.
    cost_model : RooflineCostModel
    cfg : ReplayConfig
    metadata : dict, optional
        The trace's ``servecal.*`` metadata; ``hash_block_tokens`` (tokens per hash block
        of ``block_hashes``; ``hash_block_size`` is accepted too) is used when
        ``cfg.engine.hash_block_size`` is None; ``closed_loop_start_spread_s`` (seconds, set
        by :func:`calibrate.aggregate_runs.aggregate_runs` for identical requests) spreads a
        closed loop's first sends (:class:`~replay.core.closed_loop.ClosedLoop`).

    Returns
    -------
    result : pandas.DataFrame
        ``df`` plus ``pred_queue_wait_s``, ``pred_ttft_s``, ``pred_tpot_s``, ``pred_e2e_s``
        (seconds, relative to each request's arrival), ``pred_replica_id``,
        ``pred_num_preemptions``, ``pred_status`` and, when recorded,
        ``pred_token_times_s`` (relative to arrival); with prefix caching
        ``pred_num_cached_tokens`` (prefix-cache hit at first admission, tokens); with
        ``disagg`` the columns of :meth:`replay.core.disagg.DisaggEngine.result_columns`
        (``pred_queue_wait_s`` is then the prefill queue wait, ``pred_replica_id`` the
        prefill instance); with speculative decoding ``pred_num_draft_tokens``,
        ``pred_num_accepted_tokens`` and ``pred_acceptance_length`` (:func:`~replay.core.result_columns.spec_columns`).
    engine : Engine

    Raises
    ------
    ConfigError
        Unknown scheduler, impossible KV cache, pools of different TPs under swap preemption
        (the option values themselves were checked by :class:`~replay.config.ReplayConfig`).

    Notes
    -----
    A cost model with ``dp > 1`` (vLLM ``--data-parallel-size`` of a MoE model) is one
    replica of ``dp`` ranks stepping in lock step: ``max_num_seqs``,
    ``max_num_batched_tokens`` and the KV blocks (all per rank, as vLLM takes them) are
    multiplied by ``dp``, and the step is priced for the group's tokens spread evenly over
    the ranks (:class:`replay.cost.term_base.ReplicaShape`). An imbalance between the ranks
    (one busy, one idle running a dummy batch) is not modelled beyond that.

    A cost model with ``pp > 1`` (vLLM ``--pipeline-parallel-size``; for ``disagg`` the pools'
    ``pp_prefill``/``pp_decode``) makes each replica ``pp`` virtual engines of ``max_num_seqs``
    and ``1 / pp`` of its KV blocks, with up to ``pp`` micro-batches in flight through its
    stages (:mod:`replay.core.pipeline`); such a replay always takes the exact path (every step
    through the event heap), so ``exact_steps`` changes nothing there.
    """
    columns, engine = replay_columns(df, cost_model, cfg, metadata)
    return result_frame(df.frame if isinstance(df, TraceRequests) else df, columns), engine


def replay_columns(df: pd.DataFrame | TraceRequests, cost_model: StepCostModel, cfg: ReplayConfig,
                   metadata: dict | None = None) -> tuple[dict, Engine]:
    """:func:`replay_frame` without the frame: the columns it adds to the trace (name -> values
    by trace row, shape ``(n,)``, in the result's order) and the engine; for a caller that reads
    a few columns of many replays (a fit). Arguments and errors: :func:`replay_frame`."""
    sched, closed, rec = cfg.scheduling, cfg.closed_loop, cfg.record
    rows = df if isinstance(df, TraceRequests) else TraceRequests(df)
    engine, cost_model = _build_engine(cost_model, cfg, metadata)
    frontend_s, stream_s = frontend_delays(cost_model, rows.frame)
    ec = engine.config  # the prefix caches' block geometry: what the prompts' block keys depend on
    geometry = (ec.block_size, ec.hash_block_size or ec.block_size) if ec.enable_prefix_caching else None
    with _gc_paused():  # no cycles here; collections would rescan every live request again and again
        reqs = rows.requests(rec.token_times, sched.slo_ttft_s, sched.slo_tpot_s, frontend_s, geometry)
        loop = None
        if closed.concurrency is None:
            engine.run(reqs if frontend_s is None else sorted(reqs, key=attrgetter("arrival_time_s")))
        else:
            spread = float((metadata or {}).get("closed_loop_start_spread_s", 0.0))
            loop = ClosedLoop(engine, reqs, closed.concurrency, closed.think_time_s, frontend_s, stream_s, spread)
            loop.run()
        columns = predicted_columns(rows.num_output_tokens, reqs, rec.token_times, frontend_s, stream_s)
        if loop is not None:
            columns["pred_arrival_time_s"] = send_times_column(rows.num_rows, loop.sent_at_s)
        columns.update(_engine_columns(rows.num_rows, engine, reqs, cfg.engine))
        del reqs  # freed by reference counting before collections resume
    return columns, engine


def _build_engine(cost_model: StepCostModel, cfg: ReplayConfig,
                  metadata: dict | None) -> tuple[Engine, StepCostModel]:
    """The engine :func:`replay_frame` runs (colocated, disaggregated, pipelined or both) and the
    cost model of its (prefill) replicas, which prices the front end.

    Raises
    ------
    ConfigError
        As :func:`replay_frame`.
    """
    eng, sched = cfg.engine, cfg.scheduling
    decode_cost_model = None
    if cfg.disagg is not None:
        # each pool with its own TP (BR-23); the prefill pool's sizes the cache and swap time below
        cost_model, decode_cost_model, link = resolve_pools(cost_model, cfg.disagg)
        if eng.preemption_mode == "swap" and cost_model.tp != decode_cost_model.tp:
            raise ConfigError("--preemption-mode swap with --scheduler disagg needs --tp-prefill equal to --tp-decode")
    else:
        factory = get_scheduler_factory(sched.scheduler)
    # vLLM's data-parallel ranks of a MoE model step in lock step: the group is one replica with
    # every rank's limits and KV cache (term_base.ReplicaShape)
    dp = getattr(cost_model, "dp", 1)
    pp = getattr(cost_model, "pp", 1)
    pp_decode = getattr(decode_cost_model, "pp", 1) if decode_cost_model is not None else 1
    if dp > 1 and pp > 1:
        raise ConfigError("--pp with --data-parallel-size is not modelled (DP ranks step in lock step here)",
                          options=("pp", "dp"))
    pipelined = pp > 1 or pp_decode > 1
    sched_cfg, engine_cfg = _engine_configs(cost_model, cfg, metadata, dp, pp, pipelined)
    if decode_cost_model is not None:
        m, pools = cost_model.model, cfg.disagg
        decode_blocks = (resolve_num_gpu_blocks(eng, m, decode_cost_model.gpu, decode_cost_model.tp, pp_decode)
                         // pp_decode)
        if decode_blocks < 1:
            raise ConfigError(f"--pp-decode {pp_decode}: each virtual engine needs at least one KV block")
        kw = dict(model=m, decode_num_gpu_blocks=decode_blocks, link=link, prefill_replicas=pools.prefill_replicas,
                  decode_replicas=pools.decode_replicas, first_token_from=pools.first_token_from,
                  router=get_router(sched.router), kv_handoff=pools.kv_handoff)
        if pipelined:
            return PipelineDisaggEngine(cost_model, decode_cost_model, sched_cfg, engine_cfg, pp_prefill=pp,
                                        pp_decode=pp_decode, **kw), cost_model
        return DisaggEngine(cost_model, decode_cost_model, sched_cfg, engine_cfg, **kw), cost_model
    if pipelined:
        return PipelineEngine(cost_model, factory, sched_cfg, engine_cfg, num_replicas=sched.replicas, pp=pp,
                              router=get_router(sched.router)), cost_model
    return Engine(cost_model, factory, sched_cfg, engine_cfg, num_replicas=sched.replicas,
                  router=get_router(sched.router)), cost_model


def _engine_configs(cost_model: StepCostModel, cfg: ReplayConfig, metadata: dict | None, dp: int, pp: int,
                    pipelined: bool) -> tuple[SchedulerConfig, EngineConfig]:
    """The scheduler's and the engine's settings of one (virtual) engine of a replica of ``dp``
    lock-step ranks or ``pp`` pipeline stages (its KV blocks, limits and swap time per block, s).

    Raises
    ------
    ConfigError
        A KV cache of no block (per virtual engine).
    """
    eng, rec = cfg.engine, cfg.record
    # each of vLLM v0's pp virtual engines has its own scheduler and 1/pp of the replica's blocks
    blocks = resolve_num_gpu_blocks(eng, cost_model.model, cost_model.gpu, cost_model.tp, pp) * dp // pp
    if blocks < 1:
        raise ConfigError(f"--pp {pp}: each of the {pp} virtual engines needs at least one KV block")
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


def _engine_columns(n: int, engine: Engine, reqs: list[Request], eng: EngineOptions) -> dict:
    """The columns (name -> ``n`` values, one per trace row) of a disaggregated engine, of
    speculative decoding and of prefix caching (``pred_num_cached_tokens``, tokens)."""
    out = {}
    if isinstance(engine, DisaggEngine):
        out.update(engine.result_columns(n))
    if eng.num_speculative_tokens:
        out.update(spec_columns(engine, n))
    if eng.enable_prefix_caching:
        cached = np.zeros(n, np.int64)
        for r in reqs:
            cached[r.index] = r.num_cached_tokens
        out["pred_num_cached_tokens"] = cached
    return out


def run(trace, calibration, config: ReplayConfig | None = None, *, model: str | ModelSpec | None = None,
        tp: int | None = None, dp: int | None = None, pp: int | None = None, expert_parallel: bool | None = None,
        **settings) -> pd.DataFrame:
    """Replay a request trace with a calibration; ``replay.run``, the library call of
    ``replay TRACE --calibration CAL [settings]`` (the result ``replay -o`` writes).

    Parameters
    ----------
    trace : str, os.PathLike or pandas.DataFrame
        A request trace (``request_trace/1`` Parquet, as ``traces import`` writes), or its
        rows as a frame (seconds, tokens); either is validated first.
    calibration : str, os.PathLike or schemas.calibration.Calibration
        What ``calibrate fit`` wrote.
    config : ReplayConfig, optional
        The engine and scheduling settings; not with ``settings``.
    model : str or ModelSpec, optional
        Another model on the calibrated GPU (catalog key, Hugging Face id or ``config.json``).
    tp, dp, pp, expert_parallel : optional
        Parallelism (vLLM's ``--tensor-parallel-size``...); None: the calibration's.
    **settings
        The settings by ``replay``'s option names, which are vLLM's (``max_num_seqs=128``,
        ``scheduler="chunked"``, ``seed=1``; :meth:`ReplayConfig.from_options`).

    Returns
    -------
    pandas.DataFrame
        The trace's rows plus the predictions (:func:`replay_frame`'s ``result``; seconds).

    Raises
    ------
    schemas.errors.SchemaError
        A trace or calibration that cannot be read or breaks the contract, naming it.
    schemas.errors.SpecError
        An unknown ``model``.
    ReplayError
        A trace file that is not a request trace.
    ConfigError
        Unknown or invalid settings, ``config`` and ``settings`` together, or a combination
        that cannot run (a TP that does not divide the heads, a KV cache of no block).

    Notes
    -----
    The settings are exactly those given, over vLLM's defaults: unlike the command, nothing
    is taken from the settings a calibration, a trace or a vLLM log recorded, and the KV
    cache is not read from the log (give ``num_gpu_blocks``).
    """
    from schemas.calibration import Calibration
    from schemas.kinds import REQUEST_TRACE
    from schemas.specs import get_model
    from traces.io import read_trace, validated_frame

    from .cost.cost_model import cost_model_from_calibration
    from .errors import ReplayError

    if config is not None and settings:
        raise ConfigError(f"give the settings as config or by name, not both ({', '.join(settings)})")
    cfg = config if config is not None else ReplayConfig.from_options(**settings)
    cal = calibration if isinstance(calibration, Calibration) else Calibration.read(calibration)
    model_spec = get_model(model) if isinstance(model, str) else model
    cost_model = cost_model_from_calibration(cal, model_spec, tp, dp, pp, expert_parallel=expert_parallel)
    if isinstance(trace, pd.DataFrame):
        frame, meta = validated_frame(trace, REQUEST_TRACE, "the trace frame"), {}
    else:
        kind, frame, meta = read_trace(trace)
        if kind != REQUEST_TRACE:
            raise ReplayError(f"{trace}: is a {kind}; a replay needs a request trace ({REQUEST_TRACE})")
    return replay_frame(frame, cost_model, cfg, meta)[0]


def frontend_delays(cost_model, df: pd.DataFrame) -> tuple[np.ndarray | None, float]:
    """Per row, the time before the engine (seconds), and the time per streamed output token
    after the first (seconds), of a cost model with front-end terms
    (:meth:`RooflineCostModel.frontend_s`); ``(None, 0.0)`` when both are zero and for a cost
    model without them. Open and closed loop alike (:class:`replay.core.closed_loop.ClosedLoop`).
    """
    if not hasattr(cost_model, "frontend_s"):
        return None, 0.0
    fe = cost_model.frontend_s(df["num_prompt_tokens"].to_numpy(np.int64))
    fe = None if not np.any(fe) else np.broadcast_to(fe, (len(df),)).astype(float)
    return fe, float(cost_model.stream_per_token_s)


def _chunk_cap(eng, dp: int) -> int:
    """vLLM's per-request cap on the prompt tokens of one step (0: none). With ``dp`` DP ranks
    simulated as one replica of ``dp`` times their budget, a request's chunk still runs on one
    rank: capped at that rank's ``max_num_batched_tokens``."""
    if dp == 1:
        return eng.long_prefill_token_threshold
    return min(eng.long_prefill_token_threshold or eng.max_num_batched_tokens, eng.max_num_batched_tokens)
