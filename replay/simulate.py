"""Replay a request trace through the engine: the library entry point behind ``replay``."""
from __future__ import annotations

import contextlib
import gc
import math
from dataclasses import dataclass
from operator import attrgetter

import numpy as np
import pandas as pd

from schemas.specs import GpuSpec, ModelSpec
from schemas.status import NOT_SIMULATED, OK, because

from .cost_model import LINKS, StepCostModel
from .kv_capacity import kv_capacity_blocks
from .closed_loop import ClosedLoop, check_closed_loop, send_times_column
from .disagg import DisaggEngine, resolve_pools
from .engine import Engine, EngineConfig
from .errors import ConfigError
from .request import Request
from .routing import get_router
from .schedulers import get_scheduler_factory
from .schedulers.base import SchedulerConfig


@dataclass
class ReplayConfig:
    """Options of one replay, named as vLLM names its engine arguments.

    Attributes
    ----------
    scheduler : str
        Built-in name (``chunked``, ``fcfs``, ...), ``disagg`` (prefill/decode pools, see
        :class:`replay.disagg.DisaggEngine`) or ``package.module:ClassName``.
    max_num_seqs, max_num_batched_tokens : int
        Per-replica limits (vLLM's defaults for its API server: 256 and 8192).
    block_size : int
        Tokens per KV block.
    num_gpu_blocks : int | None
        KV blocks per replica; None sizes the cache from GPU memory.
    gpu_memory_utilization : float
        Fraction of GPU memory vLLM may use (weights + KV), as in vLLM.
    max_model_len : int | None
        Longest prompt + output; None takes the model's context length.
    replicas : int
        Replicas of a colocated scheduler (``disagg`` uses ``prefill_replicas``/``decode_replicas``).
    record_token_times : bool
        Keep per-token times (``pred_token_times_s``), needed for ITL.
    record_steps : bool
        Keep the simulated step trace.
    enable_prefix_caching : bool
        Share full prompt blocks between requests (vLLM v1 automatic prefix caching), from
        the trace's ``block_hashes``.
    hash_block_size : int | None
        Tokens per hash block of ``block_hashes`` (Mooncake: 512); None: the trace's
        ``hash_block_tokens`` metadata (written by ``traces import mooncake``), else 16.
    preemption_mode : str
        ``recompute`` or ``swap`` (KV to host memory over ``swap_link`` and back).
    swap_link : str
        Host link of swap preemption, a key of :data:`replay.cost_model.LINKS`.
    router : str
        ``round_robin``, ``least_loaded`` or ``prefix_affinity`` (see :mod:`replay.routing`).
    slo_ttft_s, slo_tpot_s : float | None
        Latency objectives of requests whose trace row has none (``edf`` deadlines), seconds.
    record_step_requests : bool
        Keep the request ids of every step (for the Chrome trace); implies ``record_steps``.
    exact_steps : bool
        Simulate every step and request one by one (``EngineConfig.exact_steps``); same results, slower.
    prefill_replicas, decode_replicas : int
        ``disagg``: instances of the prefill and of the decode pool (P and D).
    tp_prefill, tp_decode : int | None
        ``disagg``: tensor-parallel degree of each pool; None: the cost model's ``tp``.
    link : str | None
        ``disagg``: prefill-to-decode KV link, a key of :data:`replay.cost_model.LINKS`;
        None: the GPUs' own ``tp_link`` (both pools in one node, as DistServe places them).
    link_bandwidth_bytes_per_s, link_latency_s : float | None
        ``disagg``: explicit link bandwidth (bytes/s) and one-way latency (seconds),
        overriding the preset's.
    first_token_from : str
        ``disagg``: ``prefill`` (DistServe: the prefill instance emits token 1) or ``decode``
        (the first decode step after the transfer does).
    concurrency : int | None
        Closed loop (:class:`replay.closed_loop.ClosedLoop`): this many clients send the
        trace's requests in trace order, each when its previous one completes; arrival
        times are ignored. None: open loop, requests arrive at ``arrival_time_s``.
    think_time_s : float
        Closed loop: a client's pause between a completion and its next send, seconds.
    long_prefill_token_threshold : int
        vLLM's per-request cap on the prompt tokens of one step, applied before the token
        budget to new and partially prefilled requests alike (0: none; v0.11-era rule, see
        :class:`replay.schedulers.base.SchedulerConfig`). ``fcfs`` and ``static`` admit whole
        prompts and ignore it.
    speculative_tokens : int
        Speculative decoding: draft tokens ``K`` per decode and step (vLLM's
        ``num_speculative_tokens``); 0: off. Each decode verifies ``K + 1`` positions (token
        budget and cost model count them all) and emits 1 + the accepted drafts.
    spec_acceptance_rate : float | None
        Speculative decoding: probability that a draft token is accepted given that those
        before it were; the accepted drafts are a prefix, drawn per decode from a generator
        seeded by ``seed``. Required with ``speculative_tokens`` > 0, refused without.
    seed : int
        Seed of the simulation's random draws (the accepted drafts).
    """

    scheduler: str = "chunked"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    num_gpu_blocks: int | None = None
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    replicas: int = 1
    record_token_times: bool = False
    record_steps: bool = False
    enable_prefix_caching: bool = False
    hash_block_size: int | None = None
    preemption_mode: str = "recompute"
    swap_link: str = "pcie4"
    router: str = "round_robin"
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    record_step_requests: bool = False
    exact_steps: bool = False
    prefill_replicas: int = 1
    decode_replicas: int = 1
    tp_prefill: int | None = None
    tp_decode: int | None = None
    link: str | None = None
    link_bandwidth_bytes_per_s: float | None = None
    link_latency_s: float | None = None
    first_token_from: str = "prefill"
    concurrency: int | None = None
    think_time_s: float = 0.0
    long_prefill_token_threshold: int = 0
    speculative_tokens: int = 0
    spec_acceptance_rate: float | None = None
    seed: int = 0


