"""The terms of the step-time model: one class per mechanism.

A term turns the replica's shape (model, GPU, tensor/data/expert parallelism, link) and
the parameter values into contributions to a few *coefficients* (:class:`Coefficients`);
:class:`replay.cost.cost_model.RooflineCostModel` folds the terms once and evaluates the step
time from the coefficients with one function for scalars (the engine's hot path) and arrays
(the fits): :data:`replay.cost.step_time.FORMULA`. A new mechanism is a new term class and its
tests; the engine never knows which terms exist.

The step's features are the step record's (:data:`schemas.step_record.STEP_FEATURES`):
``P`` prefill tokens in ``S`` prefill chunks, ``D`` decoding sequences feeding ``Q``
positions, ``C_d`` their context tokens (the seed's L_total), ``C_p`` the KV history the
prefill chunks attend to. Derived (:data:`~replay.cost.step_time.FORMULA`): ``N`` tokens,
``S + D`` sequences, ``A`` attention query-key pairs, ``C`` context tokens read.
"""
from __future__ import annotations

from schemas.cost_params import CostParams

from .comm_terms import ExpertParallelComm, TensorParallelComm
from .term_base import CostTerm, ReplicaShape


class StepOverhead(CostTerm):
    """Per-step and per-sequence CPU/launch time.

    Notes
    -----
    ``t_step + t_seq (S + D)``: the seed's ``T_launch`` plus the engine's scheduling and
    input preparation per step, and sampling/detokenising per sequence (vLLM's CPU
    overheads; Vidur models them as per-step and per-token CPU operations, Agrawal et al.
    MLSys 2024, section 4).
    """

    name = "step_overhead"
    params = ("t_step_s", "t_seq_s")

    def fold(self, shape, p, coef):
        coef.fixed_s += p["t_step_s"]
        coef.per_seq_s += p["t_seq_s"]


class DenseCompute(CostTerm):
    """GEMM FLOPs of the step's tokens, with an efficiency that grows with the tokens.

    Notes
    -----
    ``2 P_active N / (eta(N) peak)`` with ``eta(N) = eta_compute N / (N + n_half)``
    (seed section 1 for the FLOPs; the saturating efficiency models GEMMs too small to fill
    the GPU's SMs, which a decode step of a few sequences is), i.e.
    ``2 P_active (N + n_half) / (eta_compute peak)``. The FLOPs spread over the replica's
    ``G = tp * dp`` GPUs, and so does the knee: ``n_half`` is the GEMM size per GPU, the step's
    knee ``G n_half_tokens`` tokens. Split ``tp`` ways, each GPU's GEMMs are ``tp`` times narrower
    (fewer output tiles for its SMs) and fill them only at ``tp`` times the tokens; a DP rank
    sees ``N / dp`` of the tokens. So the time of a step too small to fill the GPUs,
    ``2 P_active G n_half / (eta_compute peak G)``, does not shrink as the GPUs are added.
    Vidur's H100 profile of Llama-2-7B's linear layers (``vidur_mlp_h100_llama2_7b.csv``,
    1-4,096 tokens at TP 1-8) fitted with a knee ``n_half tp^g`` gives ``g`` = 0.91
    (tests/replay/test_knee_per_gpu.py); InferenceMAX's gpt-oss-120b on H100 shows it: its TPOT at
    4 clients falls 1.4x from TP 2 to 8, not the 1.8x of a knee fixed in tokens
    (bench/INFERENCEMAX.md). ``peak`` is the GPU's dense tensor peak in the model's GEMM precision,
    ``gpu.peak_flops_for(model.gemm_precision)``: FP8 for a W8A8 FP8 checkpoint, FP4 for NVFP4,
    BF16 for the rest and where the GPU lacks the precision (vLLM then runs the weights
    dequantised to BF16: :meth:`schemas.gpu_types.GpuSpec.peak_flops_for`). The routed experts'
    share of ``P_active`` (:attr:`~schemas.spec_types.ModelSpec.active_expert_params`) is priced
    at the peak of ``model.expert_gemm_precision`` (MXFP4 experts x MXFP8 activations on
    Blackwell: FP8), the rest at ``gemm_precision``'s, though a quantised checkpoint usually
    keeps its lm_head in BF16 (a few percent of the FLOPs of a large model).
    """

    name = "dense_compute"
    params = ("eta_compute", "n_half_tokens")

    def fold(self, shape, p, coef):
        per_token = _gemm_s_per_token(shape, p)
        coef.compute_per_token_s += per_token
        coef.compute_s += per_token * p["n_half_tokens"] * shape.tp * shape.dp


