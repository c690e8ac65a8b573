"""Read a vLLM server log: the engine settings and the periodic stats lines.

What a ``vllm serve`` stdout holds (vLLM V1; the real file in ``shared/data/real`` is vLLM
0.11.0, written with a ``2026-01-20 06:11:13,161 INFO vllm.v1.metrics.loggers: ...``
format; vLLM's default ``INFO 01-20 06:11:13 [loggers.py:123] ...`` format, with or
without a ``(APIServer pid=1)`` prefix, is read too)::

    ... vllm.entrypoints.openai.api_server: vLLM API server version 0.11.0
    ... vllm.entrypoints.utils: non-default args: {'model': '...', 'max_num_batched_tokens': 64, ...}
    ... vllm.config.scheduler: Chunked prefill is enabled with max_num_batched_tokens=64.
    ... vllm.v1.engine.core: Initializing a V1 LLM engine (v0.11.0) with config: model='...',
        tensor_parallel_size=1, ..., enable_prefix_caching=True, chunked_prefill_enabled=True, ...
    ... vllm.v1.core.kv_cache_utils: GPU KV cache size: 44,640 tokens
    ... vllm.v1.metrics.loggers: Engine 000: vllm cache_config_info with initialization after num_gpu_blocks is: 2790
    ... vllm.v1.metrics.loggers: Engine 000: Avg prompt throughput: 598.2 tokens/s, Avg generation
        throughput: 6.4 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 6.7%,
        Prefix cache hit rate: 17.1%

The stats line is vLLM's ``LoggingStatLogger`` (vllm/v1/metrics/loggers.py), every 10 s
(``VLLM_LOG_STATS_INTERVAL``) while the engine is busy: throughputs are averages over the
interval since the previous line; running, waiting and KV usage are instants; the prefix
cache hit rate is hits / queried prompt tokens over the most recent requests (its
``CachingMetrics``: the last 1,000). vLLM V0's line (``Pending:`` for waiting, no engine
index) is read too.

The log's timestamps carry no time zone (the server's local clock); ``t_s`` is relative
to the first stats line unless a trace's origin is given (:func:`.stats.import_vllm_log`).

``settings``: the V1 defaults and how a log's values resolve; ``stats``: the stats lines as a
``vllm_stats/1`` frame (``traces import vllm-log``).
"""
from __future__ import annotations

import ast
import datetime as dt
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ...errors import TraceFormatError
from .settings import resolve_settings

_TS_ISO = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,9}))?")
_TS_VLLM = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) "
                      r"(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,9}))?")
_STATS = re.compile(r"(?:Engine (\d+): )?Avg prompt throughput: ")
_FIELD = re.compile(r"^\s*([A-Za-z][A-Za-z ]*?):\s*([-+]?(?:\d[\d,]*\.?\d*|\.\d+|nan|inf))\s*(%|tokens/s|reqs)?\.?\s*$")
#: Stats fields -> (column, scale, required).
_STATS_FIELDS = {
    "Avg prompt throughput": ("prompt_throughput_tokens_per_s", 1.0, True),
    "Avg generation throughput": ("generation_throughput_tokens_per_s", 1.0, True),
    "Running": ("running", 1, True),
    "Waiting": ("waiting", 1, True),
    "Pending": ("waiting", 1, True),   # vLLM V0
    "GPU KV cache usage": ("kv_cache_usage_frac", 0.01, True),
    "Prefix cache hit rate": ("prefix_cache_hit_rate_frac", 0.01, False),
    "GPU prefix cache hit rate": ("prefix_cache_hit_rate_frac", 0.01, False),   # vLLM V0
}
_CONFIG_KEYS = {"tensor_parallel_size": int, "pipeline_parallel_size": int, "data_parallel_size": int,
                "enable_prefix_caching": bool, "chunked_prefill_enabled": bool, "dtype": str, "max_seq_len": int,
                "enforce_eager": bool, "kv_cache_dtype": str, "quantization": str, "served_model_name": str,
                "model": str, "seed": int}

#: The ``vllm_stats/1`` columns of a stats line, in order.
STATS_COLUMNS = ["t_s", "engine", "prompt_throughput_tokens_per_s", "generation_throughput_tokens_per_s", "running",
                  "waiting", "kv_cache_usage_frac", "prefix_cache_hit_rate_frac"]