def resolve_num_gpu_blocks(cfg: ReplayConfig, model: ModelSpec, gpu: GpuSpec, tp: int) -> int:
    """KV blocks per replica: ``cfg.num_gpu_blocks`` or the cache that fits beside the weights.

    Raises
    ------
    ConfigError
        If the weights do not fit in GPU memory.
    """
    if cfg.num_gpu_blocks is not None:
        if cfg.num_gpu_blocks < 1:
            raise ConfigError("--num-gpu-blocks must be >= 1")
        return cfg.num_gpu_blocks
    try:
        blocks = kv_capacity_blocks(model, gpu, tp, cfg.gpu_memory_utilization, cfg.block_size)
    except ValueError as exc:
        raise ConfigError(f"{exc}; raise --tp or --gpu-memory-utilization, or give --num-gpu-blocks") from None
    except OverflowError:  # a spec with absurd sizes (e.g. a KV of inf bytes per token)
        blocks = 0
    if blocks < 1:
        raise ConfigError(f"the KV cache of {model.name} on {gpu.name} (TP={tp}) holds no block of {cfg.block_size} "
                          "tokens; check the model spec (layers, KV heads, head size) or give --num-gpu-blocks")
    return blocks


def requests_from_frame(df: pd.DataFrame, record_token_times: bool = False, slo_ttft_s: float | None = None,
                        slo_tpot_s: float | None = None, frontend_s: np.ndarray | None = None) -> list[Request]:
    """Engine requests from a request-trace DataFrame (sorted by arrival), in row order.

    Rows whose ``status`` is set and not ``ok`` (failed in the measured run) are not simulated.
    A request's SLOs are its row's ``slo_ttft_s``/``slo_tpot_s`` where given, else the
    ``slo_ttft_s``/``slo_tpot_s`` arguments, else none (``inf``). ``frontend_s`` (seconds,
    one per row) delays each request's arrival at the engine (the API server's time).
    """
    n = len(df)
    ids = df["request_id"].astype(str).tolist()
    arr = df["arrival_time_s"].to_numpy(float)
    arr = (arr if frontend_s is None else arr + frontend_s).tolist()
    prompt = df["num_prompt_tokens"].to_numpy(np.int64).tolist()
    out = df["num_output_tokens"].to_numpy(np.int64).tolist()
    prio = df["priority"].to_numpy(np.int64).tolist() if "priority" in df else [0] * n
    hashes = df["block_hashes"].tolist() if "block_hashes" in df else [None] * n
    keep = [True] * n
    if "status" in df:
        status = df["status"]
        keep = (status.isna() | (status == OK)).tolist()
    slos = []
    for col, default in (("slo_ttft_s", slo_ttft_s), ("slo_tpot_s", slo_tpot_s)):
        v = np.full(n, np.inf if default is None else float(default))
        if col in df:
            given = pd.to_numeric(df[col], errors="coerce").to_numpy(float)
            v = np.where(np.isnan(given), v, given)
        slos.append(v.tolist())
    # positional arguments: measurably cheaper than keywords a million times over
    return [Request(i, rid, t, p, o, pr, math.inf, h, record_token_times, s_ttft, s_tpot)
            for i, rid, t, p, o, pr, h, s_ttft, s_tpot, k
            in zip(range(n), ids, arr, prompt, out, prio, hashes, slos[0], slos[1], keep) if k]


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


