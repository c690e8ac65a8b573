"""Hugging Face ``config.json`` -> :class:`~schemas.spec_types.ModelSpec`: dense, MoE and MLA.

Reads the fields of a model's ``config.json`` that the cost model needs, counts the parameters
from the shapes (:func:`count_params`), and reads the weight and KV-cache dtypes and the GEMMs' precision
(``torch_dtype``, ``quantization_config``/``quantization``, ``kv_cache_dtype``, and the engine's
``expert_gemm_precision`` where given: :class:`~schemas.spec_types.ModelSpec`). Supported
``model_type`` values: Llama-style gated decoders (``llama``, ``mistral``, ``qwen2``, ``qwen3``,
``yi``), their MoE variants (``mixtral``, ``qwen2_moe``, ``qwen3_moe``, ``deepseek``, ``glm4_moe``),
DeepSeek's multi-head latent attention (``deepseek_v2``, ``deepseek_v3``), OPT, and the 2025-26
hybrids: gpt-oss (``gpt_oss``: windowed and full layers, MoE), Gemma 3 (``gemma3``,
``gemma3_text``: windowed and global layers), Llama 4 (``llama4``, ``llama4_text``: chunked and
global layers, interleaved MoE with a shared expert) and Qwen3-Next (``qwen3_next``: linear- and
full-attention layers, MoE); each layer's kind from :mod:`schemas.hf_layers`. Also the types that
extend one of them (``deepseek_v32``: :mod:`schemas.hf_identity`).

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
from .hf_layers import (CHUNKED, LINEAR, WINDOW, WRAPPER_TYPES, cfg_int, dense_mlp_width, is_moe_layer,
                        language_config, layer_kinds, linear_attention_params, linear_state, sliding_window_tokens)
from .spec_types import ModelSpec

#: model_type values whose shapes :func:`count_params` knows (lower case).
_MLA_DECODERS = {"deepseek_v2", "deepseek_v3"}
_HYBRID_DECODERS = {"gpt_oss", "gemma3_text", "llama4_text", "qwen3_next"}
_GATED_DECODERS = {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
                   "yi", "deepseek", "glm4_moe"} | _MLA_DECODERS | _HYBRID_DECODERS
_SUPPORTED_MODEL_TYPES = _GATED_DECODERS | {"opt"} | set(WRAPPER_TYPES)
#: Types whose q and k heads are RMS-normalised with weights of ``head_dim`` (q_norm, k_norm).
_QK_NORM_TYPES = {"qwen3", "qwen3_moe", "qwen3_next", "gemma3_text"}
#: Types with four norms per layer (Gemma's pre/post attention and feed-forward norms).
_FOUR_NORM_TYPES = {"gemma3_text"}


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
    return {"kv_lora_rank": cfg_int(cfg, "kv_lora_rank", where),
            "qk_rope_head_dim": cfg_int(cfg, "qk_rope_head_dim", where),
            "qk_nope_head_dim": cfg_int(cfg, "qk_nope_head_dim", where),
            "v_head_dim": cfg_int(cfg, "v_head_dim", where)}


def _head_dim(cfg: dict, where: str, hidden: int, heads: int) -> int:
    """The config's ``head_dim`` (not hidden/heads when given: case NC-01); MLA: q/k width."""
    mla = _mla_dims(cfg, where)
    if mla["kv_lora_rank"]:
        return mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"]
    return cfg_int(cfg, "head_dim", where, default=hidden // heads)


def _attention_params(cfg: dict, where: str, model_type: str, hidden: int, heads: int,
                      kv_heads: int, head_dim: int) -> int:
    """Parameters of one attention block (projections, biases, q/k or latent norms)."""
    mla = _mla_dims(cfg, where)
    if mla["kv_lora_rank"]:                      # DeepSeek-V2/V3 MLA (modeling_deepseek.py)
        rank, rope = mla["kv_lora_rank"], mla["qk_rope_head_dim"]
        q_head = mla["qk_nope_head_dim"] + rope
        q_lora = cfg_int(cfg, "q_lora_rank", where, default=0, strict=False)
        q = (hidden * q_lora + q_lora + q_lora * heads * q_head) if q_lora \
            else hidden * heads * q_head         # q_a_proj + q_a_layernorm + q_b_proj, or q_proj
        kv = hidden * (rank + rope) + rank + rank * heads * (mla["qk_nope_head_dim"]
                                                             + mla["v_head_dim"])
        return q + kv + heads * mla["v_head_dim"] * hidden
    q, kv = heads * head_dim, kv_heads * head_dim
    gate = q if model_type == "qwen3_next" and cfg.get("attn_output_gate", True) else 0  # Qwen3-Next's output gate
    attn = hidden * (q + gate) + 2 * hidden * kv + q * hidden
    if model_type in ("qwen2", "qwen2_moe") or cfg.get("attention_bias"):
        attn += q + gate + 2 * kv                # q/k/v biases
    if cfg.get("attention_bias") and model_type != "glm4_moe":
        attn += hidden                           # o bias (Llama attention_bias; GLM-4.5's o_proj has none)
    if model_type in _QK_NORM_TYPES or (model_type == "glm4_moe" and cfg.get("use_qk_norm")):
        attn += 2 * head_dim                     # q_norm, k_norm (Llama 4's qk norm is an unweighted L2)
    if model_type == "gpt_oss":
        attn += heads                            # attention sinks: one learned logit per head
    return attn


def _shared_expert_params(cfg: dict, where: str, model_type: str, hidden: int, expert: int, gated_mlp) -> int:
    """Parameters of a MoE layer's shared expert(s): Qwen2-MoE/Qwen3-Next's one of
    ``shared_expert_intermediate_size`` and its sigmoid gate (``hidden``); DeepSeekMoE/GLM-4.5's
    ``n_shared_experts`` routed-expert-sized ones; Llama 4's one of ``intermediate_size``; else none."""
    if cfg.get("shared_expert_intermediate_size"):
        return gated_mlp(cfg_int(cfg, "shared_expert_intermediate_size", where)) + hidden
    if cfg.get("n_shared_experts"):
        return cfg_int(cfg, "n_shared_experts", where) * expert
    if model_type == "llama4_text":
        return gated_mlp(cfg_int(cfg, "intermediate_size", where))
    return 0


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
    DeepSeek-V3's and GLM-4.5's multi-token-prediction layers (``num_nextn_predict_layers``) are
    not counted, as vLLM does not load them without speculative decoding. The hybrids
    (Transformers' modelling code of each): gpt-oss adds q/k/v/o biases, one attention-sink logit
    per head, expert biases (``2*width + hidden``) and a router bias; Gemma 3 four norms a layer and
    q/k norms; Llama 4 a shared expert of ``intermediate_size`` on its MoE layers and dense layers
    of ``intermediate_size_mlp``; Qwen3-Next's full-attention q projection also yields the output
    gate (``2*heads*head_dim`` wide) and its linear layers are Gated DeltaNet mixers
    (:func:`schemas.hf_layers.linear_attention_params`); GLM-4.5 q/k/v biases without an o bias
    and a router correction bias. A multimodal wrapper's vision tower is not counted (the
    language model serves the text requests a trace holds).
    """
    cfg = language_config(cfg, where)
    model_type = _model_type(cfg, where)
    hidden = cfg_int(cfg, "hidden_size", where)
    layers = cfg_int(cfg, "num_hidden_layers", where)
    heads = cfg_int(cfg, "num_attention_heads", where)
    kv_heads = cfg_int(cfg, "num_key_value_heads", where, default=heads)
    head_dim = _head_dim(cfg, where, hidden, heads)
    vocab = cfg_int(cfg, "vocab_size", where)

    if model_type == "opt":
        n = _count_opt(cfg, where, hidden, layers, vocab)
        return n, n

    kinds = layer_kinds(cfg, model_type, where)
    attn = _attention_params(cfg, where, model_type, hidden, heads, kv_heads, head_dim)
    linear = linear_attention_params(cfg, where, hidden) if LINEAR in kinds else 0
    norms = (4 if model_type in _FOUR_NORM_TYPES else 2) * hidden
    mlp_bias = bool(cfg.get("mlp_bias"))

    def gated_mlp(inter: int) -> int:
        return 3 * hidden * inter + ((2 * inter + hidden) if mlp_bias else 0)

    num_experts = num_routed_experts(cfg, where)
    dense_inter = dense_mlp_width(cfg, model_type, where, default=0 if num_experts else None)
    total = active = 0
    for i in range(layers):
        layer = (linear if kinds[i] == LINEAR else attn) + norms
        if num_experts and is_moe_layer(cfg, model_type, i, where):
            per_token = cfg_int(cfg, "num_experts_per_tok", where)
            width = moe_intermediate_size(cfg, where)
            expert = gated_mlp(width) + ((2 * width + hidden) if model_type == "gpt_oss" else 0)  # gpt-oss biases
            shared = _shared_expert_params(cfg, where, model_type, hidden, expert, gated_mlp)
            router = hidden * num_experts
            if model_type in ("gpt_oss", "glm4_moe") or cfg.get("topk_method") == "noaux_tc":
                router += num_experts                         # router bias / e_score_correction_bias
            total += layer + router + shared + num_experts * expert
            active += layer + router + shared + per_token * expert
        else:
            if not dense_inter:
                dense_inter = dense_mlp_width(cfg, model_type, where)
            total += layer + gated_mlp(dense_inter)
            active += layer + gated_mlp(dense_inter)
    tied = bool(cfg.get("tie_word_embeddings", False))
    outer = vocab * hidden * (1 if tied else 2) + hidden     # embeddings (+ lm_head) + final norm
    return total + outer, active + outer


def num_routed_experts(cfg: dict, where: str) -> int:
    """Routed experts per MoE layer (Mixtral, Qwen-MoE and DeepSeekMoE spellings); 0 if dense."""
    for key in ("num_local_experts", "num_experts", "n_routed_experts"):
        if cfg.get(key):
            return cfg_int(cfg, key, where)
    return 0


def moe_intermediate_size(cfg: dict, where: str) -> int:
    """Width of one routed expert: ``moe_intermediate_size``, else (Mixtral) ``intermediate_size``."""
    dense = cfg_int(cfg, "intermediate_size", where, default=0)
    return cfg_int(cfg, "moe_intermediate_size", where, default=dense or None)


def _count_opt(cfg: dict, where: str, hidden: int, layers: int, vocab: int) -> int:
    """OPT (Hugging Face ``modeling_opt.py``): q/k/v/out projections and an ungated ReLU MLP
    ``fc2(relu(fc1(x)))`` of width ``ffn_dim``, with biases unless ``enable_bias`` is false;
    two LayerNorms per layer (weight and bias unless ``layer_norm_elementwise_affine`` is
    false); learned positions with 2 extra rows; a final LayerNorm when
    ``do_layer_norm_before`` and not ``_remove_final_layer_norm``."""
    ffn = cfg_int(cfg, "ffn_dim", where)
    proj = cfg_int(cfg, "word_embed_proj_dim", where, default=hidden)
    max_pos = cfg_int(cfg, "max_position_embeddings", where)
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
    cfg = language_config(cfg, where)
    model_type = _model_type(cfg, where)
    hidden = cfg_int(cfg, "hidden_size", where)
    heads = cfg_int(cfg, "num_attention_heads", where)
    layers = cfg_int(cfg, "num_hidden_layers", where)
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
        num_kv_heads=cfg_int(cfg, "num_key_value_heads", where, default=heads),
        head_dim=_head_dim(cfg, where, hidden, heads),
        dtype_bytes=act_bytes,
        max_model_len=cfg_int(cfg, "max_position_embeddings", where),
        num_experts=num_experts,
        num_experts_per_token=cfg_int(cfg, "num_experts_per_tok", where) if num_experts else 0,
        **weight_format(cfg, where),        # weight bytes (dense, experts), GEMM precision
        expert_gemm_precision=cfg.get("expert_gemm_precision"),   # None: the GEMM precision
        kv_dtype_bytes=kv_dtype_bytes(cfg, where, act_bytes),
        intermediate_size=dense_mlp_width(cfg, model_type, where, default=cfg_int(cfg, "ffn_dim", where, default=0)),
        moe_intermediate_size=moe_intermediate_size(cfg, where) if num_experts else 0,
        vocab_size=cfg_int(cfg, "vocab_size", where),
        num_moe_layers=sum(is_moe_layer(cfg, model_type, i, where) for i in range(layers)) if num_experts else 0,
        **_mla_dims(cfg, where),
        **_layer_kind_fields(cfg, model_type, where, act_bytes),
    )
    try:
        return ModelSpec(**kwargs)
    except SpecError as exc:
        raise SpecError(f"{where}: {exc}") from None


def _layer_kind_fields(cfg: dict, model_type: str, where: str, act_bytes: float) -> dict:
    """The :class:`ModelSpec` fields of the windowed and linear-attention layers (all 0 without);
    chunked-attention layers stay full (:func:`chunked_note`)."""
    kinds = layer_kinds(cfg, model_type, where)
    state_bytes, flops = linear_state(cfg, where, act_bytes) if LINEAR in kinds else (0.0, 0.0)
    return {"num_window_layers": kinds.count(WINDOW), "sliding_window_tokens": sliding_window_tokens(cfg, kinds, where),
            "num_linear_layers": kinds.count(LINEAR), "linear_state_bytes": state_bytes,
            "linear_flops_per_token": flops}


def chunked_note(cfg: dict, where: str) -> str | None:
    """What the cost model makes of chunked-attention layers (Llama 4), one line; None without them.

    A chunked layer attends within its ``attention_chunk_size``-token chunk (vLLM's
    ``ChunkedLocalAttentionSpec`` frees the blocks of finished chunks): it is priced and cached as a
    full-attention layer, exact while a sequence stays within its first chunk, an upper bound after.
    """
    cfg = language_config(cfg, where)
    kinds = layer_kinds(cfg, _model_type(cfg, where), where)
    if CHUNKED not in kinds:
        return None
    return (f"{where}: {kinds.count(CHUNKED)} of {len(kinds)} layers attend in chunks of "
            f"{cfg.get('attention_chunk_size')} tokens; costed and cached as full attention (exact while a "
            "sequence stays within one chunk, an upper bound beyond)")


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
    for note in filter(None, (type_note, name_note, chunked_note(cfg, str(path)))):
        warnings.warn(note, SpecNote, stacklevel=2)
    return spec