def _gemm_s_per_token(shape: ReplicaShape, p: CostParams) -> float:
    """Seconds of GEMM FLOPs per token, ``2 (P_active - P_exp) / (eta_compute peak) + 2 P_exp /
    (eta_compute peak_exp)`` over the replica's GPUs, one stage's layers (seed section 1);
    ``P_exp`` the routed experts' active parameters, ``peak`` and ``peak_exp`` the GPU's dense
    peaks in the model's ``gemm_precision`` and ``expert_gemm_precision`` [FLOP/s] (:class:`DenseCompute`)."""
    m, gpu = shape.model, shape.gpu
    peak = gpu.peak_flops_for(m.gemm_precision)
    peak_exp = gpu.peak_flops_for(m.expert_gemm_precision)
    if peak_exp == peak:  # one peak: the very float of the single-precision formula (replays are bit-stable)
        return 2.0 * m.num_active_params / (p["eta_compute"] * peak * shape.num_gpus * shape.pp)
    seconds_per_flop = (m.num_active_params - m.active_expert_params) / peak + m.active_expert_params / peak_exp
    return 2.0 * seconds_per_flop / (p["eta_compute"] * shape.num_gpus * shape.pp)


class CudaGraphPadding(CostTerm):
    """The GEMM FLOPs of the rows a CUDA graph pads a step with (optional; adds to dense_compute).

    Notes
    -----
    vLLM v1 replays a step of ``N`` tokens, up to its largest capture size, in the CUDA graph
    captured for the next size: the linear layers compute ``G`` padding rows
    (:func:`schemas.step_record.cudagraph_padding_tokens`), priced per row as
    :class:`DenseCompute` prices a token, ``2 P_active / (eta_compute peak)`` (the peak in the
    model's GEMM precision), in the compute
    part: with it the GEMMs see ``N + G`` rows, the capture size, never fewer as ``N`` grows.
    The padding has no context: no attention pairs, no KV read, and the weights are read once
    anyway. A DP replica is priced with the padding of its whole step (vLLM pads each rank's
    share to a size the ranks agree on: approximate). Optional: name it in ``--terms`` for an
    engine with CUDA graphs (not with ``--enforce-eager``).
    """

    name = "cudagraph_padding"
    params = ("eta_compute",)
    optional = True
    requires = ("dense_compute",)

    def fold(self, shape, p, coef):
        coef.add_per_feature("compute", "num_padded_tokens", _gemm_s_per_token(shape, p))


class AttentionCompute(CostTerm):
    """Attention FLOPs, which grow with the context each query token sees.

    Notes
    -----
    ``F_att A / (eta_compute peak)`` with ``F_att`` the FLOPs one query token spends per
    context token over the full-attention layers (``4 n_layers n_heads head_dim``: QK^T and PV,
    2 FLOPs a multiply-add; Kaplan et al. 2020, table 1) and ``A`` the query-key pairs of the
    step; plus, per token, the FLOPs of the windowed and linear-attention layers, whose work
    does not grow with the context (:attr:`schemas.spec_types.ModelSpec.bounded_attention_flops_per_token`).
    ``peak`` is the BF16 peak whatever the model's GEMM precision: vLLM's default attention
    backends (FlashAttention, FlashInfer, Triton; ROCm's AITER/Triton) compute QK^T and PV in
    the activations' BF16/FP16 with the default ``--kv-cache-dtype auto``, also for an FP8 or
    FP4 checkpoint (its quantisation covers the linear layers); FP8 attention kernels over an
    FP8 KV cache (FlashAttention-3 on Hopper) are not modelled.
    """

    name = "attention_compute"
    params = ("eta_compute",)

    def fold(self, shape, p, coef):
        rate = p["eta_compute"] * shape.gpu.peak_flops * shape.num_gpus * shape.pp
        coef.compute_per_pair_s += shape.model.attention_flops_per_context_token / rate
        coef.compute_per_token_s += shape.model.bounded_attention_flops_per_token / rate


