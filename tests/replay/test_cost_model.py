"""The roofline against hand-computed values (seed theory.md sections 1-2; BR-23)."""
from dataclasses import replace
import numpy as np
import pytest

from replay.cost.cost_model import LINKS, RooflineCostModel, kv_transfer_time_s
from replay.cost.kv_capacity import kv_capacity_blocks
from replay.cost.cost_terms import SEED_TERMS
from schemas.cost_params import CostParams
from schemas.specs import GpuSpec, ModelSpec, get_gpu, get_model


@pytest.fixture
def qwen_a100():
    # Seed's example model, Qwen2.5-1.5B (P = 1.54e9, bf16), on an A100-80GB SXM (312 TFLOP/s, 2039 GB/s).
    return RooflineCostModel(get_model("qwen2.5-1.5b"), get_gpu("a100-80gb"),
                             CostParams(eta_compute=0.5, eta_mem=1.0, t_step_s=1e-4), terms=SEED_TERMS)


def test_seed_prefill_is_compute_bound(qwen_a100):
    # 2 * 1.54e9 * 512 / (0.5 * 312e12) = 1.576960e12 / 1.56e14 = 10.10872 ms; weights 3.08e9 B / 2.039e12 = 1.5106 ms
    assert qwen_a100.prefill_time_s(512) == pytest.approx(1e-4 + 10.108718e-3, rel=1e-6)


def test_seed_prefill_of_few_tokens_is_memory_bound(qwen_a100):
    # N = 8: compute 2*1.54e9*8/1.56e14 = 0.15795 ms < memory 3.08e9/2.039e12 = 1.510544 ms
    assert qwen_a100.prefill_time_s(8) == pytest.approx(1e-4 + 1.510544e-3, rel=1e-6)


def test_seed_decode(qwen_a100):
    # D_kv = 2 * 28 layers * 2 kv heads * 128 * 2 B = 28672 B/token.
    # B = 8 sequences holding 1000 tokens each: (3.08e9 + 8000 * 28672) / 2.039e12 = 3.309376e9 / 2.039e12
    assert qwen_a100.model.kv_bytes_per_token == 28672
    assert qwen_a100.decode_time_s(8, 8000) == pytest.approx(1e-4 + 1.623039e-3, rel=1e-6)


def test_decode_never_below_compute_bound(qwen_a100):
    # B = 2048 sequences of 1 token: compute 2*1.54e9*2048/1.56e14 = 40.4349 ms > memory ~1.54 ms
    assert qwen_a100.decode_time_s(2048, 2048) == pytest.approx(1e-4 + 40.434872e-3, rel=1e-6)


def test_mixed_step_is_one_launch_and_max_of_bounds(qwen_a100):
    c = 2 * 1.54e9 * (1000 + 16) / (0.5 * 312e12)
    m = (3.08e9 + (16 * 500 + 200) * 28672) / 2.039e12
    got = qwen_a100.step_time_s(1000, 16, 16 * 500, 200)
    assert got == pytest.approx(1e-4 + max(c, m), rel=1e-12)


def test_sum_form_and_cpu_overhead(qwen_a100):
    cm = qwen_a100.with_params(CostParams(eta_compute=0.5, eta_mem=0.8, t_step_s=0.0011, overlap=1.0))
    c = 2 * 1.54e9 * 100 / (0.5 * 312e12)
    m = 3.08e9 / (0.8 * 2.039e12)
    assert cm.prefill_time_s(100) == pytest.approx(1e-4 + 1e-3 + c + m, rel=1e-12)


def test_empty_step_takes_no_time(qwen_a100):
    assert qwen_a100.step_time_s(0, 0, 0) == 0.0


def test_vectorised_equals_scalar(qwen_a100):
    n = np.array([0, 1, 100, 2048])
    b = np.array([0, 5, 0, 16])
    ctx = np.array([0, 5000, 0, 20000])
    vec = qwen_a100.step_time_s(n, b, ctx)
    assert vec.tolist() == [qwen_a100.step_time_s(int(x), int(y), int(z)) for x, y, z in zip(n, b, ctx)]


