"""Import a benchmark's aggregate results (no per-request rows) as ``aggregate_targets/1``.

Many published results are summaries only: a latency's percentiles and mean per load level,
the lengths' mean and spread. Each is read into rows of
:data:`schemas.tables.AGGREGATE_COLUMNS` (one per level x metric x statistic), which
``calibrate fit`` matches by replaying a workload synthesized from the level's lengths
(:mod:`calibrate.aggregate_runs`). Formats, and what is read from each:

``llmperf`` (ray-project/llmperf ``token_benchmark_ray.py`` ``*_summary.json``; the
leaderboard's ``raw_data/summary``): one level, ``num_concurrent_requests`` clients (closed
loop), ``results_num_completed_requests``; ``results_{ttft_s, end_to_end_latency_s,
number_input_tokens, number_output_tokens}_{quantiles_pNN, mean, stddev, min, max}`` (a
number, or a number written as a string as the leaderboard's min/max are).
``results_inter_token_latency_s_*`` is not read: LLMPerf's per-request ITL changed
definition between versions (llmperf#99); E2E with the output lengths carries the decode.

``guidellm`` (``guidellm benchmark --output-path x.json``): one level per
``benchmarks[i]``, ``config.strategy.type_`` synchronous (1 client), concurrent
(``streams`` clients), throughput (every request at once: as many clients as requests),
constant or poisson (``rate`` requests/s); ``metrics.{time_to_first_token_ms,
request_latency (s), prompt_token_count, output_token_count}.successful.{count, mean,
std_dev, min, max, percentiles.pNNN}``. GuideLLM's ``inter_token_latency_ms`` statistics are
over token gaps, not requests (its ``count`` is the output tokens: 1,187 for the 40 requests
of benchmark 0 of the real sweep), each request's mean gap weighted by its tokens: not a
percentile of per-request TPOT, so not read (nor ``time_per_output_token_ms``, which includes
the TTFT); E2E with the output lengths carries the decode.

``vllm-bench`` (``vllm bench serve --save-result``, one JSON object per file, one level per
file) and ``sglang-bench`` (``bench_serving --output-file``, one JSON object per line, one
level per line): ``{mean, median, std, pNN}_{ttft, tpot, e2el | e2e_latency}_ms``,
``completed``, ``total_input_tokens``, ``total_output_tokens`` (so only the lengths' means),
``request_rate`` (``inf``: all at once) with ``burstiness`` 1 (Poisson), or
``max_concurrency`` clients with an infinite rate. ``itl`` (gaps between streamed chunks,
which may hold several tokens) is not read.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd

from ..errors import TraceFormatError
from ._json import iter_jsonl, json_number, read_json

__all__ = ["FORMATS", "Level", "import_summaries", "levels_frame", "percentile_of"]

FORMATS = ("llmperf", "guidellm", "vllm-bench", "sglang-bench")

_LLMPERF_METRICS = {"ttft_s": "ttft_s", "end_to_end_latency_s": "e2e_s",
                    "number_input_tokens": "num_prompt_tokens", "number_output_tokens": "num_output_tokens"}
_LLMPERF_KEY = re.compile(r"results_(ttft_s|end_to_end_latency_s|number_input_tokens|number_output_tokens)_"
                          r"(?:quantiles_p(\d+(?:\.\d+)?)|(mean|stddev|min|max))")
#: GuideLLM's metric -> (servecal metric, factor to seconds or tokens).
_GUIDELLM_METRICS = {"time_to_first_token_ms": ("ttft_s", 1e-3), "request_latency": ("e2e_s", 1.0),
                     "prompt_token_count": ("num_prompt_tokens", 1.0),
                     "output_token_count": ("num_output_tokens", 1.0)}
#: GuideLLM's percentile names (p001 is the 0.1th percentile).
_GUIDELLM_PCT = {"p001": 0.1, "p01": 1.0, "p05": 5.0, "p10": 10.0, "p25": 25.0, "p50": 50.0, "p75": 75.0,
                 "p90": 90.0, "p95": 95.0, "p99": 99.0, "p999": 99.9}
_BENCH_KEY = re.compile(r"(mean|median|std|p(\d+(?:\.\d+)?))_(ttft|tpot|e2el|e2e_latency)_ms")
_BENCH_METRICS = {"ttft": "ttft_s", "tpot": "tpot_s", "e2el": "e2e_s", "e2e_latency": "e2e_s"}
_PCT_KEY = re.compile(r"p(\d+(?:\.\d+)?)")
_STAT = {"stddev": "std", "std_dev": "std", "std": "std", "mean": "mean", "min": "min", "max": "max"}


class Level:
    """The rows of one load level while a file is read."""

    def __init__(self, kind: str, value: float, num_requests: int):
        self.kind, self.value, self.num_requests = kind, value, num_requests
        self.rows: list[tuple[str, str, float | None, float]] = []

    def add(self, metric: str, statistic: str, quantile_pct: float | None, value: float) -> None:
        self.rows.append((metric, statistic, quantile_pct, value))

    def add_statistics(self, path, metric: str, stats: dict, where: str, factor: float, statistic_of) -> None:
        """Add the entries of one statistics object (``{"mean": ..., "p90": ...}``) of ``metric``:
        each key ``statistic_of`` maps to ``(statistic, percentile or None)`` (None: not read), its
        value a number >= 0 (null: left out, as tools write an absent statistic) times ``factor``
        (to seconds or tokens); ``where`` names the object in errors."""
        for key, value in stats.items():
            stat = statistic_of(key)
            if stat is not None and value is not None:
                self.add(metric, stat[0], stat[1],
                         factor * _number(path, value, f"{where}.{key}", minimum=0, maximum=1e15))

    def add_uniform(self, metric: str, low_tokens: int, high_tokens: int) -> None:
        """The statistics of a length drawn uniformly from the integers ``low_tokens ..
        high_tokens`` (a benchmark's random dataset): min, max, mean and median. Their
        piecewise-linear inverse CDF through (0, min), (50, median), (100, max), which the
        fit synthesizes lengths from (:func:`traces.aggregate_workload.level_trace`), is that
        uniform's."""
        mid = (low_tokens + high_tokens) / 2
        for statistic, q, v in (("min", None, low_tokens), ("max", None, high_tokens), ("mean", None, mid),
                                ("quantile", 50.0, mid)):
            self.add(metric, statistic, q, float(v))


def percentile_of(key: str) -> float | None:
    """The percentile a key ``pNN`` / ``pNN.N`` names (``p99.9`` -> 99.9), None for another key or
    one outside [0, 100]."""
    m = _PCT_KEY.fullmatch(key)
    q = float(m.group(1)) if m else None
    return q if q is not None and 0 <= q <= 100 else None


def _number(path, value, column: str, row: int | None = None, **limits) -> float:
    """A JSON number, or a number written as a string (LLMPerf's leaderboard writes min/max so)."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise TraceFormatError(path, f"value {value[:40]!r} is not a number", row=row, column=column) from None
    return json_number(path, value, column=column, row=row, **limits)


def _llmperf(path: Path) -> list[Level]:
    obj = read_json(path)
    if not isinstance(obj, dict) or "num_concurrent_requests" not in obj:
        raise TraceFormatError(path, "has no 'num_concurrent_requests'", column="num_concurrent_requests",
                               expected="an LLMPerf summary (token_benchmark_ray.py *_summary.json)", fold=True)
    clients = _number(path, obj["num_concurrent_requests"], "num_concurrent_requests", integer=True, minimum=1)
    if "results_num_completed_requests" not in obj:
        raise TraceFormatError(path, "missing field", column="results_num_completed_requests",
                               expected="the number of completed requests")
    n = _number(path, obj["results_num_completed_requests"], "results_num_completed_requests", integer=True,
                minimum=1)
    level = Level("concurrency", float(clients), int(n))
    for key, value in obj.items():
        m = _LLMPERF_KEY.fullmatch(key)
        if m:
            q = float(m.group(2)) if m.group(2) else None
            level.add(_LLMPERF_METRICS[m.group(1)], "quantile" if q is not None else _STAT[m.group(3)], q,
                      _number(path, value, key, minimum=0, maximum=100 * 365 * 86400))
    return [level]


def _guidellm_strategy(path, bench: dict, b: int, count: int) -> tuple[str, float]:
    col = f"benchmarks[{b}].config.strategy"
    strategy = (bench.get("config") or {}).get("strategy") if isinstance(bench.get("config"), dict) else None
    kind = strategy.get("type_") if isinstance(strategy, dict) else None
    if kind == "synchronous":
        return "concurrency", 1.0
    if kind == "concurrent":
        return "concurrency", float(_number(path, strategy.get("streams"), f"{col}.streams", integer=True, minimum=1))
    if kind == "throughput":
        cap = strategy.get("max_concurrency")
        cap = count if cap is None else _number(path, cap, f"{col}.max_concurrency", integer=True, minimum=1)
        return "concurrency", float(min(cap, count))
    if kind in ("constant", "poisson"):
        rate = _number(path, strategy.get("rate"), f"{col}.rate", minimum=1e-9)
        return f"{kind}_rate", rate
    raise TraceFormatError(path, f"strategy {str(kind)[:40]!r} is not known", column=f"{col}.type_",
                           expected="synchronous, concurrent, throughput, constant or poisson")


def _guidellm(path: Path) -> list[Level]:
    obj = read_json(path)
    if not isinstance(obj, dict) or not isinstance(obj.get("benchmarks"), list) or not obj["benchmarks"]:
        raise TraceFormatError(path, "has no 'benchmarks' list", column="benchmarks",
                               expected="a GuideLLM benchmark report (guidellm benchmark --output-path x.json)",
                               fold=True)
    levels = []
    for b, bench in enumerate(obj["benchmarks"]):
        metrics = bench.get("metrics") if isinstance(bench, dict) else None
        if not isinstance(metrics, dict):
            raise TraceFormatError(path, "benchmark has no 'metrics' object", column=f"benchmarks[{b}].metrics",
                                   expected="GuideLLM's aggregate metrics")
        stats = {}
        for name in _GUIDELLM_METRICS:
            s = (metrics.get(name) or {}).get("successful") if isinstance(metrics.get(name), dict) else None
            if not isinstance(s, dict):
                raise TraceFormatError(path, "missing metric", column=f"benchmarks[{b}].metrics.{name}.successful",
                                       expected="an object with count, mean, std_dev, min, max, percentiles")
            stats[name] = s
        col = f"benchmarks[{b}].metrics.time_to_first_token_ms.successful.count"
        count = _number(path, stats["time_to_first_token_ms"].get("count"), col, integer=True, minimum=0)
        if count == 0:
            continue  # a benchmark with no successful request states nothing to match
        level = Level(*_guidellm_strategy(path, bench, b, count), count)
        for name, s in stats.items():
            metric, factor = _GUIDELLM_METRICS[name]
            where = f"benchmarks[{b}].metrics.{name}.successful"
            for stat in ("mean", "std_dev", "min", "max"):
                if stat in s:
                    level.add(metric, _STAT[stat], None, factor * _number(path, s[stat], f"{where}.{stat}", minimum=0))
            pct = s.get("percentiles")
            if not isinstance(pct, dict):
                raise TraceFormatError(path, "missing percentiles", column=f"{where}.percentiles",
                                       expected="an object p001 ... p999")
            for key, value in pct.items():
                if key in _GUIDELLM_PCT:
                    level.add(metric, "quantile", _GUIDELLM_PCT[key],
                              factor * _number(path, value, f"{where}.percentiles.{key}", minimum=0))
        levels.append(level)
    if not levels:
        raise TraceFormatError(path, "has no benchmark with a successful request",
                               column="metrics.time_to_first_token_ms.successful.count", expected=">= 1")
    return levels


def _bench_level(path, obj, row: int | None) -> Level:
    """One ``vllm bench serve`` / SGLang ``bench_serving`` result object."""
    if not isinstance(obj, dict):
        raise TraceFormatError(path, f"is a JSON {type(obj).__name__}", row=row, expected="a benchmark result object")
    for f in ("completed", "total_input_tokens", "total_output_tokens", "request_rate"):
        if f not in obj:
            raise TraceFormatError(path, "missing field", row=row, column=f, expected="a benchmark result's summary")
    n = _number(path, obj["completed"], "completed", row, integer=True, minimum=1)
    rate = obj["request_rate"]
    if rate in ("inf", "Infinity") or (isinstance(rate, float) and rate == math.inf):
        rate = math.inf
    else:
        rate = _number(path, rate, "request_rate", row, minimum=1e-9)
    cap = obj.get("max_concurrency")
    cap = None if cap is None else _number(path, cap, "max_concurrency", row, integer=True, minimum=1)
    burst = obj.get("burstiness")
    if burst is not None and _number(path, burst, "burstiness", row, minimum=0) != 1 and rate != math.inf:
        raise TraceFormatError(path, f"burstiness {burst} is not 1", row=row, column="burstiness",
                               expected="Poisson arrivals (burstiness 1): the fit replays no other arrival process")
    if rate == math.inf:
        level = Level("concurrency", float(min(cap or n, n)), n)
    elif cap is None or cap >= n:
        level = Level("poisson_rate", rate, n)
    else:
        raise TraceFormatError(path, f"request_rate {rate:g} with max_concurrency {cap}", row=row,
                               column="max_concurrency", expected="a rate (no cap) or a cap with an infinite rate: "
                                                                  "the fit replays an open or a closed loop")
    for f, metric in (("total_input_tokens", "num_prompt_tokens"), ("total_output_tokens", "num_output_tokens")):
        level.add(metric, "mean", None, _number(path, obj[f], f, row, minimum=n) / n)
    for key, value in obj.items():
        m = _BENCH_KEY.fullmatch(key)
        if m is None:
            continue
        stat = "quantile" if m.group(1) in ("median",) or m.group(2) else _STAT[m.group(1)]
        q = 50.0 if m.group(1) == "median" else float(m.group(2)) if m.group(2) else None
        if q is not None and not 0 <= q <= 100:
            raise TraceFormatError(path, f"percentile {q:g} is not in [0, 100]", row=row, column=key)
        level.add(_BENCH_METRICS[m.group(3)], stat, q, 1e-3 * _number(path, value, key, row, minimum=0,
                                                                       maximum=1e12))
    return level


def import_summaries(paths, fmt: str) -> tuple[pd.DataFrame, dict]:
    """Read aggregate results of ``fmt`` (:data:`FORMATS`) from ``paths`` (levels numbered in
    file order, then line or benchmark order).

    Returns
    -------
    frame : pandas.DataFrame
        ``aggregate_targets/1`` rows; a statistic a file gives twice (vLLM's ``median`` and
        ``p50``) is kept once, the first.
    metadata : dict
        ``source_format``, ``source`` (the files), ``num_levels``.

    Raises
    ------
    TraceFormatError
        Naming file, line and field: not the format, a missing or non-numeric field, a load
        the replay cannot reproduce (a rate with a concurrency cap, bursty arrivals), a level
        without any latency statistic.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown summary format {fmt!r}")
    levels: list[Level] = []
    for path in map(Path, paths):
        if fmt == "llmperf":
            found = _llmperf(path)
        elif fmt == "guidellm":
            found = _guidellm(path)
        elif fmt == "vllm-bench":
            found = [_bench_level(path, read_json(path), None)]
        else:
            found = [_bench_level(path, obj, row) for row, _, obj in iter_jsonl(path)]
            if not found:
                raise TraceFormatError(path, "has no runs", expected="one JSON object per line")
        for level in found:
            if not any(m in ("ttft_s", "tpot_s", "e2e_s") for m, *_ in level.rows):
                raise TraceFormatError(path, "has no latency statistic", expected="percentiles or means of TTFT, "
                                       "TPOT or E2E (e.g. median_ttft_ms, results_ttft_s_quantiles_p50)")
            levels.append(level)
    return levels_frame(levels, f"{fmt}-summary", paths)


def levels_frame(levels: list[Level], source_format: str, paths) -> tuple[pd.DataFrame, dict]:
    """``aggregate_targets/1`` rows of ``levels`` (numbered in order) and the metadata
    ``source_format``, ``source`` (``paths``) and ``num_levels``; a statistic a level gives
    twice (vLLM's ``median`` and ``p50``) is kept once, the first."""
    rows = [{"level": k, "level_kind": lv.kind, "level_value": lv.value, "num_requests": lv.num_requests,
             "metric": m, "statistic": s, "quantile_pct": q,
             "value_s": v if m.endswith("_s") else None, "value_tokens": None if m.endswith("_s") else v}
            for k, lv in enumerate(levels) for m, s, q, v in lv.rows]
    df = pd.DataFrame(rows).astype({"quantile_pct": float, "value_s": float, "value_tokens": float})
    df = df.assign(q=df["quantile_pct"].fillna(-1)).drop_duplicates(["level", "metric", "statistic", "q"])
    df = df.drop(columns="q").reset_index(drop=True)
    meta = {"source_format": source_format, "source": ", ".join(str(p) for p in paths),
            "num_levels": str(len(levels))}
    return df, meta
