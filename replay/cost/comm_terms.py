"""The collectives of a parallel replica: tensor-parallel all-reduces and expert-parallel all-to-alls.

Two terms of the step-time model (:mod:`replay.cost.cost_terms` has the others), priced over the
replica's link (:class:`~replay.cost.term_base.ReplicaShape`).
"""
from __future__ import annotations

import math

from .term_base import CostTerm


class TensorParallelComm(CostTerm):
    """Two all-reduces per layer of the step's activations (Megatron-LM).

    Notes
    -----
    One all-reduce of ``S = (N / dp) h b`` bytes over ``k = tp`` GPUs takes
    ``2 (k-1) alpha + 2 (k-1)/k S / (eta_link link_bw)`` (the ring: Patarasuk & Yuan 2009), twice
    per layer; nothing at TP 1 (docs/CASES_2.md NC-11). Over a ``fully_connected`` link (NVLink
    through NVSwitch, Infinity Fabric's mesh) the latency is ``2 alpha`` at any ``k``: vLLM's custom
    all-reduce reads every peer's buffer directly, in one step (one-shot) or a reduce-scatter and an
    all-gather step (two-shot), never ``k - 1`` ring steps; the same at ``k = 2``. InferenceMAX's
    gpt-oss-120b on H100 shows it: the TPOT of 4 clients falls from 5.2 ms at TP 2 to 3.6 ms at TP 8,
    which a ring's 14 latency steps a layer at TP 8 would not allow (bench/INFERENCEMAX.md).
    ``alpha`` is ``t_allreduce_hop_s``, the link preset's latency unless fitted (PCIe-only TP
    shows far more than the preset's 5 us);
    ``eta_link`` the fraction of the link's bandwidth the collective reaches (fitted on a TP run
    whose GPU terms come from a TP-1 calibration: on its own a TP run cannot tell it from
    ``eta_compute``, both cost time per token).
    """

    name = "tp_comm"
    params = ("t_allreduce_hop_s", "eta_link")

    def fold(self, shape, p, coef):
        k = shape.tp
        if k == 1:
            return
        m = shape.model
        layers = m.num_layers / shape.pp  # one stage's (exact: 32 / 1 == 32.0)
        alpha = p["t_allreduce_hop_s"]
        alpha = shape.link.latency_s if math.isnan(alpha) else alpha
        steps = 1 if shape.link.fully_connected else k - 1
        coef.comm_s += 2 * layers * 2 * steps * alpha
        coef.comm_per_token_s += 2 * layers * 2 * (k - 1) / k * m.hidden_size * m.dtype_bytes / (
            p["eta_link"] * shape.link.bandwidth_bytes_per_s * shape.dp)


class ExpertParallelComm(CostTerm):
    """Expert-parallel all-to-all: dispatch and combine per MoE layer.

    Notes
    -----
    With experts over ``G = tp dp`` GPUs, each token's hidden state goes to its ``k``
    experts, ``(G-1)/G`` of them on other GPUs, and comes back: per MoE layer two
    all-to-alls of ``N k h b (G-1) / G^2`` bytes per GPU at ``eta_link`` x the link's
    bandwidth, each with latency ``t_alltoall_s`` (the link's latency unless fitted).
    """

    name = "ep_comm"
    params = ("t_alltoall_s", "eta_link")

    def fold(self, shape, p, coef):
        m, g = shape.model, shape.num_gpus
        if not (m.is_moe and shape.expert_parallel and g > 1):
            return
        alpha = p["t_alltoall_s"]
        alpha = shape.link.latency_s if math.isnan(alpha) else alpha
        layers = m.num_moe_layers / shape.pp  # one stage's
        coef.comm_s += 2 * layers * alpha
        coef.comm_per_token_s += 2 * layers * m.num_experts_per_token * m.hidden_size * m.dtype_bytes * (
            g - 1) / (g * g) / (p["eta_link"] * shape.link.bandwidth_bytes_per_s)
