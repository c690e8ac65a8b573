"""The GEMM terms at the model's precision on the catalog GPUs, against hand-computed step times.

A pure-compute prefill step of Llama-3.1-8B (8,030,261,248 parameters counted from its shapes) of
N = 4,096 tokens in one chunk with no history: ``2 P N = 65,783,900,143,616`` GEMM FLOPs at
``eta_compute`` 0.5 of the peak (``n_half_tokens`` 0), and ``N^2 / 2 = 8,388,608`` query-key pairs of
``4 x 32 x 32 x 128 = 524,288`` attention FLOPs each. The peaks are the catalog's dense figures
(schemas/catalog/gpus.json): B200 FP4 9e15 (HGX B200 144 PFLOPS with sparsity / 8 GPUs / 2), BF16
2.25e15; H100 SXM BF16 989.5e12, FP8 1,979e12; A100 BF16 312e12 and no FP8.
"""
import pytest

from replay.cost.cost_model import RooflineCostModel
from schemas.cost_params import CostParams
from schemas.specs import get_gpu, spec_from_config

LLAMA = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
         "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
         "max_position_embeddings": 131072, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
NVFP4 = spec_from_config(dict(LLAMA, quantization_config={"quant_method": "modelopt", "quant_algo": "NVFP4"}), "fp4")
FP8 = spec_from_config(dict(LLAMA, quantization_config={"quant_method": "fp8", "activation_scheme": "dynamic"}), "fp8")
BF16 = spec_from_config(LLAMA, "bf16")
N = 4096
GEMM_FLOPS = 2 * 8_030_261_248 * N            # 65,783,900,143,616
ATTENTION_FLOPS = 524_288 * N * N // 2         # 4,398,046,511,104


def _step_s(model, gpu, terms=("dense_compute",)):
    cm = RooflineCostModel(model, get_gpu(gpu), CostParams(eta_compute=0.5, n_half_tokens=0.0), terms=terms)
    return cm.step_time_s(N, 0, 0, 0, 1)


def test_the_models_read_their_precision():
    assert (NVFP4.gemm_precision, FP8.gemm_precision, BF16.gemm_precision) == ("fp4", "fp8", "bf16")
    assert NVFP4.num_active_params == FP8.num_active_params == 8_030_261_248


@pytest.mark.parametrize("model, gpu, peak_flops, step_s", [
    (NVFP4, "b200", 9e15, 0.014_618_644_476_359),       # 6.578e13 / (0.5 x 9e15): at FP4
    (NVFP4, "h100-80gb", 989.5e12, 0.132_963_921_462_589),   # no FP4 on Hopper: Marlin W4A16, BF16
    (FP8, "h100-80gb", 1979e12, 0.066_481_960_731_295),      # FP8 W8A8
    (FP8, "a100-80gb", 312e12, 0.421_691_667_587_282),       # no FP8 on Ampere: Marlin W8A16, BF16
    (BF16, "b200", 2.25e15, 0.058_474_577_905_436),
])
def test_a_prefill_step_is_priced_at_the_peak_of_the_models_precision(model, gpu, peak_flops, step_s):
    assert GEMM_FLOPS == 65_783_900_143_616
    assert GEMM_FLOPS / (0.5 * peak_flops) == pytest.approx(step_s, rel=1e-12)
    assert _step_s(model, gpu) == pytest.approx(step_s, rel=1e-12)


def test_attention_stays_at_the_bf16_peak():
    """NVFP4 on B200: the GEMMs at FP4 (14.62 ms), the attention's 4.398e12 FLOPs at BF16, 0.5 x 2.25e15:
    3.909 ms, not the 0.977 ms an FP4 price would give."""
    attention_s = ATTENTION_FLOPS / (0.5 * 2.25e15)
    assert attention_s == pytest.approx(3.909_374_676_5e-3, rel=1e-10)
    assert _step_s(NVFP4, "b200", ("attention_compute",)) == pytest.approx(attention_s, rel=1e-12)
    assert _step_s(NVFP4, "b200", ("dense_compute", "attention_compute")) == \
        pytest.approx(0.014_618_644_476_359 + attention_s, rel=1e-12)


