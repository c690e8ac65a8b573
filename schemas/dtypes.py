"""Element widths: bytes per weight, per activation and per KV-cache element; the GEMM precision.

Read from a Hugging Face ``config.json`` (``torch_dtype``; ``quantization_config`` or
``quantization`` for the weights and the precision their GEMMs run in; ``kv_cache_dtype`` or a
quantisation config's KV scheme for the cache) or from vLLM's ``--kv-cache-dtype`` value. Every problem is one
:class:`~schemas.errors.SpecError` naming the file and the field.
"""
from __future__ import annotations

from typing import Any

from .errors import SpecError
from .spec_checks import check_number

#: torch_dtype -> bytes per element.
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}

#: GEMM precisions of a model's linear layers (:attr:`~schemas.spec_types.ModelSpec.gemm_precision`)
#: and of a GPU's tensor-core peaks (:meth:`~schemas.spec_types.GpuSpec.peak_flops_for`), widest first.
GEMM_PRECISIONS = ("bf16", "fp8", "fp4")


def fp4_weight_bytes(group_size: int) -> float:
    """Bytes per weight of a block-scaled FP4 format: a 4-bit E2M1 element plus one 8-bit scale
    per ``group_size`` elements [bytes]. MXFP4 (OCP Microscaling Formats v1.0: an E8M0 scale
    per 32) -> 4.25 bits = 0.53125 B; NVFP4 (NVIDIA: an E4M3 scale per 16, and one FP32 scale
    per tensor, negligible) -> 4.5 bits = 0.5625 B."""
    return (4 + 8 / group_size) / 8


#: Bytes per weight of gpt-oss's MXFP4 experts and of NVFP4 weights, their scales included.
MXFP4_BYTES = fp4_weight_bytes(32)
NVFP4_BYTES = fp4_weight_bytes(16)

#: quantisation method (``quant_method``, ModelOpt's ``quant_algo`` or vLLM's ``--quantization``)
#: -> bytes per weight, when the config does not state the bits. ``mxfp4`` is read apart (only
#: the routed experts are MXFP4: :func:`weight_format`).
_QUANT_BYTES = {"fp8": 1, "fbgemm_fp8": 1, "ptpc_fp8": 1, "int8": 1, "w8a8": 1, "smoothquant": 1,
                "experts_int8": 1, "int4": 0.5, "w4a16": 0.5, "awq": 0.5, "awq_marlin": 0.5,
                "gptq": 0.5, "gptq_marlin": 0.5, "marlin": 0.5, "nvfp4": NVFP4_BYTES,
                "modelopt_fp4": NVFP4_BYTES}

#: quantisation methods whose GEMMs multiply quantised weights by quantised activations
#: (vLLM's W8A8 FP8 and W4A4 NVFP4 linear methods) -> their precision; every other method is
#: weight-only (the weights are dequantised to BF16 in the kernel: AWQ, GPTQ, Marlin, int8
#: weight-only, MXFP4) or int8 W8A8, priced at BF16 (the catalog has no INT8 peak).
_QUANT_PRECISION = {"fp8": "fp8", "fbgemm_fp8": "fp8", "ptpc_fp8": "fp8", "nvfp4": "fp4",
                    "modelopt_fp4": "fp4"}

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


