"""The built-in catalog of models, GPUs and links, and lookups by name or path.

The catalog lives in ``schemas/catalog/``: ``models.json`` (the Hugging Face ``config.json``
fields of each model, verbatim, and its published parameter count), ``gpus.json`` (datasheet
peak FLOP/s, memory bandwidth and capacity) and ``links.json`` (interconnect bandwidth and
latency presets). Every value there has its source beside it. GPU and link names are matched
ignoring case and every character but letters, digits and dots, so ``nvidia-smi`` names work as
aliases; a model name (key, Hugging Face id or alias) must be spelled as in the catalog, case
and ``_`` for ``-`` aside: a near miss is an error naming the closest models, never another
model taken silently.

Every problem (unknown name, bad file, bad value) is raised as
:class:`~schemas.errors.SpecError` with one clear message.
"""
from __future__ import annotations

import difflib
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from .errors import SpecError, SpecFileError
from .hf_config import model_from_hf_config, read_json, spec_from_config
from .spec_checks import check_number
from .gpu_types import GpuSpec, Link
from .spec_types import ModelSpec

CATALOG_DIR = Path(__file__).resolve().parent / "catalog"

_WHAT = {"models": "model", "gpus": "GPU", "links": "link"}


def _unwrap(v: Any) -> Any:
    """``{"value": x, "source": ...}`` -> ``x``; anything else unchanged."""
    return v["value"] if isinstance(v, dict) and "value" in v else v


def _norm(name: str) -> str:
    """Lookup key: lower case, only letters, digits and dots ("Llama-3.1 8B" == "llama3.18b")."""
    return re.sub(r"[^a-z0-9.]", "", name.lower())


@lru_cache(maxsize=None)
def _catalog(kind: str) -> tuple[dict, dict]:
    """Load ``catalog/{kind}.json``; return (entries by key, normalised name -> key).

    Raises
    ------
    SpecError
        If the file is missing, not JSON, has no ``kind`` object, or two entries share a name.
    """
    path = CATALOG_DIR / f"{kind}.json"
    doc = read_json(path, "catalog")
    entries = doc.get(kind) if isinstance(doc, dict) else None
    if not isinstance(entries, dict) or not entries:
        raise SpecError(f"{path}: expected an object with a non-empty '{kind}' object")
    index: dict[str, str] = {}
    for key, entry in entries.items():
        names = [key, entry.get("hf_id", key), *entry.get("aliases", [])]
        names += [n.split("/", 1)[1] for n in names if "/" in n]   # "Qwen/Qwen3-8B" -> "Qwen3-8B"
        for alias in names:
            other = index.setdefault(_norm(alias), key)
            if other != key:
                raise SpecError(f"{path}: name '{alias}' of '{key}' also names '{other}'")
    return entries, index


def _spelled(name: str) -> str:
    """A model name as spelled: lower case, ``_`` and spaces read as ``-`` ("Llama_3.1 8B" ==
    "llama-3.1-8b"), but no separator dropped or added ("llama3-8b" is not "llama-3-8b")."""
    return re.sub(r"[-_\s]+", "-", name.strip().lower())


@lru_cache(maxsize=None)
def _spelled_index(kind: str) -> dict:
    """Spelled name (key, Hugging Face id, alias, id without its organisation) -> key."""
    index = {}
    for key, entry in _catalog(kind)[0].items():
        names = [key, entry.get("hf_id", key), *entry.get("aliases", [])]
        names += [n.split("/", 1)[1] for n in names if "/" in n]
        index.update({_spelled(n): key for n in names})
    return index


def _resolve(kind: str, name: str) -> str:
    """The catalog key that ``name`` names; SpecError listing the keys (and the closest) if none.

    A model must be named as the catalog spells it (case, and ``_`` for ``-``, aside): a
    near miss (``llama3-8b``) is refused with the closest names, never taken silently for
    another model. GPUs and links match ignoring every separator (``nvidia-smi`` names).
    """
    entries, index = _catalog(kind)
    query = _norm(name)
    if kind == "models":
        key = _spelled_index(kind).get(_spelled(name))
        loose = index.get(query)
    else:
        key = loose = index.get(query)
    if key is not None:
        return key
    close = sorted({index[n] for n in index if query and n.startswith(query)}, key=len)[:4]
    if not close and loose:  # the same letters and digits, other separators: it and the next closest
        close = list(dict.fromkeys([loose, *(index[n] for n in difflib.get_close_matches(
            query, list(index), n=4, cutoff=0.5))]))[:2]
    if not close:
        close = [index[n] for n in difflib.get_close_matches(query, list(index), n=1, cutoff=0.5)]
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    file_hint = {"models": " A path to a Hugging Face config.json works too.",
                 "gpus": " A path to a GPU spec JSON file works too.", "links": ""}[kind]
    raise SpecError(f"unknown {_WHAT[kind]} '{name}'.{hint} Known {kind}: "
                    f"{', '.join(entries)}.{file_hint}")