def test_cudagraph_padding_rows_cost_as_a_token_at_the_same_peak():
    """A 390-token prefill pads to the 400 capture size: 10 rows at 2 P / (0.5 x 9e15) each on B200."""
    cm = RooflineCostModel(NVFP4, get_gpu("b200"), CostParams(eta_compute=0.5, n_half_tokens=0.0),
                           terms=("dense_compute", "cudagraph_padding"))
    per_row_s = 2 * 8_030_261_248 / (0.5 * 9e15)
    assert cm.step_time_s(390, 0, 0, 0, 1) == pytest.approx(400 * per_row_s, rel=1e-12)


# ----------------------------------------------------------------------------- experts at their own precision

def _gpt_oss_step_s(expert_precision, gpu="b200"):
    from dataclasses import replace

    from schemas.specs import get_model
    model = replace(get_model("gpt-oss-120b"), expert_gemm_precision=expert_precision) \
        if expert_precision else get_model("gpt-oss-120b")
    return _step_s(model, gpu)


def test_the_routed_experts_are_priced_at_the_expert_gemm_precision():
    """gpt-oss-120b, a 4,096-token prefill on one B200 at eta_compute 0.5 (dense_compute only).
    5,711,982,912 active parameters, of which the routed experts' 36 layers x 4 experts x
    3 x 2,880 x 2,880 = 3,583,180,800 and the rest 2,128,802,112. MXFP4 experts x MXFP8
    activations (InferenceMAX's B200 script, VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1): the experts
    at the FP8 peak 4.5e15, the rest at BF16 2.25e15:
    4,096 x (2 x 2,128,802,112 / 2.25e15 + 2 x 3,583,180,800 / 4.5e15) / 0.5
    = 4,096 x (3.784537088e-6 + 3.1850496e-6) s = 28.547427 ms; all at BF16 (the default, Marlin
    W4A16): 4,096 x 2 x 5,711,982,912 / (0.5 x 2.25e15) = 41.593390 ms."""
    from schemas.specs import get_model
    m = get_model("gpt-oss-120b")
    assert (m.active_expert_params, m.num_active_params - m.active_expert_params) == (3_583_180_800, 2_128_802_112)
    assert m.expert_gemm_precision == m.gemm_precision == "bf16"
    assert _gpt_oss_step_s(None) == pytest.approx(0.041_593_390_235_648, rel=1e-12)
    assert _gpt_oss_step_s("bf16") == pytest.approx(0.041_593_390_235_648, rel=1e-12)
    assert _gpt_oss_step_s("fp8") == pytest.approx(0.028_547_427_074_048, rel=1e-12)
    # no FP8 on Ampere: the experts fall back to the BF16 peak, 312e12
    assert _gpt_oss_step_s("fp8", "a100-80gb") == pytest.approx(4096 * 2 * 5_711_982_912 / (0.5 * 312e12), rel=1e-12)


def test_an_unknown_expert_gemm_precision_is_refused():
    from dataclasses import replace

    from schemas.errors import SpecError
    with pytest.raises(SpecError, match="field 'expert_gemm_precision' must be one of bf16, fp8, fp4, got 'int4'"):
        replace(BF16, expert_gemm_precision="int4")


def test_a_config_can_set_the_experts_precision():
    """As ``kv_cache_dtype``, an engine setting given in the model's config (``--model-config``)."""
    from schemas.specs import spec_from_config
    mixtral = {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
               "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000, "num_local_experts": 8,
               "num_experts_per_tok": 2, "max_position_embeddings": 32768, "torch_dtype": "bfloat16"}
    assert spec_from_config(mixtral, "m").expert_gemm_precision == "bf16"
    m = spec_from_config(dict(mixtral, expert_gemm_precision="fp8"), "m")
    assert (m.gemm_precision, m.expert_gemm_precision) == ("bf16", "fp8")
