"""Import Prometheus scrapes of vLLM or SGLang as ``aggregate_targets/1``: one level per window.

The scrapes (:mod:`.prometheus_scrapes`) are cut into windows of ``window_s`` seconds (a
window ends at the first scrape at least ``window_s`` after its start; the last window may be
shorter). Over each window, counters and histogram series are read as their increase, summed
over the scrape intervals; a series that decreases between two scrapes was reset (the server
restarted) and its increase over that interval is its new value, as Prometheus' ``rate()``
reads it (each reset is listed in the metadata, ``counter_resets``). A series that appears in
a later scrape counts from 0; one that disappears (a pod gone) stops counting.

Read per window (``vllm:`` names of v0 and v1, ``sglang:`` names; vLLM's histogram buckets:
``vllm/v1/metrics/loggers.py``, ``vllm/v1/metrics/buckets.py``):

* requests: the increase of ``e2e_request_latency_seconds_count`` (finished requests); a
  window where none finished is skipped;
* latencies (``ttft_s``: ``time_to_first_token_seconds``; ``e2e_s``:
  ``e2e_request_latency_seconds``; ``tpot_s``: vLLM's per-request
  ``request_time_per_output_token_seconds``): the mean (``_sum / _count``, exact) and the
  percentiles 10, 25, 50, 75, 90, 95, 99, each in the bucket Prometheus' ``histogram_quantile``
  puts it in but not linearly inside it: with the density of maximum entropy that has the
  buckets' counts and the exact mean (:func:`.prometheus_histograms.histogram_percentiles`;
  bench/PROMETHEUS.md: linear interpolation put a real run's TPOT p90 30 % and TTFT p75 27 %
  high). Such a percentile is known only to its bucket's width: the widths are kept
  in the metadata (``windows``, ``resolution_s``), as ``aggregate_targets/1`` has no column for
  an uncertainty. ``inter_token_latency_seconds`` and ``time_per_output_token_seconds`` (vLLM
  v0/v1, SGLang) are observed once per output token, not per request (their count is the
  tokens): not a percentile of per-request TPOT, so only their (token-weighted) mean is kept,
  in the metadata;
* lengths (``num_prompt_tokens``: ``request_prompt_tokens``; ``num_output_tokens``:
  ``request_generation_tokens``): the mean and, at each finite bucket bound inside the
  distribution, the percentile of requests at or below it (exact points of the CDF, which the
  fit's workload fills with the exact mean: :mod:`traces.aggregate_workload`), with min and max the
  bounds of the first and last non-empty buckets. SGLang has no length histogram: the means
  come from ``prompt_tokens_total`` and ``generation_tokens_total`` per finished request;
* load: ``poisson_rate``, the arrival rate (requests/s): per scrape interval, the requests that
  arrived are those finished plus the increase of ``num_requests_running +
  num_requests_waiting`` (SGLang: ``num_running_reqs + num_queue_reqs``) (flow balance: the
  servers count no arrivals), and the rate is their sum over the time of the intervals in
  which some arrived (a burst and its drain in one window read as the burst's rate); without
  both gauges at every scrape, the finished requests over the window. The arrivals of each
  scrape interval are kept (metadata ``arrival_counts``; :mod:`.prometheus_flow`), and so are
  the requests held (running, waiting) at each scrape (``requests_held``): the fit replays every
  arrival up to the window's end, those held at its start first, and matches only the requests
  the replay finishes inside it, as the histograms counted them (:mod:`traces.scrape_window`);
* for the report, in the metadata (``windows``, JSON, one object per level): the window's
  start and end, queue time (``request_queue_time_seconds``, SGLang ``queue_time_seconds``)
  mean and percentiles, the means of prefill, decode and inference time, of tokens per step
  (``iteration_tokens_total``) and of the gauges (running, waiting, KV-cache usage), the
  preemptions and the prefix-cache hit rate (hits over queries, tokens).

Labels: series of every label set are summed (pods, engines), unless ``by_label`` names a
label whose every value becomes levels of its own; series of several ``model_name`` values
are not summed (an error naming them). Other series (``python_gc_*``, ``http_*``, other
``vllm:``/``sglang:`` names) are not read; the ``vllm:``/``sglang:`` names among them are listed
in the metadata (``metrics_not_read``).
"""
from __future__ import annotations

