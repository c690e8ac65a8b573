"""The 2025-26 architectures against values computed by hand from their configs: gpt-oss's windowed
and full layers, Gemma 3's five-to-one windows, Llama 4 Maverick's interleaved MoE, Qwen3-Next's
linear-attention state; their KV bytes, per-sequence state, parameter counts, step cost and KV blocks."""
import json

import pytest

from replay.cost.cost_model import RooflineCostModel
from replay.cost.kv_capacity import kv_capacity_blocks
from schemas.cost_params import CostParams
from schemas.errors import SpecError, SpecFileError
from schemas.hf_config import count_params, model_from_hf_config
from schemas.specs import CATALOG_DIR, GpuSpec, get_model

GPU = GpuSpec(name="g", peak_flops=1e15, mem_bandwidth_bytes_per_s=2e12, mem_bytes=80 * 2**30)


def test_gpt_oss_120b_kv_of_windowed_and_full_layers():
    """36 layers alternating a 128-token window and full attention; 8 KV heads of 64, bf16 KV."""
    m = get_model("gpt-oss-120b")
    assert (m.num_window_layers, m.num_full_layers, m.sliding_window_tokens) == (18, 18, 128)
    per_layer = 2 * 8 * 64 * 2                       # keys and values of one token in one layer: 2,048 B
    assert m.kv_bytes_per_token == 18 * per_layer == 36_864
    assert m.seq_state_bytes_per_rank(1) == 18 * 128 * per_layer == 4_718_592
    # at 8k tokens of context: the full layers' 8,192 tokens plus the windows', against 36 full layers
    hybrid_bytes = 8192 * m.kv_bytes_per_token + m.seq_state_bytes_per_rank(1)
    all_full_bytes = 8192 * 36 * per_layer
    assert hybrid_bytes == 306_708_480 and all_full_bytes == 603_979_776
    # TP 8: one KV head per rank, the window's KV too
    assert m.kv_bytes_per_token_per_rank(8) == 18 * 2 * 1 * 64 * 2
    assert m.seq_state_bytes_per_rank(8) == 18 * 128 * 2 * 1 * 64 * 2
    # attention FLOPs: the full layers per context token, the windowed ones per token over 128
    assert m.attention_flops_per_context_token == 4 * 18 * 64 * 64 == 294_912
    assert m.bounded_attention_flops_per_token == 4 * 18 * 64 * 64 * 128 == 37_748_736


