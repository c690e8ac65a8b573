"""Replay a request trace through the engine: the library entry points behind ``replay``.

:func:`run` replays a trace file or frame with a calibration (``replay.run``);
:func:`replay_frame` replays a validated frame with a cost model: trace -> deployment
(:func:`replay.core.deployment.resolve_deployment`, every resolution at once) -> engine -> result.
The options are a :class:`~replay.config.ReplayConfig`; the columns of the result are built in
:mod:`replay.core.result_columns`.
"""
from __future__ import annotations

import contextlib
import gc
from operator import attrgetter

import numpy as np
import pandas as pd

from schemas.specs import ModelSpec

from .config import EngineOptions, ReplayConfig
from .core.closed_loop import ClosedLoop, send_times_column
from .core.deployment import Deployment, resolve_deployment
from .core.disagg import DisaggEngine
from .core.engine import Engine
from .core.pipeline import PipelineDisaggEngine, PipelineEngine
from .core.request import Request
from .core.trace_requests import TraceRequests
from .core.result_columns import predicted_columns, result_frame, spec_columns
from .core.routing import get_router
from .cost.cost_model import StepCostModel
from .errors import ConfigError


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
        (:func:`~replay.core.deployment.resolve_deployment`; the option values themselves were
        checked by :class:`~replay.config.ReplayConfig`).

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
    dep = resolve_deployment(cost_model, cfg, metadata)
    engine = _build_engine(dep, cfg)
    frontend_s, stream_s = frontend_delays(dep.prefill.cost_model, rows.frame)
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


def _build_engine(dep: Deployment, cfg: ReplayConfig) -> Engine:
    """The engine of deployment ``dep`` (colocated, disaggregated, pipelined or both), routed
    by ``cfg``'s router; ``disagg``: its first-token and KV hand-off modes from ``cfg.disagg``.

    Raises
    ------
    ConfigError
        Settings the engine refuses (:func:`replay.core.engine_config.check_settings`).
    """
    p, d, router = dep.prefill, dep.decode, get_router(cfg.scheduling.router)
    if d is not None:
        pools = cfg.disagg
        kw = dict(model=p.cost_model.model, decode_num_gpu_blocks=d.num_gpu_blocks, link=dep.link,
                  prefill_replicas=p.replicas, decode_replicas=d.replicas, first_token_from=pools.first_token_from,
                  router=router, kv_handoff=pools.kv_handoff)
        if dep.pipelined:
            return PipelineDisaggEngine(p.cost_model, d.cost_model, dep.scheduler_config, dep.engine_config,
                                        pp_prefill=p.pp, pp_decode=d.pp, **kw)
        return DisaggEngine(p.cost_model, d.cost_model, dep.scheduler_config, dep.engine_config, **kw)
    if dep.pipelined:
        return PipelineEngine(p.cost_model, dep.policy, dep.scheduler_config, dep.engine_config,
                              num_replicas=p.replicas, pp=p.pp, router=router)
    return Engine(p.cost_model, dep.policy, dep.scheduler_config, dep.engine_config, num_replicas=p.replicas,
                  router=router)


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
    from schemas.kinds import REQUEST_TRACE, a_kind
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
            raise ReplayError(f"{trace}: is {a_kind(kind)}; a replay needs a request trace ({REQUEST_TRACE})")
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
