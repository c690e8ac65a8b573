"""Import inference-perf's report folder: its per-request lifecycle metrics when present
(:mod:`.inference_perf_requests`), else its per-stage aggregates as ``aggregate_targets/1``.

inference-perf (kubernetes-sigs/inference-perf; llm-d publishes its results in this layout)
writes into one report folder (``docs/reports.md``; ``inference_perf/reportgen/base.py``,
``ReportGenerator.generate_reports`` and ``summarize_requests``):

* ``per_request_lifecycle_metrics.json``: a list, one object per request (read by
  :func:`traces.importers.inference_perf_requests.import_inference_perf_requests`);
* ``stage_N_lifecycle_metrics.json``: one load stage's aggregates;
* ``summary_lifecycle_metrics.json``: the same over all stages;
* ``config.yaml``: the run's configuration; ``load.type`` is ``constant``, ``poisson`` or
  ``concurrent`` and ``load.stages[N]`` holds ``rate`` (requests/s) or ``concurrency_level``
  (``docs/config.md``, "Load Configuration").

A stage file, as ``summarize_requests`` writes it (times in seconds)::

    {"load_summary": {"count": 120, "requested_rate": 2.0, "achieved_rate": 1.98,
                      "concurrency": 8},            # concurrency only for concurrent loads
     "successes": {"count": 118,
                   "latency": {"time_to_first_token": {"mean": 0.21, "min": ..., "max": ...,
                                                       "median": 0.19, "p90": 0.33, ...},
                               "time_per_output_token": {...}, "request_latency": {...},
                               "normalized_time_per_output_token": {...},
                               "inter_token_latency": {...}},
                   "prompt_len": {...} or "prompt_tokens": {"total": ..., "mean": ..., ...},
                   "output_len": {...}, "output_tokens": {"total": ..., "mean": ..., ...}},
     "failures": {"count": 2, ...}}

Read per stage (one level each, in stage order): the load, closed loop at
``load_summary.concurrency`` (else ``concurrency_level`` of the stage in ``config.yaml``) for
a concurrent load, else open loop at ``load_summary.requested_rate`` with ``load.type``'s
arrivals (``constant`` -> ``constant_rate``, ``poisson`` -> ``poisson_rate``; from
``config.yaml`` beside the files, or ``load_type`` when there is none); ``successes.count``
requests; ``time_to_first_token`` -> ``ttft_s``, ``time_per_output_token`` (inference-perf's
``(last token - first token) / (N - 1)`` per request) -> ``tpot_s``, ``request_latency`` ->
``e2e_s``, each statistic ``mean``, ``min``, ``max``, ``median`` (p50) and ``pNN`` (seconds);
the prompt lengths from ``prompt_tokens`` (current releases) or ``prompt_len`` (older ones,
the field llm-d-benchmark's converter reads), the output lengths from ``output_tokens`` (the
server's count) or ``output_len`` (the client's re-tokenised count). Not read:
``normalized_time_per_output_token`` (E2E / N, which mixes in the TTFT) and
``inter_token_latency`` (over token gaps, not requests). The summary file is read only when
there is no stage file, and only for a run of one stage (several stages are several loads).
"""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import yaml

from ..errors import TraceFormatError
from ._json import json_number, read_json
from ._source import read_utf8_text
from .summaries import Level, levels_frame, percentile_of

__all__ = ["LOAD_TYPES", "PER_REQUEST", "SUMMARY", "find_reports", "import_inference_perf_stages"]

PER_REQUEST = "per_request_lifecycle_metrics.json"
SUMMARY = "summary_lifecycle_metrics.json"
#: inference-perf's ``load.type`` -> the level kind of an open loop (concurrent: a closed loop).
LOAD_TYPES = {"constant": "constant_rate", "poisson": "poisson_rate", "concurrent": "concurrency"}
_STAGE = re.compile(r"stage_(\d+)_lifecycle_metrics\.json")
_LATENCIES = {"time_to_first_token": "ttft_s", "time_per_output_token": "tpot_s", "request_latency": "e2e_s"}
#: servecal's length metric -> inference-perf's fields, preferred first.
_LENGTHS = {"num_prompt_tokens": ("prompt_tokens", "prompt_len"), "num_output_tokens": ("output_tokens", "output_len")}


def _statistic(key: str) -> tuple[str, float | None] | None:
    if key in ("mean", "min", "max"):
        return key, None
    if key == "median":
        return "quantile", 50.0
    q = percentile_of(key)
    return None if q is None else ("quantile", q)


def find_reports(folder: Path) -> tuple[Path | None, list[Path]]:
    """The per-request file of a report folder (None when absent) and its aggregate files: the
    stage files in stage order, else the summary file (empty when neither is there)."""
    per_request = folder / PER_REQUEST
    stages = sorted((p for p in folder.iterdir() if _STAGE.fullmatch(p.name)),
                    key=lambda p: int(_STAGE.fullmatch(p.name).group(1)))  # type: ignore[union-attr]
    if not stages and (folder / SUMMARY).is_file():
        stages = [folder / SUMMARY]
    return (per_request if per_request.is_file() else None), stages


def _config(path: Path) -> dict:
    """``load`` of the ``config.yaml`` at ``path`` (checked: a mapping with a known ``type``)."""
    try:
        cfg = yaml.safe_load(read_utf8_text(path, "inference-perf's config.yaml"))
    except (yaml.YAMLError, RecursionError, ValueError) as exc:
        mark = getattr(exc, "problem_mark", None)
        raise TraceFormatError(path, "not valid YAML", line=mark.line + 1 if mark is not None else None,
                               expected="inference-perf's config.yaml") from None
    load = cfg.get("load") if isinstance(cfg, dict) else None
    if not isinstance(load, dict):
        raise TraceFormatError(path, "has no 'load' mapping", column="load",
                               expected="inference-perf's config.yaml (load: type, stages)")
    if load.get("type") not in LOAD_TYPES:
        raise TraceFormatError(path, f"load type {str(load.get('type'))[:40]!r} is not read", column="load.type",
                               expected=" or ".join(LOAD_TYPES) + " (a session replay is not one load)")
    return load


