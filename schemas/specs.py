"""Model and GPU specs: the inputs of the roofline cost model, and the built-in catalog.

A :class:`ModelSpec` carries what the cost model needs from a model (parameter count P,
KV bytes per token D_kv, bytes per weight b, context length); a :class:`GpuSpec` carries
what it needs from a GPU (dense peak FLOP/s, memory bandwidth, memory capacity). Both are
part of the calibration file's contract (``to_dict`` / ``from_dict``).

Specs come from the catalog in ``schemas/catalog/`` (``gpus.json``, ``models.json``; every
value there has its source beside it), from a Hugging Face ``config.json`` on disk
(:func:`model_from_hf_config`), or from a GPU spec JSON file (:func:`gpu_from_json`).
Every problem is raised as :class:`~schemas.errors.SpecError` with one clear message.
"""
from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import MISSING, asdict, dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Any

from .errors import SpecError

CATALOG_DIR = Path(__file__).resolve().parent / "catalog"

#: torch_dtype -> bytes per weight.
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}

#: model_type values whose shapes :func:`count_params` knows (lower case).
_GATED_DECODERS = {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
                   "yi", "deepseek"}
_SUPPORTED_MODEL_TYPES = _GATED_DECODERS | {"opt"}


# --------------------------------------------------------------------------- value checks