def replay_frame(df: pd.DataFrame, cost_model: StepCostModel, cfg: ReplayConfig,
                 metadata: dict | None = None) -> tuple[pd.DataFrame, Engine]:
    """Replay a request trace; return the replay result and the engine (steps, counters).

    Parameters
    ----------
    df : pandas.DataFrame
        A validated request trace (``request_trace/1`` columns), sorted by arrival time.
    cost_model : RooflineCostModel
    cfg : ReplayConfig
    metadata : dict, optional
        The trace's ``servecal.*`` metadata; ``hash_block_tokens`` (tokens per hash block
        of ``block_hashes``; ``hash_block_size`` is accepted too) is used when
        ``cfg.hash_block_size`` is None.

    Returns
    -------
    result : pandas.DataFrame
        ``df`` plus ``pred_queue_wait_s``, ``pred_ttft_s``, ``pred_tpot_s``, ``pred_e2e_s``
        (seconds, relative to each request's arrival), ``pred_replica_id``,
        ``pred_num_preemptions``, ``pred_status`` and, when recorded,
        ``pred_token_times_s`` (relative to arrival); with prefix caching
        ``pred_num_cached_tokens`` (prefix-cache hit at first admission, tokens); with
        ``disagg`` the columns of :meth:`replay.disagg.DisaggEngine.result_columns`
        (``pred_queue_wait_s`` is then the prefill queue wait, ``pred_replica_id`` the
        prefill instance); with speculative decoding ``pred_num_draft_tokens``,
        ``pred_num_accepted_tokens`` and ``pred_acceptance_length`` (:func:`spec_columns`).
    engine : Engine

    Raises
    ------
    ConfigError
        Unknown scheduler, impossible KV cache or limits.

    Notes
    -----
    A cost model with ``dp > 1`` (vLLM ``--data-parallel-size`` of a MoE model) is one
    replica of ``dp`` ranks stepping in lock step: ``max_num_seqs``,
    ``max_num_batched_tokens`` and the KV blocks (all per rank, as vLLM takes them) are
    multiplied by ``dp``, and the step is priced for the group's tokens spread evenly over
    the ranks (:class:`replay.cost_terms.ReplicaShape`). An imbalance between the ranks
    (one busy, one idle running a dummy batch) is not modelled beyond that.
    """
    if cfg.max_num_seqs < 1 or cfg.max_num_batched_tokens < 1:
        raise ConfigError("--max-num-seqs and --max-num-batched-tokens must be >= 1")
    check_spec_options(cfg)
    check_closed_loop(cfg.concurrency, cfg.think_time_s)
    decode_cost_model = None
    if cfg.scheduler == "disagg":
        # each pool with its own TP (BR-23); the prefill pool's sizes the cache and swap time below
        cost_model, decode_cost_model, link = resolve_pools(cost_model, cfg)
        if cfg.preemption_mode == "swap" and cost_model.tp != decode_cost_model.tp:
            raise ConfigError("--preemption-mode swap with --scheduler disagg needs --tp-prefill equal to --tp-decode")
    else:
        factory = get_scheduler_factory(cfg.scheduler)
    # vLLM's data-parallel ranks of a MoE model step in lock step: the group is one replica with
    # every rank's limits and KV cache (cost_terms.ReplicaShape)
    dp = getattr(cost_model, "dp", 1)
    blocks = resolve_num_gpu_blocks(cfg, cost_model.model, cost_model.gpu, cost_model.tp) * dp
    max_len = cfg.max_model_len if cfg.max_model_len is not None else cost_model.model.max_model_len
    meta = metadata or {}
    hash_block_size = cfg.hash_block_size or int(meta.get("hash_block_tokens") or meta.get("hash_block_size") or 16)
    swap_time_per_block_s = 0.0
    if cfg.preemption_mode == "swap":
        if cfg.swap_link not in LINKS:
            raise ConfigError(f"--swap-link {cfg.swap_link}: unknown; known: {', '.join(LINKS)}")
        # each of the tp GPUs moves its share of the KV over its own host link
        swap_time_per_block_s = (cfg.block_size * cost_model.model.kv_bytes_per_token
                                 / (LINKS[cfg.swap_link].bandwidth_bytes_per_s * cost_model.tp))
    sched_cfg = SchedulerConfig(cfg.max_num_seqs * dp, cfg.max_num_batched_tokens * dp,
                                long_prefill_token_threshold=cfg.long_prefill_token_threshold,
                                num_speculative_tokens=cfg.speculative_tokens)
    engine_cfg = EngineConfig(blocks, cfg.block_size, max_len, cfg.record_token_times,
                              cfg.record_steps or cfg.record_step_requests,
                              enable_prefix_caching=cfg.enable_prefix_caching, hash_block_size=hash_block_size,
                              preemption_mode=cfg.preemption_mode, swap_time_per_block_s=swap_time_per_block_s,
                              record_step_requests=cfg.record_step_requests, exact_steps=cfg.exact_steps,
                              spec_acceptance_rate=cfg.spec_acceptance_rate or 0.0, seed=cfg.seed)
    if decode_cost_model is not None:
        m = cost_model.model
        engine = DisaggEngine(
            cost_model, decode_cost_model, sched_cfg, engine_cfg, model=m,
            decode_num_gpu_blocks=resolve_num_gpu_blocks(cfg, m, decode_cost_model.gpu, decode_cost_model.tp),
            link=link, prefill_replicas=cfg.prefill_replicas, decode_replicas=cfg.decode_replicas,
            first_token_from=cfg.first_token_from, router=get_router(cfg.router))
    else:
        engine = Engine(cost_model, factory, sched_cfg, engine_cfg, num_replicas=cfg.replicas,
                        router=get_router(cfg.router))
    frontend_s, stream_s = frontend_delays(cost_model, df, cfg)
    with _gc_paused():  # no cycles here; collections would rescan every live request again and again
        reqs = requests_from_frame(df, cfg.record_token_times, cfg.slo_ttft_s, cfg.slo_tpot_s, frontend_s)
        if cfg.concurrency is None:
            engine.run(reqs if frontend_s is None else sorted(reqs, key=attrgetter("arrival_time_s")))
        else:
            ClosedLoop(engine, reqs, cfg.concurrency, cfg.think_time_s).run()
        result = result_frame(df, reqs, cfg.record_token_times, frontend_s, stream_s)
        if cfg.concurrency is not None:
            result["pred_arrival_time_s"] = send_times_column(len(df), reqs)
        if isinstance(engine, DisaggEngine):
            for col, values in engine.result_columns(len(df)).items():
                result[col] = values
        if cfg.speculative_tokens:
            for col, values in spec_columns(engine, len(df)).items():
                result[col] = values
        if cfg.enable_prefix_caching:
            cached = np.zeros(len(df), np.int64)
            for r in reqs:
                cached[r.index] = r.num_cached_tokens
            result["pred_num_cached_tokens"] = cached
        del reqs  # freed by reference counting before collections resume
    return result, engine


