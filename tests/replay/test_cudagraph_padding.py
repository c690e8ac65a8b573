"""The CUDA-graph padding term and its derived step feature: hand-computed padding and times, the
written formula, both evaluation paths, the engine's step trace and a step fit that recovers it.

The values come from vLLM v1's capture sizes (1, 2, 4, multiples of 8 below 256, of 16 up to
512) and the dense GEMM FLOPs, ``2 P_active`` per token (seed section 1)."""
import json

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from calibrate.step_fit import fit_steps
from calibrate.umbrella import main as servecal
from replay.config import EngineOptions, RecordOptions, ReplayConfig
from replay.core.result_columns import steps_frame
from replay.cost.cost_model import RooflineCostModel
from replay.cost.cost_terms import DEFAULT_TERMS, TERMS
from replay.cost.step_time import FORMULA
from replay.errors import ConfigError
from replay.simulate import replay_frame
from schemas.cost_params import CostParams
from schemas.specs import GpuSpec, ModelSpec
from schemas.step_record import KEPT_NAMES, KeptFeatures, cudagraph_padding_tokens
from schemas.tables import STEP_TRACE, to_table, write_table

GPU = GpuSpec(name="g", peak_flops=1e15, mem_bandwidth_bytes_per_s=2e12, mem_bytes=80 * 2**30)
LLAMA = ModelSpec(name="8b", num_params=8e9, num_active_params=8e9, num_layers=32, hidden_size=4096,
                  num_attention_heads=32, num_kv_heads=8, head_dim=128, dtype_bytes=2, max_model_len=8192)
TRUTH = CostParams(eta_compute=0.5, eta_mem=0.8, t_step_s=2e-4, n_half_tokens=0.0)
GEMM_S_PER_TOKEN = 2 * 8e9 / (0.5 * 1e15)  # 3.2e-5 s
TERMS_WITH = ("step_overhead", "dense_compute", "weight_memory", "kv_memory", "cudagraph_padding")


def _cm(terms=TERMS_WITH, params=TRUTH):
    return RooflineCostModel(LLAMA, GPU, params, terms=terms)


def _kept(p, d, q=None):
    return KeptFeatures(p, int(p > 0), d, 0, 0, d if q is None else q)


@pytest.mark.parametrize("p, d, q, padding", [
    (0, 0, None, 0),  # no tokens, no graph
    (0, 1, None, 0), (0, 3, None, 1), (0, 9, None, 7), (0, 8, 24, 0), (5, 4, None, 7),
    (255, 0, None, 1), (256, 0, None, 0), (257, 0, None, 15), (500, 12, None, 0), (511, 0, None, 1),
    (513, 0, None, 0), (4096, 30, None, 0)])  # above 512: no graph
def test_padding_to_the_next_capture_size(p, d, q, padding):
    assert cudagraph_padding_tokens(_kept(p, d, q)) == padding
    arrays = KeptFeatures(*(np.array([v]) for v in _kept(p, d, q)))
    assert cudagraph_padding_tokens(arrays).tolist() == [padding]


def test_optional_and_on_top_of_dense_compute():
    assert "cudagraph_padding" in TERMS and "cudagraph_padding" not in DEFAULT_TERMS
    with pytest.raises(ConfigError, match="cudagraph_padding needs dense_compute"):
        _cm(("weight_memory", "cudagraph_padding"))


def test_hand_computed_step_time():
    """9 decodes at context 0: 16 GEMM rows, 16 x 3.2e-5 = 0.512 ms of compute against 16e9 B /
    (0.8 x 2e12 B/s) = 10 ms of weights: memory-bound, 10.2 ms either way. 300 prefill tokens pad
    to 304: 304 x 3.2e-5 = 9.728 ms < 10 ms, still memory-bound; 400 pad to 400 (a capture size):
    12.8 ms; 390 to 400: 12.8 ms with the term, 12.48 ms without."""
    with_term, without = _cm(), _cm(TERMS_WITH[:-1])
    assert with_term.step_time_s(0, 9, 0) == pytest.approx(10.2e-3, rel=1e-12) == without.step_time_s(0, 9, 0)
    assert with_term.step_time_s(400, 0, 0) == pytest.approx(2e-4 + 400 * GEMM_S_PER_TOKEN, rel=1e-12)
    assert with_term.step_time_s(390, 0, 0) == pytest.approx(2e-4 + 400 * GEMM_S_PER_TOKEN, rel=1e-12)
    assert without.step_time_s(390, 0, 0) == pytest.approx(2e-4 + 390 * GEMM_S_PER_TOKEN, rel=1e-12)
    assert with_term.coefficients.per_feature == {("compute", "num_padded_tokens"): pytest.approx(GEMM_S_PER_TOKEN)}


def test_the_written_formula_prices_it_as_the_code():
    cm = _cm(params=CostParams(eta_compute=0.5, eta_mem=0.8, t_step_s=2e-4, t_seq_s=1e-5, overlap=0.3))
    coef = cm.coefficients
    for p, s, d, cd, cp, q in [(390, 1, 0, 0, 0, 0), (100, 2, 37, 9000, 500, 37), (0, 0, 5, 300, 0, 13)]:
        g = cudagraph_padding_tokens(KeptFeatures(p, s, d, cd, cp, q))
        scope = {**{f.removesuffix("_s"): v for f, v in vars(coef).items() if f != "per_feature"},
                 "P": p, "S": s, "D": d, "C_d": cd, "C_p": cp, "Q": q,
                 "c_x": coef.per_feature["compute", "num_padded_tokens"] * g, "m_x": 0.0, "serial_x": 0.0}
        exec(FORMULA, {}, scope)
        assert cm.step_time_s(p, d, cd, cp, s, num_decode_tokens=q) == pytest.approx(scope["step"], rel=1e-12)


