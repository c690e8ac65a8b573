"""Checks of spec values: numbers in range, dataclass fields from a dict, exact byte counts, and a
model spec's fields with the defaults that depend on others (:func:`validate_model_spec`).

Shared by :mod:`schemas.spec_types`, :mod:`schemas.hf_config`, :mod:`schemas.dtypes` and
:mod:`schemas.spec_catalog`; every problem is one :class:`~schemas.errors.SpecError` naming
where it happened and the field.
"""
from __future__ import annotations

import math
from dataclasses import MISSING, fields
from typing import Any

from .errors import SpecError


def check_number(value: Any, field: str, where: str, *, integer: bool = False,
                 minimum: float = 0.0, strict: bool = True) -> Any:
    """Check that ``value`` is a finite number above (or at) ``minimum``; return it.

    Raises
    ------
    SpecError
        Naming ``where`` and ``field`` when the value is not a number, not finite, not an
        integer (with ``integer``) or out of range.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"{where}: field '{field}' must be a number, got {value!r}")
    if isinstance(value, int) and abs(value) > 2 ** 63:
        raise SpecError(f"{where}: field '{field}' is beyond any plausible size ({len(str(value))} digits)")
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


def check_fields(cls: type, d: Any, where: str) -> dict:
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


def build_checked(cls: type, d: Any, where: str) -> Any:
    """``cls(**d)`` with every problem reported as one SpecError that starts with ``where``."""
    kwargs = check_fields(cls, d, where)
    try:
        return cls(**kwargs)
    except SpecError as exc:
        raise SpecError(f"{where}: {exc}") from None


def int_if_whole(x: float) -> float:
    """``2.0`` -> ``2`` (so byte counts stay ints in JSON and in products); ``0.5`` unchanged."""
    return int(x) if float(x).is_integer() else x


def check_layer_kinds(spec: Any, where: str) -> None:
    """A :class:`~schemas.spec_types.ModelSpec`'s windowed and linear-attention layers: consistent
    counts, at least one full-attention layer, none with MLA (SpecError naming the fields)."""
    if (spec.num_window_layers == 0) != (spec.sliding_window_tokens == 0):
        raise SpecError(f"{where}: num_window_layers ({spec.num_window_layers}) and sliding_window_tokens "
                        f"({spec.sliding_window_tokens}) must both be 0 or both be > 0")
    if (spec.num_linear_layers == 0) != (spec.linear_state_bytes == 0):
        raise SpecError(f"{where}: num_linear_layers ({spec.num_linear_layers}) and linear_state_bytes "
                        f"({spec.linear_state_bytes:g}) must both be 0 or both be > 0")
    if spec.num_full_layers < 1:
        raise SpecError(f"{where}: num_window_layers ({spec.num_window_layers}) + num_linear_layers "
                        f"({spec.num_linear_layers}) must leave at least one of the num_layers "
                        f"({spec.num_layers}) with full attention")
    if spec.is_mla and (spec.num_window_layers or spec.num_linear_layers):
        raise SpecError(f"{where}: windowed or linear-attention layers are not supported with "
                        f"multi-head latent attention (kv_lora_rank {spec.kv_lora_rank})")


def check_model_relations(spec: Any, where: str) -> None:
    """A :class:`~schemas.spec_types.ModelSpec`'s fields against each other (its single fields are
    checked before): active parameters within the total, KV heads within the query heads, experts
    per token within the experts (0 for a dense model), MLA's widths.

    Raises
    ------
    SpecError
        Naming ``where`` and the fields.
    """
    if spec.num_active_params > spec.num_params:
        raise SpecError(f"{where}: num_active_params ({spec.num_active_params:g}) exceeds "
                        f"num_params ({spec.num_params:g})")
    if spec.num_kv_heads > spec.num_attention_heads:
        raise SpecError(f"{where}: num_kv_heads ({spec.num_kv_heads}) exceeds "
                        f"num_attention_heads ({spec.num_attention_heads})")
    if (spec.num_experts == 0) != (spec.num_experts_per_token == 0) or \
            spec.num_experts_per_token > spec.num_experts:
        raise SpecError(f"{where}: num_experts_per_token ({spec.num_experts_per_token}) "
                        f"must be 0 for a dense model and 1..num_experts "
                        f"({spec.num_experts}) for MoE")
    if spec.kv_lora_rank and (spec.qk_nope_head_dim + spec.qk_rope_head_dim <= 0 or spec.v_head_dim <= 0):
        raise SpecError(f"{where}: multi-head latent attention (kv_lora_rank "
                        f"{spec.kv_lora_rank}) needs qk_nope_head_dim + qk_rope_head_dim > 0 "
                        f"and v_head_dim > 0")


def validate_model_spec(spec: Any, gemm_precisions: tuple) -> None:
    """Check every field of a :class:`schemas.spec_types.ModelSpec` and fill the defaults that depend
    on other fields (frozen: set through ``object.__setattr__``): the weight, KV and expert dtypes'
    bytes, the experts' GEMM precision (one of ``gemm_precisions``) and the MoE layer count.

    Raises
    ------
    SpecError
        The first field that breaks its rule, named with the model.
    """
    where = f"model spec '{spec.name}'"
    if not isinstance(spec.name, str) or not spec.name:
        raise SpecError(f"model spec: field 'name' must be a non-empty string, "
                        f"got {spec.name!r}")
    check_number(spec.num_params, "num_params", where)
    check_number(spec.num_active_params, "num_active_params", where)
    for f in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads",
              "head_dim", "dtype_bytes", "max_model_len"):
        check_number(getattr(spec, f), f, where, integer=True)
    for f in ("num_experts", "num_experts_per_token", "intermediate_size",
              "moe_intermediate_size", "vocab_size", "kv_lora_rank", "qk_rope_head_dim",
              "qk_nope_head_dim", "v_head_dim", "num_window_layers", "sliding_window_tokens",
              "num_linear_layers"):
        check_number(getattr(spec, f), f, where, integer=True, strict=False)
    for f in ("linear_state_bytes", "linear_flops_per_token"):
        check_number(getattr(spec, f), f, where, strict=False)
    check_model_relations(spec, where)
    if spec.expert_gemm_precision is None:
        object.__setattr__(spec, "expert_gemm_precision", spec.gemm_precision)
    for f in ("gemm_precision", "expert_gemm_precision"):
        if getattr(spec, f) not in gemm_precisions:
            raise SpecError(f"{where}: field '{f}' must be one of "
                            f"{', '.join(gemm_precisions)}, got {getattr(spec, f)!r}")
    # defaults that depend on other fields (frozen: set through object.__setattr__)
    for f in ("weight_dtype_bytes", "kv_dtype_bytes", "expert_weight_dtype_bytes"):
        value = getattr(spec, f)
        default = spec.weight_dtype_bytes if f == "expert_weight_dtype_bytes" else spec.dtype_bytes
        value = default if value is None else check_number(value, f, where)
        object.__setattr__(spec, f, int_if_whole(value))
    moe_layers = spec.num_moe_layers
    if moe_layers is None:
        moe_layers = spec.num_layers if spec.num_experts else 0
    moe_layers = check_number(moe_layers, "num_moe_layers", where, integer=True, strict=False)
    if (moe_layers == 0) != (spec.num_experts == 0) or moe_layers > spec.num_layers:
        raise SpecError(f"{where}: num_moe_layers ({moe_layers}) must be 0 for a dense model "
                        f"and 1..num_layers ({spec.num_layers}) for MoE")
    object.__setattr__(spec, "num_moe_layers", moe_layers)
    check_layer_kinds(spec, where)
