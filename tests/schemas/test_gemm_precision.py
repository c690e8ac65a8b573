"""The GEMM precision of a model and the GPU peak per precision, against hand-computed values.

The quantisation blocks are those the checkpoints ship (a Hugging Face ``quantization_config``):
gpt-oss's MXFP4 (only the routed experts; 4-bit E2M1 + an E8M0 scale per 32 = 4.25 bits), NVIDIA
ModelOpt's NVFP4 (E2M1 + an E4M3 scale per 16 = 4.5 bits), FP8 W8A8, and the weight-only schemes
vLLM runs in BF16 math. The GPU figures are the catalog's (schemas/catalog/gpus.json), each a
datasheet number: NVIDIA's with-sparsity figures halved, AMD's dense figures as listed.
"""
from __future__ import annotations

import json

import pytest

from schemas.calibration import Calibration, FittedParam
from schemas.errors import SchemaError, SpecError
from schemas.specs import GpuSpec, ModelSpec, get_gpu, get_link, gpu_from_json, list_gpus, spec_from_config

# Llama-3.1-8B's shapes: 32 x (2 x 4096^2 + 2 x 4096 x 1024 + 3 x 4096 x 14336 + 2 x 4096) + 2 x 128256 x 4096
# + 4096 = 8,030,261,248 parameters
LLAMA = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
         "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
         "max_position_embeddings": 131072, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
LLAMA_PARAMS = 8_030_261_248
# Mixtral-8x7B's shapes: one expert 3 x 4096 x 14336 = 176,160,768; 32 layers x 8 experts of them
MIXTRAL = {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
           "vocab_size": 32000, "max_position_embeddings": 32768, "tie_word_embeddings": False,
           "torch_dtype": "bfloat16"}
EXPERT_PARAMS = 3 * 4096 * 14336
# gpt-oss-120b's block (its config.json): the experts MXFP4, the modules listed stay bf16
MXFP4 = {"quant_method": "mxfp4", "modules_to_not_convert": [
    "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
# nvidia/Llama-3.1-8B-Instruct-FP4 style (ModelOpt's export)
NVFP4_MODELOPT = {"quant_method": "modelopt", "quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8",
                  "group_size": 16, "exclude_modules": ["lm_head"]}


def _ct(weights, acts=None):
    """A compressed-tensors block with one config group."""
    group = {"targets": ["Linear"], "weights": weights}
    if acts is not None:
        group["input_activations"] = acts
    return {"quant_method": "compressed-tensors", "config_groups": {"group_0": group}}


FP4 = {"num_bits": 4, "type": "float", "group_size": 16}
FP8 = {"num_bits": 8, "type": "float"}


# ----------------------------------------------------------------------------- config -> precision, bytes

@pytest.mark.parametrize("quant, precision, weight_bytes", [
    (None, "bf16", 2),
    ({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}, "fp8", 1),
    ({"quant_method": "fbgemm_fp8"}, "fp8", 1),
    ({"quant_method": "modelopt", "quant_algo": "FP8"}, "fp8", 1),
    (_ct(FP8, {**FP8, "dynamic": True}), "fp8", 1),               # FP8 W8A8
    (_ct(FP8), "bf16", 1),                                         # FP8 W8A16: weight-only
    (NVFP4_MODELOPT, "fp4", 0.5625),                               # (4 + 8 / 16) / 8
    (_ct(FP4, FP4), "fp4", 0.5625),                                # compressed-tensors nvfp4 W4A4
    (_ct(FP4), "bf16", 0.5625),                                    # nvfp4a16: weight-only
    (_ct({"num_bits": 8, "type": "int"}, {"num_bits": 8, "type": "int"}), "bf16", 1),   # int8 W8A8
    ({"quant_method": "awq", "bits": 4, "group_size": 128}, "bf16", 0.5),
    ({"quant_method": "gptq", "bits": 8}, "bf16", 1),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "bf16", 0.5),
])
def test_precision_and_weight_bytes_of_a_dense_config(quant, precision, weight_bytes):
    cfg = dict(LLAMA) if quant is None else dict(LLAMA, quantization_config=quant)
    m = spec_from_config(cfg, "q", "cfg.json")
    assert (m.gemm_precision, m.weight_dtype_bytes, m.expert_weight_dtype_bytes) == \
        (precision, weight_bytes, weight_bytes)
    assert m.num_params == LLAMA_PARAMS and m.weight_bytes == LLAMA_PARAMS * weight_bytes
    assert m.dtype_bytes == 2


def test_nvfp4_modelopt_weights_and_its_fp8_kv_cache():
    m = spec_from_config(dict(LLAMA, quantization_config=NVFP4_MODELOPT), "llama-nvfp4")
    # 8,030,261,248 x 0.5625 = 4,517,021,952 B; KV 2 x 32 x 8 x 128 x 1 B
    assert m.weight_bytes == 4_517_021_952
    assert m.kv_bytes_per_token == 65_536


def test_mxfp4_experts_take_4_25_bits_the_rest_its_dtype():
    m = spec_from_config(dict(MIXTRAL, quantization_config=MXFP4), "mixtral-mxfp4")
    assert (m.gemm_precision, m.weight_dtype_bytes, m.expert_weight_dtype_bytes) == ("bf16", 2, 0.53125)
    assert m.expert_params == EXPERT_PARAMS == 176_160_768
    assert m.expert_weight_bytes == 176_160_768 * 0.53125 == 93_585_408
    # Mixtral-8x7B: 46,702,792,704 parameters, 32 x 8 x 176,160,768 = 45,097,156,608 of them routed experts
    routed = 32 * 8 * EXPERT_PARAMS
    assert (m.num_params, routed) == (46_702_792_704, 45_097_156_608)
    dense = 46_702_792_704 - 45_097_156_608                      # 1,605,636,096: attention, router, embeddings
    assert m.dense_weight_bytes == dense * 2 == 3_211_272_192
    assert m.weight_bytes == dense * 2 + routed * 0.53125 == 27_169_136_640      # 3,211,272,192 + 23,957,864,448
    assert m.weight_bytes == m.dense_weight_bytes + routed * m.expert_weight_bytes / EXPERT_PARAMS


def test_mxfp4_on_a_qwen3_moe_config_reads_the_same():
    cfg = {"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
           "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
           "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936, "max_position_embeddings": 40960,
           "tie_word_embeddings": False, "torch_dtype": "bfloat16", "quantization_config": MXFP4}
    m = spec_from_config(cfg, "qwen3-30b-a3b-mxfp4")
    assert m.expert_weight_bytes == 3 * 2048 * 768 * 0.53125 == 2_506_752


def test_an_unsupported_modelopt_algorithm_is_named():
    with pytest.raises(SpecError, match=r"cfg\.json: field 'quantization_config\.quant_algo' .* 'W4A8_AWQ'; "
                                        r"supported: FP8, NVFP4"):
        spec_from_config(dict(LLAMA, quantization_config={"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"}),
                         "x", "cfg.json")


# ----------------------------------------------------------------------------- spec files

MODEL = spec_from_config(LLAMA, "llama")


def test_a_bad_precision_in_a_spec_is_one_error_naming_the_field():
    with pytest.raises(SpecError) as err:
        ModelSpec.from_dict(dict(MODEL.to_dict(), gemm_precision="int4"), "spec.json")
    assert str(err.value) == ("spec.json: model spec 'llama': field 'gemm_precision' must be one of bf16, fp8, "
                              "fp4, got 'int4'")


def test_a_bad_precision_in_a_calibration_file_is_one_error(tmp_path):
    cal = Calibration(model=MODEL, gpu=get_gpu("b200"), tp=1, params={"eta_compute": FittedParam(0.5)})
    d = cal.to_dict()
    d["model"]["gemm_precision"] = "FP4"
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(d))
    with pytest.raises(SchemaError) as err:
        Calibration.read(path)
    assert " ".join(str(err.value).split()) == (
        f"{path}: calibration field missing or invalid: model spec: model spec 'llama': field 'gemm_precision' "
        "must be one of bf16, fp8, fp4, got 'FP4'")