def check_spec_options(cfg: ReplayConfig) -> None:
    """Refuse speculative-decoding and prefill-cap options that cannot be simulated.

    Raises
    ------
    ConfigError
        A negative ``speculative_tokens`` or ``long_prefill_token_threshold``; an
        acceptance rate outside [0, 1], missing with ``speculative_tokens`` > 0 or given
        without it.
    """
    if cfg.long_prefill_token_threshold < 0:
        raise ConfigError("--long-prefill-token-threshold must be >= 0 (0: no cap)")
    if cfg.speculative_tokens < 0:
        raise ConfigError("--speculative-tokens must be >= 0 (0: no speculative decoding)")
    a = cfg.spec_acceptance_rate
    if cfg.speculative_tokens and a is None:
        raise ConfigError("--speculative-tokens needs --spec-acceptance-rate (the probability that a draft token "
                          "is accepted given the ones before it were)")
    if a is not None and not cfg.speculative_tokens:
        raise ConfigError("--spec-acceptance-rate: only speculative decoding uses it; give --speculative-tokens K")
    if a is not None and not 0.0 <= a <= 1.0:
        raise ConfigError(f"--spec-acceptance-rate must be in [0, 1], not {a}")


def spec_columns(engine: Engine, num_rows: int) -> dict[str, np.ndarray]:
    """Per-request speculative-decoding columns of the replay result, by trace row.

    Returns
    -------
    dict
        ``pred_num_draft_tokens`` (int64: draft tokens the request's decodes verified),
        ``pred_num_accepted_tokens`` (int64: those accepted) and ``pred_acceptance_length``
        (float64: mean tokens emitted per verify step, ``1 + accepted / verify steps``, as
        vLLM reports it; NaN for a request that verified no draft).
    """
    drafts, accepted = np.zeros(num_rows, np.int64), np.zeros(num_rows, np.int64)
    length = np.full(num_rows, np.nan)
    for i, (steps, d, a) in engine.spec_counts.items():
        drafts[i], accepted[i], length[i] = d, a, 1.0 + a / steps
    return {"pred_num_draft_tokens": drafts, "pred_num_accepted_tokens": accepted, "pred_acceptance_length": length}


