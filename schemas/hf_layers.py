"""What each decoder layer of a Hugging Face ``config.json`` is: its attention kind and its MLP.

The 2025-26 architectures mix layer kinds: gpt-oss alternates attention over a 128-token sliding
window with full attention; Gemma 3 has five windowed layers to one global; Llama 4 attends in
8192-token chunks on three layers of four; Qwen3-Next has three Gated DeltaNet (linear-attention)
layers to one full-attention layer; Llama 4 Maverick and GLM-4.5 put experts on some layers only.
This module reads those maps (and the multimodal wrappers' ``text_config``) so that
:mod:`schemas.hf_config` counts each layer as what it is.

Sources: Transformers' configuration and modelling code of each type (``GptOssConfig.layer_types``,
``Gemma3TextConfig`` and its defaults, ``Llama4TextConfig.no_rope_layers`` / ``moe_layers``,
``Qwen3NextConfig.layer_types`` and ``Qwen3NextGatedDeltaNet``, ``Glm4MoeConfig``) and vLLM's KV-cache
specs of the same layers (``SlidingWindowSpec``, ``ChunkedLocalAttentionSpec``, ``MambaSpec``).
Every problem is a :class:`~schemas.errors.SpecError` naming the file and the field.
"""
from __future__ import annotations

from typing import Any

from .errors import SpecError
from .spec_checks import check_number

#: Multimodal wrappers whose language model is their ``text_config`` (read as its own type).
WRAPPER_TYPES = {"llama4": "llama4_text", "gemma3": "gemma3_text"}

#: Defaults a type's configuration class fills in when its ``config.json`` leaves a field out
#: (Transformers' ``Gemma3TextConfig`` and ``Llama4TextConfig`` signatures); published configs
#: rely on them (gemma-3-27b-it's ``text_config`` has no ``vocab_size``).
TYPE_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {"vocab_size": 262_208, "max_position_embeddings": 131_072, "head_dim": 256,
                    "sliding_window": 4096, "sliding_window_pattern": 6, "tie_word_embeddings": True},
    "llama4_text": {"vocab_size": 202_048, "max_position_embeddings": 131_072, "head_dim": 128,
                    "interleave_moe_layer_step": 1, "no_rope_layer_interval": 4, "tie_word_embeddings": False},
    "gpt_oss": {"sliding_window": 128},
    "qwen3_next": {"full_attention_interval": 4},
}

#: Layer kinds, as :func:`layer_kinds` names them.
FULL, WINDOW, CHUNKED, LINEAR = "full", "window", "chunked", "linear"


def cfg_int(cfg: dict, key: str, where: str, default: Any = None, minimum: int = 0, strict: bool = True) -> int:
    """``cfg[key]`` as a checked integer; ``default`` when absent or null (SpecError if none)."""
    value = cfg.get(key)
    if value is None:  # absent or JSON null
        if default is None:
            raise SpecError(f"{where}: missing field '{key}'")
        return default
    return check_number(value, key, where, integer=True, minimum=minimum, strict=strict)


def language_config(cfg: dict, where: str) -> dict:
    """The language model's config: a multimodal wrapper's (``llama4``, ``gemma3``) ``text_config``
    over the wrapper's own keys (its ``torch_dtype``, ``quantization_config``, ``architectures``),
    with its type's defaults (:data:`TYPE_DEFAULTS`) under both; any other config as it is, with
    its type's defaults.

    Raises
    ------
    SpecError
        A wrapper without a ``text_config`` object.
    """
    model_type = str(cfg.get("model_type") or "").lower()
    if model_type in WRAPPER_TYPES:
        text = cfg.get("text_config")
        if not isinstance(text, dict):
            raise SpecError(f"{where}: model_type '{model_type}' needs a 'text_config' object (its language model)")
        outer = {k: v for k, v in cfg.items() if k not in ("text_config", "vision_config", "model_type")}
        cfg = {**outer, **{k: v for k, v in text.items() if v is not None},
               "model_type": str(text.get("model_type") or WRAPPER_TYPES[model_type]).lower()}
        if cfg["model_type"] == "llama4":  # some exports repeat the wrapper's type inside
            cfg["model_type"] = "llama4_text"
        model_type = cfg["model_type"]
    defaults = TYPE_DEFAULTS.get(model_type, {})
    return {**defaults, **{k: v for k, v in cfg.items() if v is not None}} if defaults else cfg


