"""Tests of schemas/specs.py: spec types, the catalog, HF config.json reading, errors."""
from __future__ import annotations

import json

import pytest

from schemas.errors import SpecError
from schemas.hf_identity import SpecNote
from schemas.specs import (
    CATALOG_DIR,
    GpuSpec,
    ModelSpec,
    count_params,
    get_gpu,
    get_model,
    gpu_from_json,
    list_gpus,
    list_models,
    model_from_hf_config,
)

REQUIRED_MODELS = ["llama-3.1-8b", "llama-3.1-70b", "llama-2-7b", "llama-2-13b", "llama-2-70b",
                   "qwen3-32b", "qwen3-8b", "qwen2.5-1.5b", "qwen2.5-7b", "mistral-7b",
                   "mixtral-8x7b", "opt-13b", "yi-34b"]
REQUIRED_GPUS = ["rtx-pro-6000", "rtx-4090", "a100-80gb", "a100-40gb", "h100-80gb", "h200",
                 "l40s", "a10g", "l4"]

# A Mixtral-8x7B-like config.json (the real one's shapes).
MIXTRAL = {
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
    "vocab_size": 32000, "max_position_embeddings": 32768, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "rope_theta": 500000.0,
}


def write_json(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    return path


# ----------------------------------------------------------------------------- models

def test_llama31_8b_kv_bytes_per_token():
    m = get_model("llama-3.1-8b")
    assert m.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131072
    assert m.weight_bytes == pytest.approx(8.03e9 * 2)


def test_qwen25_15b_values():
    m = get_model("qwen2.5-1.5b")
    assert m.num_params == pytest.approx(1.54e9)
    assert (m.num_layers, m.num_kv_heads, m.head_dim) == (28, 2, 128)
    assert m.kv_bytes_per_token == 2 * 28 * 2 * 128 * 2


def test_qwen3_head_dim_is_not_hidden_over_heads():
    m = get_model("qwen3-32b")
    assert m.head_dim == 128 and m.hidden_size // m.num_attention_heads == 80


def test_catalog_has_the_required_models_and_gpus():
    assert set(REQUIRED_MODELS) <= {r["key"] for r in list_models()}
    assert set(REQUIRED_GPUS) <= {r["key"] for r in list_gpus()}


def test_shape_count_matches_published_count_within_1_percent():
    catalog = json.loads((CATALOG_DIR / "models.json").read_text())["models"]
    for row in list_models():
        cfg = catalog[row["key"]]["config"]["values"]
        total, active = count_params(cfg, row["key"])
        assert total == pytest.approx(row["num_params"], rel=0.01), row["key"]
        assert active == pytest.approx(row["num_active_params"], rel=0.01), row["key"]


def test_every_catalog_value_has_a_source():
    for row in list_models():
        assert row["config_source"].startswith("https://huggingface.co/")
        assert row["num_params_source"] and row["num_active_params_source"]
    for row in list_gpus():
        for f in ("peak_flops", "mem_bandwidth_bytes_per_s", "mem_bytes"):
            assert row[f] > 0 and len(row[f"{f}_source"]) > 10, (row["key"], f)


def test_mixtral_catalog_is_moe():
    m = get_model("mixtral-8x7b")
    assert m.is_moe and (m.num_experts, m.num_experts_per_token) == (8, 2)
    assert m.num_params == pytest.approx(46.7e9) and m.num_active_params == pytest.approx(12.9e9)


@pytest.mark.parametrize("alias", [
    "meta-llama/Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-8B-Instruct",
    "META-LLAMA/LLAMA-3.1-8B-INSTRUCT", "Llama-3.1-8B", "llama_3.1_8b", " llama-3.1-8b "])
def test_model_alias_lookup_is_case_insensitive(alias):
    assert get_model(alias).name == "llama-3.1-8b"


@pytest.mark.parametrize("alias,key", [
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx-pro-6000"),
    ("nvidia rtx pro 6000 blackwell server edition", "rtx-pro-6000"),
    ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
    ("NVIDIA H100 80GB HBM3", "h100-80gb"),
    ("NVIDIA GeForce RTX 4090", "rtx-4090"),
    ("RTXPRO6000", "rtx-pro-6000"),
    ("H100-80GB", "h100-80gb"),
])
def test_gpu_alias_lookup(alias, key):
    assert get_gpu(alias).name == key


def test_gpu_values():
    a100 = get_gpu("a100-80gb")
    assert a100.peak_flops == 312e12 and a100.mem_bandwidth_bytes_per_s == 2.039e12
    assert a100.mem_bytes == 80 * 2**30
    h100 = get_gpu("h100-80gb")
    assert h100.peak_flops == pytest.approx(989e12, rel=1e-3)
    assert h100.mem_bandwidth_bytes_per_s == 3.35e12
    assert get_gpu("rtx-pro-6000").mem_bytes == 96 * 2**30


# ----------------------------------------------------------------------------- HF config.json

def test_hf_config_dense_llama(tmp_path):
    path = write_json(tmp_path / "Llama-3.1-8B" / "config.json", LLAMA_31_8B)
    m = model_from_hf_config(path)
    assert m.name == "LlamaForCausalLM"  # the file's architectures, not its folder (issue 21)
    assert m.num_params == 8_030_261_248 == m.num_active_params
    assert (m.head_dim, m.dtype_bytes, m.max_model_len) == (128, 2, 131072)
    assert m.kv_bytes_per_token == 131072
    # get_model takes the file, and the folder that holds it
    assert get_model(str(path)) == m
    assert get_model(str(path.parent)) == m


def test_hf_config_moe_mixtral(tmp_path):
    m = model_from_hf_config(write_json(tmp_path / "mixtral" / "config.json", MIXTRAL))
    assert m.num_params == pytest.approx(46.7e9, rel=0.005)
    assert m.num_active_params == pytest.approx(12.9e9, rel=0.005)
    assert (m.num_experts, m.num_experts_per_token) == (8, 2)


def test_hf_config_qwen2_biases_and_tied_embeddings(tmp_path):
    cfg = {"model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960,
           "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
           "vocab_size": 151936, "max_position_embeddings": 131072, "tie_word_embeddings": True}
    with pytest.warns(SpecNote, match="named 'q' after its folder, a guess"):
        m = model_from_hf_config(write_json(tmp_path / "q" / "config.json", cfg))
    assert m.num_params == 1_543_714_304          # Qwen2.5-1.5B, incl. q/k/v biases
    assert m.dtype_bytes == 2                     # no torch_dtype: bf16 assumed


def test_hf_config_qwen3_moe(tmp_path):
    # Qwen3-30B-A3B shapes: 48 layers, 128 experts of 768, 8 per token (~30.5B total, ~3.3B active)
    cfg = {"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
           "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
           "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
           "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
           "tie_word_embeddings": False, "decoder_sparse_step": 1, "mlp_only_layers": []}
    with pytest.warns(SpecNote, match="named 'a3b' after its folder, a guess"):
        m = model_from_hf_config(write_json(tmp_path / "a3b" / "config.json", cfg))
    assert m.num_params == pytest.approx(30.5e9, rel=0.01)
    assert m.num_active_params == pytest.approx(3.3e9, rel=0.03)
    assert m.kv_bytes_per_token == 2 * 48 * 4 * 128 * 2


def test_hf_config_float32_and_snapshot_name(tmp_path):
    from schemas.hf_identity import SpecNote

    cfg = {k: v for k, v in dict(LLAMA_31_8B, torch_dtype="float32").items() if k != "architectures"}
    path = write_json(tmp_path / "snapshots" / ("ab" * 20) / "config.json", cfg)
    with pytest.warns(SpecNote, match="named 'llama' after its folder, a guess"):
        m = model_from_hf_config(path)
    assert m.dtype_bytes == 4 and m.name == "llama"


def test_hf_config_missing_field_is_named(tmp_path):
    cfg = {k: v for k, v in LLAMA_31_8B.items() if k != "num_hidden_layers"}
    path = write_json(tmp_path / "bad" / "config.json", cfg)
    with pytest.raises(SpecError, match=r"config\.json.*num_hidden_layers"):
        model_from_hf_config(path)


def test_hf_config_unsupported_architecture(tmp_path):
    # (with architectures LlamaForCausalLM it would be read as llama: tests/test_model_config_identity.py)
    path = write_json(tmp_path / "g" / "config.json",
                      dict(LLAMA_31_8B, model_type="gpt2", architectures=["GPT2LMHeadModel"]))
    with pytest.raises(SpecError, match="model_type 'gpt2' is not supported"):
        get_model(str(path))


def test_hf_config_not_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(SpecError, match="not valid JSON"):
        get_model(str(path))


# ----------------------------------------------------------------------------- errors

def test_unknown_model_lists_keys_and_closest_match():
    with pytest.raises(SpecError) as exc:
        get_model("llama-3.1-8")
    msg = str(exc.value)
    assert "unknown model 'llama-3.1-8'" in msg
    assert "Did you mean 'llama-3.1-8b'?" in msg
    assert "qwen2.5-1.5b" in msg and "config.json" in msg


def test_unknown_gpu_lists_keys():
    with pytest.raises(SpecError, match=r"unknown GPU 'tpu-v5'.*Known gpus: rtx-pro-6000"):
        get_gpu("tpu-v5")


def test_missing_file_is_named(tmp_path):
    with pytest.raises(SpecError, match=r"nope\.json: gpu spec file not found"):
        get_gpu(str(tmp_path / "nope.json"))


# ----------------------------------------------------------------------------- gpu json

def test_gpu_from_json(tmp_path):
    path = write_json(tmp_path / "my-gpu.json", {"peak_flops": 1e15,
                                                 "mem_bandwidth_bytes_per_s": 3e12,
                                                 "mem_bytes": {"value": 8e10, "source": "mine"}})
    g = get_gpu(str(path))
    assert g == GpuSpec("my-gpu", 1e15, 3e12, 8e10)


@pytest.mark.parametrize("bad,field", [
    ({"mem_bandwidth_bytes_per_s": 3e12, "mem_bytes": 8e10}, "peak_flops"),
    ({"peak_flops": 0, "mem_bandwidth_bytes_per_s": 3e12, "mem_bytes": 8e10}, "peak_flops"),
    ({"peak_flops": 1e15, "mem_bandwidth_bytes_per_s": -3e12, "mem_bytes": 8e10},
     "mem_bandwidth_bytes_per_s"),
    ({"peak_flops": 1e15, "mem_bandwidth_bytes_per_s": 3e12, "mem_bytes": "80GB"}, "mem_bytes"),
    ({"peak_flops": 1e15, "mem_bandwidth_bytes_per_s": 3e12, "mem_bytes": 8e10, "tflops": 1},
     "tflops"),
])
def test_bad_gpu_json_names_file_and_field(tmp_path, bad, field):
    path = write_json(tmp_path / "bad-gpu.json", bad)
    with pytest.raises(SpecError) as exc:
        gpu_from_json(path)
    assert "bad-gpu.json" in str(exc.value) and f"'{field}'" in str(exc.value)


def test_gpu_json_must_be_an_object(tmp_path):
    path = write_json(tmp_path / "list.json", [1, 2])
    with pytest.raises(SpecError, match=r"list\.json: expected a JSON object"):
        gpu_from_json(path)


# ----------------------------------------------------------------------------- round trip

def test_to_dict_from_dict_round_trip():
    for spec in (get_model("mixtral-8x7b"), get_model("opt-13b")):
        d = json.loads(json.dumps(spec.to_dict()))
        assert ModelSpec.from_dict(d) == spec
    g = get_gpu("l4")
    assert GpuSpec.from_dict(json.loads(json.dumps(g.to_dict()))) == g


def test_from_dict_rejects_missing_and_bad_fields():
    d = get_model("llama-2-7b").to_dict()
    with pytest.raises(SpecError, match="missing field.*'head_dim'"):
        ModelSpec.from_dict({k: v for k, v in d.items() if k != "head_dim"})
    with pytest.raises(SpecError, match="calib.json: .*'num_layers' must be an integer"):
        ModelSpec.from_dict(dict(d, num_layers=32.5), where="calib.json")
    with pytest.raises(SpecError, match="num_active_params .* exceeds num_params"):
        ModelSpec.from_dict(dict(d, num_active_params=2 * d["num_params"]))
    with pytest.raises(SpecError, match="num_experts_per_token"):
        ModelSpec.from_dict(dict(d, num_experts=8))