@dataclass
class VllmLog:
    """What a vLLM server log says.

    Attributes
    ----------
    settings : dict
        vLLM option names -> Python values (see :func:`engine_settings_from_vllm_log`).
    sources : dict
        Option -> where its value came from (``non-default args``, a log line, or a default).
    non_default_args : dict
        The ``non-default args: {...}`` dict as logged (empty when absent).
    stats : pandas.DataFrame
        One row per stats line: ``time`` (naive datetime, the log's clock), ``line`` (1-based),
        ``engine`` and the ``vllm_stats/1`` value columns.
    first_line_time : datetime or None
        The first timestamped line (server start).
    year_known : bool
        False for vLLM's default ``MM-DD hh:mm:ss`` timestamps (no year).
    """

    settings: dict
    sources: dict
    non_default_args: dict
    stats: pd.DataFrame
    first_line_time: dt.datetime | None = None
    year_known: bool = True
    counts: dict = field(default_factory=dict)


def _timestamp(text: str, year_state: list) -> tuple[dt.datetime | None, bool]:
    """The line's time and whether its year is known; None for a line without a time.

    Raises
    ------
    ValueError
        A time that no calendar has (second 61, month 13, ...).
    """
    m = _TS_ISO.search(text[:80])
    if m:
        y, mo, d, h, mi, s, frac = m.groups()
        us = int((frac or "0").ljust(6, "0")[:6])
        return dt.datetime(int(y), int(mo), int(d), int(h), int(mi), int(s), us), True
    m = _TS_VLLM.search(text[:120])
    if m:
        mo, d, h, mi, s, frac = m.groups()
        us = int((frac or "0").ljust(6, "0")[:6])
        t = dt.datetime(year_state[0], int(mo), int(d), int(h), int(mi), int(s), us)
        if year_state[1] is not None and t < year_state[1] - dt.timedelta(days=180):  # the log crossed New Year
            year_state[0] += 1
            t = t.replace(year=year_state[0])
        year_state[1] = t
        return t, False
    return None, True


