"""Element widths: bytes per weight, per activation and per KV-cache element.

Read from a Hugging Face ``config.json`` (``torch_dtype``; ``quantization_config`` or
``quantization`` for the weights; ``kv_cache_dtype`` or a quantisation config's KV scheme for
the cache) or from vLLM's ``--kv-cache-dtype`` value. Every problem is one
:class:`~schemas.errors.SpecError` naming the file and the field.
"""
from __future__ import annotations

from .errors import SpecError
from .spec_checks import check_number

#: torch_dtype -> bytes per element.
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}

#: quantisation method (``quant_method`` or vLLM's ``--quantization``) -> bytes per weight,
#: when the config does not state the bits.
_QUANT_BYTES = {"fp8": 1, "fbgemm_fp8": 1, "ptpc_fp8": 1, "int8": 1, "w8a8": 1, "smoothquant": 1,
                "experts_int8": 1, "int4": 0.5, "w4a16": 0.5, "awq": 0.5, "awq_marlin": 0.5,
                "gptq": 0.5, "gptq_marlin": 0.5, "marlin": 0.5, "mxfp4": 0.5, "nvfp4": 0.5}

#: vLLM ``--kv-cache-dtype`` values -> bytes per KV element; ``auto`` = the model's dtype.
KV_CACHE_DTYPE_BYTES = {"fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "fp8_ds_mla": 1,
                        "int8": 1, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2,
                        "float32": 4, "fp32": 4, "float": 4}


def kv_cache_dtype_bytes(kv_cache_dtype: str, model_dtype_bytes: float) -> float:
    """Bytes per KV-cache element for a vLLM ``--kv-cache-dtype`` value.

    Parameters
    ----------
    kv_cache_dtype : str
        ``auto`` (the model's dtype, vLLM's default), ``fp8``, ``fp8_e4m3``, ``fp8_e5m2``,
        ``bfloat16``, ``float16``, ``float32``... (case-insensitive).
    model_dtype_bytes : float
        Bytes per element of the model's activations, used for ``auto`` [bytes].

    Raises
    ------
    SpecError
        For a value vLLM does not know.
    """
    key = str(kv_cache_dtype).strip().lower().removeprefix("torch.")
    if key == "auto":
        return model_dtype_bytes
    if key not in KV_CACHE_DTYPE_BYTES:
        raise SpecError(f"kv_cache_dtype {kv_cache_dtype!r} is not supported; expected auto or "
                        f"one of {', '.join(KV_CACHE_DTYPE_BYTES)}")
    return KV_CACHE_DTYPE_BYTES[key]


def dtype_bytes(cfg: dict, where: str) -> int:
    """Bytes per activation element from ``torch_dtype`` (or ``dtype``); 2 (bf16) if absent."""
    dtype = cfg.get("torch_dtype", cfg.get("dtype"))
    if dtype is None:
        return 2
    key = str(dtype).lower().removeprefix("torch.")
    if key not in _DTYPE_BYTES:
        raise SpecError(f"{where}: field 'torch_dtype' has unsupported value {dtype!r}; "
                        f"expected one of {', '.join(sorted(_DTYPE_BYTES))}")
    return _DTYPE_BYTES[key]


def weight_dtype_bytes(cfg: dict, where: str) -> float:
    """Bytes per weight: from ``quantization_config`` (or ``quantization``), else ``torch_dtype``.

    Raises
    ------
    SpecError
        For a quantisation method whose weight width is not known.

    Notes
    -----
    fp8 and int8 -> 1; int4, AWQ and GPTQ -> ``bits / 8`` (0.5 for their usual 4 bits);
    bitsandbytes ``load_in_4bit``/``load_in_8bit`` -> 0.5/1; compressed-tensors -> the first
    config group's ``weights.num_bits / 8``; an MLX-style ``{"bits": b}`` -> ``b / 8``.
    Quantisation scales and the weights left unquantised (embeddings, often the lm_head) are
    not counted separately.
    """
    q = cfg.get("quantization_config", cfg.get("quantization"))
    if q is None:
        return dtype_bytes(cfg, where)
    if isinstance(q, str):
        q = {"quant_method": q}
    if not isinstance(q, dict):
        raise SpecError(f"{where}: field 'quantization_config' must be an object or a string, "
                        f"got {q!r}")
    method = str(q.get("quant_method") or q.get("quant_algo") or "").lower()
    bits = q.get("bits", q.get("w_bit", q.get("weight_bits")))
    if method == "bitsandbytes" or q.get("load_in_4bit") or q.get("load_in_8bit"):
        return 0.5 if q.get("load_in_4bit") else 1
    if method == "compressed-tensors":
        groups = [g for g in (q.get("config_groups") or {}).values() if isinstance(g, dict)]
        weights = groups[0].get("weights") if groups else None
        bits = weights.get("num_bits") if isinstance(weights, dict) else None
    if bits is not None:
        return check_number(bits, "quantization_config.bits", where) / 8
    if method in _QUANT_BYTES:
        return _QUANT_BYTES[method]
    raise SpecError(f"{where}: quantization method {method or q!r} is not supported (weight width "
                    f"unknown); supported: {', '.join(sorted(_QUANT_BYTES))}, bitsandbytes, "
                    f"compressed-tensors, or a 'bits' field")


def kv_dtype_bytes(cfg: dict, where: str, model_dtype_bytes: float) -> float:
    """Bytes per KV-cache element: ``kv_cache_dtype`` (as vLLM's flag), a quantisation config's
    KV scheme (compressed-tensors ``kv_cache_scheme.num_bits``, ModelOpt ``kv_cache_quant_algo``),
    else the model's dtype (vLLM's ``auto``)."""
    if cfg.get("kv_cache_dtype") is not None:
        try:
            return kv_cache_dtype_bytes(cfg["kv_cache_dtype"], model_dtype_bytes)
        except SpecError as exc:
            raise SpecError(f"{where}: {exc}") from None
    q = cfg.get("quantization_config")
    if isinstance(q, dict):
        scheme = q.get("kv_cache_scheme")
        if isinstance(scheme, dict) and scheme.get("num_bits"):
            return check_number(scheme["num_bits"], "kv_cache_scheme.num_bits", where) / 8
        if str(q.get("kv_cache_quant_algo") or "").lower() == "fp8":
            return 1
    return model_dtype_bytes