def test_kv_transfer_seed_section_2():
    # Llama-3.1-8B D_kv = 131072 B; 1000 tokens over 100 GbE (12.5e9 B/s, 10 us): 1.31072e8/1.25e10 + 1e-5 s
    m = get_model("llama-3.1-8b")
    assert kv_transfer_time_s(1000, m, LINKS["100gbe"]) == pytest.approx(0.01048576 + 1e-5, rel=1e-12)


def _br23_model():
    return ModelSpec(name="8b", num_params=8e9, num_active_params=8e9, num_layers=32, hidden_size=4096,
                     num_attention_heads=32, num_kv_heads=8, head_dim=128, dtype_bytes=2, max_model_len=8192)


def test_br23_tp_splits_compute_and_memory_per_phase():
    gpu = GpuSpec(name="g", peak_flops=1e15, mem_bandwidth_bytes_per_s=3e12, mem_bytes=80e9)
    p = CostParams(eta_compute=0.5, eta_mem=0.75, t_step_s=0.0)
    tp2 = RooflineCostModel(_br23_model(), gpu, p, tp=2, terms=SEED_TERMS)
    tp1 = RooflineCostModel(_br23_model(), gpu, p, tp=1, terms=SEED_TERMS)
    # prefill FLOPs 1.6e13 on TP2: 16 ms (TP1: 32 ms), communication ignored
    assert tp2.eval_components(1000, 0, 0)["dense_compute"] == pytest.approx(0.016)
    assert tp1.eval_components(1000, 0, 0)["dense_compute"] == pytest.approx(0.032)
    # decode weights 16e9 B at 0.75 * 3e12: 7.11 ms on TP1, 3.56 ms on TP2 (KV reads ignored)
    assert tp1.eval_components(0, 1, 0)["weight_memory"] == pytest.approx(16e9 / 2.25e12)
    assert tp2.eval_components(0, 1, 0)["weight_memory"] == pytest.approx(16e9 / 4.5e12)


def test_tp_adds_an_allreduce_per_layer_half():
    """Two all-reduces a layer of 100 tokens x 4,096 x 2 B at TP 4: the ring's bytes 2 (4-1)/4 at
    450 GB/s; the latency 2 (4-1) steps of 2 us over PCIe-like links, 2 steps over NVLink through
    NVSwitch (fully connected: vLLM's custom all-reduce)."""
    gpu = GpuSpec(name="g", peak_flops=1e15, mem_bandwidth_bytes_per_s=3e12, mem_bytes=80e9)
    size = 100 * 4096 * 2
    nvlink = RooflineCostModel(_br23_model(), gpu, CostParams(t_step_s=0.0), tp=4, tp_link=LINKS["nvlink4"])
    assert nvlink.eval_components(0, 100, 0)["tp_comm"] == pytest.approx(2 * 32 * (2 * 3 / 4 * size / 450e9 + 2 * 2e-6))
    ring = RooflineCostModel(_br23_model(), gpu, CostParams(t_step_s=0.0), tp=4,
                             tp_link=replace(LINKS["nvlink4"], fully_connected=False))
    ring_each = 2 * 3 / 4 * size / 450e9 + 2 * 3 * 2e-6
    assert ring.eval_components(0, 100, 0)["tp_comm"] == pytest.approx(2 * 32 * ring_each)


def test_kv_capacity_like_vllm():
    # (96 GiB * 0.9 - 8.03e9 * 2 B) / (16 * 131072 B) blocks
    m, g = get_model("llama-3.1-8b"), get_gpu("rtx-pro-6000")
    expected = int((96 * 2**30 * 0.9 - m.num_params * 2) // (16 * 131072))
    assert kv_capacity_blocks(m, g, 1, 0.9, 16) == expected
    with pytest.raises(ValueError, match="do not fit"):
        kv_capacity_blocks(get_model("llama-2-70b"), get_gpu("rtx-4090"), 1, 0.9, 16)


def test_bad_params_rejected():
    with pytest.raises(ValueError):
        CostParams(eta_compute=0.0)
    with pytest.raises(ValueError):
        CostParams(overlap=1.5)
    with pytest.raises(ValueError):
        CostParams(form="min")
