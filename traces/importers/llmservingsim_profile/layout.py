"""Finding an LLMServingSim profile's files: the tool's own layout or flat prefixed copies, TP selection, meta.yaml."""
from __future__ import annotations

import os
import re
from pathlib import Path

import yaml

from ...errors import TraceError, TraceFormatError

FILE_KINDS = ("meta", "dense", "attention", "per_sequence")

_SUFFIXES = {
    "meta": ("meta.yaml", "meta.yml"),
    "dense": ("dense.csv",),
    "attention": ("attention.csv",),
    "per_sequence": ("per_sequence.csv",),
}

_TP_IN_NAME = re.compile(r"(?:^|[_.\-])tp(\d+)(?=[_.\-])", re.IGNORECASE)

_TP_DIR = re.compile(r"tp(\d+)", re.IGNORECASE)

_SEPARATORS = "_-."


def _file_kind(name: str) -> str | None:
    """Which profile file a name is (``dense``, ...), or None.

    A name matches when it IS the tool's name or ends in ``<sep><tool's name>`` (the
    flat, prefixed copies such as ``lss_profile_<gpu>_<model>_tp1_dense.csv``).
    ``linear_attention.csv`` (hybrid models) is not ``attention.csv``.
    """
    low = name.lower()
    for kind in FILE_KINDS:
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
    out: dict[str, list[Path]] = {k: [] for k in FILE_KINDS}
    for p in paths:
        kind = _file_kind(p.name)
        if kind is not None:
            out[kind].append(p)
    return out


def collect(sources) -> tuple[dict[str, list[Path]], Path, bool]:
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
            stems = sorted({_stem(p, k) for k in FILE_KINDS for p in found[k]})
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


def pick(found: dict[str, list[Path]], kind: str, tp: int, anchor: Path,
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


def load_meta(path: Path | None) -> dict:
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
