"""Replay a request trace through the engine: the library entry point behind ``replay``."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from schemas.specs import GpuSpec, ModelSpec

from .cost_model import RooflineCostModel, kv_capacity_blocks
from .engine import Engine, EngineConfig
from .errors import ConfigError
from .request import Request
from .schedulers import get_scheduler_factory
from .schedulers.base import SchedulerConfig


@dataclass
class ReplayConfig:
    """Options of one replay, named as vLLM names its engine arguments.

    Attributes
    ----------
    scheduler : str
        Built-in name (``chunked``, ``fcfs``, ...) or ``package.module:ClassName``.
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
    record_token_times : bool
        Keep per-token times (``pred_token_times_s``), needed for ITL.
    record_steps : bool
        Keep the simulated step trace.
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
        return kv_capacity_blocks(model, gpu, tp, cfg.gpu_memory_utilization, cfg.block_size)
    except ValueError as exc:
        raise ConfigError(f"{exc}; raise --tp or --gpu-memory-utilization, or give --num-gpu-blocks") from None


def requests_from_frame(df: pd.DataFrame, record_token_times: bool = False) -> list[Request]:
    """Engine requests from a request-trace DataFrame (sorted by arrival).

    Rows whose ``status`` is set and not ``ok`` (failed in the measured run) are not simulated.
    """
    ids = df["request_id"].astype(str).to_numpy()
    arr = df["arrival_time_s"].to_numpy(float)
    prompt = df["num_prompt_tokens"].to_numpy(np.int64)
    out = df["num_output_tokens"].to_numpy(np.int64)
    prio = df["priority"].to_numpy(np.int64) if "priority" in df else np.zeros(len(df), np.int64)
    hashes = df["block_hashes"].to_numpy() if "block_hashes" in df else None
    status = df["status"].to_numpy() if "status" in df else None
    reqs = []
    for i in range(len(df)):
        if status is not None and status[i] not in (None, "ok") and status[i] == status[i]:
            continue
        reqs.append(Request(i, ids[i], float(arr[i]), int(prompt[i]), int(out[i]), priority=int(prio[i]),
                            block_hashes=None if hashes is None else hashes[i],
                            record_token_times=record_token_times))
    return reqs


def replay_frame(df: pd.DataFrame, cost_model: RooflineCostModel, cfg: ReplayConfig) -> tuple[pd.DataFrame, Engine]:
    """Replay a request trace; return the replay result and the engine (steps, counters).

    Parameters
    ----------
    df : pandas.DataFrame
        A validated request trace (``request_trace/1`` columns), sorted by arrival time.
    cost_model : RooflineCostModel
    cfg : ReplayConfig

    Returns
    -------
    result : pandas.DataFrame
        ``df`` plus ``pred_queue_wait_s``, ``pred_ttft_s``, ``pred_tpot_s``, ``pred_e2e_s``
        (seconds, relative to each request's arrival), ``pred_replica_id``,
        ``pred_num_preemptions``, ``pred_status`` and, when recorded,
        ``pred_token_times_s`` (relative to arrival).
    engine : Engine

    Raises
    ------
    ConfigError
        Unknown scheduler, impossible KV cache or limits.
    """
    if cfg.max_num_seqs < 1 or cfg.max_num_batched_tokens < 1:
        raise ConfigError("--max-num-seqs and --max-num-batched-tokens must be >= 1")
    factory = get_scheduler_factory(cfg.scheduler)
    blocks = resolve_num_gpu_blocks(cfg, cost_model.model, cost_model.gpu, cost_model.tp)
    max_len = cfg.max_model_len if cfg.max_model_len is not None else cost_model.model.max_model_len
    engine = Engine(cost_model, factory, SchedulerConfig(cfg.max_num_seqs, cfg.max_num_batched_tokens),
                    EngineConfig(blocks, cfg.block_size, max_len, cfg.record_token_times, cfg.record_steps),
                    num_replicas=cfg.replicas)
    reqs = requests_from_frame(df, cfg.record_token_times)
    engine.run(reqs)
    return result_frame(df, reqs), engine


def result_frame(df: pd.DataFrame, reqs: list[Request]) -> pd.DataFrame:
    """``df`` with the predicted columns of the simulated ``reqs`` (others: status only)."""
    n = len(df)
    qw, ttft, e2e = (np.full(n, np.nan) for _ in range(3))
    rep, pre = np.full(n, -1, np.int64), np.zeros(n, np.int64)
    status = np.array(["not simulated: failed in trace"] * n, dtype=object)
    times = [None] * n
    out_tokens = df["num_output_tokens"].to_numpy(np.int64)
    for r in reqs:
        i = r.index
        status[i] = r.status
        rep[i] = r.replica_id
        pre[i] = r.num_preemptions
        if r.status == "ok":
            qw[i] = r.first_scheduled_time_s - r.arrival_time_s
            ttft[i] = r.first_token_time_s - r.arrival_time_s
            e2e[i] = r.last_token_time_s - r.arrival_time_s
            if r.token_times_s is not None:
                times[i] = [t - r.arrival_time_s for t in r.token_times_s]
    from .metrics import tpot_s

    res = df.copy()
    res["pred_queue_wait_s"] = qw
    res["pred_ttft_s"] = ttft
    res["pred_tpot_s"] = tpot_s(ttft, e2e, out_tokens)
    res["pred_e2e_s"] = e2e
    res["pred_replica_id"] = rep
    res["pred_num_preemptions"] = pre
    res["pred_status"] = status
    if any(t is not None for t in times):
        res["pred_token_times_s"] = times
    return res


def steps_frame(engine: Engine) -> pd.DataFrame:
    """The simulated step trace (``step_trace/1`` columns) of an engine run with ``record_steps``."""
    cols = ["replica_id", "step_start_time_s", "step_duration_s", "num_prefill_tokens", "num_prefill_seqs",
            "num_decode_seqs", "decode_context_tokens", "prefill_context_tokens"]
    return pd.DataFrame(engine.steps, columns=cols)