def catalog_key(name: str) -> str | None:
    """The catalog key of the model or GPU ``name`` names as ``--model`` and ``--gpu`` take it
    (key, alias, Hugging Face id, ``nvidia-smi`` name), or None when it names neither."""
    for kind in ("models", "gpus"):
        try:
            return _resolve(kind, str(name).strip())
        except SpecError:
            continue
    return None


def _is_path(name: str) -> bool:
    return name.endswith(".json") or name.startswith(("/", "./", "../", "~", "."))


# --------------------------------------------------------------------------- models

def _model_entry_spec(key: str) -> ModelSpec:
    entry = _catalog("models")[0][key]
    where = f"{CATALOG_DIR / 'models.json'}: model '{key}'"
    cfg = entry["config"]["values"]
    active = entry.get("num_active_params")
    return spec_from_config(cfg, key, where, num_params=entry["num_params"]["value"],
                            num_active_params=active["value"] if active else None)


def get_model(name: str) -> ModelSpec:
    """Look up a model spec.

    Parameters
    ----------
    name : str
        A catalog key (``"llama-3.1-8b"``), a Hugging Face id alias
        (``"meta-llama/Llama-3.1-8B-Instruct"``), spelled as in the catalog (case, and ``_``
        or a space for ``-``, aside: ``llama3-8b`` is refused, naming ``llama-3-8b``); or a path to a
        Hugging Face ``config.json`` (or its folder), read by
        :func:`~schemas.hf_config.model_from_hf_config`.

    Raises
    ------
    SpecError
        Unknown name (with the known keys and the closest matches) or a bad config file.
    """
    name = str(name).strip()
    if _is_path(name):
        return model_from_hf_config(name)
    try:
        return _model_entry_spec(_resolve("models", name))
    except SpecError:
        if Path(name).expanduser().exists():
            return model_from_hf_config(name)
        raise


def list_models() -> list[dict]:
    """One row per catalog model: key, aliases, the spec's values, D_kv (the full-attention layers'), the
    bytes a sequence holds whatever its length (windowed and linear-attention layers) and the sources."""
    rows = []
    for key, entry in _catalog("models")[0].items():
        spec = _model_entry_spec(key)
        active = entry.get("num_active_params")
        rows.append({"key": key, "hf_id": entry.get("hf_id", ""),
                     "aliases": list(entry.get("aliases", [])),
                     **{k: v for k, v in spec.to_dict().items() if k != "name"},
                     "kv_bytes_per_token": spec.kv_bytes_per_token,
                     "seq_state_bytes": spec.seq_state_bytes_per_rank(1),
                     "config_source": entry["config"]["source"],
                     "num_params_source": entry["num_params"]["source"],
                     "num_active_params_source": active["source"] if active else
                     "dense: equals num_params"})
    return rows


# --------------------------------------------------------------------------- GPUs

#: The numbers of a catalog GPU, each ``{"value": ..., "source": ...}``: the dense tensor peaks
#: per precision [FLOP/s] (an FP8/FP4 peak of 0: no such tensor cores), bandwidth and capacity.
_GPU_NUMBERS = ("peak_flops", "peak_flops_fp8", "peak_flops_fp4", "mem_bandwidth_bytes_per_s",
                "mem_bytes")