class WeightMemory(CostTerm):
    """Reading the weights once per step: all of a dense model; for MoE the dense part and
    the distinct experts the step's tokens route to.

    Notes
    -----
    Dense: ``W / (eta_mem bw tp)`` (seed section 1); each DP rank reads its own copy in
    parallel. MoE (uniform routing of ``k`` of ``E`` experts per token): a given expert is
    missed by all ``N`` tokens with probability ``(1 - k/E)^N``, so a step reads
    ``L_moe E (1 - (1 - k/E)^N)`` experts' bytes, shared by the GPUs that hold experts:
    ``tp * dp`` with expert parallelism, ``tp`` without (then each rank routes only its own
    ``N / dp`` tokens: ``(1 - k/E)^(N/dp)``).
    """

    name = "weight_memory"
    params = ("eta_mem",)

    def fold(self, shape, p, coef):
        m, bw = shape.model, p["eta_mem"] * shape.gpu.mem_bandwidth_bytes_per_s * shape.pp  # one stage's layers
        if not m.is_moe:
            coef.memory_s += m.weight_bytes / (bw * shape.tp)
            return
        coef.memory_s += m.dense_weight_bytes / (bw * shape.tp)
        expert_gpus = shape.num_gpus if shape.expert_parallel else shape.tp
        coef.memory_expert_s += m.num_moe_layers * m.num_experts * m.expert_weight_bytes / (bw * expert_gpus)
        miss = 1.0 - m.num_experts_per_token / m.num_experts
        coef.expert_miss = miss if shape.expert_parallel else miss ** (1.0 / shape.dp)


class KVMemory(CostTerm):
    """Reading the KV cache of every context token the step attends to.

    Notes
    -----
    ``C D_kv_rank / (eta_mem bw dp)``: ``D_kv_rank`` the KV bytes per token on one TP rank
    (at least one KV head per rank, docs/CASES_2.md NC-01), the context spread over the DP
    ranks (seed section 1: the ``L_total D_kv`` term); plus ``(S + D) B_seq / (eta_mem bw dp)``,
    each sequence of the step reading what it holds whatever its length (``B_seq``: its window's
    KV in windowed layers, its linear-attention state:
    :meth:`schemas.spec_types.ModelSpec.seq_state_bytes_per_rank`; 0 for full attention only).
    """

    name = "kv_memory"
    params = ("eta_mem",)

    def fold(self, shape, p, coef):
        m, bw = shape.model, p["eta_mem"] * shape.gpu.mem_bandwidth_bytes_per_s * shape.dp * shape.pp
        coef.memory_per_context_token_s += m.kv_bytes_per_token_per_rank(shape.tp) / bw
        coef.memory_per_seq_s += m.seq_state_bytes_per_rank(shape.tp) / bw


class PrefillAttentionKV(CostTerm):
    """Chunked-prefill attention reading the KV history once per query head.

    Notes
    -----
    ``g C_p D_kv_rank / (eta_prefill_kv bw dp)`` with ``g = n_heads / n_kv_heads`` (the
    GQA group; 1 for MLA and multi-head attention), added to the one read of
    :class:`KVMemory`. A prefill chunk's attention kernel tiles the queries by head, so each
    of a KV head's ``g`` query heads streams that head's history again (no sharing within
    the group), and a short chunk gives too few tiles to reach the bandwidth of a GEMM.
    Measured in LLMServingSim's attention profiles of Llama-3.1-8B (``g`` = 4): a chunk of
    16-256 tokens over ``h`` history tokens takes a per-layer constant plus a time linear in
    ``h`` and independent of the chunk's size; the slope is this term's at
    ``eta_prefill_kv`` ~0.5 (see the parameter's declaration).
    """

    name = "prefill_kv"
    params = ("eta_prefill_kv",)

    def fold(self, shape, p, coef):
        m = shape.model
        group = m.num_attention_heads / m.num_kv_heads if not m.is_mla else 1.0
        coef.memory_per_prefill_context_token_s += group * m.kv_bytes_per_token_per_rank(shape.tp) / (
            p["eta_prefill_kv"] * shape.gpu.mem_bandwidth_bytes_per_s * shape.dp * shape.pp)


class Overlap(CostTerm):
    """How compute and memory time combine: ``max(c, m) + overlap min(c, m)``.

    Notes
    -----
    0 is the seed's roofline (perfect overlap), 1 the sum (none); the data choose.
    """

    name = "overlap"
    params = ("overlap",)

    def fold(self, shape, p, coef):
        coef.overlap = p["overlap"]


#: Every term, by name.
TERMS: dict[str, CostTerm] = {t.name: t for t in (
    StepOverhead(), DenseCompute(), AttentionCompute(), WeightMemory(), KVMemory(), PrefillAttentionKV(), Overlap(),
    TensorParallelComm(), ExpertParallelComm(), CudaGraphPadding())}
#: The seed's roofline (theory.md section 1) with a TP all-reduce: no attention FLOPs.
SEED_TERMS = ("step_overhead", "dense_compute", "weight_memory", "kv_memory", "overlap", "tp_comm", "ep_comm")
#: The default of fits and replays: every term but the optional ones.
DEFAULT_TERMS = tuple(name for name, term in TERMS.items() if not term.optional)