def weight_format(cfg: dict, where: str) -> dict:
    """Bytes per weight and the GEMM precision: from ``quantization_config`` (or
    ``quantization``), else ``torch_dtype`` (bytes) and BF16.

    Returns
    -------
    dict
        The :class:`~schemas.spec_types.ModelSpec` fields ``weight_dtype_bytes`` (every weight
        but the routed experts') [bytes], ``expert_weight_dtype_bytes`` (the routed experts')
        [bytes] and ``gemm_precision`` (``"bf16"``, ``"fp8"`` or ``"fp4"``).

    Raises
    ------
    SpecError
        For a quantisation method whose weight width is not known, naming ``where``.

    Notes
    -----
    Bytes: fp8 and int8 -> 1; int4, AWQ and GPTQ -> ``bits / 8`` (0.5 for their usual 4 bits);
    bitsandbytes ``load_in_4bit``/``load_in_8bit`` -> 0.5/1; compressed-tensors -> the first
    config group's ``weights.num_bits / 8``, or for FP4 weights (``type: float``, 4 bits)
    :func:`fp4_weight_bytes` of its ``group_size`` (16: NVFP4); ModelOpt (``quant_method:
    modelopt``) by its ``quant_algo``: ``FP8`` -> 1, ``NVFP4`` -> 0.5625; an MLX-style
    ``{"bits": b}`` -> ``b / 8``. ``mxfp4`` (gpt-oss): the routed experts 0.53125 (MXFP4), every
    other weight ``torch_dtype`` (vLLM's MXFP4 method quantises only the fused MoE layers;
    gpt-oss's ``modules_to_not_convert`` lists attention, router, embeddings and lm_head).
    The integer formats' scales (a 16-bit scale per 128 weights, 3%) and the weights a
    checkpoint leaves unquantised (embeddings, often the lm_head) are not counted; the FP4
    formats' scales (6% and 12.5% of a 4-bit weight) are.

    Precision: the tensor-core precision of the GEMMs where the GPU has it (vLLM's W8A8 and
    W4A4 kernels): ``fp8``/``fbgemm_fp8``/``ptpc_fp8``, ModelOpt ``FP8`` and compressed-tensors
    with float 8-bit weights AND input activations -> ``fp8``; NVFP4 (ModelOpt ``NVFP4``,
    compressed-tensors float 4-bit weights and activations) -> ``fp4``. Weight-only schemes
    (AWQ, GPTQ, int4/int8 weight-only, bitsandbytes, and ``mxfp4``, which vLLM runs W4A16 by
    default) dequantise to BF16 in the kernel -> ``bf16``; so is int8 W8A8 (no INT8 peak).
    """
    q = cfg.get("quantization_config", cfg.get("quantization"))
    if q is None:
        return _format(dtype_bytes(cfg, where))
    if isinstance(q, str):
        q = {"quant_method": q}
    if not isinstance(q, dict):
        raise SpecError(f"{where}: field 'quantization_config' must be an object or a string, "
                        f"got {q!r}")
    method = str(q.get("quant_method") or q.get("quant_algo") or "").lower()
    if method == "modelopt":          # NVIDIA ModelOpt names its scheme in quant_algo
        method = str(q.get("quant_algo") or "").lower()
        if method not in ("fp8", "nvfp4"):
            raise SpecError(f"{where}: field 'quantization_config.quant_algo' of a ModelOpt "
                            f"checkpoint is {q.get('quant_algo')!r}; supported: FP8, NVFP4")
    if method == "mxfp4":
        return _format(dtype_bytes(cfg, where), expert=MXFP4_BYTES)
    if method == "bitsandbytes" or q.get("load_in_4bit") or q.get("load_in_8bit"):
        return _format(0.5 if q.get("load_in_4bit") else 1)
    bits = q.get("bits", q.get("w_bit", q.get("weight_bits")))
    precision = _QUANT_PRECISION.get(method, "bf16")
    if method == "compressed-tensors":
        groups = [g for g in (q.get("config_groups") or {}).values() if isinstance(g, dict)]
        weights, acts = (_scheme(groups[0], "weights"), _scheme(groups[0], "input_activations")) \
            if groups else ({}, {})
        bits = weights.get("num_bits")
        w_float, a_float = _float_bits(weights), _float_bits(acts)   # W8A8 or W4A4 in float?
        precision = "fp8" if w_float == a_float == 8 else "fp4" if w_float == a_float == 4 else "bf16"
        if w_float == 4:
            group = check_number(weights.get("group_size") or 16, "weights.group_size", where)
            return _format(fp4_weight_bytes(group), precision=precision)
    if bits is not None:
        return _format(check_number(bits, "quantization_config.bits", where) / 8, precision=precision)
    if method in _QUANT_BYTES:
        return _format(_QUANT_BYTES[method], precision=precision)
    raise SpecError(f"{where}: quantization method {method or q!r} is not supported (weight width "
                    f"unknown); supported: {', '.join(sorted(_QUANT_BYTES))}, mxfp4, "
                    f"bitsandbytes, compressed-tensors, modelopt (FP8, NVFP4), or a 'bits' field")


def _format(weight_bytes: float, expert: float | None = None, precision: str = "bf16") -> dict:
    """:func:`weight_format`'s dict; the routed experts as the other weights unless ``expert``."""
    return {"weight_dtype_bytes": weight_bytes,
            "expert_weight_dtype_bytes": weight_bytes if expert is None else expert,
            "gemm_precision": precision}


def _scheme(group: dict, key: str) -> dict:
    """A compressed-tensors config group's ``weights`` or ``input_activations`` scheme ({} if none)."""
    scheme = group.get(key)
    return scheme if isinstance(scheme, dict) else {}


def _float_bits(scheme: dict) -> Any:
    """A compressed-tensors scheme's ``num_bits`` if its type is float, else None."""
    return scheme.get("num_bits") if str(scheme.get("type") or "").lower() == "float" else None


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
