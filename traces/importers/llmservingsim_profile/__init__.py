"""Import an LLMServingSim operator profile as a synthetic step trace.

LLMServingSim's profiler (``casys-kaist/LLMServingSim``, folder ``profiler/``) times the
operators of **one decoder layer** inside vLLM and writes, per model variant::

    profiler/perf/<HW>/<org>/<model>/<variant>/
        meta.yaml                 GPU, model, vLLM version, grids (one per variant)
        tp1/dense.csv             layer,tokens,time_us        (token-parameterised ops)
        tp1/per_sequence.csv      layer,sequences,time_us     (lm_head, sampler)
        tp1/attention.csv         prefill_chunk,kv_prefill,n_decode,kv_decode,time_us
        tp1/skew.csv, tp1/skew_fit.csv, tp1/step.csv, ...   (ignored here)
        tp2/...                   the same for tensor parallelism 2

:func:`import_llmservingsim_profile` composes those tables into one step row per profiled
attention-grid point, so the roofline calibration (``calibrate``) can be fitted to a GPU
profile exactly as to a measured step log. :func:`read_profile_meta` reads ``meta.yaml``
alone, so the CLI can look the model up in the catalog (for its layer count) first.

All profile times are ``time_us``: microseconds per call, for one layer.

``layout``: finding the files; ``tables``: reading and checking the CSVs; ``compose``: the
step formula and its assumptions.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from schemas.metrics import STEP_KINDS, step_kind
from schemas.step_record import StepRow

from ...errors import TraceError, TraceFormatError
from .compose import (COMPOSITION, PER_LAYER_DENSE_CALLS, PER_STEP_DENSE, PER_STEP_SEQUENCE, covered_range,
                      step_duration_s)
from .layout import FILE_KINDS, collect, load_meta, pick
from .tables import op_tables, read_attention


def read_profile_meta(sources) -> dict:
    """Read the ``meta.yaml`` of an LLMServingSim profile.

    Parameters
    ----------
    sources : list of str or Path (or one str/Path)
        As for :func:`import_llmservingsim_profile`.

    Returns
    -------
    dict
        The YAML mapping as written by the profiler (keys such as ``gpu``, ``model``,
        ``vllm_version``, ``tp_degrees``); empty when the sources hold no meta.yaml.

    Raises
    ------
    TraceFormatError
        Unreadable or invalid YAML, or a folder holding several profiles.
    """
    found, anchor, tool_layout = collect(sources)
    return load_meta(pick(found, "meta", 1, anchor, tool_layout))


def import_llmservingsim_profile(
    sources: "list[str | Path] | str | Path",
    num_layers: int | None = None,
    tp: int = 1,
    *,
    strict: bool = False,
) -> tuple[pd.DataFrame, dict]:
    """Compose an LLMServingSim operator profile into a step trace (one row per batch shape).

    Parameters
    ----------
    sources : list of str or Path
        Either one folder or a list of files. A folder in the tool's own layout holds
        ``meta.yaml`` and ``tp<N>/{dense,attention,per_sequence}.csv``; a flat folder (or
        a file list) holds files whose names end in ``meta.yaml``, ``dense.csv``,
        ``attention.csv`` and ``per_sequence.csv``, optionally prefixed
        (``lss_profile_<gpu>_<model>_tp1_dense.csv``). When several TP degrees are
        present, the files marked ``tp<tp>`` (in the name or as parent folder) are used.
        A flat folder must hold one profile only. ``meta.yaml`` is optional.
        Other files (``skew.csv``, ``skew_fit.csv``, ``step.csv``, ``hardware.yaml``, ...)
        are ignored.
    num_layers : int
        Decoder layers of the model (Llama-3.1-8B: 32). The profile times ONE layer, so
        the count must come from the caller (the CLI's ``--num-layers``, or the catalog
        entry of ``meta.yaml``'s ``model``); None raises :class:`TraceFormatError`.
    tp : int, default 1
        Tensor-parallel degree whose tables are read.
    strict : bool, default False, keyword only
        Grid points whose step would need dense or per-sequence times beyond the profiled
        token / sequence range are never extrapolated: by default they are left out and
        counted in ``metadata["dropped_out_of_range"]``; with ``strict=True`` the first
        one raises :class:`TraceFormatError`.

    Returns
    -------
    steps : pandas.DataFrame
        The ``step_trace/1`` columns, one row per kept attention-grid point, in the
        order of ``attention.csv``: ``replica_id`` (int64, 0), ``step_start_time_s``
        (float64 s, cumulative sum of the previous durations so rows are back to back),
        ``step_duration_s`` (float64 s), ``num_prefill_tokens`` (= prefill_chunk),
        ``num_prefill_seqs`` (1 if prefill_chunk > 0 else 0), ``num_decode_seqs``
        (= n_decode), ``decode_context_tokens`` (= n_decode * kv_decode) and
        ``prefill_context_tokens`` (= kv_prefill), ``num_decode_tokens`` (= n_decode: no
        speculative decoding), all counts int64.
    metadata : dict
        ``gpu``, ``model``, ``hardware``, ``variant``, ``vllm_version``,
        ``profiler_version`` (from meta.yaml, None when absent), ``num_layers``, ``tp``,
        ``source_files`` ({kind: path}), ``rows_by_kind`` ({"prefill_only",
        "decode_only", "mixed": count}), ``num_rows``, ``dropped_out_of_range``
        ({"count", "by_kind", "rule"}), ``dense_tokens_range`` and
        ``per_sequence_range`` ([lo, hi] covered by every operator) and
        ``composition`` (the formula, as text). JSON-serialisable.

    Raises
    ------
    TraceFormatError
        A missing file, missing column, non-numeric, negative, zero or NaN value, an
        unknown operator, a duplicate point, no ``num_layers``, or (``strict``) a grid
        point outside the profiled range. The message names file, row/line and column.

    Notes
    -----
    The step formula and its assumptions, with their sources: :mod:`.compose`.
    """
    found, anchor, tool_layout = collect(sources)
    if isinstance(tp, bool) or not isinstance(tp, (int, np.integer)) or tp < 1:
        raise TraceError(f"tp must be a positive integer, got {tp!r}")
    tp = int(tp)
    files = {kind: pick(found, kind, tp, anchor, tool_layout) for kind in FILE_KINDS}
    meta = load_meta(files["meta"])
    num_layers = _num_layers(num_layers, files)

    dense = op_tables(files["dense"], "tokens", tuple(PER_LAYER_DENSE_CALLS) + PER_STEP_DENSE)
    per_seq = op_tables(files["per_sequence"], "sequences", PER_STEP_SEQUENCE)
    att, att_lines = read_attention(files["attention"])

    pc, kp = att["prefill_chunk"], att["kv_prefill"]
    nd, kd = att["n_decode"], att["kv_decode"]
    kind = step_kind(pc, nd)
    tokens = pc + nd
    seqs = (pc > 0).astype(np.int64) + nd
    ranges = covered_range(dense), covered_range(per_seq)
    ok, rule = _in_range(tokens, seqs, ranges, files, att_lines, strict)
    dropped = {"count": int((~ok).sum()), "by_kind": {k: int(((kind == k) & ~ok).sum()) for k in STEP_KINDS},
               "rule": rule}

    pc, kp, nd, kd = pc[ok], kp[ok], nd[ok], kd[ok]
    kind, tokens, seqs = kind[ok], tokens[ok], seqs[ok]
    t = tokens.astype(np.float64)
    s = seqs.astype(np.float64)

    duration_s = step_duration_s(dense, per_seq, att["time_us"][ok], t, s, num_layers)
    start_s = np.concatenate(([0.0], np.cumsum(duration_s)[:-1]))

    data = {
        "replica_id": np.zeros(len(t), dtype=np.int64),
        "step_start_time_s": start_s,
        "step_duration_s": duration_s,
        "num_prefill_tokens": pc.astype(np.int64),
        "num_prefill_seqs": (pc > 0).astype(np.int64),
        "num_decode_seqs": nd.astype(np.int64),
        "decode_context_tokens": (nd * kd).astype(np.int64),
        "prefill_context_tokens": kp.astype(np.int64),
        "num_decode_tokens": nd.astype(np.int64),  # no speculative decoding: one position per decode
    }
    steps = pd.DataFrame({c: data[c] for c in StepRow._fields})
    return steps, _metadata(meta, num_layers, tp, files, kind, dropped, ranges)


def _num_layers(num_layers, files: dict) -> int:
    """``num_layers``, required (the profile times one layer) and a positive integer."""
    if num_layers is None:
        raise TraceFormatError(
            files["meta"] or files["attention"],
            "the profile times one decoder layer and the number of layers is not known",
            expected="--num-layers N (e.g. 32 for meta-llama/Llama-3.1-8B)")
    if isinstance(num_layers, bool) or not isinstance(num_layers, (int, np.integer)) \
            or num_layers < 1:
        raise TraceError(f"num_layers must be a positive integer, got {num_layers!r}")
    return int(num_layers)


def _in_range(tokens: np.ndarray, seqs: np.ndarray, ranges: tuple, files: dict, att_lines, strict: bool):
    """Which grid points lie within the profiled token and sequence ``ranges`` (no extrapolation), and the
    rule in words; a point outside refused under ``strict``, no point inside always."""
    (t_lo, t_hi), (s_lo, s_hi) = ranges
    ok = (tokens >= t_lo) & (tokens <= t_hi) & (seqs >= s_lo) & (seqs <= s_hi)
    rule = (f"steps need total tokens in [{t_lo}, {t_hi}] ({files['dense'].name}) and "
            f"sequences in [{s_lo}, {s_hi}] ({files['per_sequence'].name}); "
            "no extrapolation beyond the profiled range")
    if not ok.all() and strict:
        i = int(np.flatnonzero(~ok)[0])
        raise TraceFormatError(
            files["attention"],
            f"grid point needs {tokens[i]} tokens and {seqs[i]} sequences, outside the "
            "profiled range (no extrapolation)",
            row=i + 1, line=int(att_lines[i]),
            expected=f"total tokens in [{t_lo}, {t_hi}] and sequences in [{s_lo}, {s_hi}]")
    if not ok.any():
        raise TraceFormatError(files["attention"], "no grid point lies within the profiled "
                               "token and sequence ranges", expected=rule)
    return ok, rule


def _metadata(meta: dict, num_layers: int, tp: int, files: dict, kind: np.ndarray, dropped: dict,
              ranges: tuple) -> dict:
    """The step trace's metadata: the profile's ``meta.yaml``, the files, the rows kept by step kind and
    those dropped out of range."""
    def _meta_str(key):
        v = meta.get(key)
        return None if v is None else str(v)

    (t_lo, t_hi), (s_lo, s_hi) = ranges
    return {
        "source_format": "llmservingsim_profile",
        "gpu": _meta_str("gpu"),
        "hardware": _meta_str("hardware"),
        "model": _meta_str("model"),
        "variant": _meta_str("variant"),
        "architecture": _meta_str("architecture"),
        "vllm_version": _meta_str("vllm_version"),
        "profiler_version": _meta_str("profiler_version"),
        "num_layers": num_layers,
        "tp": tp,
        "source_files": {k: (str(p) if p is not None else None) for k, p in files.items()},
        "rows_by_kind": {k: int((kind == k).sum()) for k in STEP_KINDS},
        "num_rows": int(len(kind)),
        "dropped_out_of_range": dropped,
        "dense_tokens_range": [t_lo, t_hi],
        "per_sequence_range": [s_lo, s_hi],
        "composition": COMPOSITION,
    }