def _number(value: Any, field: str, where: str, *, integer: bool = False,
            minimum: float = 0.0, strict: bool = True) -> Any:
    """Check that ``value`` is a finite number above (or at) ``minimum``; return it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"{where}: field '{field}' must be a number, got {value!r}")
    if not math.isfinite(value):
        raise SpecError(f"{where}: field '{field}' must be finite, got {value!r}")
    if integer:
        if value != int(value):
            raise SpecError(f"{where}: field '{field}' must be an integer, got {value!r}")
        value = int(value)
    if (value <= minimum) if strict else (value < minimum):
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise SpecError(f"{where}: field '{field}' must be {bound}, got {value!r}")
    return value


def _check_fields(cls: type, d: Any, where: str) -> dict:
    """The fields of dataclass ``cls`` found in ``d``; SpecError on missing or unknown keys."""
    if not isinstance(d, dict):
        raise SpecError(f"{where}: expected a JSON object, got {type(d).__name__}")
    names = [f.name for f in fields(cls)]
    required = [f.name for f in fields(cls)
                if f.default is MISSING and f.default_factory is MISSING]
    missing = [n for n in required if n not in d]
    if missing:
        raise SpecError(f"{where}: missing field(s) {', '.join(repr(m) for m in missing)}")
    unknown = sorted(set(d) - set(names))
    if unknown:
        raise SpecError(f"{where}: unknown field(s) {', '.join(repr(u) for u in unknown)}; "
                        f"expected {', '.join(names)}")
    return {n: d[n] for n in names if n in d}


def _build(cls: type, d: Any, where: str) -> Any:
    """``cls(**d)`` with every problem reported as one SpecError that starts with ``where``."""
    kwargs = _check_fields(cls, d, where)
    try:
        return cls(**kwargs)
    except SpecError as exc:
        raise SpecError(f"{where}: {exc}") from None


# --------------------------------------------------------------------------- spec types

@dataclass(frozen=True)
class ModelSpec:
    """What the cost model needs to know about a model.

    Attributes
    ----------
    name : str
        Catalog key (e.g. ``"llama-3.1-8b"``) or the name of the config it came from.
    num_params : float
        Total parameter count P, all weights including embeddings [parameters].
    num_active_params : float
        Parameters touched per token [parameters]; equals ``num_params`` for a dense model,
        fewer for a mixture-of-experts model (routed experts not chosen are skipped).
    num_layers : int
        Decoder layers.
    hidden_size : int
        Model width [elements].
    num_attention_heads : int
        Query heads.
    num_kv_heads : int
        Key/value heads (fewer than query heads under grouped-query attention).
    head_dim : int
        Width of one attention head [elements].
    dtype_bytes : int
        Bytes per weight and per KV-cache element b [bytes] (2 for bf16/fp16).
    max_model_len : int
        Context length, ``max_position_embeddings`` of the config [tokens].
    num_experts : int
        Routed experts per MoE layer; 0 for a dense model.
    num_experts_per_token : int
        Routed experts each token uses; 0 for a dense model.
    """

    name: str
    num_params: float
    num_active_params: float
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int
    max_model_len: int
    num_experts: int = 0
    num_experts_per_token: int = 0

    def __post_init__(self) -> None:
        where = f"model spec '{self.name}'"
        if not isinstance(self.name, str) or not self.name:
            raise SpecError(f"model spec: field 'name' must be a non-empty string, "
                            f"got {self.name!r}")
        _number(self.num_params, "num_params", where)
        _number(self.num_active_params, "num_active_params", where)
        for f in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads",
                  "head_dim", "dtype_bytes", "max_model_len"):
            _number(getattr(self, f), f, where, integer=True)
        for f in ("num_experts", "num_experts_per_token"):
            _number(getattr(self, f), f, where, integer=True, strict=False)
        if self.num_active_params > self.num_params:
            raise SpecError(f"{where}: num_active_params ({self.num_active_params:g}) exceeds "
                            f"num_params ({self.num_params:g})")
        if self.num_kv_heads > self.num_attention_heads:
            raise SpecError(f"{where}: num_kv_heads ({self.num_kv_heads}) exceeds "
                            f"num_attention_heads ({self.num_attention_heads})")
        if (self.num_experts == 0) != (self.num_experts_per_token == 0) or \
                self.num_experts_per_token > self.num_experts:
            raise SpecError(f"{where}: num_experts_per_token ({self.num_experts_per_token}) "
                            f"must be 0 for a dense model and 1..num_experts "
                            f"({self.num_experts}) for MoE")

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token occupies across all layers, D_kv [bytes/token].

        Notes
        -----
        ``D_kv = 2 * num_layers * num_kv_heads * head_dim * dtype_bytes`` (keys and values;
        seed theory.md, section 1).
        """
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        """Bytes of all weights, ``num_params * dtype_bytes`` = P*b [bytes]."""
        return self.num_params * self.dtype_bytes

    # TEMPORARY (replaced by the specs branch's properties at merge)
    def kv_bytes_per_token_per_rank(self, tp: int) -> float:
        return 2 * self.num_layers * max(1, self.num_kv_heads // tp) * self.head_dim * self.dtype_bytes

    @property
    def attention_flops_per_context_token(self) -> int:
        return 4 * self.num_layers * self.num_attention_heads * self.head_dim

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers if self.num_experts else 0

    @property
    def expert_weight_bytes(self) -> float:
        return 0.0

    @property
    def dense_weight_bytes(self) -> float:
        return self.weight_bytes

    @property
    def is_moe(self) -> bool:
        """True for a mixture-of-experts model."""
        return self.num_experts > 0

    def to_dict(self) -> dict:
        """The spec as a JSON-ready dict (the calibration file's ``model`` block)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict, where: str = "model spec") -> "ModelSpec":
        """Build a spec from :meth:`to_dict` output; SpecError names the bad field."""
        return _build(cls, d, where)


@dataclass(frozen=True)
class GpuSpec:
    """What the cost model needs to know about one GPU.

    Attributes
    ----------
    name : str
        Catalog key (e.g. ``"rtx-pro-6000"``) or the name given in a spec file.
    peak_flops : float
        Dense BF16 tensor-core peak, no structured sparsity [FLOP/s].
    mem_bandwidth_bytes_per_s : float
        Datasheet DRAM bandwidth (HBM or GDDR) [bytes/s].
    mem_bytes : float
        DRAM capacity [bytes]. The catalog reads a datasheet "80 GB" as 80 GiB, since GPU
        memory is built from binary-sized DRAM (an A100 80GB reports 81920 MiB).
    tp_link : str
        Interconnect between GPUs of one tensor-parallel replica, a preset of
        ``replay.cost_model.LINKS`` (``nvlink4`` on H100 SXM, ``pcie5`` on a PCIe card...).
    """

    name: str
    peak_flops: float
    mem_bandwidth_bytes_per_s: float
    mem_bytes: float
    tp_link: str = "pcie4"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise SpecError(f"gpu spec: field 'name' must be a non-empty string, got {self.name!r}")
        where = f"gpu spec '{self.name}'"
        for f in ("peak_flops", "mem_bandwidth_bytes_per_s", "mem_bytes"):
            _number(getattr(self, f), f, where)

    def to_dict(self) -> dict:
        """The spec as a JSON-ready dict (the calibration file's ``gpu`` block)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict, where: str = "gpu spec") -> "GpuSpec":
        """Build a spec from :meth:`to_dict` output; SpecError names the bad field."""
        return _build(cls, d, where)


# --------------------------------------------------------------------------- HF config.json

def _cfg_int(cfg: dict, key: str, where: str, default: Any = None, minimum: int = 0,
             strict: bool = True) -> int:
    value = cfg.get(key)
    if value is None:  # absent or JSON null
        if default is None:
            raise SpecError(f"{where}: missing field '{key}'")
        return default
    return _number(value, key, where, integer=True, minimum=minimum, strict=strict)


def count_params(cfg: dict, where: str = "config") -> tuple[int, int]:
    """Count parameters from the shapes in a Hugging Face config.

    Parameters
    ----------
    cfg : dict
        A parsed ``config.json``.
    where : str
        Name used in error messages (usually the file path).

    Returns
    -------
    (total, active) : tuple of int
        All weights, and the weights one token touches [parameters]. Equal for dense models.

    Notes
    -----
    Per layer: attention q ``hidden*heads*head_dim``, k and v ``hidden*kv_heads*head_dim``
    each, o ``heads*head_dim*hidden`` (plus q/k/v biases for Qwen2, q/k norms for Qwen3);
    gated MLP ``3*hidden*intermediate`` (per expert for MoE, plus the router
    ``hidden*num_experts`` and any shared expert); two norms of ``hidden``. Then the token
    embedding ``vocab*hidden`` (twice unless ``tie_word_embeddings``) and the final norm.
    OPT uses an ungated ReLU MLP ``2*hidden*ffn_dim``, biases everywhere, LayerNorms and a
    learned position embedding. Active = total minus the routed experts a token skips.
    """
    model_type = str(cfg.get("model_type") or "llama").lower()
    if model_type not in _SUPPORTED_MODEL_TYPES:
        raise SpecError(f"{where}: model_type '{model_type}' is not supported; supported: "
                        f"{', '.join(sorted(_SUPPORTED_MODEL_TYPES))}")
    if cfg.get("kv_lora_rank") is not None:
        raise SpecError(f"{where}: multi-head latent attention (kv_lora_rank, DeepSeek-V2/V3) "
                        f"is not supported: its KV cache is not 2*layers*kv_heads*head_dim")
    hidden = _cfg_int(cfg, "hidden_size", where)
    layers = _cfg_int(cfg, "num_hidden_layers", where)
    heads = _cfg_int(cfg, "num_attention_heads", where)
    kv_heads = _cfg_int(cfg, "num_key_value_heads", where, default=heads)
    head_dim = _cfg_int(cfg, "head_dim", where, default=hidden // heads)
    vocab = _cfg_int(cfg, "vocab_size", where)

    if model_type == "opt":
        n = _count_opt(cfg, where, hidden, layers, vocab)
        return n, n

    q, kv = heads * head_dim, kv_heads * head_dim
    attn = hidden * q + 2 * hidden * kv + q * hidden
    if model_type in ("qwen2", "qwen2_moe") or cfg.get("attention_bias"):
        attn += q + 2 * kv                       # q/k/v biases
    if cfg.get("attention_bias"):
        attn += hidden                           # o bias (Llama attention_bias)
    if model_type in ("qwen3", "qwen3_moe"):
        attn += 2 * head_dim                     # q_norm, k_norm
    mlp_bias = bool(cfg.get("mlp_bias"))

    def gated_mlp(inter: int) -> int:
        return 3 * hidden * inter + ((2 * inter + hidden) if mlp_bias else 0)

    num_experts = _num_experts(cfg, where)
    dense_inter = _cfg_int(cfg, "intermediate_size", where, default=0 if num_experts else None)
    total = active = 0
    for i in range(layers):
        layer = attn + 2 * hidden                # attention + two norms
        if num_experts and _is_moe_layer(cfg, i, where):
            per_token = _cfg_int(cfg, "num_experts_per_tok", where)
            expert = gated_mlp(_cfg_int(cfg, "moe_intermediate_size", where,
                                        default=dense_inter or None))
            shared = 0
            if cfg.get("shared_expert_intermediate_size"):    # Qwen2-MoE
                shared = gated_mlp(_cfg_int(cfg, "shared_expert_intermediate_size", where)) + hidden
            if cfg.get("n_shared_experts"):                   # DeepSeekMoE
                shared = _cfg_int(cfg, "n_shared_experts", where) * expert
            router = hidden * num_experts
            total += layer + router + shared + num_experts * expert
            active += layer + router + shared + per_token * expert
        else:
            if not dense_inter:
                dense_inter = _cfg_int(cfg, "intermediate_size", where)
            total += layer + gated_mlp(dense_inter)
            active += layer + gated_mlp(dense_inter)
    tied = bool(cfg.get("tie_word_embeddings", False))
    outer = vocab * hidden * (1 if tied else 2) + hidden     # embeddings (+ lm_head) + final norm
    return total + outer, active + outer


def _num_experts(cfg: dict, where: str) -> int:
    """Routed experts per MoE layer (Mixtral, Qwen-MoE and DeepSeekMoE spellings); 0 if dense."""
    for key in ("num_local_experts", "num_experts", "n_routed_experts"):
        if cfg.get(key):
            return _cfg_int(cfg, key, where)
    return 0


def _is_moe_layer(cfg: dict, i: int, where: str) -> bool:
    """Whether decoder layer ``i`` (0-based) has routed experts (Qwen-MoE / DeepSeekMoE rules)."""
    if i in (cfg.get("mlp_only_layers") or []):
        return False
    step = _cfg_int(cfg, "decoder_sparse_step", where, default=1)
    first_dense = _cfg_int(cfg, "first_k_dense_replace", where, default=0, strict=False)
    freq = _cfg_int(cfg, "moe_layer_freq", where, default=1)
    return (i + 1) % step == 0 and i >= first_dense and i % freq == 0


def _count_opt(cfg: dict, where: str, hidden: int, layers: int, vocab: int) -> int:
    """OPT: biases everywhere, LayerNorm (weight+bias), ReLU MLP, learned positions (+2 offset)."""
    ffn = _cfg_int(cfg, "ffn_dim", where)
    proj = _cfg_int(cfg, "word_embed_proj_dim", where, default=hidden)
    max_pos = _cfg_int(cfg, "max_position_embeddings", where)
    layer = 4 * (hidden * hidden + hidden) + (hidden * ffn + ffn) + (ffn * hidden + hidden) \
        + 2 * 2 * hidden
    embed = vocab * proj + (max_pos + 2) * hidden
    if proj != hidden:
        embed += 2 * hidden * proj               # project_in, project_out
    final_norm = 2 * hidden if cfg.get("do_layer_norm_before", True) else 0
    lm_head = 0 if cfg.get("tie_word_embeddings", True) else vocab * proj
    return layers * layer + embed + final_norm + lm_head


def _dtype_bytes(cfg: dict, where: str) -> int:
    dtype = cfg.get("torch_dtype", cfg.get("dtype"))
    if dtype is None:
        return 2
    key = str(dtype).lower().removeprefix("torch.")
    if key not in _DTYPE_BYTES:
        raise SpecError(f"{where}: field 'torch_dtype' has unsupported value {dtype!r}; "
                        f"expected one of {', '.join(sorted(_DTYPE_BYTES))}")
    return _DTYPE_BYTES[key]


def spec_from_config(cfg: dict, name: str, where: str = "config", *,
                     num_params: float | None = None,
                     num_active_params: float | None = None) -> ModelSpec:
    """Build a :class:`ModelSpec` from a parsed Hugging Face config.

    Parameters
    ----------
    cfg : dict
        A parsed ``config.json`` (or the catalog's subset of one).
    name : str
        Name of the spec.
    where : str
        Name used in error messages.
    num_params, num_active_params : float, optional
        Published counts [parameters] that override the shape counts of :func:`count_params`.
    """
    if not isinstance(cfg, dict):
        raise SpecError(f"{where}: expected a JSON object, got {type(cfg).__name__}")
    total, active = count_params(cfg, where)
    hidden = _cfg_int(cfg, "hidden_size", where)
    heads = _cfg_int(cfg, "num_attention_heads", where)
    num_experts = _num_experts(cfg, where)
    if num_params is not None and num_active_params is None and not num_experts:
        num_active_params = num_params
    kwargs = dict(
        name=name,
        num_params=float(num_params if num_params is not None else total),
        num_active_params=float(num_active_params if num_active_params is not None else active),
        num_layers=_cfg_int(cfg, "num_hidden_layers", where),
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=_cfg_int(cfg, "num_key_value_heads", where, default=heads),
        head_dim=_cfg_int(cfg, "head_dim", where, default=hidden // heads),
        dtype_bytes=_dtype_bytes(cfg, where),
        max_model_len=_cfg_int(cfg, "max_position_embeddings", where),
        num_experts=num_experts,
        num_experts_per_token=_cfg_int(cfg, "num_experts_per_tok", where) if num_experts else 0,
    )
    try:
        return ModelSpec(**kwargs)
    except SpecError as exc:
        raise SpecError(f"{where}: {exc}") from None


def _read_json(path: Path, what: str) -> Any:
    if not path.is_file():
        raise SpecError(f"{path}: {what} file not found")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: not valid JSON ({exc})") from None


def model_from_hf_config(path: str | Path) -> ModelSpec:
    """Read a Hugging Face ``config.json`` (or a folder holding one) into a :class:`ModelSpec`.

    Parameters
    ----------
    path : str or Path
        The ``config.json`` file, or the model folder that contains it.

    Returns
    -------
    ModelSpec
        P and the active P counted from the shapes (:func:`count_params`); named after the
        file's folder, or after ``model_type`` when the folder is a Hugging Face cache
        snapshot (a 40-hex commit) or has no name.
    """
    path = Path(path).expanduser()
    if path.is_dir():
        path = path / "config.json"
    cfg = _read_json(path, "model config")
    folder = path.resolve().parent.name
    if not folder or re.fullmatch(r"[0-9a-f]{40}", folder):
        folder = str(cfg.get("model_type") or "model") if isinstance(cfg, dict) else "model"
    return spec_from_config(cfg, folder, str(path))


def gpu_from_json(path: str | Path) -> GpuSpec:
    """Read a GPU spec JSON file into a :class:`GpuSpec`.

    Parameters
    ----------
    path : str or Path
        A JSON object with ``peak_flops`` [FLOP/s], ``mem_bandwidth_bytes_per_s`` [bytes/s]
        and ``mem_bytes`` [bytes]; ``name`` defaults to the file stem. A value may also be
        written as ``{"value": ..., "source": ...}`` as in the catalog.
    """
    path = Path(path).expanduser()
    d = _read_json(path, "gpu spec")
    if not isinstance(d, dict):
        raise SpecError(f"{path}: expected a JSON object, got {type(d).__name__}")
    d = {k: _unwrap(v) for k, v in d.items() if k not in ("source", "description", "aliases")}
    d.setdefault("name", path.stem)
    return GpuSpec.from_dict(d, str(path))


def _unwrap(v: Any) -> Any:
    return v["value"] if isinstance(v, dict) and "value" in v else v


# --------------------------------------------------------------------------- the catalog

def _norm(name: str) -> str:
    """Lookup key: lower case, only letters, digits and dots ("Llama-3.1 8B" == "llama3.18b")."""
    return re.sub(r"[^a-z0-9.]", "", name.lower())


@lru_cache(maxsize=None)
def _catalog(kind: str) -> tuple[dict, dict]:
    """Load ``catalog/{kind}.json``; return (entries by key, normalised name -> key)."""
    path = CATALOG_DIR / f"{kind}.json"
    doc = _read_json(path, "catalog")
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


def _resolve(kind: str, name: str) -> str:
    """The catalog key that ``name`` names; SpecError listing the keys if none."""
    entries, index = _catalog(kind)
    key = index.get(_norm(name))
    if key is not None:
        return key
    query = _norm(name)
    close = sorted({index[n] for n in index if query and n.startswith(query)}, key=len)[:4]
    if not close:
        close = [index[n] for n in difflib.get_close_matches(query, list(index), n=1, cutoff=0.5)]
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    what = "model" if kind == "models" else "GPU"
    file_hint = "a Hugging Face config.json" if kind == "models" else "a GPU spec JSON file"
    raise SpecError(f"unknown {what} '{name}'.{hint} Known {kind}: {', '.join(entries)}. "
                    f"A path to {file_hint} works too.")


def _is_path(name: str) -> bool:
    return name.endswith(".json") or name.startswith(("/", "./", "../", "~", "."))


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
        (``"meta-llama/Llama-3.1-8B-Instruct"``), case and separators ignored; or a path to a
        Hugging Face ``config.json`` (or its folder).
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


def get_gpu(name: str) -> GpuSpec:
    """Look up a GPU spec.

    Parameters
    ----------
    name : str
        A catalog key (``"h100-80gb"``) or an ``nvidia-smi`` name alias
        (``"NVIDIA H100 80GB HBM3"``), case and separators ignored; or a path to a GPU spec
        JSON file (see :func:`gpu_from_json`).
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
    values = {f: _unwrap(entry.get(f)) for f in ("peak_flops", "mem_bandwidth_bytes_per_s",
                                                 "mem_bytes", "tp_link") if f in entry}
    return GpuSpec.from_dict({"name": key, **values}, f"{CATALOG_DIR / 'gpus.json'}: gpu '{key}'")


def list_models() -> list[dict]:
    """One row per catalog model: key, aliases, the spec's values, D_kv and the sources."""
    rows = []
    for key, entry in _catalog("models")[0].items():
        spec = _model_entry_spec(key)
        active = entry.get("num_active_params")
        rows.append({"key": key, "hf_id": entry.get("hf_id", ""),
                     "aliases": list(entry.get("aliases", [])),
                     **{k: v for k, v in spec.to_dict().items() if k != "name"},
                     "kv_bytes_per_token": spec.kv_bytes_per_token,
                     "config_source": entry["config"]["source"],
                     "num_params_source": entry["num_params"]["source"],
                     "num_active_params_source": active["source"] if active else
                     "dense: equals num_params"})
    return rows


def list_gpus() -> list[dict]:
    """One row per catalog GPU: key, aliases, the spec's values and each value's source."""
    rows = []
    for key, entry in _catalog("gpus")[0].items():
        spec = get_gpu(key)
        row = {"key": key, "description": entry.get("description", ""),
               "aliases": list(entry.get("aliases", []))}
        for f in ("peak_flops", "mem_bandwidth_bytes_per_s", "mem_bytes"):
            row[f] = getattr(spec, f)
            row[f"{f}_source"] = entry[f]["source"]
        rows.append(row)
    return rows
