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
"""
from __future__ import annotations

import csv
import math
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from schemas.metrics import STEP_KINDS, step_kind
from schemas.tables import STEP_COLUMNS

from ..errors import TraceError, TraceFormatError

__all__ = ["import_llmservingsim_profile", "read_profile_meta"]

#: Per-layer dense ops of a Llama decoder layer -> calls per layer. The profiler's
#: ``layernorm`` row is the mean of ONE RMSNorm call; Llama runs two per layer
#: (input_layernorm before attention, post_attention_layernorm after o_proj).
PER_LAYER_DENSE_CALLS: dict[str, int] = {
    "layernorm": 2,
    "qkv_proj": 1,
    "rotary_emb": 1,
    "o_proj": 1,
    "gate_up_proj": 1,
    "act_fn": 1,
    "down_proj": 1,
}
#: Dense ops that run once per step (not per layer), at all the step's tokens.
PER_STEP_DENSE = ("embedding", "final_layernorm")
#: Ops that run once per step on one row per sampled sequence.
PER_STEP_SEQUENCE = ("lm_head", "sampler")


_FILE_KINDS = ("meta", "dense", "attention", "per_sequence")
_SUFFIXES = {
    "meta": ("meta.yaml", "meta.yml"),
    "dense": ("dense.csv",),
    "attention": ("attention.csv",),
    "per_sequence": ("per_sequence.csv",),
}
_ATTENTION_KEYS = ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode")
_TP_IN_NAME = re.compile(r"(?:^|[_.\-])tp(\d+)(?=[_.\-])", re.IGNORECASE)
_TP_DIR = re.compile(r"tp(\d+)", re.IGNORECASE)
_SEPARATORS = "_-."


# ---------------------------------------------------------------------------
# Finding the files
# ---------------------------------------------------------------------------

def _file_kind(name: str) -> str | None:
    """Which profile file a name is (``dense``, ...), or None.

    A name matches when it IS the tool's name or ends in ``<sep><tool's name>`` (the
    flat, prefixed copies such as ``lss_profile_<gpu>_<model>_tp1_dense.csv``).
    ``linear_attention.csv`` (hybrid models) is not ``attention.csv``.
    """
    low = name.lower()
    for kind in _FILE_KINDS:
        for suffix in _SUFFIXES[kind]:
            if low == suffix or (low.endswith(suffix) and low[-len(suffix) - 1] in _SEPARATORS):
                if kind == "attention" and low.endswith("linear_attention.csv"):
                    return None
                return kind
    return None


def _tp_of(path: Path) -> int | None:
    """The TP degree a file is for: a ``tp<N>`` token in its name, else a ``tp<N>`` parent."""
    found = _TP_IN_NAME.findall(path.name)
    if found:
        return int(found[-1])
    m = _TP_DIR.fullmatch(path.parent.name)
    return int(m.group(1)) if m else None


def _stem(path: Path, kind: str) -> str:
    """The profile a flat file belongs to: its name without kind suffix and TP token."""
    low = path.name.lower()
    for suffix in _SUFFIXES[kind]:
        if low.endswith(suffix):
            low = low[: -len(suffix)]
            break
    low = low.rstrip(_SEPARATORS)
    low = re.sub(r"(?:^|[_.\-])tp\d+$", "", low)
    return low.rstrip(_SEPARATORS)


def _classify(paths: list[Path]) -> dict[str, list[Path]]:
    out: dict[str, list[Path]] = {k: [] for k in _FILE_KINDS}
    for p in paths:
        kind = _file_kind(p.name)
        if kind is not None:
            out[kind].append(p)
    return out


def _collect(sources) -> tuple[dict[str, list[Path]], Path, bool]:
    """Profile files named by ``sources``, by kind; the path used in messages; tool layout?"""
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    paths = [Path(s) for s in sources]
    if not paths:
        raise TraceError("no profile source given: pass one folder or the profile files")
    for p in paths:
        if not p.exists():
            raise TraceFormatError(p, "no such file or folder")

    if len(paths) == 1 and paths[0].is_dir():
        folder = paths[0]
        tp_dirs = [d for d in folder.iterdir() if d.is_dir() and _TP_DIR.fullmatch(d.name)]
        if tp_dirs:
            # The tool's own layout: <folder>/meta.yaml and <folder>/tp<N>/<kind>.csv.
            files = [f for f in folder.iterdir() if f.is_file() and _file_kind(f.name) == "meta"]
            for d in tp_dirs:
                files += [f for f in d.iterdir() if f.is_file()]
            return _classify(files), folder, True
        files = [f for f in folder.iterdir() if f.is_file()]
        found = _classify(files)
        if not found["meta"] and _TP_DIR.fullmatch(folder.name):
            # A tp<N> folder of the tool's layout: meta.yaml sits one level up.
            found["meta"] = [f for f in folder.parent.iterdir()
                             if f.is_file() and _file_kind(f.name) == "meta"]
        else:
            stems = sorted({_stem(p, k) for k in _FILE_KINDS for p in found[k]})
            if len(stems) > 1:
                raise TraceFormatError(
                    folder,
                    f"holds {len(stems)} different profiles ({', '.join(repr(s) for s in stems)})",
                    expected="one profile per folder, or its files listed explicitly")
        return found, folder, False

    for p in paths:
        if p.is_dir():
            raise TraceFormatError(
                p, "is a folder among several sources",
                expected="one folder, or a list of files")
        if _file_kind(p.name) is None:
            raise TraceFormatError(
                p, "is not an LLMServingSim profile file",
                expected="a name ending in meta.yaml, dense.csv, attention.csv or per_sequence.csv")
    return _classify(paths), paths[0].parent, False


def _pick(found: dict[str, list[Path]], kind: str, tp: int, anchor: Path,
          tool_layout: bool) -> Path | None:
    """The one file of ``kind`` for TP degree ``tp`` (None only for a missing meta.yaml)."""
    candidates = found[kind]
    if kind == "meta":
        chosen = candidates
    else:
        chosen = [p for p in candidates if _tp_of(p) == tp]
        if not chosen:
            chosen = [p for p in candidates if _tp_of(p) is None]
    if len(chosen) > 1:
        raise TraceFormatError(
            anchor, f"several {kind} files ({', '.join(str(p) for p in sorted(chosen))})",
            expected=f"exactly one {_SUFFIXES[kind][0]}" + ("" if kind == "meta" else f" for tp={tp}"))
    if chosen:
        return chosen[0]
    if kind == "meta":
        return None
    degrees = sorted({d for d in (_tp_of(p) for p in candidates) if d is not None})
    have = f" (found files for tp={', '.join(map(str, degrees))})" if degrees else ""
    raise TraceFormatError(
        anchor / f"tp{tp}" / _SUFFIXES[kind][0] if tool_layout else anchor,
        f"missing {_SUFFIXES[kind][0]} for tp={tp}{have}",
        expected=f"a file ending in {_SUFFIXES[kind][0]} (LLMServingSim profile, tp{tp})")


def _load_meta(path: Path | None) -> dict:
    if path is None:
        return {}
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceFormatError(path, f"cannot read ({exc})") from None
    try:
        meta = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise TraceFormatError(path, f"not valid YAML ({getattr(exc, 'problem', exc)})",
                               line=line) from None
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise TraceFormatError(path, "is not a YAML mapping", expected="key: value pairs")
    return meta


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
    found, anchor, tool_layout = _collect(sources)
    return _load_meta(_pick(found, "meta", 1, anchor, tool_layout))


# ---------------------------------------------------------------------------
# Reading the CSVs
# ---------------------------------------------------------------------------

def _read_csv(path: Path, columns: dict[str, str]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Read ``columns`` ({name: "str" | "int" | "time"}) of a CSV, validating every cell.

    Returns the columns as arrays and, per data row, its 1-based file line.
    ``int`` cells must be integers >= 0; ``time`` cells finite numbers > 0.
    """
    try:
        fh = path.open("r", encoding="utf-8-sig", newline="")
    except OSError as exc:
        raise TraceFormatError(path, f"cannot read ({exc})") from None
    with fh:
        reader = csv.reader(fh)
        try:
            header = next(reader, None)
            while header is not None and not any(c.strip() for c in header):
                header = next(reader, None)
            if header is None:
                raise TraceFormatError(path, "empty file",
                                       expected=f"a header with {', '.join(columns)}")
            header = [c.strip() for c in header]
            header_line = reader.line_num
            for name in columns:
                if name not in header:
                    raise TraceFormatError(path, "missing column", column=name, line=header_line,
                                           expected=f"columns {', '.join(columns)}")
            index = {name: header.index(name) for name in columns}
            values: dict[str, list] = {name: [] for name in columns}
            lines: list[int] = []
            row = 0
            for record in reader:
                if not any(c.strip() for c in record):
                    continue
                row += 1
                line = reader.line_num
                if len(record) != len(header):
                    raise TraceFormatError(path, f"{len(record)} fields", row=row, line=line,
                                           expected=f"{len(header)} as in the header")
                for name, kind in columns.items():
                    values[name].append(_cell(path, record[index[name]].strip(), kind,
                                              row, line, name))
                lines.append(line)
        except (csv.Error, UnicodeDecodeError) as exc:
            raise TraceFormatError(path, f"not a readable CSV file ({exc})",
                                   line=reader.line_num or None) from None
    if not lines:
        raise TraceFormatError(path, "no data rows", expected="at least one row after the header")
    arrays = {
        name: np.asarray(values[name], dtype={"str": object, "int": np.int64,
                                              "time": np.float64}[kind])
        for name, kind in columns.items()
    }
    return arrays, np.asarray(lines, dtype=np.int64)