def test_numbers_and_arrays_agree_bit_for_bit():
    rng = np.random.default_rng(1)
    p, d = rng.integers(0, 700, 300) * (rng.random(300) < 0.5), rng.integers(0, 300, 300)
    cd, cp, s = d * rng.integers(1, 3000, 300), np.where(p > 0, rng.integers(0, 900, 300), 0), (p > 0).astype(int)
    cm = _cm(params=CostParams(eta_compute=0.5, eta_mem=0.8, t_step_s=2e-4, t_seq_s=1e-5, overlap=0.3))
    arrays = cm.step_time_s(p, d, cd, cp, s)
    numbers = [cm.step_time_s(*map(int, v)) for v in zip(p, d, cd, cp, s)]
    assert arrays.tolist() == numbers


def test_its_component_is_the_padding_time():
    parts = _cm().eval_components(np.array([390, 0, 600]), np.array([0, 9, 0]), np.array([0, 900, 0]))
    assert parts["cudagraph_padding"].tolist() == pytest.approx([10 * GEMM_S_PER_TOKEN, 7 * GEMM_S_PER_TOKEN, 0.0])


def test_the_engine_records_it_on_every_step():
    """Chunked prefill at a 256-token budget, then closed-form decode runs: each recorded step's
    padding is its token count's, and the step trace has the term's time."""
    trace = pd.DataFrame({"request_id": list("abc"), "arrival_time_s": [0.0, 0.0, 0.05],
                          "num_prompt_tokens": [300, 45, 700], "num_output_tokens": [30, 9, 20]})
    cfg = ReplayConfig(EngineOptions(max_num_batched_tokens=256), record=RecordOptions(steps=True))
    _, engine = replay_frame(trace, _cm(), cfg)
    steps = steps_frame(engine)
    tokens = steps["num_prefill_tokens"] + steps["num_decode_seqs"]
    expected = [cudagraph_padding_tokens(_kept(int(n), 0)) for n in tokens]
    assert steps["num_padded_tokens"].tolist() == expected and sum(expected) > 0
    np.testing.assert_allclose(steps["t_cudagraph_padding_s"], steps["num_padded_tokens"] * GEMM_S_PER_TOKEN,
                               rtol=1e-12)
    np.testing.assert_allclose(steps.filter(regex=r"^t_\w+_s$").sum(axis=1), steps["step_duration_s"], rtol=1e-12)


def _padded_steps(n: int, seed: int) -> pd.DataFrame:
    """Steps of 1-600 tokens timed with the term, 1 % noise; no padding column."""
    rng = np.random.default_rng(seed)
    p = np.where(rng.random(n) < 0.6, rng.integers(260, 600, n), 0)
    d = np.where(p > 0, rng.integers(0, 4, n), rng.integers(1, 64, n))
    cd = d * rng.integers(100, 2000, n)
    return pd.DataFrame({"replica_id": 0, "step_start_time_s": np.arange(n) * 0.05, "num_prefill_tokens": p,
                         "num_prefill_seqs": (p > 0).astype(int), "num_decode_seqs": d, "decode_context_tokens": cd,
                         "step_duration_s": _cm().step_time_s(p, d, cd) * rng.lognormal(0.0, 0.01, n)})


def test_calibrate_fit_adds_it_to_the_default_terms(tmp_path):
    steps = tmp_path / "steps.parquet"
    write_table(to_table(STEP_TRACE, _padded_steps(300, 3)), steps)
    model = ["--model-config", tmp_path / "config.json", "--gpu-spec", tmp_path / "gpu.json"]
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256, "torch_dtype": "bfloat16",
        "max_position_embeddings": 8192}))
    (tmp_path / "gpu.json").write_text(json.dumps({"name": "g", "peak_flops": 1e15, "mem_bandwidth_bytes_per_s": 2e12,
                                                   "mem_bytes": 80 * 2**30}))
    res = CliRunner().invoke(servecal, [str(a) for a in ["calibrate", "fit", steps, *model, "--terms",
                                                         "+cudagraph_padding", "-o", tmp_path / "cal.json"]])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "cal.json").read_text())["terms"] == [*DEFAULT_TERMS, "cudagraph_padding"]
    alone = CliRunner().invoke(servecal, [str(a) for a in ["calibrate", "fit", steps, *model, "--terms",
                                                           "cudagraph_padding", "-o", tmp_path / "c2.json"]])
    assert alone.exit_code == 2 and "cudagraph_padding needs dense_compute" in alone.output
    assert not (tmp_path / "c2.json").exists()


def test_a_step_fit_prices_it_from_the_kept_columns():
    """Steps of 1-600 tokens timed with the term (1 % noise), the padding column dropped: the fit
    with the term recovers eta_compute within 2 % and fits better than the one without."""
    steps = _padded_steps(400, 2)
    assert set(KEPT_NAMES) - set(steps) == {"prefill_context_tokens", "num_decode_tokens"}
    start = CostParams(eta_compute=0.3, eta_mem=0.6, t_step_s=1e-4, n_half_tokens=0.0)
    fixed = {"n_half_tokens": 0.0, "t_seq_s": 0.0}
    (with_term, *_), _ = fit_steps(steps, _cm(params=start), variants=("max",), fixed=fixed)
    (without, *_), _ = fit_steps(steps, _cm(TERMS_WITH[:-1], start), variants=("max",), fixed=fixed)
    assert with_term.params["eta_compute"].value == pytest.approx(0.5, rel=0.02)
    assert with_term.score < without.score
