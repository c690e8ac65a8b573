"""Runs from aggregate results (``aggregate_targets/1``): a synthesized workload per load level,
replayed at the level's load, matched to the statistics the benchmark reported.

A summary has no requests to replay. Each level's workload is drawn from its recorded
length statistics (:func:`traces.aggregate_workload.level_trace`, seeded: the same file gives
the same runs), and the run's targets are the level's reported latency percentiles (those in
:data:`MATCHED_PCT`) and means, which the request-log fit
(:func:`calibrate.request_fit.fit_requests`) matches as it matches a log's quantiles. A level at
a ``concurrency`` N is replayed as a closed loop of N clients
(:class:`replay.core.closed_loop.ClosedLoop`), all sending at 0 as a benchmark's clients do;
when every synthesized request has the same lengths (the aggregate gives only means), the
clients would complete in the same steps and send again together forever, which real clients,
staggered by the server's own variation, do not: their first sends are then spread evenly over
the level's reported mean E2E (the cycle of a client in the steady state;
``closed_loop_start_spread_s`` in the run's metadata). A window of Prometheus scrapes replays
every request it held or saw arrive and is matched on those its replay finishes inside it, as
its histograms counted them (:mod:`traces.scrape_window`, :meth:`calibrate.run_errors.Run.predicted`).
"""
from __future__ import annotations

import pandas as pd

from traces.aggregate_workload import SEED, identical_lengths, level_statistics, level_workload, shared_prefix_tokens
from traces.errors import TraceError
from traces.scrape_window import observed_until

from .errors import FitError
from .run_errors import Run, chosen

#: Percentiles matched: the reported ones in this range (the tails of a run of tens or
#: hundreds of requests are a few requests each), plus the reported means.
MATCHED_PCT = (10.0, 90.0)


def level_targets(level: pd.DataFrame, pct_range: tuple[float, float] = MATCHED_PCT) -> dict:
    """metric -> (percentiles, NaN for a mean; values, seconds): the reported means and the
    percentiles in ``pct_range`` (default: what the fit matches; (0, 100): every one, scored by
    validation), as :func:`traces.aggregate_workload.level_statistics` reads them."""
    return level_statistics(level, pct_range)


def aggregate_runs(path: str, frame: pd.DataFrame, meta: dict, cfg, level: int | None) -> list[Run]:
    """One run per level of an ``aggregate_targets/1`` table (or level ``level`` alone).

    Each run's trace is the level's synthesized workload (:func:`traces.aggregate_workload.level_trace`, seed
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
        try:
            _, trace, meta_k = level_workload(frame, k, meta, path)
        except TraceError as exc:
            raise FitError(str(exc)) from None
        runs.append(Run(name, trace, run_cfg, meta_k, None, None, targets, level_targets(rows, (0.0, 100.0))))
    return runs


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
    spread = [r.name for r in runs if identical_lengths(r.trace)]
    if spread:
        out.append(f"{', '.join(spread)}: every synthesized request has the same lengths (the aggregate gives only "
                   "their means), so terms that grow with the length are told apart only across levels, and a "
                   "closed loop's clients start spread over the level's mean E2E instead of at once")
    windows = [r.name for r in runs if observed_until(r.metadata) is not None]
    if windows:
        out.append(f"{', '.join(windows)}: windows of scrapes whose server still held requests at their end; those "
                   "requests are replayed with the finished ones' lengths, the only ones the histograms hold (in a "
                   "burst the earliest finishers are the shorter requests: the fitted costs then run high)")
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
