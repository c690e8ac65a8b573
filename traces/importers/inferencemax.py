"""Import InferenceMAX's collected benchmark points (``agg_bmk.json``) as ``aggregate_targets/1``.

InferenceMAX (SemiAnalysis) sweeps models x GPUs x engines nightly and collects every point of
a run in one JSON list (``/work/shared/data/real/PROVENANCE.md``, section inferencemax). A point
is one deployment (``hw``, ``model``, ``framework``, ``precision``, ``image``, ``tp``, ``ep``,
``dp_attention``, ``spec_decoding``) under one workload (``isl`` / ``osl`` tokens, ``conc``
clients); its latencies are ``{mean, median, std, p99}_{ttft, tpot, itl, e2el}`` in seconds.

Workload, as InferenceMAX's per-benchmark scripts run it: the client ``benchmark_serving.py`` of
kimbochen/bench_serving (a copy of vLLM's ``benchmarks/benchmark_serving.py``) with
``--dataset-name random --random-input-len isl --random-output-len osl --random-range-ratio R
--num-prompts $((conc * 10)) --max-concurrency conc --request-rate inf --ignore-eos``: a closed
loop of ``conc`` clients, ``conc * 10`` requests, every output exactly its drawn length.

Range-ratio convention. vLLM's random dataset drew lengths uniformly from the integers
``[int(L * R), L]`` in its older ``benchmark_serving.py`` (the copy InferenceMAX runs) and from
``[floor(L * (1 - R)), ceil(L * (1 + R))]`` in ``vllm bench serve`` since 0.10. Both have
input/output throughput ratios of ``isl / osl``, so the files tell them apart by the mean
output length: ``(mean_e2el - mean_ttft) / mean_tpot + 1`` (``e2el = ttft + tpot * (out - 1)``
per request, ``tpot`` nearly constant within a point) is 0.887 .. 0.918 x ``osl`` over all
441 points of the four runs given (median 0.901), i.e. ``(1 + R) / 2`` with R = 0.8: the older
convention, lengths in ``[0.8 L, L]`` (the newer one would give 1.0 x ``osl``). The spread agrees:
``std_e2el / (osl * mean_tpot)`` is 0.055 or more on the aggregated points, near the uniform's
``0.2 / sqrt(12) = 0.058`` (the newer convention's ``[0.2 L, 1.8 L]`` would give at least 0.46). The per-GPU
throughputs cross-check the means: ``output_tput_per_gpu * tp * mean_e2el / conc`` (Little's
law) is 0.86 .. 0.90 x ``osl``, a little below because the throughput's duration includes the
run's ramp and tail. R is not in the file: ``--range-ratio`` (default 0.8, InferenceMAX's
``RANDOM_RANGE_RATIO`` of these runs).

Read per point (one level each, in order of ``isl``, ``osl``, ``conc``): the closed loop of
``conc`` clients, ``conc * prompts_per_client`` requests (the file does not say; InferenceMAX's
scripts send 10 per client), the lengths' uniform as min, max, mean and median
(:meth:`traces.importers.summaries.Level.add_uniform`), and mean, median (p50), std and p99 of
TTFT, TPOT and E2E (``e2el``). Not read: ``itl``, the gaps between streamed chunks, which hold
several tokens on SGLang and TensorRT-LLM (``mean_itl`` is 30 x ``mean_tpot`` on the SGLang
DeepSeek-R1 points), so not a per-token latency the replay predicts; ``intvty`` (1 / TPOT);
the throughputs (what the latencies and the closed loop imply).
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pandas as pd

from ..errors import TraceFormatError
from ._json import json_number, read_json
from .summaries import Level, levels_frame

__all__ = ["DEFAULT_RANGE_RATIO", "PROMPTS_PER_CLIENT", "SELECTORS", "import_inferencemax"]

#: InferenceMAX's ``RANDOM_RANGE_RATIO`` in the runs given (the data confirm it: module docstring).
DEFAULT_RANGE_RATIO = 0.8
#: Requests per client: InferenceMAX's scripts pass ``--num-prompts $((conc * 10))``.
PROMPTS_PER_CLIENT = 10
#: Fields a selection may name (the CLI's ``--hw`` ... ``--osl``): text or whole numbers.
SELECTORS = {"hw": str, "model": str, "framework": str, "precision": str, "tp": int, "ep": int, "isl": int,
             "osl": int}
#: Fields that together name one deployment: points of several cannot be one trace.
_DEPLOYMENT = ("hw", "model", "framework", "precision", "image", "tp", "ep", "dp_attention", "spec_decoding")
#: InferenceMAX's latency name -> servecal's metric; its statistic -> (statistic, percentile).
_METRICS = {"ttft": "ttft_s", "tpot": "tpot_s", "e2el": "e2e_s"}
_STATS = {"mean": ("mean", None), "median": ("quantile", 50.0), "std": ("std", None), "p99": ("quantile", 99.0)}
_MAX_LATENCY_S = 100 * 365 * 86400


def _points(path: Path) -> list[dict]:
    obj = read_json(path)
    if not isinstance(obj, list) or not obj:
        raise TraceFormatError(path, "is not a non-empty JSON list", expected="InferenceMAX's agg_bmk.json: a list "
                               "of benchmark points (hw, model, framework, isl, osl, conc, mean_ttft, ...)", fold=True)
    for row, point in enumerate(obj, 1):
        if not isinstance(point, dict):
            raise TraceFormatError(path, f"point is a JSON {type(point).__name__}", row=row,
                                   expected="an object per benchmark point")
        for field in ("hw", "model", "framework", "precision", "disagg", "isl", "osl", "conc"):
            if field not in point:
                raise TraceFormatError(path, "missing field", row=row, column=field,
                                       expected="an InferenceMAX benchmark point (agg_bmk.json)")
    return obj


def _matches(point: dict, selection: dict) -> bool:
    for field, wanted in selection.items():
        value = point.get(field)
        if SELECTORS[field] is str:
            if str(value).lower() not in {str(w).lower() for w in wanted}:
                return False
        elif value not in wanted:
            return False
    return True


def _deployment(point: dict) -> tuple:
    return tuple(point.get(f) for f in _DEPLOYMENT)


def _holdings(points: list[dict]) -> str:
    """What the points hold, one deployment a line: its fields, its workloads and its concurrencies."""
    groups: dict[tuple, Counter] = {}
    for p in points:
        groups.setdefault(_deployment(p), Counter())[(p.get("isl"), p.get("osl"))] += 1
    lines = []
    for key, work in sorted(groups.items(), key=str):
        fields = ", ".join(f"{f} {v}" for f, v in zip(_DEPLOYMENT, key) if v is not None and f != "image")
        lines.append(f"  {fields}: " + ", ".join(f"{i}/{o} x{n}" for (i, o), n in sorted(work.items())))
    return "\n".join(lines)


def _selected(path: Path, points: list[dict], selection: dict) -> list[tuple[int, dict]]:
    """The points of ``selection`` with their 1-based row; raises unless they are one deployment."""
    chosen = [(row, p) for row, p in enumerate(points, 1) if _matches(p, selection)]
    given = " ".join(f"--{f} {','.join(map(str, v))}" for f, v in selection.items()) or "(no selection)"
    if not chosen:
        raise TraceFormatError(path, f"no point matches {given}", column=", ".join(f"--{f}" for f in selection)
                               or None, expected="a selection among what the file holds (deployment: "
                               f"isl/osl x points):\n{_holdings(points)}")
    disagg = [row for row, p in chosen if p["disagg"] is not False]
    if disagg:
        raise TraceFormatError(path, f"{len(disagg)} selected point(s) are disaggregated (disagg true, first at "
                               f"row {disagg[0]}): not imported", column="disagg",
                               expected="aggregated points (select them with --hw, --framework, ...): "
                               "aggregate_targets/1 has no place for the pools' layout (prefill/decode workers, "
                               "their TP, EP and attention data parallelism) a replay would need")
    if len({_deployment(p) for _, p in chosen}) > 1:
        raise TraceFormatError(path, f"{given} selects points of several deployments, which cannot be one trace",
                               column="--hw, --model, --framework, --precision, --tp, --ep",
                               expected="a selection of one deployment; the selected points hold:\n"
                               + _holdings([p for _, p in chosen]))
    return sorted(chosen, key=lambda rp: (rp[1]["isl"], rp[1]["osl"], rp[1]["conc"], rp[0]))


def _level(path: Path, row: int, point: dict, range_ratio: float, prompts_per_client: int) -> Level:
    number = {f: json_number(path, point[f], column=f, row=row, integer=True, minimum=1) for f in ("isl", "osl",
                                                                                                   "conc")}
    level = Level("concurrency", float(number["conc"]), number["conc"] * prompts_per_client)
    for metric, field in (("num_prompt_tokens", "isl"), ("num_output_tokens", "osl")):
        length = number[field]
        level.add_uniform(metric, max(1, int(length * range_ratio)), length)
    for name, metric in _METRICS.items():
        for stat, (statistic, q) in _STATS.items():
            key = f"{stat}_{name}"
            if key not in point:
                raise TraceFormatError(path, "missing field", row=row, column=key,
                                       expected="mean, median, std and p99 of ttft, tpot and e2el, seconds")
            level.add(metric, statistic, q, json_number(path, point[key], column=key, row=row, minimum=0,
                                                        maximum=_MAX_LATENCY_S))
    return level


def import_inferencemax(path, selection: dict | None = None, range_ratio: float = DEFAULT_RANGE_RATIO,
                        prompts_per_client: int = PROMPTS_PER_CLIENT) -> tuple[pd.DataFrame, dict]:
    """Read the points of one InferenceMAX ``agg_bmk.json`` that ``selection`` picks.

    Parameters
    ----------
    path : str or os.PathLike
        The JSON list of benchmark points.
    selection : dict, optional
        Field of :data:`SELECTORS` -> the values kept (text compared without case); none: every point.
    range_ratio : float
        The benchmark's ``--random-range-ratio`` R, in [0, 1]: lengths uniform in ``[int(L * R), L]``
        (the convention the files match: module docstring).
    prompts_per_client : int
        Requests per client (``--num-prompts`` / ``conc``), >= 1.

    Returns
    -------
    frame : pandas.DataFrame
        ``aggregate_targets/1`` rows, one level per point in order of ``isl``, ``osl``, ``conc``.
    metadata : dict
        ``source_format`` (``inferencemax-summary``), ``source``, ``num_levels``, the deployment
        (``gpu`` = ``hw``, ``model``, ``tp``, ``framework``, ``precision``, ``image``, ``ep``,
        ``dp_attention``, ``spec_decoding``), ``random_range_ratio``, ``prompts_per_client`` and
        ``levels`` (each level's ``isl/osl@conc``).

    Raises
    ------
    TraceFormatError
        Naming the file, the point (row, 1-based) and the field or option: not a list of
        points, a missing or non-numeric field, a selection that is empty, holds disaggregated
        points or mixes deployments (listing what the file or the selection holds).
    ValueError
        ``range_ratio`` outside [0, 1] or ``prompts_per_client`` < 1 (the CLI checks both).
    """
    if not 0 <= range_ratio <= 1 or prompts_per_client < 1:
        raise ValueError(f"range_ratio {range_ratio} not in [0, 1] or prompts_per_client {prompts_per_client} < 1")
    path = Path(path)
    selection = {f: tuple(v) for f, v in (selection or {}).items() if v}
    unknown = set(selection) - set(SELECTORS)
    if unknown:
        raise ValueError(f"unknown selection field(s) {sorted(unknown)}")
    chosen = _selected(path, _points(path), selection)
    frame, meta = levels_frame([_level(path, row, p, range_ratio, prompts_per_client) for row, p in chosen],
                               "inferencemax-summary", [path])
    first = chosen[0][1]
    meta.update({("gpu" if f == "hw" else f): str(first[f]) for f in _DEPLOYMENT if first.get(f) is not None})
    meta.update(random_range_ratio=f"{range_ratio:g}", prompts_per_client=str(prompts_per_client),
                levels=", ".join(f"{p['isl']}/{p['osl']} tokens x{p['conc']}" for _, p in chosen))
    return frame, meta
