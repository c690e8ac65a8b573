"""The workload of a level of aggregate results (``aggregate_targets/1``): a request trace
synthesized from the level's recorded length statistics and load.

An aggregate (a benchmark's summary, a window of Prometheus scrapes) records no requests. The
fit replays each level on a synthesized workload (:mod:`calibrate.aggregate_runs`), and so do
``replay`` and ``servecal plan`` when given an aggregate: the same function, seeded, so that the
same file gives the same requests everywhere.

Workload of a level (seeded: the same file gives the same runs):

* ``min(num_requests, MAX_REQUESTS)`` requests; for a window of scrapes (an open-loop level
  with ``arrival_counts`` and ``requests_held``: :mod:`traces.scrape_window`), instead every
  request the window held or saw arrive, as many of them, since its histograms counted only
  those that finished in it;
* lengths: where percentiles of a length are reported, the inverse CDF through (0, min), the
  reported (percentile, value) points and (100, max) (the lowest and highest reported
  percentile stand in for a missing min and max), at stratified uniform points (one in each
  1/n of the CDF, in random order: the sample's percentiles are the reported ones to within a
  request), piecewise linear between two points. When the file's metadata states
  ``length_points: bucket bounds`` (``traces import prometheus``: the points are histogram
  bucket bounds, min and max those of the first and last bucket with a request, so a length
  known by min, max and mean alone is one bucket's), the density between two points is
  instead the one of maximum entropy with the reported mean
  (:func:`traces.binned.tilted_quantiles`: ``exp(λ x)`` inside every segment, one ``λ``), so
  that the sample has the exact mean: inside a bucket nothing else is known of the lengths,
  and a uniform one can put the mean half a bucket off (bench/PROMETHEUS.md: vLLM's 1-2-5
  buckets put a real run's outputs 15 % above their exact mean, the scrape fit's largest
  loss). A summary's percentiles are its sample's own order statistics, between which the
  linear reading stands (filling them with the mean moved the held-out errors of the LLMPerf
  summary and the GuideLLM sweep both ways: bench/PROMETHEUS.md). Otherwise a normal of
  the reported mean and std (std unknown: every request at the mean), clipped to
  [max(1, min), max]; rounded to whole tokens, at least 1;
* arrivals: at an open-loop level whose arrivals were counted over intervals (the file's
  metadata ``arrival_counts``: :func:`traces.scrape_window.arrival_counts`; ``traces import prometheus`` counts them
  between scrapes), a Poisson process conditioned on those counts: each interval's requests
  uniform over it (the arrival times of a Poisson process given their number in an interval
  are uniform order statistics, whatever its rate, constant inside the interval: Ross,
  *Stochastic Processes*, 2nd ed., Thm 2.3.1), from the start of the first interval with an
  arrival; the level's first ``n`` of them, and when it finished more requests than arrived in
  its time (or, for a window of scrapes, the requests held at its first scrape), the others
  at 0 (they arrived before it: the server held them when it began).
  Otherwise
  ``poisson_rate`` r, exponential gaps of mean 1/r from 0; ``constant_rate`` r, one
  request every 1/r s; ``concurrency`` N, every request at 0 (the closed loop of N clients that
  sends them is the replay's: :class:`replay.core.closed_loop.ClosedLoop`). When every
  synthesized request has the same lengths (the aggregate gives only means), the clients would
  complete in the same steps and send again together forever, which real clients, staggered by
  the server's own variation, do not: their first sends are then spread evenly over the level's
  reported mean E2E (the cycle of a client in the steady state; ``closed_loop_start_spread_s``
  in :func:`level_metadata`);
* prompts: unique (no prefix-cache hit), unless the file's metadata states
  ``shared_prefix_tokens`` S (``traces import summary --shared-prefix-tokens``): then every
  prompt of a level opens with the same S tokens (its first ``min(S, prompt) // 16`` hash
  blocks are the level's), the rest unique.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from schemas.tables import AGGREGATE_LATENCIES
from schemas.text import wrap_error

from .binned import tilted_quantiles
from .errors import TraceError
from .scrape_window import (OBSERVED_UNTIL, arrival_counts, observed_until_s, origin_s, replayed_requests,
                            requests_held, whole_counts)

#: Requests synthesized per level at most (a replay per level per evaluation of the fit).
MAX_REQUESTS = 1000
#: Seed of the synthesized workloads (level k uses SEED + k).
SEED = 0
#: Tokens per hash block of the synthesized prompts (``hash_block_tokens``).
BLOCK_TOKENS = 16
#: The level kinds of an open loop (requests arrive at a rate, whatever the server does).
OPEN_LOOP = ("poisson_rate", "constant_rate")
#: The metadata ``length_points`` of a file whose length points are histogram bucket bounds.
BUCKET_BOUNDS = "bucket bounds"


def _lengths(stats: pd.DataFrame, n: int, rng: np.random.Generator, metric: str, where: str,
             bucket_bounds: bool) -> np.ndarray:
    """``n`` lengths of ``metric`` from its statistics rows (see the module's docstring);
    ``bucket_bounds``: its points are histogram bucket bounds, filled with the mean."""
    rows = stats[stats["metric"] == metric]
    one = {s: float(v) for s, v in zip(rows["statistic"], rows["value_tokens"]) if s != "quantile"}
    q = rows[rows["statistic"] == "quantile"].sort_values("quantile_pct")
    lo, hi = one.get("min"), one.get("max")
    one_bucket = bucket_bounds and "mean" in one and lo is not None and hi is not None and lo < hi
    if len(q) or one_bucket:
        qp, qv = q["quantile_pct"].to_numpy(float), q["value_tokens"].to_numpy(float)
        first = lo if not qv.size else (qv[0] if lo is None else min(lo, qv[0]))
        last = hi if not qv.size else (qv[-1] if hi is None else max(hi, qv[-1]))
        pct = np.concatenate([[0.0], qp, [100.0]])
        val = np.maximum.accumulate(np.concatenate([[first], qv, [last]]))
        u = (rng.permutation(n) + rng.uniform(size=n)) / n  # stratified: one draw per 1/n of the CDF
        v = tilted_quantiles(val, pct / 100.0, one.get("mean") if bucket_bounds else None, u)
    elif "mean" in one:
        v = rng.normal(one["mean"], one.get("std", 0.0), n)
        v = np.clip(v, max(1.0, lo or 1.0), hi if hi is not None else np.inf)
    else:
        raise TraceError(wrap_error(f"{where}: no statistic of {metric} (a mean or percentiles); "
                                    "the workload of the level cannot be synthesized"))
    return np.maximum(np.rint(v), 1).astype(np.int64)


def _scheduled(counts: list, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` arrival times (seconds from the first counted arrival's interval,
    :func:`traces.scrape_window.origin_s`) of a Poisson process conditioned on ``counts``,
    ``(start_s, end_s, requests)`` per interval (module docstring); the counts are rounded to
    whole requests keeping their running total."""
    times = np.sort(np.concatenate([rng.uniform(c[0], c[1], k) for c, k in zip(counts, whole_counts(counts))]))
    times = times - origin_s(counts)
    return times[:n] if n <= times.size else np.concatenate([np.zeros(n - times.size), times])


def _windowed(kind: str, counts: list | None, held: list | None) -> bool:
    """Whether a level is replayed as a window of scrapes (module docstring): an open loop with
    arrivals counted (one at least) and the requests held at its scrapes."""
    return kind in OPEN_LOOP and bool(counts) and held is not None and int(whole_counts(counts).sum()) >= 1


def level_trace(level: pd.DataFrame, where: str, seed: int, shared_prefix_tokens: int = 0,
                counts: list | None = None, bucket_bounds: bool = False, held: list | None = None) -> pd.DataFrame:
    """The synthesized request trace of one level.

    Parameters
    ----------
    level : pandas.DataFrame
        The level's rows of an ``aggregate_targets/1`` table.
    where : str
        The level's name in errors (``FILE#K``).
    seed : int
        Seed of the draws (the fit uses ``SEED + K`` for level ``K``).
    shared_prefix_tokens : int
        Tokens every prompt of the level opens with (:func:`shared_prefix_tokens`).
    counts : list of (start_s, end_s, requests), optional
        The level's arrivals counted over intervals (:func:`arrival_counts`): used at an open-loop
        level when they hold an arrival.
    bucket_bounds : bool
        The lengths' points are histogram bucket bounds (:func:`length_points_are_buckets`).
    held : list of (time_s, running, waiting), optional
        The requests held at the level's scrapes (:func:`traces.scrape_window.requests_held`):
        with ``counts``, the level is a window of scrapes and its workload every arrival of it
        (:func:`traces.scrape_window.replayed_requests`), not its count of finished requests.

    Returns
    -------
    pandas.DataFrame
        ``request_trace/1`` columns (arrival times in seconds from 0, lengths in tokens), with
        ``block_hashes`` when prompts share a prefix.

    Raises
    ------
    TraceError
        A length with neither a mean nor percentiles.
    """
    kind, value = level["level_kind"].iloc[0], float(level["level_value"].iloc[0])
    windowed = _windowed(kind, counts, held)
    n = int(min(replayed_requests(counts, held) if windowed else level["num_requests"].iloc[0], MAX_REQUESTS))
    rng = np.random.default_rng(seed)
    prompt = _lengths(level, n, rng, "num_prompt_tokens", where, bucket_bounds)
    output = _lengths(level, n, rng, "num_output_tokens", where, bucket_bounds)
    if kind in OPEN_LOOP and counts and np.rint(sum(c[2] for c in counts)) >= 1:
        arrival = _scheduled(counts, n, rng)
    elif kind == "poisson_rate":
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


def shared_prefix_tokens(meta: dict, path) -> int:
    """The ``shared_prefix_tokens`` an aggregate's metadata states (0: none).

    Raises
    ------
    TraceError
        A value that is not a whole number >= 0.
    """
    text = str(meta.get("shared_prefix_tokens", "0"))
    if not (text.isascii() and text.isdigit()):
        raise TraceError(f"{path}: metadata shared_prefix_tokens {text[:40]!r} is not a whole number of tokens >= 0")
    return int(text)


def length_points_are_buckets(meta: dict, path) -> bool:
    """Whether a file's metadata states ``length_points: bucket bounds`` (module docstring).

    Raises
    ------
    TraceError
        Another value, naming the file and the key.
    """
    text = meta.get("length_points")
    if text is not None and text != BUCKET_BOUNDS:
        raise TraceError(f"{path}: metadata length_points {str(text)[:40]!r}: expected {BUCKET_BOUNDS!r} or none")
    return text == BUCKET_BOUNDS


def level_options(meta: dict, path, level: int) -> dict:
    """The options of :func:`level_trace` a file's metadata ``meta`` gives its level ``level``:
    ``shared_prefix_tokens``, ``counts``, ``bucket_bounds`` and ``held``; raises what their
    readers raise."""
    return {"shared_prefix_tokens": shared_prefix_tokens(meta, path), "counts": arrival_counts(meta, path, level),
            "bucket_bounds": length_points_are_buckets(meta, path), "held": requests_held(meta, path, level)}


def busiest_level(frame: pd.DataFrame, path, level: int | None = None) -> int:
    """The level of an ``aggregate_targets/1`` table with the highest arrival rate (requests/s),
    among its open-loop levels (:data:`OPEN_LOOP`): a production scrape's busiest window; or
    ``level`` when given, checked to be one of those.

    Raises
    ------
    TraceError
        A table with no open-loop level (every level a closed loop of clients, whose arrival
        rate is the server's, not the traffic's), or a ``level`` it does not have or that is
        a closed loop.
    """
    levels = frame.drop_duplicates("level")
    open_loop = levels[levels["level_kind"].isin(OPEN_LOOP)]
    if level is not None:
        if level not in set(levels["level"]):
            raise TraceError(f"{path}#{level}: no such level (the file has "
                             f"{', '.join(map(str, sorted(levels['level'])))})")
        if level not in set(open_loop["level"]):
            raise TraceError(wrap_error(f"{path}#{level}: a closed loop of clients; its arrival rate is the "
                                        "server's, not the traffic's: choose a level at an arrival rate"))
        return level
    if open_loop.empty:
        kinds = ", ".join(sorted(levels["level_kind"].unique()))
        raise TraceError(wrap_error(f"{path}: no level at an arrival rate (levels: {kinds}); the rate of a closed "
                                    "loop of clients is the server's, not the traffic's"))
    return int(open_loop.loc[open_loop["level_value"].astype(float).idxmax(), "level"])


def level_statistics(level: pd.DataFrame, pct_range: tuple[float, float] = (0.0, 100.0)) -> dict:
    """The latency statistics a level reports: metric (:data:`schemas.tables.AGGREGATE_LATENCIES`)
    -> ``(percentiles, NaN for a mean; values, seconds)``, its means and its percentiles in
    ``pct_range``."""
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


def identical_lengths(trace: pd.DataFrame) -> bool:
    """Whether every request of ``trace`` has the same prompt and output lengths."""
    return trace["num_prompt_tokens"].nunique() == 1 and trace["num_output_tokens"].nunique() == 1


def level_metadata(level: pd.DataFrame, meta: dict, trace: pd.DataFrame) -> dict:
    """The metadata a level's synthesized ``trace`` is replayed with: the file's ``meta``, the
    level's load in words (``aggregate_level``), the prompts' ``hash_block_tokens``, and for a
    closed loop of identical requests ``closed_loop_start_spread_s``, the level's reported mean
    E2E (seconds; see the module's docstring)."""
    kind, value = level["level_kind"].iloc[0], float(level["level_value"].iloc[0])
    out = {**meta, "aggregate_level": f"{kind.replace('_', ' ')} {value:g}", "hash_block_tokens": str(BLOCK_TOKENS)}
    e2e = level_statistics(level).get("e2e_s")
    if kind == "concurrency" and identical_lengths(trace) and e2e is not None and np.isnan(e2e[0]).any():
        out["closed_loop_start_spread_s"] = f"{e2e[1][np.isnan(e2e[0])][0]:.9g}"
    return out


def level_workload(frame: pd.DataFrame, level: int, meta: dict, path) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """Level ``level`` of an ``aggregate_targets/1`` table read from ``path`` (its ``meta``) as the
    fit, ``replay`` and ``servecal plan`` replay it: ``(rows, trace, metadata)``, the level's rows,
    its synthesized request trace (:func:`level_trace`, seed ``SEED + level``, the options the
    file's metadata gives, :func:`level_options`) and the metadata it is replayed with
    (:func:`level_metadata`; for a window of scrapes also
    :data:`traces.scrape_window.OBSERVED_UNTIL`, the window's end on the trace's clock).

    Raises
    ------
    TraceError
        A bad ``shared_prefix_tokens``, ``arrival_counts``, ``requests_held`` or
        ``length_points``, or a length with neither a mean nor percentiles.
    """
    rows = frame[frame["level"] == level]
    options = level_options(meta, path, int(level))
    trace = level_trace(rows, f"{path}#{level}", SEED + int(level), **options)
    out = level_metadata(rows, meta, trace)
    counts, held = options["counts"], options["held"]
    if _windowed(rows["level_kind"].iloc[0], counts, held):
        until = observed_until_s(counts, held, trace["arrival_time_s"].to_numpy(),
                                 len(trace) == replayed_requests(counts, held))
        if until is not None:
            out[OBSERVED_UNTIL] = f"{until:.9g}"
    return rows, trace, out