def _stage_index(path: Path) -> int | None:
    m = _STAGE.fullmatch(path.name)
    return int(m.group(1)) if m else None


def _load(path: Path, obj: dict, load: dict | None, load_type: str | None) -> tuple[str, float]:
    """(level kind, value) of the stage file ``path``."""
    summary = obj.get("load_summary")
    if not isinstance(summary, dict):
        raise TraceFormatError(path, "missing field", column="load_summary",
                               expected="an inference-perf lifecycle report (load_summary, successes, failures)")
    kind_of = load["type"] if load is not None else load_type
    stage = _stage_index(path)
    stages = load.get("stages") if load is not None else None
    declared = stages[stage] if isinstance(stages, list) and stage is not None and stage < len(stages) \
        and isinstance(stages[stage], dict) else {}
    if stage is None and isinstance(stages, list) and len(stages) != 1:
        raise TraceFormatError(path, f"summarises {len(stages)} load stages", column="load.stages",
                               expected="the stage_N_lifecycle_metrics.json files: one load each")
    if stage is None and isinstance(stages, list):
        declared = stages[0] if isinstance(stages[0], dict) else {}
    if summary.get("concurrency") is not None or kind_of == "concurrent":
        value = summary.get("concurrency", declared.get("concurrency_level"))
        return "concurrency", float(json_number(path, value, column="load_summary.concurrency", integer=True,
                                                minimum=1))
    if kind_of is None:
        raise TraceFormatError(path, "no config.yaml beside it says the arrivals", column="load.type",
                               expected="config.yaml in the report folder, or --load-type constant|poisson")
    rate = summary.get("requested_rate", declared.get("rate"))
    return LOAD_TYPES[kind_of], float(json_number(path, rate, column="load_summary.requested_rate", minimum=1e-9))


def _stage_level(path: Path, load: dict | None, load_type: str | None) -> Level:
    obj = read_json(path)
    if not isinstance(obj, dict):
        raise TraceFormatError(path, f"is a JSON {type(obj).__name__}", expected="an inference-perf lifecycle "
                               "report object (load_summary, successes, failures)")
    kind, value = _load(path, obj, load, load_type)
    ok = obj.get("successes")
    if not isinstance(ok, dict) or "count" not in ok:
        raise TraceFormatError(path, "missing field", column="successes.count", expected="the successful requests")
    count = json_number(path, ok["count"], column="successes.count", integer=True, minimum=0)
    if count == 0:
        raise TraceFormatError(path, "has no successful request", column="successes.count", expected=">= 1")
    level = Level(kind, value, count)
    latency = ok.get("latency")
    if not isinstance(latency, dict):
        raise TraceFormatError(path, "missing field", column="successes.latency",
                               expected="time_to_first_token, time_per_output_token, request_latency in seconds")
    for name, metric in _LATENCIES.items():
        stats = latency.get(name)
        if isinstance(stats, dict):  # null when no request streamed (TTFT, TPOT)
            level.add_statistics(path, metric, stats, f"successes.latency.{name}", 1.0, _statistic)
    if not any(m in _LATENCIES.values() for m, *_ in level.rows):
        raise TraceFormatError(path, "has no latency statistic", column="successes.latency",
                               expected="statistics of time_to_first_token, time_per_output_token or "
                                        "request_latency (seconds)")
    for metric, names in _LENGTHS.items():
        name = next((n for n in names if isinstance(ok.get(n), dict) and "mean" in ok[n]), None)
        if name is None:
            raise TraceFormatError(path, "missing field", column=f"successes.{names[0]}",
                                   expected=f"the lengths' statistics ({' or '.join(names)}: mean, min, max, ...)")
        level.add_statistics(path, metric, ok[name], f"successes.{name}", 1.0, _statistic)
    return level


def import_inference_perf_stages(paths, load_type: str | None = None) -> tuple[pd.DataFrame, dict]:
    """Read inference-perf stage (or summary) files into ``aggregate_targets/1``, one level per
    file in the given order.

    Parameters
    ----------
    paths : list of Path
        ``stage_N_lifecycle_metrics.json`` files (or one ``summary_lifecycle_metrics.json``);
        ``config.yaml`` beside the first is read when present.
    load_type : {"constant", "poisson", "concurrent"}, optional
        ``load.type`` when there is no ``config.yaml`` (a concurrent stage says so itself).

    Returns
    -------
    frame : pandas.DataFrame
        ``aggregate_targets/1`` rows (latencies in seconds, lengths in tokens).
    metadata : dict
        ``source_format`` (``inference-perf-summary``), ``source``, ``num_levels``,
        ``load_type`` and its ``load_type_source``.

    Raises
    ------
    TraceFormatError
        Naming the file and the field: not JSON, a missing or non-numeric field, no successful
        request, no latency statistic, an unknown load type, a summary of several stages, an
        open loop whose arrivals nothing states.
    """
    paths = [Path(p) for p in paths]
    if not paths:
        raise ValueError("no inference-perf report files")
    config = paths[0].parent / "config.yaml"
    load = _config(config) if config.is_file() else None
    levels = [_stage_level(p, load, load_type) for p in paths]
    frame, meta = levels_frame(levels, "inference-perf-summary", paths)
    meta["load_type"] = str(load["type"] if load is not None else load_type or "concurrent")
    meta["load_type_source"] = str(config) if load is not None else "--load-type" if load_type else "load_summary"
    return frame, meta