def layer_kinds(cfg: dict, model_type: str, where: str) -> list[str]:
    """The attention kind of each decoder layer: :data:`FULL`, :data:`WINDOW`, :data:`CHUNKED` or
    :data:`LINEAR`.

    Notes
    -----
    ``layer_types`` when the config lists it (``"sliding_attention"``, ``"full_attention"``,
    ``"chunked_attention"``, ``"linear_attention"``), else the type's rule: gpt-oss, every even
    layer (0-based) windowed (``GptOssConfig``); Gemma 3, layer ``i`` windowed unless ``(i + 1) %
    sliding_window_pattern == 0``; Llama 4, layer ``i`` chunked when ``attention_chunk_size`` is set
    and ``no_rope_layers[i]`` is 1 (its default: unless ``(i + 1) % no_rope_layer_interval == 0``),
    as ``Llama4TextDecoderLayer`` decides; Qwen3-Next, linear unless ``(i + 1) %
    full_attention_interval == 0``. Every layer of any other type is full attention.

    Raises
    ------
    SpecError
        A ``layer_types`` list of the wrong length or with an unknown entry.
    """
    layers = cfg_int(cfg, "num_hidden_layers", where)
    listed = cfg.get("layer_types")
    if listed is not None:
        names = {"full_attention": FULL, "sliding_attention": WINDOW, "chunked_attention": CHUNKED,
                 "linear_attention": LINEAR}
        if not isinstance(listed, list) or len(listed) != layers or any(t not in names for t in listed):
            raise SpecError(f"{where}: field 'layer_types' must list one of {', '.join(sorted(names))} for each of "
                            f"the {layers} layers (num_hidden_layers)")
        return [names[t] for t in listed]
    if model_type == "gpt_oss":
        return [WINDOW if i % 2 == 0 else FULL for i in range(layers)]
    if model_type == "gemma3_text":
        pattern = cfg_int(cfg, "sliding_window_pattern", where, minimum=1, strict=False)
        return [FULL if (i + 1) % pattern == 0 else WINDOW for i in range(layers)]
    if model_type == "qwen3_next":
        interval = cfg_int(cfg, "full_attention_interval", where, minimum=1, strict=False)
        return [FULL if (i + 1) % interval == 0 else LINEAR for i in range(layers)]
    if model_type == "llama4_text" and cfg.get("attention_chunk_size"):
        no_rope = cfg.get("no_rope_layers")
        if no_rope is None:
            interval = cfg_int(cfg, "no_rope_layer_interval", where, minimum=1, strict=False)
            no_rope = [int((i + 1) % interval != 0) for i in range(layers)]
        if not isinstance(no_rope, list) or len(no_rope) != layers:
            raise SpecError(f"{where}: field 'no_rope_layers' must list 0 or 1 for each of the {layers} layers")
        return [CHUNKED if flag else FULL for flag in no_rope]
    return [FULL] * layers


def sliding_window_tokens(cfg: dict, kinds: list[str], where: str) -> int:
    """The window of the windowed layers [tokens]: the config's ``sliding_window``; 0 without them."""
    return cfg_int(cfg, "sliding_window", where, minimum=1, strict=False) if WINDOW in kinds else 0


def is_moe_layer(cfg: dict, model_type: str, i: int, where: str) -> bool:
    """Whether decoder layer ``i`` (0-based) has routed experts.

    Notes
    -----
    Llama 4 (``Llama4TextDecoderLayer``): ``i in moe_layers``, by default every
    ``interleave_moe_layer_step``-th layer from ``step - 1``. Qwen2/3-MoE and Qwen3-Next: not in
    ``mlp_only_layers`` and ``(i + 1) % decoder_sparse_step == 0``. DeepSeekMoE/V2/V3 and GLM-4.5
    (``first_k_dense_replace``): ``i >= first_k_dense_replace`` and ``i % moe_layer_freq == 0``.
    Mixtral and gpt-oss: every layer.
    """
    if model_type == "llama4_text":
        moe_layers = cfg.get("moe_layers")
        if moe_layers is None:
            step = cfg_int(cfg, "interleave_moe_layer_step", where, minimum=1, strict=False)
            return i % step == step - 1
        return i in moe_layers
    if i in (cfg.get("mlp_only_layers") or []):
        return False
    step = cfg_int(cfg, "decoder_sparse_step", where, default=1)
    first_dense = cfg_int(cfg, "first_k_dense_replace", where, default=0, strict=False)
    freq = cfg_int(cfg, "moe_layer_freq", where, default=1)
    return (i + 1) % step == 0 and i >= first_dense and i % freq == 0


