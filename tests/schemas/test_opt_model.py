"""OPT (facebook/opt-13b, the model of DistServe's runs) on A100-80GB: hand-counted parameters,
weight bytes, FLOPs per token and KV bytes from the config's numbers, read as ``--model-config``
and from the catalog.

OPT is not a Llama-style decoder: MHA (no ``num_key_value_heads``: KV heads = attention
heads), a 2-matrix ReLU FFN ``fc2(relu(fc1(x)))`` of width ``ffn_dim`` (not a gated 3-matrix
MLP), biases on every linear layer, LayerNorms with weight and bias, learned positions with
an offset of 2 rows, and the LM head tied to the token embedding (Hugging Face
``modeling_opt.py``).
"""
from __future__ import annotations

import json

import pandas as pd
import pytest
from click.testing import CliRunner

from calibrate.umbrella import main as servecal
from replay.cost.cost_model import RooflineCostModel
from schemas.cost_params import CostParams
from schemas.hf_config import count_params
from schemas.specs import get_gpu, get_model, model_from_hf_config
from schemas.tables import STEP_TRACE, to_table, write_table

#: https://huggingface.co/facebook/opt-13b/blob/main/config.json (the fields a reader meets).
OPT_13B_CONFIG = {
    "_name_or_path": "facebook/opt-13b", "_remove_final_layer_norm": False, "activation_dropout": 0.0,
    "activation_function": "relu", "architectures": ["OPTForCausalLM"], "attention_dropout": 0.0,
    "bos_token_id": 2, "do_layer_norm_before": True, "dropout": 0.1, "eos_token_id": 2, "ffn_dim": 20480,
    "hidden_size": 5120, "init_std": 0.02, "layerdrop": 0.0, "max_position_embeddings": 2048,
    "model_type": "opt", "num_attention_heads": 40, "num_hidden_layers": 40, "output_projection": True,
    "pad_token_id": 1, "prefix": "</s>", "torch_dtype": "float16", "transformers_version": "4.21.0.dev0",
    "use_cache": True, "vocab_size": 50272, "word_embed_proj_dim": 5120,
}

# Hand count, hidden h = 5120, ffn f = 20480, 40 layers, vocab 50272, 2048 positions:
#   attention q, k, v, out_proj: 4 * (h*h + h)       = 4 * 26,219,520 = 104,878,080
#   fc1 h*f + f                                      = 104,857,600 + 20,480 = 104,878,080
#   fc2 f*h + h                                      = 104,857,600 + 5,120  = 104,862,720
#   two LayerNorms 2 * 2h                            = 20,480
#   one layer                                        = 314,639,360; x 40 = 12,585,574,400
#   token embedding 50272 * 5120 (tied LM head)      = 257,392,640
#   learned positions (2048 + 2) * 5120              = 10,496,000
#   final LayerNorm 2h                               = 10,240
#   total                                            = 12,853,473,280
OPT_13B_PARAMS = 12_853_473_280
#: What a gated 3-matrix MLP (Llama's gate/up/down, no biases) would have counted instead of fc1/fc2.
GATED_INSTEAD = 40 * (3 * 5120 * 20480 - (2 * 5120 * 20480 + 20480 + 5120))


def test_opt_13b_parameters_by_hand(tmp_path):
    assert 40 * (4 * (5120 * 5120 + 5120) + (5120 * 20480 + 20480) + (20480 * 5120 + 5120) + 4 * 5120) \
        + 50272 * 5120 + 2050 * 5120 + 2 * 5120 == OPT_13B_PARAMS
    assert count_params(OPT_13B_CONFIG) == (OPT_13B_PARAMS, OPT_13B_PARAMS)
    assert OPT_13B_PARAMS + GATED_INSTEAD == pytest.approx(17.04e9, rel=1e-3)  # the count this is not


def test_opt_13b_model_config_file(tmp_path):
    folder = tmp_path / "opt-13b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(OPT_13B_CONFIG))
    m = model_from_hf_config(folder / "config.json")
    assert (m.name, m.num_params, m.num_active_params) == ("facebook/opt-13b", OPT_13B_PARAMS, OPT_13B_PARAMS)
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.head_dim) == (40, 5120, 40, 128)
    assert m.num_kv_heads == 40 and not m.is_moe                     # MHA: kv heads = attention heads
    assert (m.intermediate_size, m.vocab_size, m.max_model_len) == (20480, 50272, 2048)  # ffn_dim
    assert (m.dtype_bytes, m.weight_dtype_bytes, m.kv_dtype_bytes) == (2, 2, 2)          # float16
    # weights: 2 bytes each = 25,706,946,560 B (25.7 GB: one A100-80GB holds them at TP 1)
    assert m.weight_bytes == 2 * OPT_13B_PARAMS == 25_706_946_560
    # KV: keys and values, 40 layers x 40 heads x 128 x 2 B = 819,200 B per token; 409,600 per rank at TP 2
    assert m.kv_bytes_per_token == 2 * 40 * 40 * 128 * 2 == 819_200
    assert m.kv_bytes_per_token_per_rank(2) == 409_600
    # attention: QK^T and PV, 2 FLOPs per multiply-add: 4 x 40 layers x 40 heads x 128 per context token
    assert m.attention_flops_per_context_token == 819_200


