"""A vLLM log's stats lines as a ``vllm_stats/1`` frame on a trace's clock, and as a time-series CSV."""
from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import numpy as np
import pandas as pd

from ...errors import TraceFormatError
from . import STATS_COLUMNS, read_vllm_log


def _jsonable(v):
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return repr(v)


def import_vllm_log(path: str | Path, origin_unix_s: float | None = None,
                    utc_offset_hours: float | None = None) -> tuple[pd.DataFrame, dict]:
    """The stats series of a vLLM log as a ``vllm_stats/1`` frame, and the settings as metadata.

    Parameters
    ----------
    path : str or Path
    origin_unix_s : float, optional
        Put ``t_s`` on a trace's clock: seconds since this epoch instant (a request trace's
        ``time_origin_unix_s`` metadata, written by ``traces import guidellm`` and
        ``vllm-otlp``). Default: ``t_s`` = 0 at the first stats line.
    utc_offset_hours : float, optional
        With ``origin_unix_s``: the log clock's offset from UTC (e.g. -8 for PST). Default:
        the multiple of 15 minutes that puts the first stats line closest to the origin
        (vLLM writes its first stats line within 10 s of the first request), reported in the
        metadata as inferred.

    Returns
    -------
    frame : pandas.DataFrame
        ``t_s`` (s), ``engine`` (index), ``prompt_throughput_tokens_per_s`` and
        ``generation_throughput_tokens_per_s`` (vLLM's averages over the interval ending at
        ``t_s``), ``running``, ``waiting`` (requests), ``kv_cache_usage_frac`` and
        ``prefix_cache_hit_rate_frac`` (fractions in [0, 1]; the hit rate null when the line
        has none). Sorted by time, engines interleaved.
    metadata : dict
        ``engine_settings`` and ``engine_settings_sources`` (JSON), ``non_default_args``
        (JSON; non-JSON values as their repr), ``vllm_version``, ``time_origin``,
        ``first_stats_line_time`` (the log's clock), ``stats_interval_s`` (median gap).

    Raises
    ------
    TraceFormatError
        As :func:`read_vllm_log`, and a log without stats lines (a server run with
        ``--disable-log-stats``).
    """
    path = Path(path)
    log = read_vllm_log(path)
    st = log.stats
    if st.empty:
        raise TraceFormatError(path, "has no stats lines ('Engine NNN: Avg prompt throughput: ...')",
                               column="Avg prompt throughput",
                               expected="a log of a server run without --disable-log-stats that served requests")
    st = st.sort_values(["time", "engine"], kind="stable").reset_index(drop=True)
    t_first = st["time"].iloc[0]
    rel = (st["time"] - t_first).dt.total_seconds().to_numpy()
    meta = {
        "source_format": "vllm-log",
        "source": str(path),
        "vllm_version": str(log.settings.get("vllm_version", "")),
        "engine_settings": json.dumps(_jsonable(log.settings)),
        "engine_settings_sources": json.dumps(log.sources),
        "non_default_args": json.dumps(_jsonable(log.non_default_args)),
        "first_stats_line_time": t_first.isoformat(),
        "log_first_line_time": log.first_line_time.isoformat() if log.first_line_time else "",
        "log_clock": "naive local time as written in the log" + ("" if log.year_known else " (no year in the log)"),
        "num_stats_lines": str(len(st)),
        "num_engines": str(st["engine"].nunique()),
    }
    gaps = np.diff(rel[st["engine"].to_numpy() == st["engine"].iloc[0]])
    if gaps.size:
        meta["stats_interval_s"] = f"{float(np.median(gaps)):.3f}"
    if origin_unix_s is None:
        t = rel
        meta["time_origin"] = "first stats line"
    else:
        naive_epoch = (t_first - dt.datetime(1970, 1, 1)).total_seconds()
        if utc_offset_hours is None:
            q = round((naive_epoch - origin_unix_s) / 900.0) * 900.0
            utc_offset_hours = q / 3600.0
            how = "inferred (first stats line nearest the trace origin, 15-min steps)"
        else:
            how = "given"
        first = naive_epoch - utc_offset_hours * 3600.0 - origin_unix_s
        t = rel + first
        meta.update({"time_origin": f"trace origin {origin_unix_s!r} (unix s)",
                     "log_utc_offset_hours": f"{utc_offset_hours:g}", "log_utc_offset_source": how,
                     "first_stats_line_t_s": f"{first:.3f}"})
    df = pd.DataFrame({"t_s": t, **{c: st[c].to_numpy() for c in STATS_COLUMNS[1:]}})
    df["prefix_cache_hit_rate_frac"] = df["prefix_cache_hit_rate_frac"].astype(float)
    return df, meta


def timeseries_csv_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """The stats series in the layout ``replay --report --measured-timeseries`` reads.

    Columns ``t, prompt_throughput, gen_throughput, running, waiting, kv_cache_pct,
    prefix_cache_hit_pct`` (as the 1-second ``timeseries.csv`` of the LLMServingSim runs;
    percentages 0-100). Several engines (data-parallel ranks) are summed per stats tick
    (their lines' times rounded to 1 s), KV usage and hit rate averaged.
    """
    frame = frame[frame["t_s"] >= 0]
    if frame["engine"].nunique() <= 1:
        return pd.DataFrame({
            "t": frame["t_s"].to_numpy(),
            "prompt_throughput": frame["prompt_throughput_tokens_per_s"].to_numpy(),
            "gen_throughput": frame["generation_throughput_tokens_per_s"].to_numpy(),
            "running": frame["running"].to_numpy(),
            "waiting": frame["waiting"].to_numpy(),
            "kv_cache_pct": frame["kv_cache_usage_frac"].to_numpy() * 100.0,
            "prefix_cache_hit_pct": frame["prefix_cache_hit_rate_frac"].to_numpy() * 100.0,
        })
    g = frame.assign(t=frame["t_s"].round(0)).groupby("t", sort=True)
    return pd.DataFrame({
        "prompt_throughput": g["prompt_throughput_tokens_per_s"].sum(),
        "gen_throughput": g["generation_throughput_tokens_per_s"].sum(),
        "running": g["running"].sum(),
        "waiting": g["waiting"].sum(),
        "kv_cache_pct": g["kv_cache_usage_frac"].mean() * 100.0,
        "prefix_cache_hit_pct": g["prefix_cache_hit_rate_frac"].mean() * 100.0,
    }).reset_index()
