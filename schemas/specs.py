"""Model, GPU and link specs: the inputs of the cost model, and the built-in catalog.

This module gathers, under the import path callers have always used, the modules split by
concern:

- :mod:`schemas.spec_types`: :class:`ModelSpec`, its validation and the properties the cost
  model uses (weight bytes, KV bytes per token and per TP rank, MoE expert bytes, attention
  FLOPs);
- :mod:`schemas.gpu_types`: :class:`GpuSpec` (its peaks per precision) and :class:`Link`;
- :mod:`schemas.hf_config`: a Hugging Face ``config.json`` -> ``ModelSpec`` (dense, MoE, MLA);
- :mod:`schemas.dtypes`: bytes per weight, activation and KV element and the GEMM precision
  (``torch_dtype``, quantisation settings, vLLM's ``--kv-cache-dtype``);
- :mod:`schemas.spec_checks`: the value checks they share;
- :mod:`schemas.spec_catalog`: lookups in ``schemas/catalog/`` (``models.json``,
  ``gpus.json``, ``links.json``; every value with its source).

Every problem is raised as :class:`~schemas.errors.SpecError` with one clear message.
"""
from __future__ import annotations

from .dtypes import (
    KV_CACHE_DTYPE_BYTES,
    dtype_bytes,
    kv_cache_dtype_bytes,
    kv_dtype_bytes,
    weight_format,
)
from .hf_config import (
    count_params,
    model_from_hf_config,
    num_routed_experts,
    read_json,
    spec_from_config,
)
from .spec_catalog import (
    CATALOG_DIR,
    catalog_key,
    get_gpu,
    get_link,
    get_model,
    gpu_from_json,
    link_presets,
    list_gpus,
    list_links,
    list_models,
)
from .gpu_types import GpuSpec, Link
from .spec_types import ModelSpec

__all__ = [
    "CATALOG_DIR", "KV_CACHE_DTYPE_BYTES", "GpuSpec", "Link", "ModelSpec", "catalog_key", "count_params",
    "dtype_bytes", "get_gpu", "get_link", "get_model", "gpu_from_json",
    "kv_cache_dtype_bytes", "kv_dtype_bytes", "link_presets", "list_gpus", "list_links",
    "list_models", "model_from_hf_config", "num_routed_experts", "read_json", "spec_from_config",
    "weight_format",
]
