"""Hand-computed tests of the ModelSpec properties the cost model uses (schemas/spec_types.py),
of MoE/MLA/quantised config.json reading (schemas/hf_config.py, schemas/dtypes.py), of the
catalog entries added with them, of the link presets, and of old calibration files loading.

Every expected number is written out as the arithmetic it comes from.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from schemas.calibration import Calibration, FittedParam
from schemas.errors import SpecError
from schemas.specs import (
    CATALOG_DIR,
    GpuSpec,
    Link,
    ModelSpec,
    get_gpu,
    get_link,
    get_model,
    link_presets,
    list_links,
    list_models,
    model_from_hf_config,
    spec_from_config,
)

DATA = Path(__file__).parents[1] / "data"
QWEN3_30B_A3B = "hf_config_qwen3_30b_a3b_instruct_2507.json"

# NC-01's config (Qwen3-4B's attention shapes: head_dim 128 given, not 2560/32 = 80).
NC01 = {"model_type": "qwen3", "num_hidden_layers": 36, "hidden_size": 2560,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "intermediate_size": 9728, "vocab_size": 151936, "max_position_embeddings": 40960,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16"}


def write_json(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    return path


# ----------------------------------------------------------------------------- NC-01

def test_nc01_kv_bytes_per_token_and_per_rank():
    m = spec_from_config(NC01, "nc01")
    assert m.head_dim == 128                                      # not 2560 // 32 = 80
    assert m.kv_bytes_per_token == 2 * 36 * 8 * 128 * 2 == 147_456
    assert m.kv_bytes_per_token_per_rank(1) == 147_456
    assert m.kv_bytes_per_token_per_rank(2) == 2 * 36 * 4 * 128 * 2 == 73_728
    assert m.kv_bytes_per_token_per_rank(8) == 2 * 36 * 1 * 128 * 2 == 18_432
    # TP 16 > 8 KV heads: one (replicated) head per rank, not 147,456 / 16 = 9,216
    assert m.kv_bytes_per_token_per_rank(16) == 18_432
    with pytest.raises(SpecError, match="'tp'"):
        m.kv_bytes_per_token_per_rank(0)


def test_nc01_fp8_kv_halves_the_bytes():
    m = spec_from_config(NC01, "nc01").with_kv_cache_dtype("fp8")
    assert (m.kv_dtype_bytes, m.dtype_bytes, m.weight_dtype_bytes) == (1, 2, 2)
    assert m.kv_bytes_per_token == 2 * 36 * 8 * 128 * 1 == 73_728
    assert spec_from_config(dict(NC01, kv_cache_dtype="fp8_e5m2"), "x").kv_bytes_per_token == 73_728
    assert spec_from_config(NC01, "x").with_kv_cache_dtype("auto").kv_dtype_bytes == 2
    with pytest.raises(SpecError, match="kv_cache_dtype 'fp4' is not supported"):
        spec_from_config(NC01, "x").with_kv_cache_dtype("fp4")


def test_dense_attention_flops_and_weight_split():
    m = spec_from_config(NC01, "nc01")
    assert m.attention_flops_per_context_token == 4 * 36 * 32 * 128 == 589_824
    assert (m.num_moe_layers, m.expert_weight_bytes) == (0, 0)
    assert m.dense_weight_bytes == m.weight_bytes == m.num_params * 2
    assert (m.intermediate_size, m.vocab_size) == (9728, 151936)


# ----------------------------------------------------------------------------- Qwen3-30B-A3B (MoE)

def test_qwen3_30b_a3b_real_config(real_data_dir):
    m = model_from_hf_config(real_data_dir / QWEN3_30B_A3B)
    # attention per layer: q 2048*4096 + k,v 2*2048*512 + o 4096*2048 + q/k norms 2*128
    attn = 2048 * 4096 + 2 * 2048 * 512 + 4096 * 2048 + 2 * 128
    assert attn == 18_874_624
    expert = 3 * 2048 * 768                                       # gate, up, down
    router = 2048 * 128
    outer = 151936 * 2048 * 2 + 2048                              # embeddings, lm_head, final norm
    total = 48 * (attn + 2 * 2048 + router + 128 * expert) + outer
    active = 48 * (attn + 2 * 2048 + router + 8 * expert) + outer
    assert (m.num_params, m.num_active_params) == (total, active) == (30_532_122_624, 3_353_032_704)
    assert (m.num_experts, m.num_experts_per_token, m.num_moe_layers) == (128, 8, 48)
    assert (m.moe_intermediate_size, m.intermediate_size, m.vocab_size) == (768, 6144, 151936)
    assert m.weight_bytes == 2 * 30_532_122_624 == 61_064_245_248
    assert m.expert_weight_bytes == 3 * 2048 * 768 * 2 == 9_437_184
    # everything but the 48 x 128 routed experts: attention, norms, routers, embeddings
    dense_params = 48 * (attn + 2 * 2048 + router) + outer
    assert dense_params == 1_541_093_376
    assert m.dense_weight_bytes == 2 * dense_params == 3_082_186_752
    assert m.dense_weight_bytes == m.weight_bytes - 48 * 128 * m.expert_weight_bytes
    assert m.kv_bytes_per_token == 2 * 48 * 4 * 128 * 2 == 98_304
    assert m.kv_bytes_per_token_per_rank(2) == 49_152
    assert m.kv_bytes_per_token_per_rank(8) == m.kv_bytes_per_token_per_rank(4) == 24_576
    assert m.attention_flops_per_context_token == 4 * 48 * 32 * 128 == 786_432
    assert m.max_model_len == 262144 and not m.is_mla


def test_qwen3_30b_a3b_catalog_is_the_real_config(real_data_dir):
    real = json.loads((real_data_dir / QWEN3_30B_A3B).read_text())
    catalog = json.loads((CATALOG_DIR / "models.json").read_text())["models"]["qwen3-30b-a3b"]
    for key, value in catalog["config"]["values"].items():
        assert real[key] == value, key                            # verbatim
    from_file = model_from_hf_config(real_data_dir / QWEN3_30B_A3B)
    assert get_model("Qwen/Qwen3-30B-A3B-Instruct-2507") == replace(from_file, name="qwen3-30b-a3b")


def test_moe_layer_rules(tmp_path):
    base = {"model_type": "qwen3_moe", "hidden_size": 64, "moe_intermediate_size": 32,
            "intermediate_size": 128, "num_experts": 4, "num_experts_per_tok": 2,
            "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 100, "max_position_embeddings": 256}
    # Qwen3-MoE: layers 1, 3, 5 sparse (step 2), minus mlp_only_layers [3]
    m = spec_from_config(dict(base, decoder_sparse_step=2, mlp_only_layers=[3]), "q")
    assert m.num_moe_layers == 2
    # DeepSeek: first 2 dense, then every layer
    m = spec_from_config(dict(base, model_type="deepseek", first_k_dense_replace=2), "d")
    assert m.num_moe_layers == 4
    # the routed experts are all that the dense bytes leave out
    assert m.dense_weight_bytes == m.weight_bytes - 4 * 4 * (3 * 64 * 32 * 2)


# ----------------------------------------------------------------------------- DeepSeek-V2-Lite (MLA + MoE)

def test_deepseek_v2_lite_mla_config():
    m = model_from_hf_config(DATA / "hf_config_deepseek_v2_lite.json")
    assert m.is_mla and (m.kv_lora_rank, m.qk_rope_head_dim) == (512, 64)
    assert m.head_dim == 128 + 64                                 # q/k head: nope + rope
    # the cache holds one 512 + 64 latent per token and layer, whatever the heads or TP
    assert m.kv_bytes_per_token == 27 * (512 + 64) * 2 == 31_104
    assert m.kv_bytes_per_token_per_rank(4) == 31_104
    assert m.with_kv_cache_dtype("fp8").kv_bytes_per_token == 27 * 576 * 1 == 15_552
    # scores over q/k heads of 192, values of 128: 2 * layers * heads * (192 + 128)
    assert m.attention_flops_per_context_token == 2 * 27 * 16 * (128 + 64 + 128) == 276_480
    # parameters: MLA attention (no q LoRA) per layer
    attn = 2048 * 16 * 192 + 2048 * (512 + 64) + 512 + 512 * 16 * (128 + 128) + 16 * 128 * 2048
    assert attn == 13_763_072
    expert = 3 * 2048 * 1408
    moe_mlp = 64 * expert + 2 * expert + 2048 * 64                # routed, 2 shared, router
    dense_mlp = 3 * 2048 * 10944                                  # layer 0 (first_k_dense_replace 1)
    outer = 102400 * 2048 * 2 + 2048
    total = 27 * (attn + 2 * 2048) + dense_mlp + 26 * moe_mlp + outer
    active = 27 * (attn + 2 * 2048) + dense_mlp + 26 * (6 * expert + 2 * expert + 2048 * 64) + outer
    assert (m.num_params, m.num_active_params) == (total, active) == (15_706_484_224, 2_661_150_208)
    # DeepSeek-V2 paper: 15.7B total (2.4B activated counts no embeddings)
    assert m.num_params == pytest.approx(15.7e9, rel=0.005)
    assert (m.num_experts, m.num_experts_per_token, m.num_moe_layers) == (64, 6, 26)
    assert m.expert_weight_bytes == 3 * 2048 * 1408 * 2 == 17_301_504
    assert m.dense_weight_bytes == 2 * (total - 26 * 64 * expert) == 2_623_265_792
    assert (m.intermediate_size, m.moe_intermediate_size, m.vocab_size) == (10944, 1408, 102400)


def test_deepseek_v3_q_lora_and_spec_round_trip(tmp_path):
    cfg = json.loads((DATA / "hf_config_deepseek_v2_lite.json").read_text())
    cfg.update(model_type="deepseek_v3", q_lora_rank=64, topk_method="noaux_tc")
    m = model_from_hf_config(write_json(tmp_path / "v3" / "config.json", cfg))
    lite = model_from_hf_config(DATA / "hf_config_deepseek_v2_lite.json")
    # q_proj 2048*16*192 becomes q_a 2048*64 + its norm 64 + q_b 64*16*192; plus a bias per expert
    delta = 27 * ((2048 * 64 + 64 + 64 * 16 * 192) - 2048 * 16 * 192) + 26 * 64
    assert m.num_params - lite.num_params == delta
    assert ModelSpec.from_dict(json.loads(json.dumps(m.to_dict()))) == m


def test_deepseek_v3_shapes_give_the_published_counts():
    """DeepSeek-V3's config.json shapes (fp8 weights): 671B total, 37B activated (the V3 report;
    the 14B multi-token-prediction module is not counted), 70,272 B of latent KV per token."""
    cfg = {"model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61,
           "num_attention_heads": 128, "num_key_value_heads": 128, "q_lora_rank": 1536,
           "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
           "intermediate_size": 18432, "moe_intermediate_size": 2048, "n_routed_experts": 256,
           "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
           "moe_layer_freq": 1, "topk_method": "noaux_tc", "vocab_size": 129280,
           "max_position_embeddings": 163840, "tie_word_embeddings": False,
           "torch_dtype": "bfloat16", "num_nextn_predict_layers": 1,
           "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                   "weight_block_size": [128, 128]}}
    m = spec_from_config(cfg, "deepseek-v3")
    assert m.num_params == pytest.approx(671e9, rel=0.001)
    assert m.num_active_params == pytest.approx(37e9, rel=0.02)
    assert m.kv_bytes_per_token == 61 * (512 + 64) * 2 == 70_272
    assert (m.num_moe_layers, m.weight_dtype_bytes, m.dtype_bytes) == (58, 1, 2)
    assert m.expert_weight_bytes == 3 * 7168 * 2048 * 1 == 44_040_192


def test_mla_needs_its_head_dims():
    cfg = json.loads((DATA / "hf_config_deepseek_v2_lite.json").read_text())
    with pytest.raises(SpecError, match="missing field 'v_head_dim'"):
        spec_from_config({k: v for k, v in cfg.items() if k != "v_head_dim"}, "x", "cfg.json")
    with pytest.raises(SpecError, match="kv_lora_rank .* not 'llama'"):
        spec_from_config(dict(NC01, model_type="llama", kv_lora_rank=512), "x")


# ----------------------------------------------------------------------------- quantised weights

@pytest.mark.parametrize("quant,expected", [
    ({"quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                              "weight_block_size": [128, 128]}}, 1),
    ({"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128,
                              "zero_point": True, "version": "gemm"}}, 0.5),
    ({"quantization_config": {"quant_method": "gptq", "bits": 8, "group_size": 128}}, 1),
    ({"quantization_config": {"quant_method": "gptq"}}, 0.5),
    ({"quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}}, 0.5),
    ({"quantization_config": {"quant_method": "compressed-tensors", "config_groups": {
        "group_0": {"weights": {"num_bits": 8, "type": "float"}}}}}, 1),
    ({"quantization": "int8"}, 1),
    ({"quantization": "int4"}, 0.5),
    ({"quantization": {"bits": 4, "group_size": 64}}, 0.5),   # MLX
    ({}, 2),
])
def test_weight_dtype_from_quantization(quant, expected):
    m = spec_from_config(dict(NC01, **quant), "q")
    assert m.weight_dtype_bytes == expected
    assert m.weight_bytes == m.num_params * expected
    assert (m.dtype_bytes, m.kv_dtype_bytes) == (2, 2)             # activations, KV stay bf16


def test_fp8_moe_expert_bytes_and_kv_scheme():
    cfg = json.loads((DATA / "hf_config_deepseek_v2_lite.json").read_text())
    cfg["quantization_config"] = {"quant_method": "compressed-tensors", "config_groups": {
        "g": {"weights": {"num_bits": 8}}}, "kv_cache_scheme": {"num_bits": 8, "type": "float"}}
    m = spec_from_config(cfg, "lite-fp8")
    assert m.expert_weight_bytes == 3 * 2048 * 1408 * 1
    assert m.kv_bytes_per_token == 27 * 576 * 1


def test_unknown_quantization_is_named():
    with pytest.raises(SpecError, match=r"cfg\.json: quantization method 'hqq' is not supported"):
        spec_from_config(dict(NC01, quantization_config={"quant_method": "hqq"}), "x", "cfg.json")


# ----------------------------------------------------------------------------- old calibration files

OLD_MIXTRAL = {"name": "mixtral-8x7b", "num_params": 46.7e9, "num_active_params": 12.9e9,
               "num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_kv_heads": 8,
               "head_dim": 128, "dtype_bytes": 2, "max_model_len": 32768, "num_experts": 8,
               "num_experts_per_token": 2}


def test_old_model_dict_loads_with_defaults():
    m = ModelSpec.from_dict(OLD_MIXTRAL)
    assert (m.weight_dtype_bytes, m.kv_dtype_bytes, m.num_moe_layers) == (2, 2, 32)
    assert m.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 and m.weight_bytes == 46.7e9 * 2
    # no moe_intermediate_size in an old dict: one expert from the skipped parameters
    assert m.expert_weight_bytes == pytest.approx((46.7e9 - 12.9e9) / (32 * 6) * 2)
    assert m.expert_weight_bytes == pytest.approx(3 * 4096 * 14336 * 2, rel=1e-3)
    dense = ModelSpec.from_dict({**OLD_MIXTRAL, "name": "d", "num_params": 8e9,
                                 "num_active_params": 8e9, "num_experts": 0,
                                 "num_experts_per_token": 0})
    assert (dense.num_moe_layers, dense.dense_weight_bytes) == (0, 16e9)


def test_old_calibration_file_reads(tmp_path):
    params = {k: FittedParam(value=v) for k, v in {"eta_compute": 0.5, "eta_mem": 0.8, "t_step_s": 1e-4}.items()}
    cal = Calibration(model=get_model("llama-3.1-8b"), gpu=get_gpu("h100-80gb"), tp=1, params=params)
    d = cal.to_dict()
    old_fields = ("name", "num_params", "num_active_params", "num_layers", "hidden_size",
                  "num_attention_heads", "num_kv_heads", "head_dim", "dtype_bytes",
                  "max_model_len", "num_experts", "num_experts_per_token")
    d["model"] = {k: d["model"][k] for k in old_fields}            # what the old code wrote
    path = tmp_path / "old_cal.json"
    path.write_text(json.dumps(d))
    old = Calibration.read(path)
    assert old.model.kv_bytes_per_token == cal.model.kv_bytes_per_token == 131072
    assert old.model.weight_bytes == cal.model.weight_bytes


def test_new_fields_are_checked():
    with pytest.raises(SpecError, match="'weight_dtype_bytes' must be > 0"):
        ModelSpec.from_dict(dict(OLD_MIXTRAL, weight_dtype_bytes=0))
    with pytest.raises(SpecError, match="num_moe_layers .* 1..num_layers"):
        ModelSpec.from_dict(dict(OLD_MIXTRAL, num_moe_layers=33))
    with pytest.raises(SpecError, match="num_moe_layers .* 0 for a dense model"):
        ModelSpec.from_dict(dict(OLD_MIXTRAL, num_experts=0, num_experts_per_token=0,
                                 num_moe_layers=4))


# ----------------------------------------------------------------------------- catalog entries

@pytest.mark.parametrize("alias,key", [
    ("qwen3-14b", "qwen3-14b"), ("Qwen/Qwen3-14B", "qwen3-14b"),
    ("codellama-34b", "codellama-34b"), ("codellama/CodeLlama-34b-Instruct-hf", "codellama-34b"),
    ("CodeLlama-34b-Instruct-hf", "codellama-34b"),
    ("qwen3-30b-a3b", "qwen3-30b-a3b"), ("Qwen/Qwen3-30B-A3B-Instruct-2507", "qwen3-30b-a3b"),
    ("Qwen3-30B-A3B-Instruct-2507", "qwen3-30b-a3b"),
])
def test_new_catalog_aliases(alias, key):
    assert get_model(alias).name == key


def test_new_catalog_entries_hand_counted():
    rows = {r["key"]: r for r in list_models()}
    q14 = get_model("qwen3-14b")
    layer = (5120 * 5120 + 2 * 5120 * 1024 + 5120 * 5120 + 2 * 128) + 2 * 5120 + 3 * 5120 * 17408
    assert 40 * layer + 151936 * 5120 * 2 + 5120 == 14_768_307_200
    assert q14.num_params == 14.8e9 and q14.kv_bytes_per_token == 2 * 40 * 8 * 128 * 2 == 163_840
    cl = get_model("codellama-34b")
    layer = (8192 * 8192 + 2 * 8192 * 1024 + 8192 * 8192) + 2 * 8192 + 3 * 8192 * 22016
    assert 48 * layer + 32000 * 8192 * 2 + 8192 == 33_743_970_304
    assert cl.num_params == 33.7e9 and cl.kv_bytes_per_token == 2 * 48 * 8 * 128 * 2 == 196_608
    # the CodeLlama-34B vLLM log in shared/data: 'Available KV cache memory: 8.18 GiB',
    # 'GPU KV cache size: 44,640 tokens' (2,790 blocks of 16) agree at 196,608 B/token
    assert 44_640 * cl.kv_bytes_per_token / 2**30 == pytest.approx(8.18, abs=0.01)
    assert cl.max_model_len == 16384 and (cl.intermediate_size, cl.vocab_size) == (22016, 32000)
    for key in ("qwen3-14b", "codellama-34b", "qwen3-30b-a3b"):
        assert rows[key]["config_source"].startswith("https://huggingface.co/")
        assert "model card" in rows[key]["num_params_source"] or \
            "safetensors" in rows[key]["num_params_source"]


# ----------------------------------------------------------------------------- links

def test_link_presets_from_the_catalog():
    assert get_link("nvlink4") == Link("nvlink4", 450e9, 2e-6, fully_connected=True)
    assert get_link("NVLink-3") == Link("nvlink3", 300e9, 2e-6, fully_connected=True)
    assert get_link("100GbE") == Link("100gbe", 12.5e9, 1e-5)
    assert not get_link("pcie5").fully_connected and get_link("xgmi-mi300").fully_connected
    presets = link_presets()
    assert list(presets) == ["pcie4", "pcie5", "nvlink3", "nvlink4", "nvlink5", "xgmi-mi300",
                             "xgmi-mi355", "100gbe", "200gbe", "400gbe"]
    from replay.cost.cost_model import LINKS
    assert LINKS == presets
    for row in list_links():
        assert len(row["bandwidth_bytes_per_s_source"]) > 20 and len(row["latency_s_source"]) > 20


def test_every_gpu_tp_link_is_a_catalog_link():
    presets = link_presets()
    for key in json.loads((CATALOG_DIR / "gpus.json").read_text())["gpus"]:
        assert get_gpu(key).tp_link in presets, key
    assert GpuSpec("g", 1e15, 3e12, 8e10).tp_link in presets


def test_unknown_link_lists_the_presets():
    with pytest.raises(SpecError, match=r"unknown link 'nvlink9'.*Known links: pcie4, pcie5"):
        get_link("nvlink9")


# ----------------------------------------------------------------------------- CLI --model-config

def test_model_config_option_reads_moe_and_mla(tmp_path, real_data_dir):
    """``calibrate fit --model-config`` on the real Qwen3-30B-A3B config and on DeepSeek-V2-Lite's,
    then ``replay`` with the calibration: the spec's new fields travel in the calibration file."""
    import pandas as pd
    from click.testing import CliRunner

    from calibrate.umbrella import main as servecal
    from schemas.tables import REQUEST_TRACE, STEP_TRACE, to_table, write_table

    steps = tmp_path / "steps.parquet"
    write_table(to_table(STEP_TRACE, pd.DataFrame({
        "replica_id": 0, "step_start_time_s": [0.0, 1.0, 2.0, 3.0],
        "step_duration_s": [0.01, 0.02, 0.012, 0.03], "num_prefill_tokens": [0, 512, 0, 1024],
        "num_prefill_seqs": [0, 1, 0, 1], "num_decode_seqs": [8, 0, 16, 0],
        "decode_context_tokens": [800, 0, 1600, 0]})), steps)
    trace = tmp_path / "t.parquet"
    write_table(to_table(REQUEST_TRACE, pd.DataFrame({
        "request_id": ["a", "b"], "arrival_time_s": [0.0, 0.1], "num_prompt_tokens": [50, 70],
        "num_output_tokens": [5, 3]})), trace)
    for config, experts, mla in ((real_data_dir / QWEN3_30B_A3B, 128, 0),
                                 (DATA / "hf_config_deepseek_v2_lite.json", 64, 512)):
        cal = tmp_path / f"{experts}.json"
        res = CliRunner().invoke(servecal, [str(a) for a in (
            "calibrate", "fit", steps, "--model-config", config, "--gpu", "h100-80gb",
            "--variants", "max", "--fix", "n_half_tokens=0", "--fix", "t_seq_s=0", "-o", cal)])
        assert res.exit_code == 0, res.output
        model = json.loads(cal.read_text())["model"]
        assert (model["num_experts"], model["kv_lora_rank"]) == (experts, mla)
        res = CliRunner().invoke(servecal, [str(a) for a in (
            "replay", trace, "--calibration", cal, "-o", tmp_path / f"pred{experts}.parquet")])
        assert res.exit_code == 0, res.output


