"""Runs from aggregate results (``aggregate_targets/1``): a synthesized workload per load level,
replayed at the level's load, matched to the statistics the benchmark reported.

A summary has no requests to replay. Each level's workload is drawn from its recorded
length statistics, and the run's targets are the level's reported latency percentiles
(those in :data:`MATCHED_PCT`) and means, which the request-log fit
(:func:`calibrate.request_fit.fit_requests`) matches as it matches a log's quantiles.

Workload of a level (seeded: the same file gives the same runs):

* ``min(num_requests, MAX_REQUESTS)`` requests;
* lengths: where percentiles of a length are reported, the piecewise-linear inverse CDF
  through (0, min), the reported (percentile, value) points and (100, max) (the lowest and
  highest reported percentile stand in for a missing min and max), at stratified uniform
  points (one in each 1/n of the CDF, in random order: the sample's percentiles are the
  reported ones to within a request); otherwise a normal of
  the reported mean and std (std unknown: every request at the mean), clipped to
  [max(1, min), max]; rounded to whole tokens, at least 1;
* load: ``concurrency`` N, a closed loop of N clients (:class:`replay.core.closed_loop.ClosedLoop`),
  all sending at 0 as a benchmark's clients do; when every synthesized request has the same
  lengths (the aggregate gives only means), the clients would complete in the same steps and
  send again together forever, which real clients, staggered by the server's own variation, do
  not: their first sends are then spread evenly over the level's reported mean E2E (the cycle
  of a client in the steady state; ``closed_loop_start_spread_s`` in the run's metadata);
  ``poisson_rate`` r, exponential gaps of mean 1/r from 0; ``constant_rate`` r, one request
  every 1/r s;
* prompts: unique (no prefix-cache hit), unless the file's metadata states
  ``shared_prefix_tokens`` S (``traces import summary --shared-prefix-tokens``): then every
  prompt of a level opens with the same S tokens (its first ``min(S, prompt) // 16`` hash
  blocks are the level's), the rest unique.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from schemas.tables import AGGREGATE_LATENCIES

from .errors import FitError
from .run_errors import Run, chosen

#: Percentiles matched: the reported ones in this range (the tails of a run of tens or
#: hundreds of requests are a few requests each), plus the reported means.
MATCHED_PCT = (10.0, 90.0)
#: Requests synthesized per level at most (a replay per level per evaluation of the fit).
MAX_REQUESTS = 1000
#: Seed of the synthesized workloads (level k uses SEED + k).
SEED = 0
#: Tokens per hash block of the synthesized prompts (``hash_block_tokens``).
BLOCK_TOKENS = 16


def _lengths(stats: pd.DataFrame, n: int, rng: np.random.Generator, metric: str, where: str) -> np.ndarray:
    """``n`` lengths of ``metric`` from its statistics rows (see the module's docstring)."""
    rows = stats[stats["metric"] == metric]
    one = {s: float(v) for s, v in zip(rows["statistic"], rows["value_tokens"]) if s != "quantile"}
    q = rows[rows["statistic"] == "quantile"].sort_values("quantile_pct")
    lo, hi = one.get("min"), one.get("max")
    if len(q):
        pct, val = q["quantile_pct"].to_numpy(float), q["value_tokens"].to_numpy(float)
        pct = np.concatenate([[0.0], pct, [100.0]])
        val = np.maximum.accumulate(np.concatenate([[val[0] if lo is None else min(lo, val[0])], val,
                                                    [val[-1] if hi is None else max(hi, val[-1])]]))
        u = (rng.permutation(n) + rng.uniform(size=n)) * (100.0 / n)  # stratified: one draw per 1/n of the CDF
        v = np.interp(u, pct, val)
    elif "mean" in one:
        v = rng.normal(one["mean"], one.get("std", 0.0), n)
        v = np.clip(v, max(1.0, lo or 1.0), hi if hi is not None else np.inf)
    else:
        raise FitError(f"{where}: no statistic of {metric} (a mean or percentiles); "
                       "the workload of the level cannot be synthesized")
    return np.maximum(np.rint(v), 1).astype(np.int64)


def level_trace(level: pd.DataFrame, where: str, seed: int, shared_prefix_tokens: int = 0) -> pd.DataFrame:
    """The synthesized request trace of one level's rows (``request_trace/1`` columns), with
    ``block_hashes`` when prompts share a prefix of ``shared_prefix_tokens``."""
    kind, value = level["level_kind"].iloc[0], float(level["level_value"].iloc[0])
    n = int(min(level["num_requests"].iloc[0], MAX_REQUESTS))
    rng = np.random.default_rng(seed)
    prompt = _lengths(level, n, rng, "num_prompt_tokens", where)
    output = _lengths(level, n, rng, "num_output_tokens", where)
    if kind == "poisson_rate":
        arrival = np.concatenate([[0.0], np.cumsum(rng.exponential(1.0 / value, n - 1))])
    elif kind == "constant_rate":
        arrival = np.arange(n) / value
    else:
        arrival = np.zeros(n)
    trace = pd.DataFrame({"request_id": [str(i + 1) for i in range(n)], "arrival_time_s": arrival,
                          "num_prompt_tokens": prompt, "num_output_tokens": output})
    if shared_prefix_tokens > 0:
        shared = np.minimum(shared_prefix_tokens, prompt) // BLOCK_TOKENS
        full = prompt // BLOCK_TOKENS
        start = np.concatenate([[0], np.cumsum(full - shared)[:-1]]) + (1 << 40)  # unique ids above the shared ones
        trace["block_hashes"] = [list(range(s)) + list(range(u, u + f - s)) for s, f, u in zip(shared, full, start)]
    return trace


def level_targets(level: pd.DataFrame, pct_range: tuple[float, float] = MATCHED_PCT) -> dict:
    """metric -> (percentiles, NaN for a mean; values, seconds): the reported means and the
    percentiles in ``pct_range`` (default: what the fit matches; (0, 100): every one, scored by
    validation)."""
    out = {}
    for m in AGGREGATE_LATENCIES:
        rows = level[level["metric"] == m]
        q = rows["quantile_pct"].to_numpy(float)
        keep = ((rows["statistic"] == "quantile").to_numpy() & (q >= pct_range[0]) & (q <= pct_range[1])) \
            | (rows["statistic"] == "mean").to_numpy()
        if keep.any():
            out[m] = (np.where(rows["statistic"].to_numpy()[keep] == "mean", np.nan, q[keep]),
                      rows["value_s"].to_numpy(float)[keep])
    return out


def aggregate_runs(path: str, frame: pd.DataFrame, meta: dict, cfg, level: int | None) -> list[Run]:
    """One run per level of an ``aggregate_targets/1`` table (or level ``level`` alone).

    Each run's trace is the level's synthesized workload (:func:`level_trace`, seed
    ``SEED + level``), its config ``cfg`` with the level's ``concurrency`` (None for a rate),
    its targets :func:`level_targets`, its ``reported`` every mean and percentile of the level.

    Raises
    ------
    FitError
        A level not in the file, a level with no latency statistic in :data:`MATCHED_PCT` or
        mean, or one whose lengths have no statistic.
    """

    runs = []
    for k in chosen(frame, "level", level, f"{path}#{level}", "level"):
        rows = frame[frame["level"] == k]
        name = f"{path}#{k}"
        targets = level_targets(rows)
        if not targets:
            raise FitError(f"{name}: no latency percentile in p{MATCHED_PCT[0]:g}..p{MATCHED_PCT[1]:g} and no mean; "
                           "nothing for the fit to match")
        kind, value = rows["level_kind"].iloc[0], rows["level_value"].iloc[0]
        run_cfg = cfg.with_options(concurrency=int(value) if kind == "concurrency" else None)
        meta_k = {**meta, "aggregate_level": f"{kind.replace('_', ' ')} {value:g}",
                  "hash_block_tokens": str(BLOCK_TOKENS)}
        trace = level_trace(rows, name, SEED + int(k), shared_prefix_tokens(meta, path))
        if kind == "concurrency" and _identical(trace) and "e2e_s" in targets:
            means = targets["e2e_s"][1][np.isnan(targets["e2e_s"][0])]
            if means.size:
                meta_k["closed_loop_start_spread_s"] = f"{means[0]:.9g}"
        runs.append(Run(name, trace, run_cfg, meta_k, None, None, targets, level_targets(rows, (0.0, 100.0))))
    return runs


def _identical(trace: pd.DataFrame) -> bool:
    """Whether every synthesized request has the same prompt and output lengths."""
    return trace["num_prompt_tokens"].nunique() == 1 and trace["num_output_tokens"].nunique() == 1


def shared_prefix_tokens(meta: dict, path) -> int:
    """The ``shared_prefix_tokens`` an aggregate's metadata states (0: none).

    Raises
    ------
    FitError
        A value that is not a whole number >= 0.
    """
    text = str(meta.get("shared_prefix_tokens", "0"))
    if not (text.isascii() and text.isdigit()):
        raise FitError(f"{path}: metadata shared_prefix_tokens {text[:40]!r} is not a whole number of tokens >= 0")
    return int(text)


def fit_runs(runs: list[Run], cost_model, **options) -> list:
    """:func:`calibrate.request_fit.fit_requests` on request logs and runs of aggregates alike.

    With a run of aggregates among ``runs``, TTFT, TPOT and E2E are matched unless ``options``
    name the metrics (a summary may lack TPOT; its E2E then carries the decode), and the best
    fit's warnings say what the aggregates cannot identify (:func:`not_identified`).
    Returns the fits, best first; raises what ``fit_requests`` raises.
    """
    from .request_fit import fit_requests

    aggregate = [r for r in runs if r.targets is not None]
    if aggregate:
        options.setdefault("metrics", ("ttft_s", "tpot_s", "e2e_s"))
    fits = fit_requests(runs, cost_model, **options)
    if aggregate:
        fits[0].warnings += not_identified(aggregate)
    return fits


def not_identified(runs: list[Run]) -> list[str]:
    """What a fit on these aggregate runs cannot tell, in sentences (printed as warnings and
    recorded with the calibration)."""
    out = ["fitted from aggregates (aggregate_targets/1): each level's workload is synthesized from its "
           f"recorded length statistics (seed {SEED}), not the measured requests; only reported percentiles in "
           f"p{MATCHED_PCT[0]:g}..p{MATCHED_PCT[1]:g} and means are matched"]
    spread = [r.name for r in runs if _identical(r.trace)]
    if spread:
        out.append(f"{', '.join(spread)}: every synthesized request has the same lengths (the aggregate gives only "
                   "their means), so terms that grow with the length are told apart only across levels, and a "
                   "closed loop's clients start spread over the level's mean E2E instead of at once")
    if len(runs) == 1:
        out.append("one load level: per-step and per-token costs, and the scheduler's batching, are told apart "
                   "only by the spread of lengths within it; fit several levels (concurrencies or rates)")
    if not any("tpot_s" in r.targets or "e2e_s" in r.targets for r in runs):
        out.append("no TPOT or E2E statistic: the decode is not constrained")
    if any("block_hashes" in r.trace for r in runs):
        shared = shared_prefix_tokens(runs[0].metadata, "")
        out.append(f"prefix cache: the prompts of a level share their first {shared} tokens as stated at import "
                   "(--shared-prefix-tokens), not as measured")
    else:
        out.append("prefix-cache hits are unknown (an aggregate records no prompts): they are folded into the "
                   "fitted prefill speed (state a shared prefix with traces import summary --shared-prefix-tokens)")
    out.append("time outside the engine (network, API front end; all of it for a hosted API) is folded into "
               "TTFT and into the fitted terms")
    return out
