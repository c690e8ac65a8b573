"""Hugging Face ``config.json`` -> :class:`~schemas.spec_types.ModelSpec`: dense, MoE and MLA.

Reads the fields of a model's ``config.json`` that the cost model needs, counts the parameters
from the shapes (:func:`count_params`), and reads the weight and KV-cache dtypes and the GEMMs' precision
(``torch_dtype``, ``quantization_config``/``quantization``, ``kv_cache_dtype``). Supported
``model_type`` values: Llama-style gated decoders (``llama``, ``mistral``, ``qwen2``, ``qwen3``,
``yi``), their MoE variants (``mixtral``, ``qwen2_moe``, ``qwen3_moe``, ``deepseek``) and
DeepSeek's multi-head latent attention (``deepseek_v2``, ``deepseek_v3``), and OPT; and the
types that extend one of them (``deepseek_v32``: :mod:`schemas.hf_identity`).

Every problem is raised as :class:`~schemas.errors.SpecError` naming the file and the field.
"""
from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

from .dtypes import dtype_bytes, kv_dtype_bytes, weight_format
from .errors import SpecError, SpecFileError, text_reason
from .hf_identity import EXTENDED_MODEL_TYPES, SpecNote, config_name, read_as_type
from .spec_checks import check_number
from .spec_types import ModelSpec

#: model_type values whose shapes :func:`count_params` knows (lower case).
_MLA_DECODERS = {"deepseek_v2", "deepseek_v3"}
_GATED_DECODERS = {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
                   "yi", "deepseek"} | _MLA_DECODERS
_SUPPORTED_MODEL_TYPES = _GATED_DECODERS | {"opt"}


def _cfg_int(cfg: dict, key: str, where: str, default: Any = None, minimum: int = 0,
             strict: bool = True) -> int:
    """``cfg[key]`` as a checked integer; ``default`` when absent or null (SpecError if none)."""
    value = cfg.get(key)
    if value is None:  # absent or JSON null
        if default is None:
            raise SpecError(f"{where}: missing field '{key}'")
        return default
    return check_number(value, key, where, integer=True, minimum=minimum, strict=strict)


# --------------------------------------------------------------------------- shapes

def _model_type(cfg: dict, where: str) -> str:
    model_type = str(cfg.get("model_type") or "llama").lower()
    if model_type not in _SUPPORTED_MODEL_TYPES:
        raise SpecError(f"{where}: model_type '{model_type}' is not supported; supported: "
                        f"{', '.join(sorted(_SUPPORTED_MODEL_TYPES))}, and types that extend one "
                        f"({', '.join(sorted(EXTENDED_MODEL_TYPES))}, or architectures naming one's class)")
    if cfg.get("kv_lora_rank") and model_type not in _MLA_DECODERS:
        raise SpecError(f"{where}: kv_lora_rank (multi-head latent attention) is supported for "
                        f"model_type {', '.join(sorted(_MLA_DECODERS))}, not '{model_type}'")
    return model_type


def _mla_dims(cfg: dict, where: str) -> dict:
    """MLA widths of a DeepSeek-V2/V3 config (all 0 for ordinary attention)."""
    if not cfg.get("kv_lora_rank"):
        return {"kv_lora_rank": 0, "qk_rope_head_dim": 0, "qk_nope_head_dim": 0, "v_head_dim": 0}
    return {"kv_lora_rank": _cfg_int(cfg, "kv_lora_rank", where),
            "qk_rope_head_dim": _cfg_int(cfg, "qk_rope_head_dim", where),
            "qk_nope_head_dim": _cfg_int(cfg, "qk_nope_head_dim", where),
            "v_head_dim": _cfg_int(cfg, "v_head_dim", where)}