def _cell(path: Path, text: str, kind: str, row: int, line: int, column: str):
    if kind == "str":
        if not text:
            raise TraceFormatError(path, "empty value", row=row, line=line, column=column,
                                   expected="an operator name")
        return text
    if kind == "int":
        try:
            value = int(text)
        except ValueError:
            try:
                f = float(text)
            except ValueError:
                f = math.nan
            if not (math.isfinite(f) and f.is_integer()):
                raise TraceFormatError(path, f"not an integer: {text!r}", row=row, line=line,
                                       column=column, expected="a whole number >= 0") from None
            value = int(f)
        if value < 0:
            raise TraceFormatError(path, f"negative value {value}", row=row, line=line,
                                   column=column, expected="a whole number >= 0")
        if value >= 2 ** 63:
            raise TraceFormatError(path, f"value {text[:20]}... ({len(text)} characters) is out of range", row=row,
                                   line=line, column=column, expected="a 64-bit integer")
        return value
    try:
        value = float(text)
    except ValueError:
        raise TraceFormatError(path, f"not a number: {text!r}", row=row, line=line,
                               column=column, expected="a time in microseconds > 0") from None
    if not math.isfinite(value):
        raise TraceFormatError(path, f"not a finite number: {text!r}", row=row, line=line,
                               column=column, expected="a time in microseconds > 0")
    if value <= 0:
        raise TraceFormatError(path, f"{'zero' if value == 0 else 'negative'} time {text}",
                               row=row, line=line, column=column,
                               expected="a time in microseconds > 0")
    return value


