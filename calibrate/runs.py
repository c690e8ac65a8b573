"""Measured runs for calibration and validation: request logs split into runs, each with
its engine settings, and the measured-vs-predicted error of a calibration on each."""
from __future__ import annotations

from dataclasses import replace

import pandas as pd

from replay.analysis.compare import compare
from replay.config import ReplayConfig, RecordOptions
from replay.simulate import replay_frame
from schemas.kinds import a_kind
from schemas.tables import AGGREGATE_TARGETS, REQUEST_TRACE
from schemas.text import wrap_error

from .errors import FitError, RunSpecError
from .run_errors import Run, chosen


def parse_run_spec(spec: str) -> tuple[str, int | None, tuple[float, float] | None]:
    """``"sweep.parquet#2@0:60"`` -> ``("sweep.parquet", 2, (0.0, 60.0))``: benchmark 2 of a
    multi-benchmark log (its ``benchmark`` column), requests arriving in [0, 60) s. Both parts
    are optional; a window side may be empty (``@30:`` from 30 s on).

    A path that exists as given is a file, whatever ``#`` or ``@`` it holds.

    Raises
    ------
    RunSpecError
        A benchmark that is not a whole number, or a window that is not START:END seconds
        (plain decimal numbers, START < END).
    """
    import os
    import re

    if os.path.exists(spec):
        return spec, None, None
    rest, at, window = spec.rpartition("@") if "@" in spec else (spec, "", "")
    path, sep, k = rest.rpartition("#") if "#" in rest else (rest, "", "")
    if sep and not (k.isascii() and k.isdigit()):  # not '²', which isdigit() takes and int() refuses
        raise RunSpecError(f"{spec}: expected FILE[#K][@START:END] with K a benchmark number")
    span = None
    if at:
        a, colon, b = window.partition(":")
        number = re.compile(r"(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|inf")  # what float() takes, less _ and signs
        if colon and all(not x or number.fullmatch(x) for x in (a, b)):
            span = (float(a) if a else 0.0, float(b) if b else float("inf"))
        if not colon or span is None or not span[0] < span[1]:
            raise RunSpecError(f"{spec}: expected a time window @START:END in seconds with START < END, e.g. @0:60")
    return path, (int(k) if sep else None), span


def load_runs(specs, cfg: ReplayConfig, read_trace, keep=frozenset()) -> list[Run]:
    """The runs of ``specs`` (``FILE[#K][@START:END]``, :func:`parse_run_spec`): one per file,
    or one per value of a log's ``benchmark`` column (GuideLLM sweeps), each replayed under
    ``cfg`` updated with the engine settings an importer recorded in the file's metadata
    (``engine_settings``, vLLM's names), except the options named in ``keep`` (given on the
    command line or taken from the server's log: they win). With a window, every request is replayed
    (later arrivals share the engine with the window's requests, as they did in the measured
    run) and only the latencies of those arriving inside it are matched or scored
    (:attr:`Run.scored`): a fit on a window sees no latency from outside it. An aggregate
    (``aggregate_targets/1``) gives one run per load level, or level K for ``FILE#K``
    (:func:`calibrate.aggregate_runs.aggregate_runs`).

    Raises
    ------
    FitError
        A file that is not a request log or an aggregate, a benchmark or level not in the
        file, an empty window, a window on an aggregate, a run named more than once.
    """
    from .aggregate_runs import aggregate_runs

    runs = []
    for spec in specs:
        path, k, span = parse_run_spec(spec)
        kind, frame, meta = read_trace(path)
        if kind not in (REQUEST_TRACE, AGGREGATE_TARGETS):
            raise FitError(f"{path}: is {a_kind(kind)}; only request logs and aggregates can be fitted together "
                           "or validated on")
        run_cfg = _with_engine_metadata(cfg, meta, path, keep)
        if kind == AGGREGATE_TARGETS:
            if span is not None:
                raise FitError(f"{spec}: an aggregate has no arrival times to window; give FILE or FILE#K")
            runs.extend(aggregate_runs(path, frame, meta, run_cfg, k))
            continue
        parts = [(path, frame)]
        if k is not None or ("benchmark" in frame and frame["benchmark"].nunique() > 1):
            if "benchmark" not in frame:
                raise FitError(f"{spec}: the file has no 'benchmark' column; give the file without #{k}")
            parts = []
            for b in chosen(frame, "benchmark", k, spec, "benchmark"):
                part = frame[frame["benchmark"] == b]
                part = part.assign(arrival_time_s=part["arrival_time_s"] - part["arrival_time_s"].min())
                parts.append((f"{path}#{b}", part.sort_values("arrival_time_s", kind="stable").reset_index(drop=True)))
        for name, part in parts:
            scored = None
            if span is not None:
                t = part["arrival_time_s"]
                scored = ((t >= span[0]) & (t < span[1])).to_numpy()
                if not scored.any():
                    raise FitError(f"{spec}: no request arrives in the window [{span[0]:g}, {span[1]:g}) s")
                name = f"{name}@{_seconds(span[0])}:{_seconds(span[1])}"
            runs.append(Run(name, part, run_cfg, meta, None, scored))
    return named_once(runs)