def test_a_calibration_file_round_trips_the_new_fields(tmp_path):
    model = spec_from_config(dict(MIXTRAL, quantization_config=MXFP4), "mixtral-mxfp4")
    cal = Calibration(model=model, gpu=get_gpu("mi355x"), tp=8, params={"eta_compute": FittedParam(0.5)})
    path = tmp_path / "cal.json"
    cal.write(path)
    back = Calibration.read(path)
    assert back.model == model and back.gpu == get_gpu("mi355x")
    assert (back.model.expert_weight_dtype_bytes, back.gpu.peak_flops_fp4) == (0.53125, 10066.3e12)


def test_an_old_calibration_file_without_the_fields_loads_as_bf16(tmp_path):
    cal = Calibration(model=MODEL, gpu=get_gpu("h100-80gb"), tp=1, params={"eta_compute": FittedParam(0.5)})
    d = cal.to_dict()
    for block, fields in (("model", ("gemm_precision", "expert_weight_dtype_bytes")),
                          ("gpu", ("peak_flops_fp8", "peak_flops_fp4"))):
        for f in fields:
            del d[block][f]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(d))
    old = Calibration.read(path)
    assert (old.model.gemm_precision, old.model.expert_weight_dtype_bytes) == ("bf16", 2)
    assert (old.gpu.peak_flops_fp8, old.gpu.peak_flops_fp4) == (0, 0)
    assert old.gpu.peak_flops_for("fp8") == 989.5e12 and old.model.weight_bytes == MODEL.weight_bytes


# ----------------------------------------------------------------------------- GPUs

