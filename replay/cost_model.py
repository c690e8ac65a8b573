"""The roofline cost model of one replica's forward pass (step).

The engine sees a cost model only through :class:`StepCostModel`: the duration of a step
from the step's aggregates. :class:`RooflineCostModel` is the seed's roofline
(``shared/seed/theory.md`` section 1) with the parameters calibration fits.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from schemas.calibration import Calibration
from schemas.specs import GpuSpec, Link, ModelSpec, link_presets

from .errors import ConfigError
from .kv_capacity import kv_capacity_blocks  # noqa: F401  (its old home; import it from there)


class StepCostModel(Protocol):
    """What the engine needs from a cost model.

    An implementation may also set ``supports_arrays = True`` when ``step_time_s`` is
    deterministic and accepts numpy arrays; the engine then prices runs of identical decode
    steps in one call (closed form). Stochastic or scalar-only models are called per step.
    """

    def step_time_s(self, num_prefill_tokens: int, num_decode_seqs: int,
                    decode_context_tokens: int, prefill_context_tokens: int = 0) -> float:
        """Duration in seconds of one step with these aggregates (0 tokens -> 0 s)."""
        ...


@dataclass(frozen=True)
class CostParams:
    """Fitted parameters of the roofline.

    Attributes
    ----------
    eta_compute : float
        Fraction of the GPU's dense peak FLOP/s reached, in (0, 1].
    eta_mem : float
        Fraction of the datasheet memory bandwidth reached, in (0, 1].
    t_launch_s : float
        Kernel launch latency per step, seconds (seed: ~0.05-0.10 ms).
    t_cpu_s : float
        Per-step CPU overhead (scheduling, sampling, detokenising), seconds.
    form : str
        ``"max"`` (the seed's roofline) or ``"sum"`` (compute and memory times added).
    """

    eta_compute: float = 0.5
    eta_mem: float = 1.0
    t_launch_s: float = 1e-4
    t_cpu_s: float = 0.0
    form: str = "max"

    def __post_init__(self):
        if not (0 < self.eta_compute <= 1.5 and 0 < self.eta_mem <= 1.5):
            raise ValueError(f"efficiencies must be in (0, 1.5]: eta_compute={self.eta_compute}, eta_mem={self.eta_mem}")
        if self.t_launch_s < 0 or self.t_cpu_s < 0:
            raise ValueError("t_launch_s and t_cpu_s must be >= 0")
        if self.form not in ("max", "sum"):
            raise ValueError(f"form must be 'max' or 'sum', not {self.form!r}")


#: Link presets by name, built from the catalog (``schemas/catalog/links.json``, every value
#: with its source; :func:`schemas.specs.get_link`). Kept here so older imports still work.
LINKS: dict[str, Link] = link_presets()


@dataclass(frozen=True)
class RooflineCostModel:
    """Roofline step time of one replica (``tp`` GPUs) for one model.

    Parameters
    ----------
    model : ModelSpec
    gpu : GpuSpec
    params : CostParams
    tp : int
        Tensor-parallel degree: weights, KV and FLOPs split over ``tp`` GPUs.
    tp_link : Link, optional
        Link the all-reduces of tensor parallelism run over (default: the GPU's ``tp_link``).

    Notes
    -----
    With P the (active) parameter count, b bytes per weight, D_kv the KV bytes per token
    (``2 * n_layers * n_kv_heads * head_dim * b``), peak the dense FLOP/s and bw the memory
    bandwidth of one GPU (seed, theory.md section 1)::

        compute_s = 2 * P * N_tokens / (eta_compute * peak * tp)
        memory_s  = (P * b + (L_decode + L_prefill_ctx) * D_kv) / (eta_mem * bw * tp)
        step_s    = t_launch + t_cpu + max(compute_s, memory_s)     (form "max")
                                      or compute_s + memory_s         (form "sum")
                    + 2 * n_layers * allreduce(N_tokens * hidden * b)  (tp > 1)

    For a prefill-only step of N tokens this is the seed's ``T_prefill(N)``; for a
    decode-only step of B sequences holding L_total context tokens it is the seed's
    ``T_decode(B, L_total)``, never below its compute bound. The ring all-reduce of S bytes
    over K GPUs takes ``2 (K-1)/K * S / link_bw + 2 (K-1) * link_latency`` (Patarasuk &
    Yuan 2009), twice per layer (attention and MLP outputs, Megatron-LM).
    """

    #: ``step_time_s`` is deterministic and accepts numpy arrays: the engine may price a run
    #: of identical decode steps in one call (a cost model without it is called step by step).
    supports_arrays = True

    model: ModelSpec
    gpu: GpuSpec
    params: CostParams = field(default_factory=CostParams)
    tp: int = 1
    tp_link: Link | None = None

    def __post_init__(self):
        if self.tp < 1:
            raise ConfigError(f"tp must be >= 1, not {self.tp}")
        if self.model.num_attention_heads % self.tp:
            raise ConfigError(f"tp={self.tp} does not divide the {self.model.num_attention_heads} attention heads of "
                             f"{self.model.name} (vLLM refuses it)")
        # the constants of compute_s and memory_s, for the scalar path of step_time_s (the
        # engine's hot path): the same operations in the same order, so the same floats
        object.__setattr__(self, "_scalar_terms", (
            2.0 * self.model.num_active_params, self.params.eta_compute * self.peak_flops,
            self.model.weight_bytes, self.model.kv_bytes_per_token,
            self.params.eta_mem * self.bandwidth_bytes_per_s, self.params.form == "max",
            self.params.t_launch_s + self.params.t_cpu_s))
        if self.tp_link is None:  # the GPU's own interconnect
            if self.gpu.tp_link not in LINKS:
                raise ConfigError(f"gpu {self.gpu.name}: unknown tp_link {self.gpu.tp_link!r}; known: {', '.join(LINKS)}")
            object.__setattr__(self, "tp_link", LINKS[self.gpu.tp_link])

    def with_params(self, params: CostParams) -> "RooflineCostModel":
        """A copy with other parameters."""
        return replace(self, params=params)

    def flops(self, num_tokens):
        """FLOPs of a step feeding ``num_tokens`` tokens: ``2 * P * N`` (seed section 1)."""
        return 2.0 * self.model.num_active_params * num_tokens

    def bytes_read(self, context_tokens):
        """Bytes a step reads: all weights plus ``context_tokens`` tokens of KV (seed section 1)."""
        return self.model.weight_bytes + context_tokens * self.model.kv_bytes_per_token

    @property
    def peak_flops(self) -> float:
        """Dense peak FLOP/s of the replica's ``tp`` GPUs."""
        return self.gpu.peak_flops * self.tp

    @property
    def bandwidth_bytes_per_s(self) -> float:
        """Memory bandwidth of the replica's ``tp`` GPUs, bytes/s."""
        return self.gpu.mem_bandwidth_bytes_per_s * self.tp

    def compute_s(self, num_tokens):
        """Compute-bound time of ``num_tokens`` tokens (scalar or array), seconds."""
        return self.flops(num_tokens) / (self.params.eta_compute * self.peak_flops)

    def memory_s(self, context_tokens):
        """Memory-bound time of reading all weights and ``context_tokens`` tokens of KV, seconds."""
        return self.bytes_read(context_tokens) / (self.params.eta_mem * self.bandwidth_bytes_per_s)

    def allreduce_s(self, num_tokens):
        """All-reduce time of one step for ``num_tokens`` tokens (0 when tp == 1), seconds."""
        if self.tp == 1:
            return 0.0 * num_tokens
        k = self.tp
        size = num_tokens * self.model.hidden_size * self.model.dtype_bytes
        one = 2 * (k - 1) / k * size / self.tp_link.bandwidth_bytes_per_s + 2 * (k - 1) * self.tp_link.latency_s
        return 2 * self.model.num_layers * one

    def step_time_s(self, num_prefill_tokens, num_decode_seqs, decode_context_tokens,
                    prefill_context_tokens=0):
        """Duration of one step, seconds (scalars or numpy arrays of equal shape).

        A step with no tokens takes 0 s.
        """
        tokens = num_prefill_tokens + num_decode_seqs
        if tokens.__class__ is int or not isinstance(tokens, np.ndarray):  # scalars: plain floats, same IEEE ops
            if tokens <= 0:
                return 0.0
            two_p, compute_den, weights, d_kv, memory_den, form_max, fixed_s = self._scalar_terms
            c = two_p * tokens / compute_den
            m = (weights + (decode_context_tokens + prefill_context_tokens) * d_kv) / memory_den
            body = (c if c > m else m) if form_max else c + m
            return fixed_s + body + (self.allreduce_s(tokens) if self.tp > 1 else 0.0)
        p = self.params
        c = self.compute_s(tokens)
        m = self.memory_s(decode_context_tokens + prefill_context_tokens)
        body = np.maximum(c, m) if p.form == "max" else c + m
        t = p.t_launch_s + p.t_cpu_s + body + self.allreduce_s(tokens)
        return np.where(np.asarray(tokens) > 0, t, 0.0)

    def prefill_time_s(self, num_tokens: int) -> float:
        """Seed's ``T_prefill(N)``: one prefill-only step of ``num_tokens`` tokens, seconds."""
        return self.step_time_s(num_tokens, 0, 0)

    def decode_time_s(self, batch_size: int, context_tokens: int) -> float:
        """Seed's ``T_decode(B, L_total)``: one decode-only step, seconds."""
        return self.step_time_s(0, batch_size, context_tokens)


def kv_transfer_time_s(num_prompt_tokens: int, model: ModelSpec, link: Link) -> float:
    """Time to move a prompt's KV cache between instances, seconds.

    Notes
    -----
    Seed, theory.md section 2: ``T = L_prompt * D_kv / link_bw + latency``.
    """
    return num_prompt_tokens * model.kv_bytes_per_token / link.bandwidth_bytes_per_s + link.latency_s


def cost_model_from_calibration(cal: Calibration, model: ModelSpec | None = None,
                                tp: int | None = None) -> RooflineCostModel:
    """The roofline of a calibration file, optionally for another model on the same GPU or
    another tensor-parallel degree (the efficiencies and latencies carry over)."""
    params = CostParams(eta_compute=cal.value("eta_compute"), eta_mem=cal.value("eta_mem"),
                        t_launch_s=cal.value("t_launch_s"), t_cpu_s=cal.value("t_cpu_s"), form=cal.form)
    return RooflineCostModel(model or cal.model, cal.gpu, params, tp or cal.tp)