def named_once(runs: list[Run]) -> list[Run]:
    """``runs``, each named once (a run given twice, or as ``FILE`` and ``FILE#K``, would be fitted
    twice over, its errors weighted double).

    Raises
    ------
    FitError
        A run name that repeats.
    """
    names = [r.name for r in runs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise FitError(f"{', '.join(twice)}: named more than once (as FILE and FILE#K, or twice); each run counts "
                       "once: give it once")
    return runs


def _seconds(x: float) -> str:
    """A window bound as short as it reads back exactly (``15``, ``10.1200926``, ``inf``)."""
    return f"{x:g}" if float(f"{x:g}") == x else repr(x)


#: What identifies one measured request across files: a copy, a slice or a window of a log
#: keeps these values exactly; two different logs do not share a measured latency.
_MEASURED_KEY = ("request_id", "num_prompt_tokens", "num_output_tokens", "ttft_s", "e2e_s")


def share_requests(a: Run, b: Run) -> bool:
    """Whether runs ``a`` and ``b`` score some of the same measured requests (the same request
    id, lengths and measured TTFT and E2E): the same file under another path, a copy, a slice
    (``traces slice``) or an overlapping window alike; for runs of aggregates, the same level
    of the same file (its bytes)."""
    if a.targets is not None or b.targets is not None:  # an aggregate's level: the same file's same level
        (pa, ka, _), (pb, kb, _) = parse_run_spec(a.name), parse_run_spec(b.name)
        return a.targets is not None and b.targets is not None and ka == kb and _same_file(pa, pb)
    cols = [c for c in _MEASURED_KEY if c in a.trace and c in b.trace]
    if "request_id" not in cols or not {"ttft_s", "e2e_s"} & set(cols):
        return False
    measured = [c for c in ("ttft_s", "e2e_s") if c in cols]

    def keys(run):
        rows = run.scored_rows(run.trace)
        rows = rows[rows[measured].notna().any(axis=1)]  # a failed request measured nothing to share
        return set(map(tuple, rows[cols].astype(str).to_numpy()))

    return not keys(a).isdisjoint(keys(b))


def _same_file(a, b) -> bool:
    from schemas.calibration import sha256_of

    try:
        return sha256_of(a) == sha256_of(b)
    except OSError:
        return False


def in_source(a: Run, spec: str, sha256: str) -> bool:
    """Whether run ``a`` (named by :func:`load_runs`) scores requests of ``spec``, a run a
    calibration records it was fitted on (``FILE[#K][@START:END]`` as typed then, and the
    file's ``sha256``): the same bytes, the same benchmark or one of them the whole file, and
    time windows that overlap (none: the whole run)."""
    from schemas.calibration import sha256_of

    (pa, ka, wa), (_, kb, wb) = parse_run_spec(a.name), parse_run_spec(spec)
    if ka is not None and kb is not None and ka != kb:
        return False
    (a0, a1), (b0, b1) = wa or (0.0, float("inf")), wb or (0.0, float("inf"))
    try:
        return a0 < b1 and b0 < a1 and sha256_of(pa) == sha256
    except OSError:
        return False


def _with_engine_metadata(cfg: ReplayConfig, meta: dict, path, keep=frozenset()) -> ReplayConfig:
    """``cfg`` with the engine settings recorded in the trace's metadata
    (:func:`traces.io.recorded_engine_settings`) but for the options in ``keep``.

    Raises
    ------
    FitError
        A recorded setting that is not valid, naming the file.
    """
    from traces.errors import TraceError
    from traces.io import recorded_engine_settings

    try:
        engine = recorded_engine_settings(meta, path)
    except TraceError as exc:
        raise FitError(str(exc)) from None
    if not engine:
        return cfg
    changes = {k: v for k, v in engine.items() if k in cfg.options() and k not in keep}
    return cfg.with_options(**changes) if changes else cfg


def score_runs(runs: list[Run], cost_model) -> pd.DataFrame:
    """Measured vs predicted on every request log: one row per run and metric with the p50/p90
    relative errors (``err_p50``, ``err_p90``) and the absolute ones in ms where the
    measured value is below 1 ms (``replay.analysis.compare.compare``'s table, stacked).
    Aggregates are scored by :func:`calibrate.aggregate_score.score_aggregates`.

    Raises
    ------
    FitError
        A run none of whose scored requests the engine completes (all rejected: its settings
        admit none), naming the run and why.
    """
    from schemas.status import OK

    rows = []
    for run in runs:
        res, _ = replay_frame(run.trace, cost_model, replace(run.config, record=RecordOptions()), run.metadata)
        scored = run.scored_rows(res)
        if not (scored["pred_status"] == OK).any():
            why = ", ".join(f"{n} {r}" for r, n in scored["pred_status"].value_counts().items())
            raise FitError(wrap_error(f"{run.name}: no request can be simulated with these settings ({why}); "
                                      "nothing to score"))
        table = compare(scored)
        table.insert(0, "run", run.name)
        rows.append(table)
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()
