"""Each cost term against hand-computed values; the scalar and array paths equal bit for bit;
step time non-decreasing in every feature (shared/cases NC-01, NC-11)."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.cost.cost_model import RooflineCostModel
from replay.cost.cost_terms import DEFAULT_TERMS, TERMS
from replay.cost.term_base import CostTerm
from replay.errors import ConfigError
from schemas.cost_params import PARAMS, CostParams
from schemas.specs import GpuSpec, Link, ModelSpec, get_gpu, get_model

GPU = GpuSpec(name="g", peak_flops=1e15, mem_bandwidth_bytes_per_s=2e12, mem_bytes=80 * 2**30)
LLAMA = ModelSpec(name="8b", num_params=8e9, num_active_params=8e9, num_layers=32, hidden_size=4096,
                  num_attention_heads=32, num_kv_heads=8, head_dim=128, dtype_bytes=2, max_model_len=8192)


def _cm(terms, model=LLAMA, **params):
    return RooflineCostModel(model, GPU, CostParams(**params), terms=tuple(terms))


def test_step_overhead_per_step_and_per_sequence():
    cm = _cm(["step_overhead"], t_step_s=1e-3, t_seq_s=2e-5)
    # 3 prefill chunks + 10 decodes: 1 ms + 13 * 20 us
    assert cm.step_time_s(300, 10, 5000, 0, 3) == pytest.approx(1e-3 + 13 * 2e-5, rel=1e-12)
    assert cm.step_time_s(0, 0, 0) == 0.0


def test_dense_compute_with_small_gemm_efficiency():
    # 2 P (N + n_half) / (eta peak): 2 * 8e9 * (100 + 50) / (0.5 * 1e15) = 4.8 ms; eta(N) = 0.5 * 100 / 150
    cm = _cm(["dense_compute"], eta_compute=0.5, n_half_tokens=50)
    assert cm.step_time_s(100, 0, 0) == pytest.approx(4.8e-3, rel=1e-12)
    assert cm.step_time_s(100, 0, 0) == pytest.approx(2 * 8e9 * 100 / (0.5 * 100 / 150 * 1e15), rel=1e-12)


@pytest.mark.parametrize("tp,dp", [(2, 1), (8, 1), (2, 2)])
def test_dense_compute_knee_is_per_gpu(tp, dp):
    """The knee is per GPU: on G = tp dp GPUs a step of N tokens takes 2 P (N + G n_half) / (eta peak G).
    n_half 50, N 100: TP 2 -> 2 * 8e9 * (100 + 100) / (0.5e15 * 2) = 3.2 ms; TP 8 -> 2 * 8e9 * 500 /
    (0.5e15 * 8) = 2.0 ms; TP 2 x DP 2 as TP 4: 2 * 8e9 * 300 / 2e15 = 2.4 ms. The part below the knee,
    2 P n_half / (eta peak) = 1.6 ms, is the same on any number of GPUs."""
    cm = RooflineCostModel(LLAMA, GPU, CostParams(eta_compute=0.5, n_half_tokens=50), tp=tp, dp=dp,
                           terms=("dense_compute",))
    g = tp * dp
    assert cm.step_time_s(100, 0, 0) == pytest.approx({2: 3.2e-3, 8: 2.0e-3, 4: 2.4e-3}[g], rel=1e-12)
    assert cm.coefficients.compute_s == pytest.approx(1.6e-3, rel=1e-12)


def test_attention_compute_grows_with_context():
    # F_att = 4 * 32 layers * 32 heads * 128 = 524,288 FLOP per query-key pair.
    # Decode: 16 sequences with 16,000 context tokens in all -> 16,000 pairs;
    # prefill chunk of 512 tokens after 1,000 cached: 512 * 1000 + 512^2 / 2 = 643,072 pairs.
    cm = _cm(["attention_compute"], eta_compute=0.5)
    assert LLAMA.attention_flops_per_context_token == 524_288
    per_pair = 524_288 / (0.5 * 1e15)
    assert cm.step_time_s(0, 16, 16_000) == pytest.approx(16_000 * per_pair, rel=1e-12)
    assert cm.step_time_s(512, 0, 0, 1000, 1) == pytest.approx(643_072 * per_pair, rel=1e-12)
    # two equal chunks of 256 with 1,000 tokens of history each: 2 * (256 * 1000 + 256^2 / 2) pairs
    assert cm.step_time_s(512, 0, 0, 2000, 2) == pytest.approx(2 * (256_000 + 32_768) * per_pair, rel=1e-12)


def test_weight_and_kv_memory():
    # weights 16e9 B + 10,000 tokens * 131,072 B/token, at 0.8 * 2e12 B/s
    cm = _cm(["weight_memory", "kv_memory"], eta_mem=0.8)
    assert LLAMA.kv_bytes_per_token == 131_072
    assert cm.step_time_s(0, 8, 10_000) == pytest.approx((16e9 + 10_000 * 131_072) / 1.6e12, rel=1e-12)


def test_prefill_attention_rereads_history_once_per_query_head():
    # GQA group 32 / 8 = 4; a 64-token chunk over 2,000 tokens of history: 4 * 2,000 * 131,072 B
    # at 0.5 * 2e12 B/s = 1.048576 ms, independent of the chunk's size; decodes do not pay it.
    cm = _cm(["prefill_kv"], eta_prefill_kv=0.5)
    assert cm.step_time_s(64, 0, 0, 2000, 1) == pytest.approx(4 * 2000 * 131_072 / 1e12, rel=1e-12)
    assert cm.step_time_s(16, 0, 0, 2000, 1) == cm.step_time_s(64, 0, 0, 2000, 1)
    assert cm.step_time_s(0, 8, 10_000) == 0.0
    # per TP rank: 8 KV heads over TP 2 -> 65,536 B/token, the group unchanged (16 / 4 heads per rank)
    tp2 = RooflineCostModel(LLAMA, GPU, CostParams(eta_prefill_kv=0.5), tp=2, terms=("prefill_kv",))
    assert tp2.step_time_s(64, 0, 0, 2000, 1) == pytest.approx(4 * 2000 * 65_536 / 1e12, rel=1e-12)


def test_prefill_kv_efficiency_from_llmservingsim_attention_profiles(real_data_dir):
    """The declared eta_prefill_kv comes from the RTX PRO 6000 and RTX 4090 attention profiles:
    the per-layer time of a 16-256-token chunk is linear in its history, and its slope is one KV
    read at the decode kernels' efficiency plus this term's four reads (Llama-3.1-8B, group 4)."""
    import pandas as pd

    etas = []
    for gpu, bw in (("rtxpro6000", 1.792e12), ("rtx4090", 1.008e12)):
        a = pd.read_csv(real_data_dir / f"lss_profile_{gpu}_llama31_8b_tp1_attention.csv")
        pre = a[(a.n_decode == 0) & (a.prefill_chunk <= 256) & (a.kv_prefill >= 256)]
        slope_s = np.polyfit(pre.kv_prefill, pre.time_us, 1)[0] * 1e-6
        dec = a[(a.prefill_chunk == 0) & (a.n_decode >= 64) & (a.kv_decode >= 2048)]
        eta_decode = float(np.median(dec.n_decode * dec.kv_decode * 4096 / (dec.time_us * 1e-6))) / bw
        etas.append(4 * 4096 / ((slope_s - 4096 / (eta_decode * bw)) * bw))
    assert etas == pytest.approx([0.47, 0.61], abs=0.01)
    assert min(etas) <= PARAMS["eta_prefill_kv"].default <= max(etas)


def test_kv_bytes_per_rank_keep_one_head_per_gpu_nc01():
    # NC-01: 36 layers, 8 KV heads, head_dim 128, bf16: 147,456 B/token; TP 16 -> 1 head per rank: 18,432 B
    m = ModelSpec(name="nc01", num_params=4e9, num_active_params=4e9, num_layers=36, hidden_size=2560,
                  num_attention_heads=32, num_kv_heads=8, head_dim=128, dtype_bytes=2, max_model_len=32768)
    assert m.kv_bytes_per_token == 147_456
    cm = RooflineCostModel(m, GPU, CostParams(eta_mem=1.0), tp=16, terms=("kv_memory",))
    assert cm.coefficients.memory_per_context_token_s == pytest.approx(18_432 / 2e12, rel=1e-12)


@pytest.mark.parametrize("overlap", [0.0, 0.25, 1.0])
def test_overlap_blends_max_and_sum(overlap):
    cm = _cm(["dense_compute", "weight_memory", "overlap"], eta_compute=0.5, eta_mem=1.0, overlap=overlap)
    c, m = 2 * 8e9 * 300 / 0.5e15, 16e9 / 2e12  # 9.6 ms, 8 ms
    assert cm.step_time_s(300, 0, 0) == pytest.approx(max(c, m) + overlap * min(c, m), rel=1e-12)


@pytest.mark.parametrize("tp,each_us,step_ms", [(1, 0.0, 0.0), (2, 20.486, 3.278), (4, 45.729, 7.317),
                                                (8, 88.350, 14.136)])
def test_tp_allreduce_nc11(tp, each_us, step_ms):
    """NC-11: hidden 8,192, bf16, 80 layers, 64 tokens, 5 us per hop, 100 GB/s; two all-reduces
    per layer, ring volume 2 (n-1)/n, 2 (n-1) hops; nothing at TP 1."""
    m = ModelSpec(name="nc11", num_params=70e9, num_active_params=70e9, num_layers=80, hidden_size=8192,
                  num_attention_heads=64, num_kv_heads=8, head_dim=128, dtype_bytes=2, max_model_len=8192)
    cm = RooflineCostModel(m, GPU, CostParams(t_allreduce_hop_s=5e-6), tp=tp, tp_link=Link("l", 1e11, 5e-6),
                           terms=("tp_comm",))
    assert cm.step_time_s(0, 64, 0) == pytest.approx(step_ms * 1e-3, abs=1e-6)
    assert cm.step_time_s(0, 64, 0) / 160 == pytest.approx(each_us * 1e-6, abs=1e-9)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_tp_allreduce_over_a_fully_connected_link_takes_two_steps_at_any_size(tp):
    """NC-11's model and link, fully connected (NVLink through NVSwitch): each all-reduce's latency is
    2 x 5 us at any TP (vLLM's custom all-reduce), its bytes still 2 (n-1)/n of 64 x 8,192 x 2 B at
    100 GB/s; at TP 2 the same as the ring (2 (2-1) = 2 steps)."""
    m = ModelSpec(name="nc11", num_params=70e9, num_active_params=70e9, num_layers=80, hidden_size=8192,
                  num_attention_heads=64, num_kv_heads=8, head_dim=128, dtype_bytes=2, max_model_len=8192)
    switched, ring = (RooflineCostModel(m, GPU, CostParams(t_allreduce_hop_s=5e-6), tp=tp, terms=("tp_comm",),
                                        tp_link=Link("l", 1e11, 5e-6, fully_connected=connected))
                      for connected in (True, False))
    each_s = 2 * 5e-6 + 2 * (tp - 1) / tp * 64 * 8192 * 2 / 1e11
    assert switched.step_time_s(0, 64, 0) == pytest.approx(160 * each_s, rel=1e-12)
    if tp == 2:
        assert switched.step_time_s(0, 64, 0) == ring.step_time_s(0, 64, 0)
    else:
        assert switched.step_time_s(0, 64, 0) < ring.step_time_s(0, 64, 0)


def test_tp_allreduce_latency_defaults_to_the_link_and_can_be_fitted():
    m = get_model("llama-3.1-8b")
    link = Link("pcie", 64e9, 5e-6)
    preset = RooflineCostModel(m, GPU, CostParams(), tp=2, tp_link=link, terms=("tp_comm",))
    fitted = RooflineCostModel(m, GPU, CostParams(t_allreduce_hop_s=150e-6), tp=2, tp_link=link, terms=("tp_comm",))
    assert preset.coefficients.comm_s == pytest.approx(2 * 32 * 2 * 5e-6)
    assert fitted.coefficients.comm_s == pytest.approx(2 * 32 * 2 * 150e-6)


def test_link_efficiency_scales_the_bytes_not_the_latency():
    """eta_link: the all-reduce's bytes move at eta_link x the link's bandwidth; the hop latency
    is untouched. Llama-3.1-8B TP 2 over a 64 GB/s link at 25 %: per token and layer two
    all-reduces of 4,096 x 2 B with ring volume 2 (2-1)/2, i.e. 64 x 8,192 B / 16 GB/s = 32.768 us."""
    m = get_model("llama-3.1-8b")
    link = Link("pcie", 64e9, 5e-6)
    cm = RooflineCostModel(m, GPU, CostParams(eta_link=0.25), tp=2, tp_link=link, terms=("tp_comm",))
    assert cm.coefficients.comm_per_token_s == pytest.approx(32.768e-6, rel=1e-12)
    assert cm.coefficients.comm_s == pytest.approx(2 * 32 * 2 * 5e-6, rel=1e-12)
    # the expert-parallel all-to-all too: test_expert_parallel_all_to_all's bytes at half the bandwidth
    moe = RooflineCostModel(get_model("qwen3-30b-a3b"), GPU, CostParams(eta_link=0.5), dp=2, expert_parallel=True,
                            tp_link=Link("l", 50e9, 20e-6), terms=("ep_comm",))
    per_gpu = 100 * 8 * 2048 * 2 * 1 / 4
    assert moe.step_time_s(0, 100, 0) == pytest.approx(2 * 48 * (20e-6 + per_gpu / 25e9), rel=1e-12)


def test_a_parameter_declared_at_a_bound_is_not_called_inert():
    """eta_link is declared 1 (its upper bound): probing 'halfway to the upper bound' changed
    nothing, so a TP 2 fit held it as 'no effect on this hardware'; it has one at TP 2, none at TP 1."""
    from calibrate.fitting import inert_params

    m = get_model("llama-3.1-8b")
    assert "eta_link" not in inert_params(RooflineCostModel(m, GPU, CostParams(), tp=2), ["eta_link"])
    assert "eta_link" in inert_params(RooflineCostModel(m, GPU, CostParams(), tp=1), ["eta_link"])


def test_dp_chunks_are_capped_at_one_rank_budget():
    """A 5,000-token prompt on DP 2 ranks of 2,048 tokens each: the replica's merged budget is
    4,096, but the prompt runs on one rank, so no step prefills more than 2,048 of it."""
    from replay.config import EngineOptions, RecordOptions, ReplayConfig
    from replay.core.result_columns import steps_frame
    from replay.simulate import replay_frame

    cm = RooflineCostModel(get_model("qwen3-30b-a3b"), GPU, CostParams(), dp=2, expert_parallel=True)
    import pandas as pd

    trace = pd.DataFrame({"request_id": ["a"], "arrival_time_s": [0.0], "num_prompt_tokens": [5000],
                          "num_output_tokens": [3]})
    cfg = ReplayConfig(EngineOptions(max_num_seqs=8, max_num_batched_tokens=2048), record=RecordOptions(steps=True))
    _, engine = replay_frame(trace, cm, cfg)
    prefills = steps_frame(engine)["num_prefill_tokens"]
    assert prefills[prefills > 0].tolist() == [2048, 2048, 904]


def test_moe_reads_the_distinct_experts_a_step_touches():
    """Qwen3-30B-A3B (48 MoE layers, 128 experts, 8 per token, 9,437,184 B per expert and layer,
    3,082,186,752 B dense), DP 2 with expert parallelism on two GPUs: a step of N tokens reads
    the dense weights on each GPU and 48 * 128 * (1 - (120/128)^N) experts spread over 2 GPUs."""
    m = get_model("qwen3-30b-a3b")
    assert (m.num_moe_layers, m.num_experts, m.num_experts_per_token) == (48, 128, 8)
    assert m.expert_weight_bytes == 9_437_184 and m.dense_weight_bytes == 3_082_186_752
    cm = RooflineCostModel(m, GPU, CostParams(eta_mem=1.0), dp=2, expert_parallel=True, terms=("weight_memory",))
    for n in (1, 8, 256):
        experts = 48 * 128 * (1 - (120 / 128) ** n)
        assert cm.step_time_s(0, n, 0) == pytest.approx((3_082_186_752 + experts * 9_437_184 / 2) / 2e12, rel=1e-12)
    # one token touches 8 experts per layer: 8/128 of the expert bytes, not all of them
    one = cm.step_time_s(0, 1, 0)
    assert one == pytest.approx((3_082_186_752 + 48 * 8 * 9_437_184 / 2) / 2e12, rel=1e-12)
    # without expert parallelism each DP rank holds every expert and routes its own N / dp tokens
    rep = RooflineCostModel(m, GPU, CostParams(eta_mem=1.0), dp=2, terms=("weight_memory",))
    assert rep.step_time_s(0, 16, 0) == pytest.approx(
        (3_082_186_752 + 48 * 128 * (1 - (120 / 128) ** 8) * 9_437_184) / 2e12, rel=1e-9)


def test_expert_parallel_all_to_all():
    # per MoE layer two all-to-alls of N k h b (G-1)/G^2 bytes per GPU, each with latency alpha
    m = get_model("qwen3-30b-a3b")
    link = Link("l", 50e9, 20e-6)
    cm = RooflineCostModel(m, GPU, CostParams(), dp=2, expert_parallel=True, tp_link=link, terms=("ep_comm",))
    per_gpu = 100 * 8 * 2048 * 2 * 1 / 4
    assert cm.step_time_s(0, 100, 0) == pytest.approx(2 * 48 * (20e-6 + per_gpu / 50e9), rel=1e-12)
    dense = RooflineCostModel(get_model("llama-3.1-8b"), GPU, CostParams(), dp=2, expert_parallel=True,
                              terms=("ep_comm",))
    assert dense.step_time_s(0, 100, 0) == 0.0


def test_frontend_delays_request_latencies(tmp_path):
    """The front end: every token reaches the client t_frontend + t_per_prompt_token L later, each
    token after the first t_stream later again; the engine's queue wait is unchanged."""
    import pandas as pd

    from replay.config import RecordOptions, ReplayConfig
    from replay.simulate import replay_frame

    trace = pd.DataFrame({"request_id": ["a", "b"], "arrival_time_s": [0.0, 10.0], "num_prompt_tokens": [100, 2000],
                          "num_output_tokens": [5, 5]})
    base = _cm(DEFAULT_TERMS, eta_compute=0.5, eta_mem=0.8)
    fe = base.with_params(base.params.replace(t_frontend_s=0.02, t_frontend_per_prompt_token_s=1e-5,
                                              t_stream_per_token_s=1e-3))
    cfg = ReplayConfig(record=RecordOptions(token_times=True))
    r0, _ = replay_frame(trace, base, cfg)
    r1, _ = replay_frame(trace, fe, cfg)
    shift = 0.02 + 1e-5 * trace["num_prompt_tokens"].to_numpy()
    np.testing.assert_allclose(r1["pred_ttft_s"], r0["pred_ttft_s"] + shift, rtol=1e-12)
    np.testing.assert_allclose(r1["pred_e2e_s"], r0["pred_e2e_s"] + shift + 4e-3, rtol=1e-12)
    np.testing.assert_allclose(r1["pred_tpot_s"], r0["pred_tpot_s"] + 1e-3, rtol=1e-12)
    np.testing.assert_allclose(r1["pred_queue_wait_s"], r0["pred_queue_wait_s"], rtol=1e-12)
    np.testing.assert_allclose(r1["pred_token_times_s"][1], np.array(r0["pred_token_times_s"][1]) + shift[1]
                               + 1e-3 * np.arange(5), rtol=1e-12)


# -- properties over random models, parameters and term subsets ---------------------------------------

_MODELS = [LLAMA, get_model("qwen3-30b-a3b")]
_param = {n: st.floats(p.lower if p.lower > 0 else 0.0, p.upper, allow_nan=False)
          .filter(lambda v, lo=p.lower: v >= lo) for n, p in PARAMS.items()}
_features = st.tuples(st.integers(0, 8192), st.integers(0, 512), st.integers(0, 2_000_000), st.integers(0, 200_000),
                      st.integers(0, 16))


@st.composite
def _cost_models(draw):
    terms = draw(st.sets(st.sampled_from(list(TERMS)), min_size=1))
    terms |= {r for t in terms for r in TERMS[t].requires}
    params = {n: draw(s) for n, s in _param.items()}
    params["eta_compute"] = max(params["eta_compute"], PARAMS["eta_compute"].lower)
    params["eta_mem"] = max(params["eta_mem"], PARAMS["eta_mem"].lower)
    model = draw(st.sampled_from(_MODELS))
    tp = draw(st.sampled_from([1, 2, 4]))
    dp = draw(st.sampled_from([1, 2]))
    return RooflineCostModel(model, get_gpu("h100-80gb"), CostParams(**params), tp=tp, dp=dp,
                             expert_parallel=draw(st.booleans()), terms=tuple(sorted(terms)))


def _seqs(p, s):
    return (s if s else 1) if p else 0  # a prefill has at least one chunk; none without prefill tokens


@settings(max_examples=150, deadline=None)
@given(_cost_models(), st.lists(_features, min_size=1, max_size=8))
def test_scalar_and_array_paths_equal_bit_for_bit(cm, rows):
    p, d, cd, cp, s = (np.array(col, np.int64) for col in zip(*rows))
    s = np.array([_seqs(a, b) for a, b in zip(p, s)], np.int64)
    cp = np.where(p > 0, cp, 0)
    vec = cm.step_time_s(p, d, cd, cp, s)
    scal = [cm.step_time_s(int(a), int(b), int(c), int(e), int(f)) for a, b, c, e, f in zip(p, d, cd, cp, s)]
    assert vec.tolist() == scal


@settings(max_examples=150, deadline=None)
@given(_cost_models(), _features, st.sampled_from(range(4)), st.integers(1, 1000))
def test_step_time_non_decreasing_in_every_feature(cm, row, which, by):
    p, d, cd, cp, s = row
    s = _seqs(p, s)
    cp = cp if p else 0
    before = cm.step_time_s(p, d, cd, cp, s)
    bumped = [p, d, cd, cp]
    bumped[which] += by
    if which == 3 and not bumped[0]:  # prefill history needs prefill tokens
        bumped[0] = 1
    after = cm.step_time_s(*bumped, _seqs(bumped[0], s))
    assert after >= before or math.isclose(after, before, rel_tol=1e-12)


# -- speculative decoding: Q = num_decode_tokens decode positions (D + drafts) --------------------

_spec_features = st.tuples(st.integers(0, 8192), st.integers(0, 512), st.integers(0, 2_000_000),
                           st.integers(0, 200_000), st.integers(0, 16), st.integers(0, 2048))  # ..., drafts


def _positions(d, drafts):
    return d + drafts if d else 0  # no decode, no draft


@settings(max_examples=150, deadline=None)
@given(_cost_models(), st.lists(_spec_features, min_size=1, max_size=8))
def test_scalar_and_array_paths_equal_bit_for_bit_with_drafts(cm, rows):
    p, d, cd, cp, s, e = (np.array(col, np.int64) for col in zip(*rows))
    s = np.array([_seqs(a, b) for a, b in zip(p, s)], np.int64)
    cp = np.where(p > 0, cp, 0)
    q = np.array([_positions(a, b) for a, b in zip(d, e)], np.int64)
    vec = cm.step_time_s(p, d, cd, cp, s, num_decode_tokens=q)
    scal = [cm.step_time_s(int(a), int(b), int(c), int(x), int(f), num_decode_tokens=int(g))
            for a, b, c, x, f, g in zip(p, d, cd, cp, s, q)]
    assert vec.tolist() == scal
    # with no draft (Q = D) it is the model without the argument, bit for bit
    assert cm.step_time_s(p, d, cd, cp, s, num_decode_tokens=d).tolist() == cm.step_time_s(p, d, cd, cp, s).tolist()


@settings(max_examples=150, deadline=None)
@given(_cost_models(), _spec_features, st.sampled_from([0, 2, 3, 5]), st.integers(1, 1000))
def test_step_time_non_decreasing_with_drafts(cm, row, which, by):
    """Non-decreasing in the prefill tokens, both contexts and the draft positions, for fixed
    decode sequences (like the prefill pairs for fixed chunks, the decode pairs assume equal
    verify lengths: more sequences sharing the same context and drafts make fewer pairs)."""
    p, d, cd, cp, s, e = row
    s = _seqs(p, s)
    cp = cp if p else 0
    before = cm.step_time_s(p, d, cd, cp, s, num_decode_tokens=_positions(d, e))
    bumped = [p, d, cd, cp, s, e]
    bumped[which] += by
    if which == 3 and not bumped[0]:
        bumped[0] = 1
    p2, d2, cd2, cp2, _, e2 = bumped
    after = cm.step_time_s(p2, d2, cd2, cp2, _seqs(p2, s), num_decode_tokens=_positions(d2, e2))
    assert after >= before or math.isclose(after, before, rel_tol=1e-12)


def test_dp_a_request_needs_room_on_one_rank():
    """DP 2 ranks of 200 KV blocks each (3,200 tokens): a 5,000-token prompt fits the pooled
    400 blocks but no rank, so it is rejected as vLLM would (it ran); a 3,000-token one runs."""
    import pandas as pd

    from replay.config import EngineOptions, ReplayConfig
    from replay.simulate import replay_frame

    cm = RooflineCostModel(get_model("qwen3-30b-a3b"), GPU, CostParams(), dp=2, expert_parallel=True)
    trace = pd.DataFrame({"request_id": ["big", "ok"], "arrival_time_s": [0.0, 0.0],
                          "num_prompt_tokens": [5000, 3000], "num_output_tokens": [3, 3]})
    res, _ = replay_frame(trace, cm, ReplayConfig(EngineOptions(max_num_seqs=8, max_num_batched_tokens=2048,
                                                                num_gpu_blocks=200)))
    assert res["pred_status"].tolist() == ["rejected: exceeds KV cache capacity", "ok"]


def test_a_term_that_adds_to_another_is_refused_without_it(monkeypatch):
    class OnTopOfCompute(CostTerm):
        name, requires = "on_top", ("dense_compute",)

        def fold(self, shape, p, coef):
            coef.compute_per_token_s += 1e-6

    monkeypatch.setitem(TERMS, "on_top", OnTopOfCompute())
    with pytest.raises(ConfigError, match="on_top needs dense_compute"):
        RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb"), terms=("on_top", "weight_memory"))
    assert RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb"),
                             terms=("dense_compute", "on_top")).coefficients.compute_per_token_s > 1e-6
