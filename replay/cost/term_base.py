"""What every cost term shares: the replica's shape, the folded coefficients and the term's contract.

:class:`ReplicaShape` is the hardware one replica runs on, :class:`Coefficients` the few numbers
the terms fold into (:data:`replay.cost.step_time.FORMULA` prices a step from them), and
:class:`CostTerm` the contract of one mechanism. The terms themselves are in
:mod:`replay.cost.cost_terms` (compute and memory) and :mod:`replay.cost.comm_terms` (the
collectives of tensor and expert parallelism).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from schemas.specs import GpuSpec, Link, ModelSpec

from schemas.cost_params import CostParams


#: Where a derived feature's time goes (:meth:`Coefficients.add_per_feature`).
PARTS = ("compute", "memory", "serial")


@dataclass(frozen=True)
class ReplicaShape:
    """The hardware one engine replica runs on.

    Attributes
    ----------
    model : ModelSpec
    gpu : GpuSpec
    tp : int
        Tensor-parallel degree (GPUs splitting every layer).
    dp : int
        Data-parallel ranks stepping in lock step as one replica (vLLM's
        ``--data-parallel-size`` for MoE models: every rank steps together; the replica's
        tokens are spread evenly over the ranks, an idle rank runs a dummy batch).
    expert_parallel : bool
        vLLM's ``--enable-expert-parallel``: the routed experts are split over the
        ``tp * dp`` GPUs instead of replicated on every DP rank.
    link : Link
        The link of the all-reduces and all-to-alls.
    pp : int
        Pipeline-parallel stages of the replica (vLLM ``--pipeline-parallel-size``). The
        terms price **one stage**: it holds ``1 / pp`` of the layers, so every per-layer
        term (FLOPs, weight and KV reads, the collectives of each layer) is divided by ``pp``;
        the per-step and per-sequence CPU time is not (each stage's worker launches its own
        kernels, as Vidur prices a stage: ``num_layers_per_pipeline_stage`` blocks plus the
        CPU overheads). The embedding and LM head are spread with the rest, and a layer count
        ``pp`` does not divide is split fractionally (vLLM gives the remainder to some stages).
        The pipeline itself (stages in flight, activation transfers) is the engine's
        (:mod:`replay.core.pipeline`).
    """

    model: ModelSpec
    gpu: GpuSpec
    tp: int
    dp: int
    expert_parallel: bool
    link: Link
    pp: int = 1

    @property
    def num_gpus(self) -> int:
        """GPUs of the replica, ``tp * dp``."""
        return self.tp * self.dp


@dataclass
class Coefficients:
    """The folded step-time model: the coefficients of :data:`replay.cost.step_time.FORMULA`.

    Units: seconds, seconds per token (``_per_token_s``), per query-key pair, per context
    token; ``expert_miss`` is the probability that one token does not route to a given
    expert, ``overlap`` the fraction of the smaller of compute and memory time not hidden.
    Each term adds to some of these (``expert_miss`` and ``overlap`` it sets);
    :meth:`RooflineCostModel.step_time_s` evaluates them.
    """

    fixed_s: float = 0.0
    per_seq_s: float = 0.0
    compute_per_token_s: float = 0.0
    compute_s: float = 0.0
    compute_per_pair_s: float = 0.0
    memory_s: float = 0.0
    memory_per_context_token_s: float = 0.0
    memory_per_prefill_context_token_s: float = 0.0
    memory_per_seq_s: float = 0.0
    memory_expert_s: float = 0.0
    expert_miss: float = 1.0
    overlap: float = 0.0
    comm_s: float = 0.0
    comm_per_token_s: float = 0.0
    per_feature: dict = field(default_factory=dict)

    def as_tuple(self) -> tuple:
        """The scalar coefficients in declaration order (the hot path unpacks this)."""
        return tuple(getattr(self, f.name) for f in fields(self) if f.name != "per_feature")

    def add_per_feature(self, part: str, feature: str, seconds_per_unit: float) -> None:
        """Add ``seconds_per_unit`` per unit of the derived feature ``feature`` to ``part``
        (``"compute"``, ``"memory"`` or ``"serial"``).

        Raises
        ------
        ValueError
            An unknown part, or a feature that is not a derived one of the step record.
        """
        from schemas.step_record import DERIVED_FEATURES  # here: the step record imports numpy, --help must not

        if part not in PARTS:
            raise ValueError(f"part {part!r}: expected one of {', '.join(PARTS)}")
        derived = [f.name for f in DERIVED_FEATURES]
        if feature not in derived:
            raise ValueError(f"{feature!r} is not a derived feature of the step record ({', '.join(derived)})")
        self.per_feature[part, feature] = self.per_feature.get((part, feature), 0.0) + seconds_per_unit


class CostTerm:
    """One mechanism of the step time.

    Subclasses set ``name`` (the identifier stored in a calibration), ``params`` (the
    names of :data:`replay.cost_params.PARAMS` they read) and implement :meth:`fold`; an
    ``optional`` term is not in :data:`DEFAULT_TERMS` (``--terms`` names it to use it); a term
    that adds to another's time ``requires`` it (a cost model naming it alone is refused).
    """

    name: str = ""
    params: tuple = ()
    optional: bool = False
    requires: tuple = ()

    def fold(self, shape: ReplicaShape, p: CostParams, coef: Coefficients) -> None:
        """Add this term's contribution to ``coef`` for ``shape`` and parameter values ``p``."""
        raise NotImplementedError