def _op_tables(path: Path, x_column: str, required: tuple[str, ...],
               min_x: int = 1) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Read dense.csv / per_sequence.csv into {op: (x sorted, time_us)} for ``required`` ops."""
    cols, lines = _read_csv(path, {"layer": "str", x_column: "int", "time_us": "time"})
    layers, xs, ts = cols["layer"], cols[x_column], cols["time_us"]
    known = set(required) | (set(PER_LAYER_DENSE_CALLS) | set(PER_STEP_DENSE)
                             if x_column == "tokens" else set(PER_STEP_SEQUENCE))
    seen: dict[tuple[str, int], int] = {}
    for i, (op, x) in enumerate(zip(layers, xs)):
        if op not in known:
            raise TraceFormatError(
                path, f"unknown operator {op!r}", row=i + 1, line=int(lines[i]), column="layer",
                expected=f"one of {', '.join(sorted(known))} (this importer composes "
                         "Llama-architecture profiles)")
        if x < min_x:
            raise TraceFormatError(path, f"{x_column} = {x}", row=i + 1, line=int(lines[i]),
                                   column=x_column, expected=f">= {min_x}")
        key = (op, int(x))
        if key in seen:
            raise TraceFormatError(
                path, f"duplicate point ({op}, {x_column}={x}), first at row {seen[key]}",
                row=i + 1, line=int(lines[i]), column=x_column,
                expected="one row per operator and point")
        seen[key] = i + 1
    tables = {}
    for op in required:
        mask = layers == op
        if not mask.any():
            raise TraceFormatError(path, f"no rows for operator {op!r}", column="layer",
                                   expected=f"rows for {', '.join(required)}")
        order = np.argsort(xs[mask], kind="stable")
        tables[op] = (xs[mask][order].astype(np.float64), ts[mask][order])
    return tables


def _read_attention(path: Path) -> tuple[dict[str, np.ndarray], np.ndarray]:
    cols, lines = _read_csv(path, {**{k: "int" for k in _ATTENTION_KEYS}, "time_us": "time"})
    pc, nd = cols["prefill_chunk"], cols["n_decode"]
    empty = np.flatnonzero((pc == 0) & (nd == 0))
    if empty.size:
        i = int(empty[0])
        raise TraceFormatError(path, "empty batch (prefill_chunk = 0 and n_decode = 0)",
                               row=i + 1, line=int(lines[i]), column="n_decode",
                               expected="a prefill chunk, decode requests or both")
    keys = pd.DataFrame({k: cols[k] for k in _ATTENTION_KEYS})
    dup = np.flatnonzero(keys.duplicated().to_numpy())
    if dup.size:
        i = int(dup[0])
        raise TraceFormatError(path, "duplicate grid point "
                               + ", ".join(f"{k}={int(cols[k][i])}" for k in _ATTENTION_KEYS),
                               row=i + 1, line=int(lines[i]),
                               expected="one row per (prefill_chunk, kv_prefill, n_decode, kv_decode)")
    return cols, lines


# ---------------------------------------------------------------------------
# Composition
# ---------------------------------------------------------------------------

def _interp(table: tuple[np.ndarray, np.ndarray], x: np.ndarray) -> np.ndarray:
    """Linear interpolation in the point count; refuses to extrapolate."""
    xp, fp = table
    if x.size and (x.min() < xp[0] or x.max() > xp[-1]):
        raise TraceError(f"point {x.min() if x.min() < xp[0] else x.max()} outside the profiled "
                         f"range [{xp[0]:g}, {xp[-1]:g}]")  # guarded by the caller's mask
    return np.interp(x, xp, fp)


def _range(tables: dict[str, tuple[np.ndarray, np.ndarray]]) -> tuple[int, int]:
    """The point range every table covers: [max of minima, min of maxima]."""
    return (int(max(t[0][0] for t in tables.values())),
            int(min(t[0][-1] for t in tables.values())))


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
        ``prefill_context_tokens`` (= kv_prefill), all counts int64.
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
    Each row of ``attention.csv`` is one batch shape ``(prefill_chunk, kv_prefill,
    n_decode, kv_decode)``: one prefill chunk of ``prefill_chunk`` tokens that sees
    ``kv_prefill`` tokens of history, plus ``n_decode`` decode requests holding
    ``kv_decode`` tokens of context each. Kinds: prefill-only (``n_decode = 0``),
    decode-only (``prefill_chunk = 0``), mixed (both > 0). With

    - ``T = prefill_chunk + n_decode`` tokens in the step and
    - ``S = [prefill_chunk > 0] + n_decode`` sequences that reach the LM head,

    the step time in microseconds is::

        t = L * ( 2*layernorm(T) + qkv_proj(T) + rotary_emb(T) + o_proj(T)
                  + gate_up_proj(T) + act_fn(T) + down_proj(T) + attention(grid point) )
            + embedding(T) + final_layernorm(T) + lm_head(S) + sampler(S)

    and ``step_duration_s = t * 1e-6``. ``L`` is ``num_layers``. ``op(T)`` is linear
    interpolation (:func:`numpy.interp`) of ``dense.csv`` in ``tokens``, ``op(S)`` of
    ``per_sequence.csv`` in ``sequences``; ``attention`` is the grid point's own
    ``time_us``.

    Assumptions, with their source:

    - ``layernorm`` twice per layer: LLMServingSim's Llama catalog
      (``profiler/models/llama.yaml``) emits ``layernorm`` in ``pre_attn`` and again in
      ``post_attn`` (vLLM's input_layernorm and post_attention_layernorm), and its timing
      extraction (``profiler/core/hooks/timings.py``) divides the summed RMSNorm time
      by parent invocations times that occurrence count, i.e. the row is the mean of
      ONE call. ``final_layernorm`` is the model's last norm, once per step.
    - ``lm_head`` and ``sampler`` run once per step on S rows: vLLM computes logits only
      at the last position of each scheduled sequence. A prefill chunk counts as one
      sequence whether or not it is the prompt's last chunk (vLLM V1 computes, then
      discards, the token of a partial prefill), so S = 1 + n_decode for a chunk.
    - The profile has no tensor-parallel communication: for ``tp > 1`` the tables time
      one shard and no all-reduce is added. CPU time between steps (scheduling,
      detokenising) is not in the profile either, so these steps are GPU-only.
    - Within a shape all decode requests share one ``kv_decode``. The profiler's skew
      tables (``skew.csv``, ``skew_fit.csv``, meta.yaml ``skew_*``), which correct for
      uneven decode contexts, are ignored, as are any other files in the folder.
    - Points needing ``T`` or ``S`` outside the profiled range are never extrapolated
      (see ``strict``). On the published profiles this removes the mixed shapes with a
      2048-token chunk plus decodes (T > 2048), which also exceed the profiled engine's
      ``max_num_batched_tokens`` = 2048 and so cannot occur in it.
    """
    found, anchor, tool_layout = _collect(sources)
    if isinstance(tp, bool) or not isinstance(tp, (int, np.integer)) or tp < 1:
        raise TraceError(f"tp must be a positive integer, got {tp!r}")
    tp = int(tp)
    files = {kind: _pick(found, kind, tp, anchor, tool_layout) for kind in _FILE_KINDS}
    meta = _load_meta(files["meta"])
    if num_layers is None:
        raise TraceFormatError(
            files["meta"] or files["attention"],
            "the profile times one decoder layer and the number of layers is not known",
            expected="--num-layers N (e.g. 32 for meta-llama/Llama-3.1-8B)")
    if isinstance(num_layers, bool) or not isinstance(num_layers, (int, np.integer)) \
            or num_layers < 1:
        raise TraceError(f"num_layers must be a positive integer, got {num_layers!r}")
    num_layers = int(num_layers)

    dense = _op_tables(files["dense"], "tokens", tuple(PER_LAYER_DENSE_CALLS) + PER_STEP_DENSE)
    per_seq = _op_tables(files["per_sequence"], "sequences", PER_STEP_SEQUENCE)
    att, att_lines = _read_attention(files["attention"])

    pc, kp = att["prefill_chunk"], att["kv_prefill"]
    nd, kd = att["n_decode"], att["kv_decode"]
    kind = step_kind(pc, nd)
    tokens = pc + nd
    seqs = (pc > 0).astype(np.int64) + nd

    t_lo, t_hi = _range(dense)
    s_lo, s_hi = _range(per_seq)
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
    dropped_by_kind = {k: int(((kind == k) & ~ok).sum()) for k in STEP_KINDS}

    pc, kp, nd, kd = pc[ok], kp[ok], nd[ok], kd[ok]
    kind, tokens, seqs = kind[ok], tokens[ok], seqs[ok]
    t = tokens.astype(np.float64)
    s = seqs.astype(np.float64)

    per_layer_us = att["time_us"][ok].copy()
    for op, calls in PER_LAYER_DENSE_CALLS.items():
        per_layer_us += calls * _interp(dense[op], t)
    step_us = num_layers * per_layer_us
    for op in PER_STEP_DENSE:
        step_us += _interp(dense[op], t)
    for op in PER_STEP_SEQUENCE:
        step_us += _interp(per_seq[op], s)
    duration_s = step_us * 1e-6
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
    }
    steps = pd.DataFrame({c: data[c] for c in STEP_COLUMNS})

    def _meta_str(key):
        v = meta.get(key)
        return None if v is None else str(v)

    metadata = {
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
        "num_rows": int(len(steps)),
        "dropped_out_of_range": {"count": int((~ok).sum()),
                                 "by_kind": dropped_by_kind, "rule": rule},
        "dense_tokens_range": [t_lo, t_hi],
        "per_sequence_range": [s_lo, s_hi],
        "composition": (
            "t_us = L*(2*layernorm(T)+qkv_proj(T)+rotary_emb(T)+o_proj(T)+gate_up_proj(T)"
            "+act_fn(T)+down_proj(T)+attention) + embedding(T)+final_layernorm(T)"
            "+lm_head(S)+sampler(S); T=prefill_chunk+n_decode, S=[prefill_chunk>0]+n_decode"),
    }
    return steps, metadata
