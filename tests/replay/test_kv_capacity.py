"""KV-cache capacity as vLLM sizes it (replay/cost/kv_capacity.py): cases NC-04 and NC-01."""
from __future__ import annotations

import pytest

from replay.errors import ConfigError
from replay.cost.kv_capacity import kv_block_bytes_per_rank, kv_capacity_blocks
from schemas.specs import GpuSpec, ModelSpec

GiB = 2**30


def nc04_model(**kw) -> ModelSpec:
    """32 layers, 8 KV heads, head_dim 128, bf16; 8 Gi parameters = 16 GiB of weights."""
    return ModelSpec(name="nc04", num_params=8 * GiB, num_active_params=8 * GiB, num_layers=32,
                     hidden_size=4096, num_attention_heads=32, num_kv_heads=8, head_dim=128,
                     dtype_bytes=2, max_model_len=32768, **kw)


GPU_80 = GpuSpec("80gib", 1e15, 2e12, 80 * GiB)             # 85,899,345,920 B
NON_KV = dict(activation_bytes=1.5 * GiB, non_torch_bytes=0.5 * GiB)   # + 16 GiB weights = 18 GiB


def test_nc04_block_bytes():
    assert kv_block_bytes_per_rank(nc04_model(), 1, 16) == 32 * 16 * 2 * 8 * 128 * 2 == 2_097_152


@pytest.mark.parametrize("util,blocks", [(0.90, 27_648), (0.95, 29_696)])
def test_nc04_blocks_follow_the_utilization(util, blocks):
    # (80 GiB * util - 18 GiB) / 2 MiB: 54 GiB -> 27,648; 58 GiB -> 29,696
    n = kv_capacity_blocks(nc04_model(), GPU_80, 1, util, 16, **NON_KV)
    assert n == blocks
    assert n * 16 == {0.90: 442_368, 0.95: 475_136}[util]
    assert n * 16 / 32768 == {0.90: 13.5, 0.95: 14.5}[util]      # max concurrency at 32,768


def test_nc04_fp8_kv_doubles_the_blocks_and_block_64_keeps_the_tokens():
    fp8 = nc04_model().with_kv_cache_dtype("fp8")
    assert kv_capacity_blocks(fp8, GPU_80, 1, 0.90, 16, **NON_KV) == 55_296    # 884,736 tokens
    assert kv_capacity_blocks(nc04_model(), GPU_80, 1, 0.90, 64, **NON_KV) == 6_912  # 442,368 tokens


def test_nc04_80_gb_read_as_decimal_is_wrong():
    decimal = GpuSpec("80gb", 1e15, 2e12, 80e9)
    assert kv_capacity_blocks(nc04_model(), decimal, 1, 0.90, 16, **NON_KV) == 25_116


def test_nc04_engine_does_not_start_when_free_memory_is_short():
    # another process holds 5 GiB: 75 GiB free < 76 GiB requested at 0.95
    with pytest.raises(ConfigError, match="vLLM refuses to start"):
        kv_capacity_blocks(nc04_model(), GPU_80, 1, 0.95, 16, free_bytes=75 * GiB, **NON_KV)
    # at 0.90 the request (72 GiB) fits in 75 GiB free: blocks as usual, not from free memory
    assert kv_capacity_blocks(nc04_model(), GPU_80, 1, 0.90, 16, free_bytes=75 * GiB,
                              **NON_KV) == 27_648


def test_nc01_capacity_and_replicated_heads_under_tp():
    # 36 layers, 8 KV heads, head_dim 128: 147,456 B/token; a 20 GiB KV budget per GPU
    m = ModelSpec(name="nc01", num_params=4e9, num_active_params=4e9, num_layers=36,
                  hidden_size=2560, num_attention_heads=32, num_kv_heads=8, head_dim=128,
                  dtype_bytes=2, max_model_len=40960)
    assert kv_block_bytes_per_rank(m, 1, 16) == 2_359_296
    gpu = GpuSpec("g", 1e15, 2e12, 20 * GiB + 8e9)                # 20 GiB beside 8e9 B of weights
    assert kv_capacity_blocks(m, gpu, 1, 1.0, 16) == 9_102       # 145,632 tokens
    assert 9_102 * 16 == 145_632
    # TP 16: each GPU holds 1/16 of the weights but a whole (replicated) KV head per layer
    assert kv_block_bytes_per_rank(m, 16, 16) == 16 * 18_432
    gpu16 = GpuSpec("g16", 1e15, 2e12, 20 * GiB + 8e9 / 16)
    assert kv_capacity_blocks(m, gpu16, 16, 1.0, 16) == 20 * GiB // (16 * 18_432) == 72_817


def test_bad_options_and_weights_that_do_not_fit():
    with pytest.raises(ConfigError, match=r"gpu_memory_utilization must be in \(0, 1\]"):
        kv_capacity_blocks(nc04_model(), GPU_80, 1, 1.2, 16)
    with pytest.raises(ConfigError, match="block_size"):
        kv_capacity_blocks(nc04_model(), GPU_80, 1, 0.9, 0)
    small = GpuSpec("small", 1e15, 2e12, 16 * GiB)
    with pytest.raises(ValueError, match="do not fit"):
        kv_capacity_blocks(nc04_model(), small, 1, 0.9, 16)