import json
import math
from collections import defaultdict

import pandas as pd

from ..aggregate_workload import BUCKET_BOUNDS
from ..errors import TraceFormatError
from .prometheus_flow import flow_balance
from .prometheus_histograms import histogram_percentiles, histogram_stats
from .prometheus_scrapes import Scrape, read_scrapes
from .summaries import Level, levels_frame

__all__ = ["PERCENTILES", "import_prometheus"]

#: Percentiles interpolated from a latency histogram.
PERCENTILES = (10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0)
#: Histograms read (name without the ``vllm:``/``sglang:`` prefix) -> servecal's metric.
_LATENCY = {"time_to_first_token_seconds": "ttft_s", "e2e_request_latency_seconds": "e2e_s",
            "request_time_per_output_token_seconds": "tpot_s"}
_LENGTH = {"request_prompt_tokens": "num_prompt_tokens", "request_generation_tokens": "num_output_tokens"}
#: Histograms kept for the report (metadata): their mean; queue time also its percentiles.
_REPORT_HIST = {"request_queue_time_seconds": "queue_time_s", "queue_time_seconds": "queue_time_s",
                "request_prefill_time_seconds": "prefill_time_s", "request_decode_time_seconds": "decode_time_s",
                "request_inference_time_seconds": "inference_time_s",
                "inter_token_latency_seconds": "itl_token_weighted_s",
                "time_per_output_token_seconds": "itl_token_weighted_s",
                "iteration_tokens_total": "tokens_per_step"}
_COUNTERS = {"num_preemptions_total": "preemptions", "prefix_cache_queries_total": "prefix_cache_queries",
             "prefix_cache_hits_total": "prefix_cache_hits", "prompt_tokens_total": "prompt_tokens",
             "generation_tokens_total": "generation_tokens"}
_GAUGES = {"num_requests_running": "running", "num_running_reqs": "running", "num_requests_waiting": "waiting",
           "num_queue_reqs": "waiting", "kv_cache_usage_perc": "kv_cache_usage", "gpu_cache_usage_perc":
           "kv_cache_usage", "token_usage": "kv_cache_usage"}
_HIST_NAMES = set(_LATENCY) | set(_LENGTH) | set(_REPORT_HIST)
_ENGINES = ("vllm", "sglang")
_MODEL_LABEL = "model_name"


def _split(name: str) -> tuple[str | None, str, str]:
    """``vllm:ttft_seconds_bucket`` -> ("vllm", "ttft_seconds", "_bucket")."""
    engine, sep, rest = name.partition(":")
    if not sep or engine not in _ENGINES or rest.endswith("_created"):  # _created: a series' creation time
        return None, name, ""
    for suffix in ("_bucket", "_count", "_sum"):
        if rest.endswith(suffix) and rest[:-len(suffix)] in _HIST_NAMES:
            return engine, rest[:-len(suffix)], suffix
    return engine, rest, ""


def _increases(scrapes: list[Scrape], resets: list[str]) -> list[dict]:
    """Per interval (scrape k-1 -> k): series key -> increase (reset-aware), for counters and buckets."""
    out = []
    for prev, cur in zip(scrapes, scrapes[1:]):
        inc = {}
        for key, value in cur.samples.items():
            engine, base, suffix = _split(key[0])
            if engine is None or not (suffix or base in _COUNTERS):
                continue
            if not math.isfinite(value) or value < 0:
                raise TraceFormatError(cur.where, f"{key[0]}{dict(key[1])} is {value!r}", column=key[0],
                                       expected="a count or sum >= 0 (a counter or histogram series)", fold=True)
            before = prev.samples.get(key, 0.0)
            if value < before:
                resets.append(f"{key[0]}{dict(key[1])} at {cur.where}")
                before = 0.0
            inc[key] = value - before
        out.append(inc)
    return out


