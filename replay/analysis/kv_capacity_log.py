"""KV-cache capacity read from a request log that does not record it (issue #21 item 6).

A paged-KV engine (vLLM's block manager, PagedAttention, Kwon et al. SOSP 2023) holds, for
every running request, ``ceil(context / block_size)`` blocks from its prefill to its end; the
context is the prompt plus the tokens generated so far. From a request log (arrival time,
TTFT, E2E, prompt and output lengths) the blocks in use at any time follow, with the tokens
generated between the first token and the end taken as linear in time (a request's decode
rate is steady between two prefills that stall it). When the cache is the bottleneck the log
shows it: the blocks in use stop growing at a plateau while requests wait although the batch
is below ``max_num_seqs``; vLLM admits a prompt only when its blocks fit beside a watermark
(``block_manager.can_allocate``) and preempts a running request when a decode finds no free
block, so the plateau sits at the capacity. Without such a plateau the log only bounds the
capacity from below (the peak in use).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

#: A plateau is where the blocks in use stay within this fraction of their peak.
PLATEAU_FRACTION = 0.95
#: Share of the log's time at the plateau with requests waiting that makes it a bottleneck.
MIN_SATURATED_SHARE = 0.05


@dataclass(frozen=True)
class KvCapacityFromLog:
    """What a request log says of the KV cache's size.

    Attributes
    ----------
    num_gpu_blocks : int | None
        The capacity estimated from the plateau's median (blocks per replica); None when the log
        never fills the cache (then only ``lower_bound_blocks`` is known).
    lower_bound_blocks : int
        The peak of the blocks in use: the capacity is at least this (but for the requests
        preempted by recompute, which the log counts as running).
    saturated_share : float
        Share of the log's time at the plateau with requests waiting below ``max_num_seqs``.
    block_size : int
        Tokens per block used to count.
    """

    num_gpu_blocks: int | None
    lower_bound_blocks: int
    saturated_share: float
    block_size: int

    def describe(self) -> str:
        """One line for the user, e.g. ``"~3,495 blocks (16 tokens) from the log: ..."``."""
        if self.num_gpu_blocks is None:
            return (f">= {self.lower_bound_blocks:,} blocks ({self.block_size} tokens): the peak the log holds at "
                    "once; it never fills the KV cache, so its size is not identified")
        return (f"~{self.num_gpu_blocks:,} blocks ({self.block_size} tokens) from the log: the blocks in use "
                f"plateau there (peak {self.lower_bound_blocks:,}) while requests wait below max_num_seqs "
                f"({self.saturated_share:.0%} of its time)")


def blocks_in_use(requests: pd.DataFrame, times_s: np.ndarray, block_size: int) -> tuple[np.ndarray, ...]:
    """Blocks held, requests running and requests waiting at each time of ``times_s``.

    Parameters
    ----------
    requests : DataFrame
        A request trace with measured ``ttft_s`` and ``e2e_s`` (rows without them are left
        out), ``arrival_time_s`` [s], ``num_prompt_tokens``, ``num_output_tokens``.
    times_s : ndarray, shape (T,)
        Times on the trace's clock [s].
    block_size : int
        Tokens per KV block.

    Returns
    -------
    blocks, running, waiting : ndarray, shape (T,)
        ``sum ceil((L_prompt + 1 + g(t)) / block_size)`` over the requests between their
        first token and their end, ``g`` the tokens generated after the first, linear in time
        from 0 to ``L_out - 1``; the count of those requests; the count between arrival and
        first token (queued or in prefill).
    """
    arrival, first, end, prompt, out = _timeline(requests)
    blocks, running, waiting = (np.zeros(len(times_s)) for _ in range(3))
    step = max(1, 2_000_000 // len(arrival))  # times per chunk: ~2M floats per temporary, whatever R
    for lo in range(0, len(times_s), step):
        t = np.asarray(times_s[lo:lo + step], dtype=float)[:, None]
        run = (first <= t) & (t < end)
        frac = np.clip((t - first) / np.maximum(end - first, 1e-12), 0.0, 1.0)
        ctx = prompt + 1 + frac * np.maximum(out - 1, 0)
        blocks[lo:lo + step] = np.where(run, np.ceil(ctx / block_size), 0.0).sum(axis=1)
        running[lo:lo + step] = run.sum(axis=1)
        waiting[lo:lo + step] = ((arrival <= t) & (t < first)).sum(axis=1)
    return blocks, running, waiting


def kv_capacity_from_log(requests: pd.DataFrame, block_size: int = 16, max_num_seqs: int | None = None,
                         num_samples: int = 4000) -> KvCapacityFromLog:
    """Estimate or bound the KV cache's size (blocks per replica) from a request log.

    Parameters
    ----------
    requests : DataFrame
        As :func:`blocks_in_use` takes it; one replica's requests.
    block_size : int
        Tokens per block (vLLM's ``--block-size``, 16 by default).
    max_num_seqs : int, optional
        The engine's batch cap; times with this many running are not evidence of a full
        cache (the batch cap holds the queue then).
    num_samples : int
        Evenly spaced times from the first arrival to the last end at which the blocks are
        counted.

    Returns
    -------
    KvCapacityFromLog
        ``num_gpu_blocks`` the median of the blocks in use at the plateau: the times within
        :data:`PLATEAU_FRACTION` of the peak with at least two requests waiting (one is the
        one in prefill) below ``max_num_seqs``, when they are at least
        :data:`MIN_SATURATED_SHARE` of the log's time; else None, with the peak as lower
        bound.

    Raises
    ------
    ValueError
        ``block_size`` or ``num_samples`` below 1, or no request with a measured TTFT and E2E.

    Notes
    -----
    The log cannot tell a request preempted by recompute from a running one, so the
    plateau overcounts while such requests wait to be recomputed (and under the watermark
    of free blocks vLLM keeps for admission, 1 % in v0, it undercounts): on a synthetic log
    of a 500-block cache at 30 and 60 req/s the median reads 520-521 blocks, the peak 542-543
    (tests/replay/test_kv_capacity_log.py). The median is the less biased; both are said.
    """
    if block_size < 1 or num_samples < 1:
        raise ValueError(f"block_size ({block_size}) and num_samples ({num_samples}) must be >= 1")
    arrival, _, end, _, _ = _timeline(requests)
    times = np.linspace(arrival.min(), end.max(), num_samples)
    blocks, running, waiting = blocks_in_use(requests, times, block_size)
    peak = int(blocks.max())
    below_cap = running < max_num_seqs if max_num_seqs else np.ones_like(running, dtype=bool)
    saturated = (blocks >= PLATEAU_FRACTION * peak) & (waiting >= 2) & below_cap
    share = float(saturated.mean())
    if share < MIN_SATURATED_SHARE or peak == 0:
        return KvCapacityFromLog(None, peak, share, block_size)
    return KvCapacityFromLog(int(np.median(blocks[saturated])), peak, share, block_size)


def _timeline(requests: pd.DataFrame) -> tuple[np.ndarray, ...]:
    """Arrival, first-token and end times [s], prompt and output tokens of the requests with
    a measured TTFT and E2E (ValueError when there is none)."""
    cols = ("arrival_time_s", "ttft_s", "e2e_s", "num_prompt_tokens", "num_output_tokens")
    if any(c not in requests.columns for c in cols):
        raise ValueError(f"a request log with {', '.join(cols)} is needed to read the KV cache's size")
    arrival, ttft, e2e, prompt, out = (requests[c].to_numpy(dtype=float, na_value=np.nan) for c in cols)
    ok = np.isfinite(arrival) & np.isfinite(ttft) & np.isfinite(e2e) & (e2e >= ttft)
    if not ok.any():
        raise ValueError("no request has a measured TTFT and E2E: the KV cache's size cannot be read from the log")
    a = arrival[ok]
    return a, a + ttft[ok], a + e2e[ok], prompt[ok], out[ok]


def kv_blocks_when_not_recorded(logs: list[tuple[str, pd.DataFrame]], block_size: int, max_num_seqs: int | None,
                                default_blocks: int | None = None) -> tuple[int | None, str | None]:
    """The KV blocks to simulate for a deployment whose logs do not record them, and what to say.

    Parameters
    ----------
    logs : list of (name, DataFrame)
        Request logs of one colocated deployment (one replica each); logs without measured
        TTFT and E2E are skipped.
    block_size, max_num_seqs : int
        The engine's settings.
    default_blocks : int, optional
        What GPU memory gives (:func:`replay.core.deployment.resolve_num_gpu_blocks`), to compare.

    Returns
    -------
    (blocks, message)
        ``blocks`` the median of the estimates of the logs whose cache fills
        (:func:`kv_capacity_from_log`), else the largest lower bound when it exceeds
        ``default_blocks`` (the memory-derived cache is smaller than what a log held), else
        None (keep the default); ``message`` one line naming the logs, or None when no log
        has latencies.
    """
    found = []
    for name, frame in logs:
        try:
            found.append((name, kv_capacity_from_log(frame, block_size, max_num_seqs)))
        except ValueError:
            continue
    if not found:
        return None, None
    filled = [est.num_gpu_blocks for _, est in found if est.num_gpu_blocks is not None]
    if filled:
        blocks = int(np.median(filled))
        said = "; ".join(f"{name}: {est.describe()}" for name, est in found if est.num_gpu_blocks is not None)
        return blocks, (f"num_gpu_blocks not recorded: {blocks:,} read from the log{'s' if len(filled) > 1 else ''} "
                        f"({said}); "
                        "--num-gpu-blocks overrides")
    name, low = max(found, key=lambda x: x[1].lower_bound_blocks)
    if default_blocks is not None and low.lower_bound_blocks > default_blocks:
        return low.lower_bound_blocks, (f"num_gpu_blocks not recorded: {low.lower_bound_blocks:,}, the most {name} "
                                        f"holds at once, above the {default_blocks:,} GPU memory gives; "
                                        "--num-gpu-blocks overrides")
    mem = f"{default_blocks:,} from GPU memory" if default_blocks is not None else "the default from GPU memory"
    return None, (f"num_gpu_blocks not recorded: {mem}; no log fills the KV cache, so they only bound it: "
                  f"{low.describe()} ({name}); --num-gpu-blocks overrides")


def kv_blocks_from_logs(logs: list, engine, cost_model, colocated: bool) -> tuple[int | None, str | None]:
    """The KV blocks per replica read from ``logs`` when nothing set them, and the line to print.

    Parameters
    ----------
    logs : list of (name, DataFrame)
        The measured request logs, one deployment.
    engine : replay.config.EngineOptions
        Its settings after the command line and the recorded ones filled them: an explicit
        or recorded ``num_gpu_blocks`` is never replaced (then ``(None, None)``).
    cost_model : RooflineCostModel
        The replica: the memory default comes from its model, GPU and TP.
    colocated : bool
        One replica, no DP, PP or disaggregation, the run as measured (no what-if): only then
        does a log show the cache of the engine simulated.

    Returns
    -------
    (blocks, line)
        As :func:`replay.analysis.kv_capacity_log.kv_blocks_when_not_recorded`.
    """
    if engine.num_gpu_blocks is not None or not colocated or cost_model.dp != 1 or cost_model.pp != 1:
        return None, None
    from ..errors import ConfigError
    from ..core.deployment import resolve_num_gpu_blocks

    try:
        default = resolve_num_gpu_blocks(engine, cost_model.model, cost_model.gpu, cost_model.tp)
    except ConfigError:  # no block fits: the replay itself says so, naming the trace
        return None, None
    return kv_blocks_when_not_recorded(logs, engine.block_size, engine.max_num_seqs, default)
