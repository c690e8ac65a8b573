"""Measured runs for calibration and validation: request logs split into runs, each with
its engine settings, and the measured-vs-predicted error of a calibration on each."""
from __future__ import annotations

import json
from dataclasses import replace

import pandas as pd

from replay.compare import compare
from replay.simulate import ReplayConfig, replay_frame
from schemas.tables import REQUEST_TRACE

from .errors import FitError
from .request_fit import Run


def parse_run_spec(spec: str) -> tuple[str, int | None]:
    """``"sweep.parquet#2"`` -> ``("sweep.parquet", 2)``: benchmark 2 of a multi-benchmark
    log (its ``benchmark`` column); ``"run.parquet"`` -> ``("run.parquet", None)``.

    Raises
    ------
    FitError
        What follows ``#`` is not a whole number.
    """
    path, sep, k = spec.rpartition("#")
    if not sep:
        return spec, None
    if not k.isdigit():
        raise FitError(f"{spec}: expected FILE or FILE#K with K a benchmark number")
    return path, int(k)


def load_runs(specs, cfg: ReplayConfig, read_trace) -> list[Run]:
    """The runs of ``specs`` (paths, or ``path#K``): one per file, or one per value of a
    log's ``benchmark`` column (GuideLLM sweeps), each replayed under ``cfg`` updated with
    the engine settings in the file's metadata (``engine``, JSON with vLLM's names) where
    ``cfg`` kept its default.

    Raises
    ------
    FitError
        A file that is not a request log, or a benchmark not in the file.
    """
    runs = []
    for spec in specs:
        path, k = parse_run_spec(spec)
        kind, frame, meta = read_trace(path)
        if kind != REQUEST_TRACE:
            raise FitError(f"{path}: is a {kind}; only request logs can be fitted together or validated on")
        run_cfg = _with_engine_metadata(cfg, meta)
        if "benchmark" in frame and frame["benchmark"].nunique() > 1 or k is not None:
            if "benchmark" not in frame:
                raise FitError(f"{spec}: the file has no 'benchmark' column; give the file without #{k}")
            wanted = [k] if k is not None else sorted(frame["benchmark"].unique())
            for b in wanted:
                part = frame[frame["benchmark"] == b]
                if part.empty:
                    raise FitError(f"{spec}: no benchmark {b} (the file has "
                                   f"{', '.join(str(x) for x in sorted(frame['benchmark'].unique()))})")
                part = part.assign(arrival_time_s=part["arrival_time_s"] - part["arrival_time_s"].min())
                runs.append(Run(f"{path}#{b}", part.sort_values("arrival_time_s", kind="stable").reset_index(drop=True),
                                run_cfg, meta))
        else:
            runs.append(Run(path, frame, run_cfg, meta))
    return runs


def _with_engine_metadata(cfg: ReplayConfig, meta: dict) -> ReplayConfig:
    """``cfg`` with the trace's recorded engine settings where ``cfg`` has its defaults."""
    raw = (meta or {}).get("engine")
    if not raw:
        return cfg
    try:
        engine = json.loads(raw) if isinstance(raw, str) else dict(raw)
    except (ValueError, TypeError):
        return cfg
    defaults = ReplayConfig()
    changes = {k: v for k, v in engine.items()
               if hasattr(defaults, k) and getattr(cfg, k) == getattr(defaults, k) and v is not None}
    return replace(cfg, **changes) if changes else cfg


def score_runs(runs: list[Run], cost_model) -> pd.DataFrame:
    """Measured vs predicted on every run: one row per run and metric with the p50/p90
    relative errors (``err_p50``, ``err_p90``) and the absolute ones in ms where the
    measured value is below 1 ms (``replay.compare.compare``'s table, stacked)."""
    rows = []
    for run in runs:
        res, _ = replay_frame(run.trace, cost_model, replace(run.config, record_token_times=False), run.metadata)
        table = compare(res)
        table.insert(0, "run", run.name)
        rows.append(table)
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()