def test_opt_13b_catalog_on_a100_flops_and_bytes_per_step():
    m, g = get_model("facebook/opt-13b"), get_gpu("NVIDIA A100-SXM4-80GB")
    assert (m.name, g.name) == ("opt-13b", "a100-80gb")
    assert m.num_params == 12.85e9 and m.num_kv_heads == 40 and m.intermediate_size == 20480
    assert (g.peak_flops, g.mem_bandwidth_bytes_per_s, g.mem_bytes) == (312e12, 2039e9, 80 * 2**30)
    assert g.tp_link == "nvlink3"
    # linear layers: 2 FLOPs per parameter per token = 25.7 GFLOP/token; 1000 prefill tokens at the
    # datasheet peak: 2 * 12.85e9 * 1000 / 312e12 = 82.37 ms
    cm = RooflineCostModel(m, g, CostParams(eta_compute=1.0, n_half_tokens=0), terms=("dense_compute",))
    assert cm.step_time_s(1000, 0, 0) == pytest.approx(2 * 12.85e9 * 1000 / 312e12, rel=1e-12)
    assert cm.step_time_s(1000, 0, 0) == pytest.approx(0.0823718, rel=1e-6)
    # reading the weights once: 25.7e9 B / 2039e9 B/s = 12.60 ms a step, half per GPU at TP 2
    cm = RooflineCostModel(m, g, CostParams(eta_mem=1.0), terms=("weight_memory",))
    assert cm.step_time_s(0, 1, 100) == pytest.approx(25.7e9 / 2039e9, rel=1e-12)
    cm = RooflineCostModel(m, g, CostParams(eta_mem=1.0), tp=2, terms=("weight_memory",))
    assert cm.step_time_s(0, 1, 100) == pytest.approx(25.7e9 / 2039e9 / 2, rel=1e-12)


def test_calibrate_fit_takes_the_opt_config(tmp_path):
    (tmp_path / "opt").mkdir()
    config = tmp_path / "opt" / "config.json"
    config.write_text(json.dumps(OPT_13B_CONFIG))
    steps = tmp_path / "steps.parquet"
    write_table(to_table(STEP_TRACE, pd.DataFrame({
        "replica_id": 0, "step_start_time_s": [0.0, 1.0, 2.0, 3.0],
        "step_duration_s": [0.02, 0.1, 0.025, 0.2], "num_prefill_tokens": [0, 512, 0, 1024],
        "num_prefill_seqs": [0, 1, 0, 1], "num_decode_seqs": [8, 0, 16, 0],
        "decode_context_tokens": [800, 0, 1600, 0]})), steps)
    cal = tmp_path / "cal.json"
    res = CliRunner().invoke(servecal, [str(a) for a in (
        "calibrate", "fit", steps, "--model-config", config, "--gpu", "a100-80gb", "--variants", "max",
        "--fix", "n_half_tokens=0", "--fix", "t_seq_s=0", "-o", cal)])
    assert res.exit_code == 0, res.output
    model = json.loads(cal.read_text())["model"]
    assert (model["num_params"], model["num_kv_heads"], model["intermediate_size"]) == (OPT_13B_PARAMS, 40, 20480)


def test_opt_variants_projection_no_final_norm_no_bias():
    # OPT-350m: hidden 1024 projected to 512-wide embeddings (project_in/out, no bias), post-LN
    # (do_layer_norm_before false: no final LayerNorm). Layer: 4*(1024^2 + 1024) + (1024*4096 + 4096)
    # + (4096*1024 + 1024) + 4*1024 = 12,596,224; x 24 = 302,309,376; + 50272*512 + 2050*1024
    # + 2*1024*512 = 28,887,040: 331,196,416, the count Hugging Face reports for facebook/opt-350m
    opt_350m = dict(OPT_13B_CONFIG, hidden_size=1024, ffn_dim=4096, num_hidden_layers=24, num_attention_heads=16,
                    word_embed_proj_dim=512, do_layer_norm_before=False)
    assert count_params(opt_350m)[0] == 331_196_416
    # enable_bias false drops the 6 biases of a layer; _remove_final_layer_norm drops the final one;
    # layer_norm_elementwise_affine false drops every LayerNorm's weight and bias
    n = OPT_13B_PARAMS
    assert count_params(dict(OPT_13B_CONFIG, enable_bias=False))[0] == n - 40 * (4 * 5120 + 20480 + 5120)
    assert count_params(dict(OPT_13B_CONFIG, _remove_final_layer_norm=True))[0] == n - 2 * 5120
    assert count_params(dict(OPT_13B_CONFIG, layer_norm_elementwise_affine=False))[0] == n - (40 * 4 + 2) * 5120