def _head_dim(cfg: dict, where: str, hidden: int, heads: int) -> int:
    """The config's ``head_dim`` (not hidden/heads when given: case NC-01); MLA: q/k width."""
    mla = _mla_dims(cfg, where)
    if mla["kv_lora_rank"]:
        return mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"]
    return _cfg_int(cfg, "head_dim", where, default=hidden // heads)


def _attention_params(cfg: dict, where: str, model_type: str, hidden: int, heads: int,
                      kv_heads: int, head_dim: int) -> int:
    """Parameters of one attention block (projections, biases, q/k or latent norms)."""
    mla = _mla_dims(cfg, where)
    if mla["kv_lora_rank"]:                      # DeepSeek-V2/V3 MLA (modeling_deepseek.py)
        rank, rope = mla["kv_lora_rank"], mla["qk_rope_head_dim"]
        q_head = mla["qk_nope_head_dim"] + rope
        q_lora = _cfg_int(cfg, "q_lora_rank", where, default=0, strict=False)
        q = (hidden * q_lora + q_lora + q_lora * heads * q_head) if q_lora \
            else hidden * heads * q_head         # q_a_proj + q_a_layernorm + q_b_proj, or q_proj
        kv = hidden * (rank + rope) + rank + rank * heads * (mla["qk_nope_head_dim"]
                                                             + mla["v_head_dim"])
        return q + kv + heads * mla["v_head_dim"] * hidden
    q, kv = heads * head_dim, kv_heads * head_dim
    attn = hidden * q + 2 * hidden * kv + q * hidden
    if model_type in ("qwen2", "qwen2_moe") or cfg.get("attention_bias"):
        attn += q + 2 * kv                       # q/k/v biases
    if cfg.get("attention_bias"):
        attn += hidden                           # o bias (Llama attention_bias)
    if model_type in ("qwen3", "qwen3_moe"):
        attn += 2 * head_dim                     # q_norm, k_norm
    return attn


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

    Raises
    ------
    SpecError
        For an unsupported ``model_type`` or a missing or invalid shape field.

    Notes
    -----
    Per layer: attention q ``hidden*heads*head_dim``, k and v ``hidden*kv_heads*head_dim``
    each, o ``heads*head_dim*hidden`` (plus q/k/v biases for Qwen2, q/k norms for Qwen3);
    MLA (DeepSeek-V2/V3) instead q (or its low-rank pair), the joint KV down-projection
    ``hidden*(kv_lora_rank+qk_rope_head_dim)``, its norm, the up-projection
    ``kv_lora_rank*heads*(qk_nope_head_dim+v_head_dim)`` and o ``heads*v_head_dim*hidden``;
    gated MLP ``3*hidden*intermediate`` (per expert for MoE, plus the router
    ``hidden*num_experts`` and any shared expert); two norms of ``hidden``. Then the token
    embedding ``vocab*hidden`` (twice unless ``tie_word_embeddings``) and the final norm.
    OPT uses an ungated ReLU MLP ``2*hidden*ffn_dim``, biases everywhere, LayerNorms and a
    learned position embedding. Active = total minus the routed experts a token skips.
    DeepSeek-V3's multi-token-prediction layer (``num_nextn_predict_layers``) is not counted,
    as vLLM does not load it without speculative decoding.
    """
    model_type = _model_type(cfg, where)
    hidden = _cfg_int(cfg, "hidden_size", where)
    layers = _cfg_int(cfg, "num_hidden_layers", where)
    heads = _cfg_int(cfg, "num_attention_heads", where)
    kv_heads = _cfg_int(cfg, "num_key_value_heads", where, default=heads)
    head_dim = _head_dim(cfg, where, hidden, heads)
    vocab = _cfg_int(cfg, "vocab_size", where)

    if model_type == "opt":
        n = _count_opt(cfg, where, hidden, layers, vocab)
        return n, n

    attn = _attention_params(cfg, where, model_type, hidden, heads, kv_heads, head_dim)
    mlp_bias = bool(cfg.get("mlp_bias"))

    def gated_mlp(inter: int) -> int:
        return 3 * hidden * inter + ((2 * inter + hidden) if mlp_bias else 0)

    num_experts = num_routed_experts(cfg, where)
    dense_inter = _cfg_int(cfg, "intermediate_size", where, default=0 if num_experts else None)
    total = active = 0
    for i in range(layers):
        layer = attn + 2 * hidden                # attention + two norms
        if num_experts and is_moe_layer(cfg, i, where):
            per_token = _cfg_int(cfg, "num_experts_per_tok", where)
            expert = gated_mlp(moe_intermediate_size(cfg, where))
            shared = 0
            if cfg.get("shared_expert_intermediate_size"):    # Qwen2-MoE
                shared = gated_mlp(_cfg_int(cfg, "shared_expert_intermediate_size", where)) + hidden
            if cfg.get("n_shared_experts"):                   # DeepSeekMoE
                shared = _cfg_int(cfg, "n_shared_experts", where) * expert
            router = hidden * num_experts
            if cfg.get("topk_method") == "noaux_tc":          # DeepSeek-V3 e_score_correction_bias
                router += num_experts
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


def num_routed_experts(cfg: dict, where: str) -> int:
    """Routed experts per MoE layer (Mixtral, Qwen-MoE and DeepSeekMoE spellings); 0 if dense."""
    for key in ("num_local_experts", "num_experts", "n_routed_experts"):
        if cfg.get(key):
            return _cfg_int(cfg, key, where)
    return 0


def moe_intermediate_size(cfg: dict, where: str) -> int:
    """Width of one routed expert: ``moe_intermediate_size``, else (Mixtral) ``intermediate_size``."""
    dense = _cfg_int(cfg, "intermediate_size", where, default=0)
    return _cfg_int(cfg, "moe_intermediate_size", where, default=dense or None)


def is_moe_layer(cfg: dict, i: int, where: str) -> bool:
    """Whether decoder layer ``i`` (0-based) has routed experts.

    Notes
    -----
    Qwen2/3-MoE (``Qwen3MoeDecoderLayer``): not in ``mlp_only_layers`` and
    ``(i + 1) % decoder_sparse_step == 0``. DeepSeekMoE/V2/V3 (``DeepseekV2DecoderLayer``):
    ``i >= first_k_dense_replace`` and ``i % moe_layer_freq == 0``. Mixtral: every layer.
    """
    if i in (cfg.get("mlp_only_layers") or []):
        return False
    step = _cfg_int(cfg, "decoder_sparse_step", where, default=1)
    first_dense = _cfg_int(cfg, "first_k_dense_replace", where, default=0, strict=False)
    freq = _cfg_int(cfg, "moe_layer_freq", where, default=1)
    return (i + 1) % step == 0 and i >= first_dense and i % freq == 0


def _count_opt(cfg: dict, where: str, hidden: int, layers: int, vocab: int) -> int:
    """OPT (Hugging Face ``modeling_opt.py``): q/k/v/out projections and an ungated ReLU MLP
    ``fc2(relu(fc1(x)))`` of width ``ffn_dim``, with biases unless ``enable_bias`` is false;
    two LayerNorms per layer (weight and bias unless ``layer_norm_elementwise_affine`` is
    false); learned positions with 2 extra rows; a final LayerNorm when
    ``do_layer_norm_before`` and not ``_remove_final_layer_norm``."""
    ffn = _cfg_int(cfg, "ffn_dim", where)
    proj = _cfg_int(cfg, "word_embed_proj_dim", where, default=hidden)
    max_pos = _cfg_int(cfg, "max_position_embeddings", where)
    bias = 1 if cfg.get("enable_bias", True) else 0
    norm = 2 * hidden if cfg.get("layer_norm_elementwise_affine", True) else 0
    layer = 4 * (hidden * hidden + bias * hidden) + (hidden * ffn + bias * ffn) \
        + (ffn * hidden + bias * hidden) + 2 * norm
    embed = vocab * proj + (max_pos + 2) * hidden
    if proj != hidden:
        embed += 2 * hidden * proj               # project_in, project_out
    final = cfg.get("do_layer_norm_before", True) and not cfg.get("_remove_final_layer_norm", False)
    final_norm = norm if final else 0
    lm_head = 0 if cfg.get("tie_word_embeddings", True) else vocab * proj
    return layers * layer + embed + final_norm + lm_head


# --------------------------------------------------------------------------- config -> spec

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

    Raises
    ------
    SpecError
        Naming ``where`` and the field, for a missing, invalid or inconsistent value.
    """
    if not isinstance(cfg, dict):
        raise SpecError(f"{where}: expected a JSON object, got {type(cfg).__name__}")
    total, active = count_params(cfg, where)
    hidden = _cfg_int(cfg, "hidden_size", where)
    heads = _cfg_int(cfg, "num_attention_heads", where)
    layers = _cfg_int(cfg, "num_hidden_layers", where)
    num_experts = num_routed_experts(cfg, where)
    if num_params is not None and num_active_params is None and not num_experts:
        num_active_params = num_params
    act_bytes = dtype_bytes(cfg, where)
    kwargs = dict(
        name=name,
        num_params=float(num_params if num_params is not None else total),
        num_active_params=float(num_active_params if num_active_params is not None else active),
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=_cfg_int(cfg, "num_key_value_heads", where, default=heads),
        head_dim=_head_dim(cfg, where, hidden, heads),
        dtype_bytes=act_bytes,
        max_model_len=_cfg_int(cfg, "max_position_embeddings", where),
        num_experts=num_experts,
        num_experts_per_token=_cfg_int(cfg, "num_experts_per_tok", where) if num_experts else 0,
        **weight_format(cfg, where),        # weight bytes (dense, experts), GEMM precision
        kv_dtype_bytes=kv_dtype_bytes(cfg, where, act_bytes),
        intermediate_size=_cfg_int(cfg, "intermediate_size", where, strict=False,
                                   default=_cfg_int(cfg, "ffn_dim", where, default=0)),  # OPT
        moe_intermediate_size=moe_intermediate_size(cfg, where) if num_experts else 0,
        vocab_size=_cfg_int(cfg, "vocab_size", where),
        num_moe_layers=sum(is_moe_layer(cfg, i, where) for i in range(layers)) if num_experts else 0,
        **_mla_dims(cfg, where),
    )
    try:
        return ModelSpec(**kwargs)
    except SpecError as exc:
        raise SpecError(f"{where}: {exc}") from None


def read_json(path: Path, what: str) -> Any:
    """Parse a JSON file; SpecError naming the file when it is missing or not valid JSON."""
    if not path.is_file():
        raise SpecError(f"{path}: {what} file not found")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeError, RecursionError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise SpecError(f"{path}: not valid JSON ({text_reason(path, exc)})") from None


def model_from_hf_config(path: str | Path) -> ModelSpec:
    """Read a Hugging Face ``config.json`` (or a folder holding one) into a :class:`ModelSpec`.

    Parameters
    ----------
    path : str or Path
        The ``config.json`` file, or the model folder that contains it.

    Returns
    -------
    ModelSpec
        P and the active P counted from the shapes (:func:`count_params`); named by the file
        (its ``_name_or_path``, else its ``architectures``), else after the file's folder, or
        after ``model_type`` when the folder is a Hugging Face cache snapshot (a 40-hex
        commit) or has no name (:func:`schemas.hf_identity.config_name`). A config that
        extends a supported type is read as that type
        (:func:`schemas.hf_identity.read_as_type`). Each choice the reader made (a type read
        as another, a name guessed) is a :class:`~schemas.hf_identity.SpecNote` warning.

    Raises
    ------
    SpecFileError
        Naming the file: not found, not JSON, unsupported architecture, missing field.
    """
    path = Path(path).expanduser()
    if path.is_dir():
        path = path / "config.json"
    try:
        cfg = read_json(path, "model config")
        if not isinstance(cfg, dict):
            raise SpecError(f"{path}: expected a JSON object, got {type(cfg).__name__}")
        folder = path.resolve().parent.name
        if not folder or re.fullmatch(r"[0-9a-f]{40}", folder):
            folder = str(cfg.get("model_type") or "model")
        cfg, type_note = read_as_type(cfg, _SUPPORTED_MODEL_TYPES, str(path))
        name, name_note = config_name(cfg, folder, str(path))
        spec = spec_from_config(cfg, name, str(path))
    except SpecFileError:
        raise
    except SpecError as exc:
        raise SpecFileError(str(exc)) from None
    for note in filter(None, (type_note, name_note)):
        warnings.warn(note, SpecNote, stacklevel=2)
    return spec