def spec_decode_stats(engine: Engine) -> dict:
    """Speculative decoding over the whole run, as vLLM's spec-decode metrics name them.

    Returns
    -------
    dict
        ``num_drafts`` (verify steps: decodes that verified at least one draft),
        ``num_draft_tokens``, ``num_accepted_tokens``, ``acceptance_rate`` (accepted /
        draft tokens, in [0, 1]) and ``acceptance_length`` (``1 + accepted / drafts``: mean
        tokens per verify step); the last two NaN when nothing was drafted.
    """
    steps = sum(c[0] for c in engine.spec_counts.values())
    drafts = sum(c[1] for c in engine.spec_counts.values())
    accepted = sum(c[2] for c in engine.spec_counts.values())
    return {"num_drafts": steps, "num_draft_tokens": drafts, "num_accepted_tokens": accepted,
            "acceptance_rate": accepted / drafts if drafts else math.nan,
            "acceptance_length": 1.0 + accepted / steps if steps else math.nan}


def frontend_delays(cost_model, df: pd.DataFrame, cfg: ReplayConfig) -> tuple[np.ndarray | None, float]:
    """Per row, the time before the engine (seconds), and the time per streamed output token
    after the first (seconds), of a cost model with front-end terms
    (:meth:`RooflineCostModel.frontend_s`); ``(None, 0.0)`` when both are zero, for a cost
    model without them, and in a closed loop (whose sends follow the engine's completions).
    """
    if cfg.concurrency is not None or not hasattr(cost_model, "frontend_s"):
        return None, 0.0
    fe = cost_model.frontend_s(df["num_prompt_tokens"].to_numpy(np.int64))
    fe = None if not np.any(fe) else np.broadcast_to(fe, (len(df),)).astype(float)
    return fe, float(cost_model.stream_per_token_s)