def gpu_from_json(path: str | Path) -> GpuSpec:
    """Read a GPU spec JSON file into a :class:`GpuSpec`.

    Parameters
    ----------
    path : str or Path
        A JSON object with ``peak_flops`` (dense BF16) [FLOP/s], ``mem_bandwidth_bytes_per_s``
        [bytes/s] and ``mem_bytes`` [bytes]; optionally ``peak_flops_fp8`` and ``peak_flops_fp4``
        [FLOP/s] (0, the default: none) and ``tp_link``; ``name`` defaults to the file stem. A value may also be
        written as ``{"value": ..., "source": ...}`` as in the catalog.

    Raises
    ------
    SpecFileError
        Naming the file and the field: missing file, not JSON, missing/unknown/bad field.
    """
    path = Path(path).expanduser()
    try:
        d = read_json(path, "gpu spec")
        if not isinstance(d, dict):
            raise SpecError(f"{path}: expected a JSON object, got {type(d).__name__}")
        d = {k: _unwrap(v) for k, v in d.items() if k not in ("source", "description", "aliases")}
        d.setdefault("name", path.stem)
        return GpuSpec.from_dict(d, str(path))
    except SpecFileError:
        raise
    except SpecError as exc:
        raise SpecFileError(str(exc)) from None


def get_gpu(name: str) -> GpuSpec:
    """Look up a GPU spec.

    Parameters
    ----------
    name : str
        A catalog key (``"h100-80gb"``) or an ``nvidia-smi`` name alias
        (``"NVIDIA H100 80GB HBM3"``), case and separators ignored; or a path to a GPU spec
        JSON file (see :func:`gpu_from_json`).

    Raises
    ------
    SpecError
        Unknown name (with the known keys and the closest match) or a bad spec file.
    """
    name = str(name).strip()
    if _is_path(name):
        return gpu_from_json(name)
    try:
        key = _resolve("gpus", name)
    except SpecError:
        if Path(name).expanduser().is_file():
            return gpu_from_json(name)
        raise
    entry = _catalog("gpus")[0][key]
    values = {f: _unwrap(entry.get(f)) for f in (*_GPU_NUMBERS, "tp_link") if f in entry}
    return GpuSpec.from_dict({"name": key, **values}, f"{CATALOG_DIR / 'gpus.json'}: gpu '{key}'")


def list_gpus() -> list[dict]:
    """One row per catalog GPU: key, aliases, the spec's values and each value's source."""
    rows = []
    for key, entry in _catalog("gpus")[0].items():
        spec = get_gpu(key)
        row = {"key": key, "description": entry.get("description", ""),
               "aliases": list(entry.get("aliases", []))}
        for f in (*_GPU_NUMBERS, "tp_link"):
            row[f] = getattr(spec, f)
            row[f"{f}_source"] = entry[f]["source"]
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- links

def get_link(name: str) -> Link:
    """Look up an interconnect preset (``pcie4``, ``pcie5``, ``nvlink3``, ``nvlink4``,
    ``nvlink5``, ``xgmi-mi300``, ``xgmi-mi355``, ``100gbe``, ``200gbe``,
    ``400gbe``), case and separators ignored.

    Returns
    -------
    Link
        Named by its catalog key; bandwidth one way [bytes/s], latency [s], whether it connects
        every GPU of a group directly (``fully_connected``, default false).

    Raises
    ------
    SpecError
        Unknown name (with the known keys), or a bad value in ``links.json``.
    """
    key = _resolve("links", str(name).strip())
    entry = _catalog("links")[0][key]
    where = f"{CATALOG_DIR / 'links.json'}: link '{key}'"
    bw = check_number(_unwrap(entry.get("bandwidth_bytes_per_s")), "bandwidth_bytes_per_s", where)
    lat = check_number(_unwrap(entry.get("latency_s")), "latency_s", where, strict=False)
    connected = _unwrap(entry.get("fully_connected", False))
    if not isinstance(connected, bool):
        raise SpecError(f"{where}: field 'fully_connected' must be true or false, got {connected!r}")
    return Link(key, bw, lat, connected)


def link_presets() -> dict[str, Link]:
    """Every catalog link by key, in catalog order (a new dict each call)."""
    return {key: get_link(key) for key in _catalog("links")[0]}


def list_links() -> list[dict]:
    """One row per catalog link: key, description, bandwidth and latency with their sources."""
    rows = []
    for key, entry in _catalog("links")[0].items():
        link = get_link(key)
        rows.append({"key": key, "description": entry.get("description", ""),
                     "bandwidth_bytes_per_s": link.bandwidth_bytes_per_s,
                     "bandwidth_bytes_per_s_source": entry["bandwidth_bytes_per_s"]["source"],
                     "latency_s": link.latency_s,
                     "latency_s_source": entry["latency_s"]["source"]})
    return rows