# key: (BF16, FP8, FP4 dense FLOP/s, bytes/s, bytes, tp_link), each from the datasheet figure named
NEW_GPUS = {
    # HGX B200, 8 GPUs, with sparsity: BF16 36, FP8 72, FP4 144 PFLOPS; DGX B200 64 TB/s, 1,440 GB
    "b200": (36e15 / 8 / 2, 72e15 / 8 / 2, 144e15 / 8 / 2, 64e12 / 8, 180 * 2**30, "nvlink5"),
    # GB200 superchip, 2 GPUs, with sparsity: BF16 10, FP8 20, FP4 40 PFLOPS; 16 TB/s, 372 GB
    "gb200": (10e15 / 2 / 2, 20e15 / 2 / 2, 40e15 / 2 / 2, 16e12 / 2, 186 * 2**30, "nvlink5"),
    "h20": (148e12, 296e12, 0, 4.0e12, 96 * 2**30, "nvlink4"),
    "mi300x": (1307.4e12, 2614.9e12, 0, 5.3e12, 192 * 2**30, "xgmi-mi300"),
    "mi325x": (1307.4e12, 2614.9e12, 0, 6.0e12, 256 * 2**30, "xgmi-mi300"),
    "mi355x": (2516.6e12, 5033.2e12, 10066.3e12, 8.0e12, 288 * 2**30, "xgmi-mi355"),
    "h200": (1979e12 / 2, 3958e12 / 2, 0, 4.8e12, 141 * 2**30, "nvlink4"),
}


@pytest.mark.parametrize("key", NEW_GPUS)
def test_the_catalog_loads_every_new_gpu_and_its_link(key):
    g = get_gpu(key)
    values = (g.peak_flops, g.peak_flops_fp8, g.peak_flops_fp4, g.mem_bandwidth_bytes_per_s, g.mem_bytes, g.tp_link)
    assert values[:5] == pytest.approx(NEW_GPUS[key][:5], rel=1e-12) and values[5] == NEW_GPUS[key][5]
    get_link(g.tp_link)                                          # a preset of links.json


def test_the_new_links_one_direction():
    # NVLink 5: 1.8 TB/s per GPU both ways; MI300X: 7 links x 64 GB/s each way; MI355X: 7 x 76.8
    assert get_link("nvlink5").bandwidth_bytes_per_s == 1.8e12 / 2
    assert get_link("xgmi-mi300").bandwidth_bytes_per_s == 7 * 64e9
    assert get_link("xgmi-mi355").bandwidth_bytes_per_s == pytest.approx(7 * 153.6e9 / 2)
    assert get_link("Infinity Fabric MI300").name == "xgmi-mi300"      # xGMI: AMD's name for the GPU links


@pytest.mark.parametrize("alias, key", [("NVIDIA B200", "b200"), ("NVIDIA GB200", "gb200"), ("NVIDIA H20", "h20"),
                                        ("AMD Instinct MI300X OAM", "mi300x"), ("AMD Instinct MI325X", "mi325x"),
                                        ("AMD Instinct MI355X", "mi355x")])
def test_the_new_gpus_by_their_smi_names(alias, key):
    assert get_gpu(alias).name == key


def test_every_catalog_peak_has_a_source_and_the_narrower_peaks_are_faster():
    for row in list_gpus():
        for f in ("peak_flops_fp8", "peak_flops_fp4", "tp_link"):
            assert len(row[f"{f}_source"]) > 20, (row["key"], f)
        fp8, fp4 = row["peak_flops_fp8"], row["peak_flops_fp4"]
        assert fp8 == 0 or fp8 == pytest.approx(2 * row["peak_flops"], rel=0.02), row["key"]
        assert fp4 == 0 or fp4 == pytest.approx(2 * fp8, rel=0.01), row["key"]


@pytest.mark.parametrize("key, precision, peak", [
    ("b200", "fp4", 9e15), ("b200", "fp8", 4.5e15), ("b200", "bf16", 2.25e15),
    ("h100-80gb", "fp4", 989.5e12),        # NVFP4 on Hopper: Marlin W4A16, BF16 math (not FP8)
    ("h100-80gb", "fp8", 1979e12),
    ("a100-80gb", "fp8", 312e12),          # FP8 on Ampere: Marlin W8A16, BF16 math
    ("mi300x", "fp4", 1307.4e12), ("mi355x", "fp4", 10066.3e12),
])
def test_peak_for_a_precision_falls_back_to_bf16(key, precision, peak):
    assert get_gpu(key).peak_flops_for(precision) == peak


def test_an_unknown_precision_and_a_negative_peak_are_named(tmp_path):
    with pytest.raises(SpecError, match=r"gpu spec 'b200': precision 'int8' is not one of bf16, fp8, fp4"):
        get_gpu("b200").peak_flops_for("int8")
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"peak_flops": 1e15, "mem_bandwidth_bytes_per_s": 2e12, "mem_bytes": 8e10,
                                "peak_flops_fp8": -1}))
    with pytest.raises(SpecError, match=r"gpu\.json: gpu spec 'gpu': field 'peak_flops_fp8' must be >= 0, got -1"):
        gpu_from_json(path)
    assert GpuSpec("g", 1e15, 2e12, 8e10).peak_flops_for("fp4") == 1e15