def result_frame(df: pd.DataFrame, reqs: list[Request], token_times: bool = False,
                 frontend_s: np.ndarray | None = None, stream_per_token_s: float = 0.0) -> pd.DataFrame:
    """``df`` with the predicted columns of the simulated ``reqs`` (others: status only);
    ``pred_token_times_s`` too with ``token_times`` (the requests recorded them).

    Latencies are from the client's send (``df``'s arrival): the engine's, plus
    ``frontend_s`` (per row, seconds) on every token and ``stream_per_token_s`` per token
    after the first; the queue wait is the engine's."""
    n = len(df)
    out_tokens = df["num_output_tokens"].to_numpy(np.int64)

    def column(name: str, dtype) -> np.ndarray:
        return np.fromiter(map(attrgetter(name), reqs), dtype, len(reqs))

    def scattered(values: np.ndarray, fill) -> np.ndarray:  # by row; rows not simulated get ``fill``
        if len(reqs) == n:  # every row, in order (requests_from_frame keeps the row order)
            return values
        out = np.full(n, fill, dtype=values.dtype)
        out[idx] = values
        return out

    idx = column("index", np.int64) if len(reqs) != n else None
    status_sim = column("status", object)
    ok = status_sim == OK
    arrival = column("arrival_time_s", float)
    qw, ttft, e2e = (scattered(np.where(ok, column(name, float) - arrival, np.nan), np.nan)
                     for name in ("first_scheduled_time_s", "first_token_time_s", "last_token_time_s"))
    if frontend_s is not None or stream_per_token_s:
        fe = frontend_s if frontend_s is not None else np.zeros(n)
        ttft = ttft + fe
        e2e = e2e + fe + stream_per_token_s * np.maximum(out_tokens - 1, 0)
    times = None
    if token_times:
        times = [None] * n
        for r in reqs:
            if r.status == OK and r.token_times_s is not None:
                shift = r.arrival_time_s - (0.0 if frontend_s is None else frontend_s[r.index])
                times[r.index] = [t - shift + stream_per_token_s * i for i, t in enumerate(r.token_times_s)]
    from schemas.metrics import tpot_s

    res = df.copy()
    res["pred_queue_wait_s"] = qw
    res["pred_ttft_s"] = ttft
    res["pred_tpot_s"] = tpot_s(ttft, e2e, out_tokens)
    res["pred_e2e_s"] = e2e
    res["pred_replica_id"] = scattered(column("replica_id", np.int64), -1)
    res["pred_num_preemptions"] = scattered(column("num_preemptions", np.int64), 0)
    res["pred_status"] = scattered(status_sim, because(NOT_SIMULATED, "failed in trace"))
    if times is not None:
        res["pred_token_times_s"] = times
    return res


def steps_frame(engine: Engine) -> pd.DataFrame:
    """The simulated step trace (``step_trace/1`` columns) of an engine run with ``record_steps``."""
    cols = ["replica_id", "step_start_time_s", "step_duration_s", "num_prefill_tokens", "num_prefill_seqs",
            "num_decode_seqs", "decode_context_tokens", "prefill_context_tokens"]
    frame = pd.DataFrame(engine.steps, columns=cols)
    if engine.step_decode_tokens and len(engine.step_decode_tokens) == len(frame):  # speculative decoding
        frame["num_decode_tokens"] = np.asarray(engine.step_decode_tokens, np.int64)
    return frame