def _check_inf(scrape: Scrape) -> None:
    """Every histogram series of ``scrape`` has its ``le="+Inf"`` bucket and its ``_count``."""
    series, closed = {}, set()
    for name, labels in scrape.samples:
        engine, base, suffix = _split(name)
        if suffix == "_bucket":
            rest = tuple(p for p in labels if p[0] != "le")
            series[(base, rest)] = name
            if dict(labels).get("le") in ("+Inf", "Inf", "inf", "+inf"):
                closed.add((base, rest))
    for key, name in series.items():
        if key not in closed or (name[:-7] + "_count", key[1]) not in scrape.samples:
            raise TraceFormatError(scrape.where, f"histogram {name[:-7]}{dict(key[1])} has no le=\"+Inf\" bucket "
                                   "or no _count", column=name[:-7], expected="complete histograms (a truncated "
                                   "scrape?)", fold=True)


def _group_of(labels: tuple, by_label: str | None, where: str) -> str:
    if by_label is None:
        return ""
    found = dict(labels).get(by_label)
    if found is None:
        raise TraceFormatError(where, f"a series has no label {by_label!r} (labels {dict(labels)})",
                               column="--by-label", expected="a label every vLLM/SGLang series carries "
                               "(model_name, engine, pod, ...)", fold=True)
    return found


def _lengths(level: Level, metric: str, cum: list[tuple[float, float]], mean: float) -> None:
    n = cum[-1][1]
    level.add(metric, "mean", None, mean)
    nonzero = [(b, c) for b, c in cum if c > 0]
    prev = [b for b, c in cum if c == 0 and not math.isinf(b)]
    level.add(metric, "min", None, max(1.0, prev[-1] if prev else 1.0))
    finite = [b for b, _ in cum if not math.isinf(b)]
    last = next((b for b, c in cum if c >= n), finite[-1] if finite else mean)
    level.add(metric, "max", None, max(last if not math.isinf(last) else finite[-1], mean))
    for bound, c in nonzero:
        if not math.isinf(bound) and 0 < c < n:
            level.add(metric, "quantile", 100.0 * c / n, bound)


def _engine(scrapes: list[Scrape]) -> str:
    engines = {e for s in scrapes for key in s.samples for e in [_split(key[0])[0]] if e}
    for e in _ENGINES:
        if any(_split(key[0]) == (e, "e2e_request_latency_seconds", "_count") for s in scrapes for key in s.samples):
            return e
    raise TraceFormatError(", ".join(sorted({s.where.split(",")[0] for s in scrapes}))[:200],
                           "no vLLM or SGLang request histogram (vllm:e2e_request_latency_seconds, "
                           "sglang:e2e_request_latency_seconds)" + (f"; found {sorted(engines)} metrics" if engines
                                                                      else ""),
                           expected="scrapes of a vLLM or SGLang server's /metrics", fold=True)


def _windows(scrapes: list[Scrape], window_s: float) -> list[tuple[int, int]]:
    """(first, last) scrape index of each window."""
    cuts = [0]
    for k in range(1, len(scrapes)):
        if scrapes[k].time_s - scrapes[cuts[-1]].time_s >= window_s - 1e-9:
            cuts.append(k)
    if cuts[-1] != len(scrapes) - 1:
        cuts.append(len(scrapes) - 1)
    return list(zip(cuts, cuts[1:]))


def _gauges(scrapes: list[Scrape], prefix: str, group, by_label: str | None) -> dict:
    """Per gauge kind: (the values summed over the group's series) at each scrape given."""
    out: dict[str, list[float]] = defaultdict(list)
    for s in scrapes:
        per: dict[str, list[float]] = defaultdict(list)
        for (name, labels), v in s.samples.items():
            kind = _GAUGES.get(name[len(prefix):]) if name.startswith(prefix) else None
            if kind and _group_of(labels, by_label, s.where) == group:
                per[kind].append(v)
        for kind, values in per.items():
            # usage is a fraction per engine (averaged); request counts add up over engines
            out[kind].append(sum(values) / len(values) if kind == "kv_cache_usage" else sum(values))
    return out