def dense_mlp_width(cfg: dict, model_type: str, where: str, default: Any = None) -> int:
    """Width of a dense (non-expert) layer's MLP: Llama 4's ``intermediate_size_mlp`` (its
    ``intermediate_size`` is an expert's), else ``intermediate_size``."""
    key = "intermediate_size_mlp" if model_type == "llama4_text" else "intermediate_size"
    return cfg_int(cfg, key, where, default=default)


# --------------------------------------------------------------------------- linear attention

def _linear_dims(cfg: dict, where: str) -> tuple[int, int, int, int, int]:
    """Qwen3-Next's Gated DeltaNet widths: key heads, value heads, key and value head widths, conv kernel."""
    return (cfg_int(cfg, "linear_num_key_heads", where), cfg_int(cfg, "linear_num_value_heads", where),
            cfg_int(cfg, "linear_key_head_dim", where), cfg_int(cfg, "linear_value_head_dim", where),
            cfg_int(cfg, "linear_conv_kernel_dim", where))


def linear_attention_params(cfg: dict, where: str, hidden: int) -> int:
    """Parameters of one Gated DeltaNet layer's mixer (Transformers' ``Qwen3NextGatedDeltaNet``).

    Notes
    -----
    With ``k = heads_k * d_k`` and ``v = heads_v * d_v``: ``in_proj_qkvz`` ``hidden * (2k + 2v)``,
    ``in_proj_ba`` ``hidden * 2 heads_v``, the depthwise ``conv1d`` ``(2k + v) * kernel`` (no bias),
    ``dt_bias`` and ``A_log`` ``heads_v`` each, the gated norm ``d_v`` and ``out_proj`` ``v * hidden``.
    """
    heads_k, heads_v, d_k, d_v, kernel = _linear_dims(cfg, where)
    k, v = heads_k * d_k, heads_v * d_v
    return hidden * (2 * k + 2 * v) + hidden * 2 * heads_v + (2 * k + v) * kernel + 2 * heads_v + d_v + v * hidden


def linear_state(cfg: dict, where: str, dtype_bytes: float) -> tuple[float, float]:
    """One sequence's state in one Gated DeltaNet layer [bytes] and the FLOPs one token spends on
    it [FLOP/token].

    Notes
    -----
    State (vLLM's ``MambaSpec`` of the layer, ``mamba_utils.gated_delta_net_state_shape``): the
    recurrent ``heads_v * d_k * d_v`` matrix, in ``mamba_ssm_dtype`` when the config names one
    (4 bytes for ``float32``) else the model's dtype, and the convolution's last ``kernel - 1``
    inputs of width ``2k + v`` in the model's dtype. FLOPs: the delta-rule update reads the state
    once to predict the value, writes a rank-one correction and reads it out with the query,
    three multiply-adds per state element (``6 heads_v d_k d_v``), plus the convolution
    ``2 kernel (2k + v)``.
    """
    heads_k, heads_v, d_k, d_v, kernel = _linear_dims(cfg, where)
    conv_width = 2 * heads_k * d_k + heads_v * d_v
    recurrent = heads_v * d_k * d_v
    ssm = str(cfg.get("mamba_ssm_dtype") or "").lower()
    ssm_bytes = {"float32": 4, "fp32": 4, "bfloat16": 2, "float16": 2}.get(ssm, dtype_bytes)
    state_bytes = recurrent * ssm_bytes + (kernel - 1) * conv_width * dtype_bytes
    return float(state_bytes), float(6 * recurrent + 2 * kernel * conv_width)