def test_gpt_oss_kv_blocks_at_8k_context_vs_a_full_attention_model():
    """The blocks count the full layers (16 tokens x 18 layers x 2,048 B = 589,824 B a block); the
    windows of max_num_seqs sequences are set aside first (:func:`kv_capacity_blocks`, Notes)."""
    m = get_model("gpt-oss-120b")
    gpu = GpuSpec(name="g", peak_flops=1e15, mem_bandwidth_bytes_per_s=2e12, mem_bytes=m.weight_bytes + 40e9)
    available = 40e9                                  # utilization 1: the memory beside the weights
    block = 16 * 18 * 2048
    # 64 sequences: 64 windows of 4,718,592 B set aside (well under available / (window + 128 tokens of KV))
    expected = int((available - 64 * 4_718_592) // block)
    assert kv_capacity_blocks(m, gpu, 1, 1.0, 16, max_num_seqs=64) == expected == 67_304
    # an 8k-token sequence takes 512 of these blocks and its window; with 36 full layers a block is
    # twice the bytes and the sequence 512 of them: about half the 8k sequences fit
    hybrid_seqs = kv_capacity_blocks(m, gpu, 1, 1.0, 16, max_num_seqs=64) // 512
    assert hybrid_seqs == 131
    assert int(available // (16 * 36 * 2048)) // 512 == 66


def test_the_set_aside_never_exceeds_the_memory():
    """Gemma 3 27B's 52 windowed layers hold 436 MB a sequence at its 1,024-token window: 256 of them
    would not fit beside the weights on 80 GiB; the set-aside stops at the sequences that fit with
    their window and as many tokens of full-attention KV, so the engine still starts."""
    m = get_model("gemma-3-27b")
    state = 52 * 1024 * (2 * 16 * 128 * 2)
    assert m.seq_state_bytes_per_rank(1) == state == 436_207_616
    assert m.kv_bytes_per_token == 10 * 2 * 16 * 128 * 2 == 81_920
    gpu = GpuSpec(name="g", peak_flops=1e15, mem_bandwidth_bytes_per_s=2e12, mem_bytes=m.weight_bytes + 18e9)
    seqs = int(18e9 // (state + 1024 * 81_920))      # 34
    assert seqs == 34
    blocks = kv_capacity_blocks(m, gpu, 1, 1.0, 16, max_num_seqs=256)
    assert blocks == int((18e9 - seqs * state) // (16 * 81_920)) > 0
    assert kv_capacity_blocks(m, gpu, 1, 1.0, 16, max_num_seqs=0) == int(18e9 // (16 * 81_920))


def test_qwen3_next_constant_state_per_sequence():
    """Gated DeltaNet layer: 32 value heads of 128 x 128 recurrent state, and a convolution window of
    kernel - 1 = 3 inputs of width 2 * 16 * 128 + 32 * 128 = 8,192; bf16; 36 such layers of 48."""
    m = get_model("qwen3-next-80b-a3b")
    assert (m.num_linear_layers, m.num_full_layers) == (36, 12)
    per_layer = 32 * 128 * 128 * 2 + 3 * 8192 * 2
    assert m.linear_state_bytes == per_layer == 1_097_728
    assert m.seq_state_bytes_per_rank(1) == 36 * per_layer == 39_518_208
    assert m.seq_state_bytes_per_rank(4) == 36 * per_layer / 4      # heads split over TP
    assert m.kv_bytes_per_token == 12 * 2 * 2 * 256 * 2 == 24_576
    assert m.linear_flops_per_token == 6 * 32 * 128 * 128 + 2 * 4 * 8192
    # the shape count equals the published one to the parameter (its model card's 80B / 3B)
    assert (m.num_params, m.num_active_params) == (79_674_391_296, 3_874_929_408)


def test_qwen3_next_state_read_per_sequence_in_the_step_time():
    """A decode step of 10 sequences over 10,000 tokens reads the full layers' KV per token and each
    sequence's 39.5 MB state: (10,000 * 24,576 + 10 * 39,518,208) B at 0.8 * 2e12 B/s."""
    cm = RooflineCostModel(get_model("qwen3-next-80b-a3b"), GPU, CostParams(eta_mem=0.8), terms=("kv_memory",))
    assert cm.step_time_s(0, 10, 10_000) == pytest.approx((10_000 * 24_576 + 10 * 39_518_208) / 1.6e12, rel=1e-12)
    # a prefill chunk is a sequence of the step too
    assert cm.step_time_s(100, 0, 0, 0, 1) == pytest.approx(39_518_208 / 1.6e12, rel=1e-12)


def test_llama4_maverick_moe_layer_map_and_weight_bytes():
    m = get_model("llama-4-maverick")
    assert (m.num_moe_layers, m.num_experts, m.num_experts_per_token) == (24, 128, 1)
    attention = 5120 * 5120 + 2 * 5120 * 1024 + 5120 * 5120 + 2 * 5120   # q, k, v, o and two norms
    expert = 3 * 5120 * 8192
    moe_layer = attention + 5120 * 128 + expert + 128 * expert         # router, shared and routed experts
    dense_layer = attention + 3 * 5120 * 16384                          # intermediate_size_mlp
    embeddings = 2 * 202_048 * 5120 + 5120                              # untied, and the final norm
    total = 24 * moe_layer + 24 * dense_layer + embeddings
    assert total == 400_711_848_960 == m.num_params
    assert m.weight_bytes == 2 * total
    assert m.expert_weight_bytes == 2 * expert
    cfg = json.loads((CATALOG_DIR / "models.json").read_text())["models"]
    cfg = cfg["llama-4-maverick"]["config"]["values"]
    assert count_params(cfg)[1] == total - 24 * 127 * expert            # one routed expert a token


def test_gemma3_defaults_and_windows_from_a_published_text_config(tmp_path):
    """gemma-3-27b-it's text_config leaves vocab_size and the window pattern to Gemma3TextConfig."""
    m = get_model("gemma-3-27b")
    assert (m.vocab_size, m.max_model_len, m.num_window_layers, m.sliding_window_tokens) == (262_208, 131_072, 52, 1024)
    attention = 5376 * 4096 + 2 * 5376 * 2048 + 4096 * 5376 + 2 * 128  # q, k, v, o, q_norm, k_norm
    layer = attention + 4 * 5376 + 3 * 5376 * 21504                     # four norms, gated MLP
    assert m.num_params == 62 * layer + 262_208 * 5376 + 5376           # tied embeddings


def test_layer_types_are_checked(tmp_path):
    cfg = json.loads((CATALOG_DIR / "models.json").read_text())["models"]
    values = dict(cfg["gpt-oss-20b"]["config"]["values"], layer_types=["full_attention"] * 23 + ["sparse"])
    path = tmp_path / "config.json"
    path.write_text(json.dumps(values))
    with pytest.raises(SpecFileError, match="layer_types"):
        model_from_hf_config(path)
    values["layer_types"] = ["sliding_attention"] * 24               # no full-attention layer left
    path.write_text(json.dumps(values))
    with pytest.raises(SpecFileError, match="at least one"):
        model_from_hf_config(path)


def test_a_wrapper_without_text_config_is_refused(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama4", "torch_dtype": "bfloat16"}))
    with pytest.raises(SpecFileError, match="text_config"):
        model_from_hf_config(path)


def test_llama4_chunked_layers_are_said_to_be_costed_as_full(tmp_path):
    cfg = json.loads((CATALOG_DIR / "models.json").read_text())["models"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**cfg["llama-4-scout"]["config"]["values"], "_name_or_path": "llama-4-scout"}))
    with pytest.warns(UserWarning, match="36 of 48 layers attend in chunks of 8192 tokens"):
        m = model_from_hf_config(path)
    assert m.num_full_layers == 48 and m.num_moe_layers == 48


def test_window_fields_must_agree():
    with pytest.raises(SpecError, match="sliding_window_tokens"):
        get_model("gpt-oss-20b").__class__(**{**get_model("gpt-oss-20b").to_dict(), "sliding_window_tokens": 0})


def test_catalog_says_which_layers_hold_a_state_per_sequence():
    from click.testing import CliRunner

    from calibrate.cli import main as calibrate_main

    out = CliRunner().invoke(calibrate_main, ["catalog"]).output
    assert "gpt-oss-120b: 18 windowed (128 tokens) of 36 layers" in out and "4.7 MB a sequence" in out
    assert "qwen3-next-80b-a3b: 36 linear-attention of 48 layers" in out and "39.5 MB" in out
    assert "llama-3.1-8b:" not in out  # full attention only: nothing outside KV B/token