def _level(engine: str, inc: dict, window: list[Scrape], finished: list[float], gauges: dict,
           where: str) -> tuple[Level, dict, list | None, list | None] | None:
    """The level of one window and group (None: none finished), its report and the counts and
    requests held of :func:`.prometheus_flow.flow_balance`."""
    p = f"{engine}:"
    e2e = histogram_stats(inc, p + "e2e_request_latency_seconds", where)
    if e2e is None:
        return None
    n = e2e["count"]
    if n < 0.5:
        return None
    first, last = window[0], window[-1]
    arrivals, rate, counts, held = flow_balance(n, finished, [s.time_s for s in window], gauges)
    level = Level("poisson_rate", rate, int(round(n)))
    report: dict = {"start_unix_s": first.time_s, "end_unix_s": last.time_s, "finished_requests": n,
                    "arrived_requests": arrivals, "resolution_s": {}}
    for name, metric in _LATENCY.items():
        h = histogram_stats(inc, p + name, where)
        if h is None:
            continue
        level.add(metric, "mean", None, h["mean"])
        widths = {}
        for pct, (value, width) in zip(PERCENTILES, histogram_percentiles(h["cum"], h["mean"], PERCENTILES)):
            level.add(metric, "quantile", pct, value)
            widths[f"p{pct:g}"] = width if math.isfinite(width) else None
        report["resolution_s"][metric] = widths
    for name, metric in _LENGTH.items():
        h = histogram_stats(inc, p + name, where)
        if h is not None:
            _lengths(level, metric, h["cum"], h["mean"])
        else:  # SGLang: only the token counters
            counter = p + ("prompt_tokens_total" if metric == "num_prompt_tokens" else "generation_tokens_total")
            total = sum(v for (s, _), v in inc.items() if s == counter)
            if total > 0:
                level.add(metric, "mean", None, total / n)
    report.update(_report(inc, p, gauges, where))
    return level, report, counts, held


def _report(inc: dict, p: str, gauges: dict, where: str) -> dict:
    """The window's measures for the report: the other histograms' means, queue-time percentiles,
    preemptions, prefix-cache hit rate and the gauges' means."""
    report: dict = {}
    for name, key in _REPORT_HIST.items():
        h = histogram_stats(inc, p + name, where)
        if h is not None:
            report[f"{key}_mean"] = h["mean"]
            if key == "queue_time_s":
                report["queue_time_s"] = {f"p{q:g}": v for q, (v, _) in
                                          zip(PERCENTILES, histogram_percentiles(h["cum"], h["mean"], PERCENTILES))}
    counters = defaultdict(float)
    for (s, _), v in inc.items():
        if s.startswith(p) and s[len(p):] in _COUNTERS:
            counters[_COUNTERS[s[len(p):]]] += v
    if "preemptions" in counters:
        report["preemptions"] = counters["preemptions"]
    if counters.get("prefix_cache_queries", 0) > 0:
        report["prefix_cache_hit_rate"] = counters["prefix_cache_hits"] / counters["prefix_cache_queries"]
    for kind, values in gauges.items():
        report[f"{kind}_mean"] = sum(values) / len(values)
    return report


def _not_read(scrapes: list[Scrape]) -> list[str]:
    names = set()
    for key in scrapes[-1].samples:
        engine, base, suffix = _split(key[0])
        if engine and not suffix and base not in _COUNTERS and base not in _GAUGES:
            names.add(key[0])
    return sorted(names)


def _groups(scrapes: list[Scrape], engine: str, by_label: str | None) -> list[str]:
    """The groups' label values (one ``""`` without ``by_label``), checking that models are not mixed."""
    groups, models = set(), set()
    for s in scrapes:
        for name, labels in s.samples:
            if name.startswith(f"{engine}:"):
                groups.add(_group_of(labels, by_label, s.where))
                if _MODEL_LABEL in dict(labels):
                    models.add(dict(labels)[_MODEL_LABEL])
    if len(models) > 1 and by_label != _MODEL_LABEL:
        shown = ", ".join(sorted(models)[:5])
        raise TraceFormatError(scrapes[0].where, f"series of {len(models)} models ({shown}): not summed",
                               column=_MODEL_LABEL, expected="scrapes of one model, or --by-label model_name "
                               "(one level per model and window)", fold=True)
    return sorted(groups)


