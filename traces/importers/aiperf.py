"""Import NVIDIA AIPerf's exports: ``profile_export.jsonl`` (one record per request) as a request
trace, ``profile_export_aiperf.json`` (the run's statistics) as ``aggregate_targets/1``.

Sources (ai-dynamo/aiperf): ``docs/tutorials/working-with-profile-exports.md`` (both files,
with examples), ``docs/reference/json-export-schema.md`` (the statistics block),
``docs/metrics_reference.md`` (each metric's definition), ``MetricTimeUnit`` in
``aiperf/common/enums/metric_enums.py`` (time units ``ns``, ``us``, ``ms``, ``sec``; ``s``
in other releases). Every value comes with its ``unit``, which is honoured, never assumed.

Per request (``profile_export.jsonl``)::

    {"metadata": {"request_start_ns": 1759813207532900363, "benchmark_phase": "profiling",
                  "was_cancelled": false, ...},
     "metrics": {"input_sequence_length": {"value": 550, "unit": "tokens"},
                 "time_to_first_token": {"value": 255.9, "unit": "ms"},
                 "request_latency": {"value": 297.5, "unit": "ms"},
                 "output_sequence_length": {"value": 9, "unit": "tokens"}, ...},
     "error": null or {"code": 499, "type": "RequestCancellationError", "message": "..."}}

Read: arrival = ``request_start_ns`` (older releases: ``timestamp_ns``; epoch ns) minus the
first; ``input_sequence_length`` (``error_isl`` for a failed request) -> prompt tokens;
``output_sequence_length`` (else ``output_token_count``) -> output tokens;
``time_to_first_token`` -> TTFT (absent when not streamed); ``request_latency`` -> E2E; TPOT
= (E2E - TTFT)/(N - 1), which is AIPerf's per-request ``inter_token_latency``. Records of
another ``benchmark_phase`` than ``profiling`` (warm-up) are left out and counted; a record
with an ``error`` or ``was_cancelled`` is kept with ``status = 'failed: ...'`` (left out and
counted when it records no prompt length: AIPerf writes ``metrics: null`` for some).

Aggregate (``profile_export_aiperf.json``; the metrics at the top level, or under ``records``
in early releases): each metric ``{"unit": "ms", "avg": ..., "min": ..., "max": ..., "std":
..., "p1" ... "p99": ...}``. Read as one level per file: ``time_to_first_token`` -> ``ttft_s``,
``inter_token_latency`` (per request ``(request_latency - TTFT) / (OSL - 1)``, the mean decode
interval) -> ``tpot_s``, ``request_latency`` -> ``e2e_s``, ``input_sequence_length`` and
``output_sequence_length`` (tokens) -> the lengths; ``avg`` -> mean, ``std``, ``min``, ``max``,
``pNN``. Requests: ``request_count.avg`` (else ``request_latency.count``). Load:
``input_config.loadgen``: ``concurrency`` alone (``request_rate_mode`` ``concurrency_burst``)
is a closed loop; ``request_rate`` an open loop, ``constant`` or ``poisson`` by
``request_rate_mode`` (Poisson when not given).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from schemas.metrics import tpot_s

from ..errors import TraceFormatError
from ._frame import assemble_frame
from ._json import iter_jsonl, json_number, read_json
from ._rows import RowStatus
from .summaries import Level, levels_frame, percentile_of

__all__ = ["PER_REQUEST", "SUMMARY", "import_aiperf_records", "import_aiperf_summaries"]

PER_REQUEST = "profile_export.jsonl"
SUMMARY = "profile_export_aiperf.json"
#: AIPerf's time units -> seconds.
TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0}
_LATENCIES = {"time_to_first_token": "ttft_s", "inter_token_latency": "tpot_s", "request_latency": "e2e_s"}
_LENGTHS = {"input_sequence_length": "num_prompt_tokens", "output_sequence_length": "num_output_tokens"}
_RATE_MODES = {"constant": "constant_rate", "poisson": "poisson_rate"}


def _factor(path, unit, column: str, row: int | None, tokens: bool) -> float:
    """The factor to seconds (or 1 for tokens) of ``unit``; an error naming the field otherwise."""
    if tokens:
        if unit != "tokens":
            raise TraceFormatError(path, f"unit {str(unit)[:20]!r} is not tokens", row=row, column=f"{column}.unit",
                                   expected="'tokens'")
        return 1.0
    if not isinstance(unit, str) or unit.lower() not in TIME_UNITS:
        raise TraceFormatError(path, f"unit {str(unit)[:20]!r} is not a time unit", row=row,
                               column=f"{column}.unit", expected="ns, us, ms, s or sec")
    return TIME_UNITS[unit.lower()]


def _measure(path, metrics: dict, name: str, row: int, tokens: bool = False) -> float | None:
    """The value of ``metrics[name]`` (``{"value", "unit"}``) in seconds or tokens; None when absent."""
    m = metrics.get(name)
    if m is None:
        return None
    column = f"metrics.{name}"
    if not isinstance(m, dict) or "value" not in m or "unit" not in m:
        raise TraceFormatError(path, "not a measurement", row=row, column=column,
                               expected='{"value": number, "unit": "ms" | "tokens" | ...}')
    factor = _factor(path, m["unit"], column, row, tokens)
    return factor * json_number(path, m["value"], column=f"{column}.value", row=row, minimum=0,
                                maximum=1e20, integer=tokens)


def import_aiperf_records(path: str | Path, invalid: str = "error") -> tuple[pd.DataFrame, dict]:
    """Read ``profile_export.jsonl`` into a request trace.

    Parameters
    ----------
    path : str or Path
    invalid : {"error", "flag", "drop"}
        A success with TTFT > E2E or without output tokens is invalid.

    Returns
    -------
    frame : pandas.DataFrame
        ``request_trace/1``: ``arrival_time_s``, tokens, ``ttft_s``, ``e2e_s``, ``tpot_s``
        (seconds); ``request_id`` = the record's ``x_request_id``, else its 1-based row.
    metadata : dict
        ``source_format`` (``aiperf``), ``source``, ``arrival_source``, ``num_warmup_left_out``,
        ``num_failed_without_length_left_out``, row counts.

    Raises
    ------
    TraceFormatError
        Naming the file, the record (row and line) and the field: not JSON Lines, a missing
        field, a unit that is not a time (or not ``tokens``), a value that is not a number,
        no profiling record.
    """
    path = Path(path)
    status = RowStatus(path, invalid)
    c_order = status.invalid("time_to_first_token > request_latency", "metrics.time_to_first_token",
                             "time_to_first_token <= request_latency")
    c_out0 = status.invalid("success with 0 output tokens", "metrics.output_sequence_length", ">= 1")
    send, prompt, output, ttft, e2e, codes, rows, ids = [], [], [], [], [], [], [], []
    warmup = unsized = 0
    for row, _, rec in iter_jsonl(path):
        meta = rec.get("metadata")
        metrics = rec.get("metrics") if isinstance(rec.get("metrics"), dict) else {}
        if not isinstance(meta, dict):
            raise TraceFormatError(path, "missing field", row=row, column="metadata",
                                   expected="an AIPerf record (metadata, metrics, error)")
        if meta.get("benchmark_phase", "profiling") != "profiling":
            warmup += 1
            continue
        failed = bool(rec.get("error") or meta.get("was_cancelled"))
        n_in = _measure(path, metrics, "input_sequence_length", row, tokens=True)
        if n_in is None:
            n_in = _measure(path, metrics, "error_isl", row, tokens=True)
        if n_in is None and failed:
            unsized += 1  # a failed request whose prompt length AIPerf did not record
            continue
        if n_in is None:
            raise TraceFormatError(path, "missing field", row=row, column="metrics.input_sequence_length",
                                   expected='{"value": N, "unit": "tokens"}')
        key = "request_start_ns" if "request_start_ns" in meta else "timestamp_ns"
        send.append(json_number(path, meta.get(key), column=f"metadata.{key}", row=row, integer=True, minimum=0))
        rows.append(row)
        ids.append(str(meta.get("x_request_id") or row))
        prompt.append(int(json_number(path, n_in, column="metrics.input_sequence_length.value", row=row,
                                      minimum=1)))
        t, e, out = np.nan, np.nan, 0
        if failed:
            why = f"{_get(rec.get('error'), 'code') or ''} {_get(rec.get('error'), 'type') or 'cancelled'}".strip()
            code = status.failed(why[:100])
        else:
            first, latency, out = _success(path, metrics, row)
            code = c_out0 if out == 0 else c_order if first is not None and first > latency else 0
            if code == 0:
                t, e = (np.nan if first is None else first), latency
        output.append(out)
        ttft.append(t)
        e2e.append(e)
        codes.append(code)
    if not send:
        raise TraceFormatError(path, "has no profiling records", expected="AIPerf's profile_export.jsonl: one record "
                               "per request with metadata.benchmark_phase 'profiling'")
    c = np.asarray(codes, np.int16)
    status.add(c, rows=np.asarray(rows))
    s = np.asarray(send, np.int64)
    out_a = np.asarray(output, np.int64)
    ttft_a, e2e_a = np.asarray(ttft, float), np.asarray(e2e, float)
    df, meta = assemble_frame((s - s.min()) / 1e9, np.asarray(prompt, np.int64), out_a, status=status, codes=c,
                              rows=np.asarray(rows, np.int64), request_ids=ids,
                              extra={"ttft_s": ttft_a, "e2e_s": e2e_a, "tpot_s": tpot_s(ttft_a, e2e_a, out_a)})
    meta.update({"source_format": "aiperf", "source": str(path), "num_warmup_left_out": str(warmup),
                 "num_failed_without_length_left_out": str(unsized),
                 "arrival_source": "recorded: metadata.request_start_ns (epoch ns) relative to the first"})
    return df, meta


def _success(path, metrics: dict, row: int) -> tuple[float | None, float, int]:
    """(TTFT s or None when not streamed, E2E s, output tokens) of the successful record ``row``."""
    latency = _measure(path, metrics, "request_latency", row)
    if latency is None:
        raise TraceFormatError(path, "missing field", row=row, column="metrics.request_latency",
                               expected='{"value": number, "unit": "ms"}')
    n_out = _measure(path, metrics, "output_sequence_length", row, tokens=True)
    if n_out is None:
        n_out = _measure(path, metrics, "output_token_count", row, tokens=True)
    if n_out is None:
        raise TraceFormatError(path, "missing field", row=row, column="metrics.output_sequence_length",
                               expected='{"value": N, "unit": "tokens"}')
    return _measure(path, metrics, "time_to_first_token", row), latency, int(n_out)


def _get(obj, key: str):
    return obj.get(key) if isinstance(obj, dict) else None


def _statistic(key: str) -> tuple[str, float | None] | None:
    if key in ("min", "max", "std"):
        return key, None
    if key == "avg":
        return "mean", None
    q = percentile_of(key)
    return None if q is None else ("quantile", q)


def _load(path: Path, obj: dict, count: int) -> tuple[str, float]:
    """(level kind, value) from ``input_config.loadgen``."""
    loadgen = _get(_get(obj, "input_config"), "loadgen")
    where = "input_config.loadgen"
    if not isinstance(loadgen, dict):
        raise TraceFormatError(path, "missing field", column=where,
                               expected="the run's load (concurrency, request_rate, request_rate_mode)")
    rate, clients = loadgen.get("request_rate"), loadgen.get("concurrency")
    if clients is not None:
        clients = json_number(path, clients, column=f"{where}.concurrency", integer=True, minimum=1)
    if rate is None:
        if clients is None:
            raise TraceFormatError(path, "states neither a concurrency nor a request rate", column=where,
                                   expected="concurrency (a closed loop) or request_rate (an open loop)")
        return "concurrency", float(min(clients, count))
    rate = json_number(path, rate, column=f"{where}.request_rate", minimum=1e-9)
    mode = loadgen.get("request_rate_mode") or "poisson"
    if mode not in _RATE_MODES:
        raise TraceFormatError(path, f"request_rate_mode {str(mode)[:30]!r} with a request rate",
                               column=f"{where}.request_rate_mode", expected="constant or poisson")
    if clients is not None and clients < count:
        raise TraceFormatError(path, f"request_rate {rate:g} with concurrency {clients}", column=f"{where}.concurrency",
                               expected="a rate (no cap) or a concurrency alone: the fit replays an open or a "
                                        "closed loop")
    return _RATE_MODES[mode], float(rate)


def _summary_level(path: Path) -> Level:
    obj = read_json(path)
    if not isinstance(obj, dict):
        raise TraceFormatError(path, f"is a JSON {type(obj).__name__}",
                               expected="AIPerf's profile_export_aiperf.json: one object of metrics")
    metrics = obj["records"] if isinstance(obj.get("records"), dict) else obj
    count_of = _get(metrics.get("request_count"), "avg")
    column = "request_count.avg"
    if count_of is None:
        count_of, column = _get(metrics.get("request_latency"), "count"), "request_latency.count"
    count = json_number(path, count_of, column=column, integer=True, minimum=1)
    level = Level(*_load(path, obj, count), count)
    for name, metric in {**_LATENCIES, **_LENGTHS}.items():
        stats = metrics.get(name)
        tokens = name in _LENGTHS
        if stats is None and not tokens:
            continue  # TTFT and ITL are absent from a run that did not stream
        if not isinstance(stats, dict) or "unit" not in stats:
            raise TraceFormatError(path, "missing field" if stats is None else "not a statistics object",
                                   column=name, expected='{"unit": ..., "avg": ..., "p50": ..., ...}')
        factor = _factor(path, stats["unit"], name, None, tokens)
        level.add_statistics(path, metric, stats, name, factor, _statistic)
    if not any(m in _LATENCIES.values() for m, *_ in level.rows):
        raise TraceFormatError(path, "has no latency statistic", column="request_latency",
                               expected="statistics of request_latency, time_to_first_token or inter_token_latency")
    return level


def import_aiperf_summaries(paths) -> tuple[pd.DataFrame, dict]:
    """Read ``profile_export_aiperf.json`` files into ``aggregate_targets/1``, one level per file
    in the given order (a sweep's runs).

    Returns
    -------
    frame : pandas.DataFrame
        ``aggregate_targets/1`` rows: latencies in seconds (converted by each metric's
        ``unit``), lengths in tokens.
    metadata : dict
        ``source_format`` (``aiperf-summary``), ``source``, ``num_levels``.

    Raises
    ------
    TraceFormatError
        Naming the file and the field: not JSON, a missing metric or load, a unit that is not a
        time (or not ``tokens``), a value that is not a number, a rate with a concurrency cap.
    """
    paths = [Path(p) for p in paths]
    return levels_frame([_summary_level(p) for p in paths], "aiperf-summary", paths)