@pytest.mark.parametrize("tp,dp", [(1, 1), (2, 1), (4, 2)])
def test_a_calibration_2_file_keeps_its_step_times(tmp_path, tp, dp):
    """calibration/2 held the knee in the step's tokens: n_half 96 on tp x dp GPUs. Read as
    calibration/3 (the knee per GPU) it becomes 96 / (tp dp), with its interval and band points, and
    prices a 64-token step as before: 2 P (64 + 96) / (eta peak tp dp)."""
    from replay.cost.cost_model import cost_model_from_calibration

    params = {"eta_compute": FittedParam(0.5), "eta_mem": FittedParam(0.8),
              "n_half_tokens": FittedParam(96.0, stderr=8.0, ci95=(80.0, 112.0))}
    model = get_model("qwen3-30b-a3b" if dp > 1 else "llama-3.1-8b")
    cal = Calibration(model=model, gpu=get_gpu("h100-80gb"), tp=tp, dp=dp, params=params,
                      terms=["dense_compute"], band_points=[{"n_half_tokens": 120.0, "eta_compute": 0.4}])
    d = cal.to_dict()
    d["servecal.schema"] = "calibration/2"
    path = tmp_path / "v2.json"
    path.write_text(json.dumps(d))
    old = Calibration.read(path)
    g = tp * dp
    knee = old.params["n_half_tokens"]
    assert (knee.value, knee.stderr, knee.ci95) == (96.0 / g, 8.0 / g, (80.0 / g, 112.0 / g))
    assert old.band_points == [{"n_half_tokens": 120.0 / g, "eta_compute": 0.4}]
    step_s = cost_model_from_calibration(old, model, tp, dp).step_time_s(64, 0, 0)
    expected = 2 * model.num_active_params * (64 + 96) / (0.5 * get_gpu("h100-80gb").peak_flops * g)
    assert step_s == pytest.approx(expected, rel=1e-12)