def import_prometheus(paths, window_s: float = 300.0, by_label: str | None = None) -> tuple[pd.DataFrame, dict]:
    """Read scrapes of a vLLM or SGLang ``/metrics`` page as ``aggregate_targets/1``.

    Parameters
    ----------
    paths : list of str or os.PathLike
        Files or folders of scrapes, or ``query_range`` JSON exports
        (:func:`.prometheus_scrapes.read_scrapes`).
    window_s : float
        Seconds of one window (> 0); each window of each group is a level.
    by_label : str, optional
        A label (``model_name``, ``engine``, ``pod``, ...) whose values are kept apart: one level
        per value and window. None: every series summed.

    Returns
    -------
    frame : pandas.DataFrame
        ``aggregate_targets/1`` rows, levels in order of group, then window (module docstring).
    metadata : dict
        ``source_format`` (``prometheus``), ``source``, ``num_levels``, ``engine`` (vllm or
        sglang), ``window_s``, ``levels`` (each level's window, seconds after the first scrape,
        and group), ``windows`` (JSON list, one object per level: module docstring),
        ``counter_resets`` (count; the series and scrapes listed in ``counter_reset_series``),
        ``metrics_not_read``, ``by_label``, ``windows_left_out`` (the windows in which no request
        finished, seconds after the first scrape: no level), ``arrival_counts`` (JSON: level ->
        ``[start_s, end_s, requests]`` per scrape interval from the window's start, where the
        gauges give them), ``requests_held`` (JSON: level -> ``[time_s, running, waiting]`` per
        scrape, the same levels) and ``length_points`` (``bucket bounds``), read by
        :func:`traces.aggregate_workload.level_options`.

    Raises
    ------
    TraceFormatError
        Naming the file (and line or field): what :func:`.prometheus_scrapes.read_scrapes`
        raises; no vLLM/SGLang request histogram; a histogram without ``le="+Inf"`` or with
        different buckets in the series summed; series of several models summed; a series
        without the ``by_label`` label; no window with a finished request.
    ValueError
        ``window_s`` not > 0.
    """
    if not window_s > 0:
        raise ValueError(f"window_s {window_s} is not > 0")
    scrapes = read_scrapes(paths)
    engine = _engine(scrapes)
    for s in scrapes:
        _check_inf(s)
    groups = _groups(scrapes, engine, by_label)
    resets: list[str] = []
    increases = _increases(scrapes, resets)
    levels, reports, names, idle, counts, held = [], [], [], [], {}, {}
    t0 = scrapes[0].time_s
    for group in groups:
        for a, b in _windows(scrapes, window_s):
            inc: dict = defaultdict(float)
            for k in range(a, b):
                for key, v in increases[k].items():
                    if _group_of(key[1], by_label, scrapes[k + 1].where) == group:
                        inc[key] += v
            where = f"{scrapes[a].where} .. {scrapes[b].where}"
            gauges = _gauges(scrapes[a:b + 1], f"{engine}:", group, by_label)
            count = f"{engine}:e2e_request_latency_seconds_count"
            finished = [sum(v for key, v in increases[k].items() if key[0] == count
                            and _group_of(key[1], by_label, scrapes[k + 1].where) == group) for k in range(a, b)]
            found = _level(engine, inc, scrapes[a:b + 1], finished, gauges, where)
            span = f"{scrapes[a].time_s - t0:g}-{scrapes[b].time_s - t0:g} s" + (f" {by_label}={group}" if by_label
                                                                                 else "")
            if found is None:
                idle.append(span)
                continue
            if found[2] is not None:
                counts[str(len(levels))], held[str(len(levels))] = found[2], found[3]
            levels.append(found[0])
            reports.append({**found[1], **({by_label: group} if by_label else {})})
            names.append(span)
    if not levels:
        raise TraceFormatError(", ".join(map(str, paths)), "no window with a finished request",
                               column=f"{engine}:e2e_request_latency_seconds_count",
                               expected="scrapes over a time when requests finished", fold=True)
    frame, meta = levels_frame(levels, "prometheus", paths)
    meta.update(engine=engine, window_s=f"{window_s:g}", levels=", ".join(names),
                windows=json.dumps(reports, separators=(",", ":")), counter_resets=str(len(resets)),
                metrics_not_read=", ".join(_not_read(scrapes)), by_label=by_label or "",
                windows_left_out=", ".join(idle), arrival_counts=json.dumps(counts, separators=(",", ":")),
                requests_held=json.dumps(held, separators=(",", ":")),
                length_points=BUCKET_BOUNDS)
    if resets:
        meta["counter_reset_series"] = "; ".join(resets[:20]) + (f"; ... ({len(resets)})" if len(resets) > 20 else "")
    return frame, meta