def _number(path, text: str, lineno: int, column: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        raise TraceFormatError(path, f"value {text!r:.40} is not a number", line=lineno, column=column) from None


def _config_value(raw: str, typ):
    raw = raw.strip()
    if raw.startswith("'") and raw.endswith("'") and len(raw) >= 2:
        raw = raw[1:-1]
    if raw == "None":
        return None
    if typ is bool:
        return raw == "True"
    if typ is int:
        try:
            return int(raw)
        except ValueError:
            return None
    if raw.startswith("torch."):
        raw = raw[len("torch."):]
    return raw


def _parse_stats(path, msg: str, lineno: int) -> dict:
    out: dict = {}
    for part in msg.split(", "):
        m = _FIELD.match(part)
        if not m:
            continue
        key, val, unit = m.groups()
        if key not in _STATS_FIELDS:
            continue
        col, scale, _ = _STATS_FIELDS[key]
        v = _number(path, val, lineno, key)
        if not math.isfinite(v) or v < 0:
            raise TraceFormatError(path, f"value {val!r} is not a finite number >= 0", line=lineno, column=key)
        if isinstance(scale, int):
            if v != int(v) or v > 1e9:
                raise TraceFormatError(path, f"value {val!r} is not a whole number of requests up to 1e9",
                                       line=lineno, column=key)
            out[col] = int(v)
        else:
            out[col] = v * scale
    for key, (col, _, required) in _STATS_FIELDS.items():
        if required and col not in out and key != "Pending":
            if key == "Waiting" and "waiting" in out:
                continue
            raise TraceFormatError(path, f"stats line has no '{key}' field (truncated?)", line=lineno, column=key,
                                   expected="vLLM's 'Avg prompt throughput: X tokens/s, Avg generation throughput: "
                                            "Y tokens/s, Running: N reqs, Waiting: M reqs, GPU KV cache usage: x%, "
                                            "Prefix cache hit rate: y%'")
    if out["kv_cache_usage_frac"] > 1 + 1e-9:
        raise TraceFormatError(path, f"GPU KV cache usage {out['kv_cache_usage_frac']:.1%} is above 100%",
                               line=lineno, column="GPU KV cache usage")
    return out


def read_vllm_log(path: str | Path) -> VllmLog:
    """Parse a vLLM server log (see the module docstring for what is read).

    Raises
    ------
    TraceFormatError
        Naming the file, the line and the field: not UTF-8 text, a ``non-default args`` that
        is not a Python dict literal, a stats line with a missing or non-numeric field (e.g.
        cut off), a KV usage above 100 %, a stats line without a timestamp, stats of one
        engine going back in time, a file with no vLLM line at all.
    """
    path = Path(path)
    fh = _open(path)
    found: dict[str, tuple[object, str]] = {}
    nda: dict = {}
    stats = []
    first_time = None
    year_known = True
    year_state = [2000, None]
    counts = {"lines": 0, "gpu_kv_cache_size_lines": 0}
    vllm_seen = False
    with fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError:
                raise TraceFormatError(path, "is not UTF-8 text", line=lineno, expected="a vLLM server log") from None
            try:
                counts["lines"] += 1
                if "vllm" in line.lower() or "Engine " in line:
                    vllm_seen = True
                if first_time is None:
                    t, known = _timestamp(line, year_state)
                    if t is not None:
                        first_time, year_known = t, known
                if "non-default args: " in line:
                    nda.update(_non_default_args(path, line, lineno))
                    continue
                m = _STATS.search(line)
                if m:
                    row, known = _stats_row(path, line, m, lineno, year_state)
                    year_known = year_known and known
                    stats.append(row)
                    continue
                _read_setting(line, lineno, found, counts)
            except TraceFormatError:
                raise
            except (ValueError, OverflowError) as exc:  # a time no calendar has, a number beyond any range
                raise TraceFormatError(path, f"unreadable value ({str(exc)[:80]})", line=lineno,
                                       expected="a vLLM server log line") from None
    if not vllm_seen:
        raise TraceFormatError(path, "has no vLLM log line", expected="the stdout of 'vllm serve'")

    settings, sources = resolve_settings(nda, found)

    frame = pd.DataFrame(stats, columns=["time", "line", "engine", *STATS_COLUMNS[2:]])
    if len(frame):
        for e, g in frame.groupby("engine"):
            back = np.flatnonzero(np.diff(g["time"].to_numpy()) < np.timedelta64(0))
            if back.size:
                raise TraceFormatError(path, f"stats of engine {e} go back in time",
                                       line=int(g["line"].iloc[back[0] + 1]), column="time",
                                       expected="non-decreasing timestamps")
    return VllmLog(settings, sources, nda, frame, first_time, year_known, counts)


def _open(path: Path):
    """``path`` opened for reading bytes; a missing file, a folder or an unreadable one refused."""
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise TraceFormatError(path, "no such file") from None
    except IsADirectoryError:
        raise TraceFormatError(path, "is a directory; expected a vLLM log file") from None
    except OSError as exc:
        raise TraceFormatError(path, f"cannot open ({exc.strerror})") from None


def _non_default_args(path: Path, line: str, lineno: int) -> dict:
    """The ``non-default args: {...}`` dict that vLLM prints at start."""
    text = line.split("non-default args: ", 1)[1].strip()
    try:
        val = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise TraceFormatError(path, "non-default args is not a Python dict literal (cut off?)",
                               line=lineno, column="non-default args",
                               expected="{'option': value, ...} as vLLM prints it") from None
    if not isinstance(val, dict):
        raise TraceFormatError(path, f"non-default args is a {type(val).__name__}", line=lineno,
                               column="non-default args", expected="a dict")
    return val


def _stats_row(path: Path, line: str, m: re.Match, lineno: int, year_state: list) -> tuple[dict, bool]:
    """One stats line (``m``: its :data:`_STATS` match) as a row with its time, line and engine index;
    and whether the year of its time is known."""
    t, known = _timestamp(line, year_state)
    if t is None:
        raise TraceFormatError(path, "stats line has no timestamp", line=lineno, column="time",
                               expected="'YYYY-MM-DD hh:mm:ss' or vLLM's 'INFO MM-DD hh:mm:ss' prefix")
    row = _parse_stats(path, line[m.end() - len("Avg prompt throughput: "):], lineno)
    engine = int(m.group(1) or 0)
    if engine > 1_000_000:
        raise TraceFormatError(path, f"engine index {m.group(1)[:20]} is not plausible", line=lineno,
                               column="Engine")
    row.update(time=t, line=lineno, engine=engine)
    return row, known


def _read_setting(line: str, lineno: int, found: dict, counts: dict) -> None:
    """Record in ``found`` (name -> (value, where)) an engine setting the line states, if any."""
    if (m := re.search(r"vLLM API server version (\S+)", line)) and "vllm_version" not in found:
        found["vllm_version"] = (m.group(1), f"line {lineno}: vLLM API server version")
    elif m := re.search(r"Initializing a V\d LLM engine \(v([^)]+)\) with config: (.*)", line):
        found.setdefault("vllm_version", (m.group(1), f"line {lineno}: engine config"))
        cfg = m.group(2)
        for key, typ in _CONFIG_KEYS.items():
            km = re.search(rf"(?:^|[ ,]){key}=('[^']*'|[^,]*)", cfg)
            if km:
                name = "enable_chunked_prefill" if key == "chunked_prefill_enabled" else key
                found[name] = (_config_value(km.group(1), typ), f"line {lineno}: engine config")
    elif m := re.search(r"Chunked prefill is enabled with max_num_batched_tokens=(\d+)", line):
        found["max_num_batched_tokens"] = (int(m.group(1)), f"line {lineno}: chunked prefill line")
        found["enable_chunked_prefill"] = (True, f"line {lineno}: chunked prefill line")
    elif m := re.search(r"Using max model len (\d+)", line):
        found["max_model_len"] = (int(m.group(1)), f"line {lineno}: 'Using max model len'")
    elif m := re.search(r"GPU KV cache size: ([\d,]+) tokens", line):
        counts["gpu_kv_cache_size_lines"] += 1
        found.setdefault("gpu_kv_cache_size_tokens",
                         (int(m.group(1).replace(",", "")), f"line {lineno}: GPU KV cache size"))
    elif m := re.search(r"num_gpu_blocks is: (\d+)", line):
        found.setdefault("num_gpu_blocks", (int(m.group(1)), f"line {lineno}: num_gpu_blocks"))
    elif m := re.search(r"# (?:GPU|CUDA) blocks: (\d+)", line):   # vLLM V0
        found.setdefault("num_gpu_blocks", (int(m.group(1)), f"line {lineno}: # GPU blocks"))
    elif m := re.search(r"Available KV cache memory: ([\d.]+) GiB", line):
        found.setdefault("available_kv_cache_memory_gib", (float(m.group(1)), f"line {lineno}"))
    elif m := re.search(r"Model loading took ([\d.]+) ?GiB", line):
        found.setdefault("model_weights_gib", (float(m.group(1)), f"line {lineno}"))


def engine_settings_from_vllm_log(path: str | Path) -> dict:
    """The engine settings of a vLLM server log, under vLLM's option names.

    Parameters
    ----------
    path : str or Path
        The server's stdout (``vllm serve ... > vllm.log``).

    Returns
    -------
    dict
        Every option of the ``non-default args`` line, as logged (e.g. ``model``,
        ``max_num_seqs``), then the values the engine printed once resolved (they win):
        ``vllm_version``, ``max_num_batched_tokens`` and ``enable_chunked_prefill``
        ("Chunked prefill is enabled with ..."), ``max_model_len`` ("Using max model len"),
        ``tensor_parallel_size``, ``pipeline_parallel_size``, ``data_parallel_size``,
        ``enable_prefix_caching``, ``dtype``, ``enforce_eager``, ``kv_cache_dtype``,
        ``quantization``, ``seed`` (the engine config line); measured: ``num_gpu_blocks``,
        ``gpu_kv_cache_size_tokens`` (tokens), ``available_kv_cache_memory_gib``,
        ``model_weights_gib`` (GiB); ``block_size`` = KV cache tokens / blocks when both are
        printed. Settings servecal uses that the log lacks get vLLM 0.11.0's V1 defaults
        (:data:`.settings.V1_DEFAULTS`); those that depend on the GPU (``max_num_seqs``,
        ``max_num_batched_tokens``) or the model (``max_model_len``) are ``None`` then.
        Where each value came from: :func:`read_vllm_log` ``.sources``.

    Examples
    --------
    >>> s = engine_settings_from_vllm_log("blis_eval_codellama34b_prefill_sweep_vllm.log")  # doctest: +SKIP
    >>> s["max_num_seqs"], s["max_num_batched_tokens"], s["num_gpu_blocks"], s["block_size"]  # doctest: +SKIP
    (32, 64, 2790, 16)
    """
    return read_vllm_log(path).settings

