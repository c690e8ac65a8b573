"""The roofline cost model of one replica's forward pass (step).

The engine sees a cost model only through :class:`StepCostModel`: the duration of a step
from the step's aggregates. :class:`RooflineCostModel` is the seed's roofline
(``docs/theory.md`` section 1) with the parameters calibration fits.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Callable, Protocol

import numpy as np

from schemas.calibration import Calibration
from schemas.cost_params import PARAMS, CostParams
from schemas.specs import GpuSpec, Link, ModelSpec, link_presets

from .cost_terms import DEFAULT_TERMS, TERMS
from .term_base import Coefficients, ReplicaShape
from ..errors import ConfigError
from .step_time import feature_arrays, step_time_function, unfolded


class StepCostModel(Protocol):
    """What the engine needs from a cost model.

    An implementation may also set ``supports_arrays = True`` when ``step_time_s`` is
    deterministic, accepts numpy arrays and is non-decreasing in the decode context; the
    engine then prices runs of identical decode steps in one call (closed form).
    Stochastic or scalar-only models are called per step.

    Under speculative decoding the engine passes ``num_decode_tokens``, the positions the
    decodes feed (their next tokens plus the draft tokens they verify, ``K + 1`` per decode
    unless the budget or the request's end cuts it); ``num_decode_seqs`` still counts
    sequences (per-sequence CPU work). Without it the engine never passes the argument, so
    a cost model that does not take it works everywhere else; with it, it is refused.
    """

    def step_time_s(self, num_prefill_tokens: int, num_decode_seqs: int, decode_context_tokens: int,
                    prefill_context_tokens: int = 0, num_prefill_seqs: int | None = None,
                    num_decode_tokens: int | None = None) -> float:
        """Duration in seconds of one step with these aggregates (0 tokens -> 0 s).

        ``num_decode_tokens`` (>= ``num_decode_seqs``; None: equal to it) counts the decode
        positions fed, draft tokens included.
        """
        ...


#: Parameters of the time a request spends outside the engine (:meth:`RooflineCostModel.frontend_s`).
FRONTEND_PARAMS = ("t_frontend_s", "t_frontend_per_prompt_token_s", "t_stream_per_token_s")
#: The parameter of a disaggregated replay's KV handoff (:func:`replay.core.disagg_pools.resolve_pools`).
HANDOFF_PARAMS = ("t_kv_migrate_s",)

#: Link presets by name, built from the catalog (``schemas/catalog/links.json``, every value
#: with its source).
LINKS: dict[str, Link] = link_presets()


@dataclass(frozen=True)
class RooflineCostModel:
    """Step time of one replica as a sum of mechanisms (:mod:`replay.cost.cost_terms`).

    Parameters
    ----------
    model : ModelSpec
    gpu : GpuSpec
    params : CostParams
        Values of the parameters (:data:`replay.cost_params.PARAMS`).
    tp : int
        Tensor-parallel degree: weights, KV and FLOPs split over ``tp`` GPUs.
    tp_link : Link, optional
        Link of the all-reduces and all-to-alls (default: the GPU's ``tp_link`` preset).
    dp : int
        Data-parallel ranks stepping in lock step as this one replica (vLLM
        ``--data-parallel-size``; see :class:`replay.cost.term_base.ReplicaShape`).
    expert_parallel : bool
        vLLM ``--enable-expert-parallel``: routed experts split over the ``tp * dp`` GPUs.
    terms : tuple of str
        Names of :data:`replay.cost.cost_terms.TERMS` in the model (default: all);
        :data:`~replay.cost.cost_terms.SEED_TERMS` is the seed's roofline.
    pp : int
        Pipeline-parallel stages (vLLM ``--pipeline-parallel-size``): :meth:`step_time_s` is
        then the time of **one stage** (``1 / pp`` of the layers,
        :class:`~replay.cost.term_base.ReplicaShape`), and :meth:`pp_transfer_s` the activation
        transfer between two stages; the engine runs the pipeline (:mod:`replay.core.pipeline`).
    pp_link : Link, optional
        Link between two pipeline stages (default: ``tp_link``, the GPU's own interconnect).

    Attributes
    ----------
    step_time_s : callable
        The duration of a step with these features, seconds (:meth:`StepCostModel.step_time_s`,
        numbers or arrays): :func:`replay.cost.step_time.step_time_function` of the folded terms.
    coefficients : Coefficients
        The folded terms.

    Raises
    ------
    ConfigError
        ``tp``, ``dp`` or ``pp`` below 1, ``tp`` not dividing the attention heads, ``pp``
        above the layer count, an unknown term or link.

    Notes
    -----
    The terms are folded once into :class:`~replay.cost.term_base.Coefficients`; the step
    time is then :data:`replay.cost.step_time.FORMULA` of the step's features
    (:data:`schemas.step_record.STEP_FEATURES`), evaluated by one function on Python numbers
    (the engine's, per step) and on arrays (closed-form decode runs, fits, components): the
    two agree bit for bit. Under speculative decoding the ``D`` decodes feed ``Q =
    num_decode_tokens`` positions (their next tokens and the drafts they verify): they are
    tokens, attend to their context and the positions before them, and their KV is read;
    ``S + D`` still counts sequences. With ``Q = D`` this is the model without drafts, bit
    for bit.

    With the seed's terms and ``overlap`` 0 this is the seed's ``T_prefill(N)`` for a
    prefill-only step and ``T_decode(B, L_total)`` for a decode-only one, never below its
    compute bound (theory.md section 1). Every coefficient is >= 0, so the step time is
    non-decreasing in the tokens, the decode sequences and both contexts.
    """

    #: ``step_time_s`` is deterministic and accepts numpy arrays: the engine may price a run
    #: of identical decode steps in one call (a cost model without it is called step by step).
    supports_arrays = True

    model: ModelSpec
    gpu: GpuSpec
    params: CostParams = field(default_factory=CostParams)
    tp: int = 1
    tp_link: Link = None  # type: ignore[assignment]  # None: the GPU's preset, set by __post_init__
    dp: int = 1
    expert_parallel: bool = False
    terms: tuple = DEFAULT_TERMS
    pp: int = 1
    pp_link: Link = None  # type: ignore[assignment]  # None: tp_link, set by __post_init__
    if TYPE_CHECKING:  # set by __post_init__, not fields (pickled as the fields: __reduce__)
        coefficients: Coefficients = field(init=False)
        step_time_s: Callable[..., float] = field(init=False)

    def __post_init__(self):
        if self.tp < 1 or self.dp < 1 or self.pp < 1:
            raise ConfigError(f"tp, dp and pp must be >= 1, not tp={self.tp}, dp={self.dp}, pp={self.pp}")
        if self.pp > self.model.num_layers:
            raise ConfigError(f"pp={self.pp} exceeds the {self.model.num_layers} layers of {self.model.name} "
                              "(vLLM refuses a stage without a layer)", options=("pp",))
        if self.model.num_attention_heads % self.tp:
            raise ConfigError(f"tp={self.tp} does not divide the {self.model.num_attention_heads} attention heads of "
                              f"{self.model.name} (vLLM refuses it)", options=("tp",))
        unknown = [t for t in self.terms if t not in TERMS]
        if unknown:
            raise ConfigError(f"unknown cost term(s) {', '.join(unknown)}; known: {', '.join(TERMS)}")
        missing = [f"{t} needs {r}" for t in self.terms for r in TERMS[t].requires if r not in self.terms]
        if missing:
            raise ConfigError(f"cost terms: {'; '.join(missing)} (it adds to that term's time)", options=("terms",))
        if not isinstance(self.params, CostParams):
            object.__setattr__(self, "params", CostParams(**self.params))
        if self.tp_link is None:  # the GPU's own interconnect
            if self.gpu.tp_link not in LINKS:
                raise ConfigError(f"gpu {self.gpu.name}: unknown tp_link {self.gpu.tp_link!r}; "
                                  f"known: {', '.join(LINKS)}")
            object.__setattr__(self, "tp_link", LINKS[self.gpu.tp_link])
        if self.pp_link is None:
            object.__setattr__(self, "pp_link", self.tp_link)
        shape = self.shape
        coef = _folded(self.terms, shape, self.params)
        object.__setattr__(self, "coefficients", coef)
        object.__setattr__(self, "step_time_s", step_time_function(coef))

    def __reduce__(self):
        """Pickled as its fields (the evaluators are closures, rebuilt by ``__post_init__``)."""
        return type(self), tuple(getattr(self, f.name) for f in fields(self))

    @property
    def shape(self) -> ReplicaShape:
        """The replica's hardware, as the terms see it."""
        return ReplicaShape(self.model, self.gpu, self.tp, self.dp, self.expert_parallel, self.tp_link, self.pp)

    def pp_activation_bytes(self, num_tokens):
        """Bytes sent from one pipeline stage to the next for a micro-batch of ``num_tokens``
        tokens: ``num_tokens * hidden_size * dtype_bytes`` (the hidden states, in the model's
        dtype; vLLM's ``IntermediateTensors``). Scalar or array."""
        m = self.model
        return num_tokens * m.hidden_size * m.dtype_bytes

    def pp_transfer_s(self, num_tokens):
        """Time of one stage-to-stage activation transfer of ``num_tokens`` tokens, seconds:
        ``latency + pp_activation_bytes(num_tokens) / bandwidth`` of :attr:`pp_link` (the
        seed's transfer form, theory.md section 2); 0 at ``pp`` 1 (no stage boundary)."""
        if self.pp == 1:
            return 0.0
        link = self.pp_link
        return self.pp_activation_bytes(num_tokens) / link.bandwidth_bytes_per_s + link.latency_s

    def with_params(self, params: CostParams) -> "RooflineCostModel":
        """A copy with other parameters."""
        return replace(self, params=params)

    @property
    def free_params(self) -> tuple:
        """Names of the parameters the model reads (its terms', the front end's and the KV
        handoff's), in :data:`PARAMS` order."""
        used = {p for t in self.terms for p in TERMS[t].params} | set(FRONTEND_PARAMS) | set(HANDOFF_PARAMS)
        return tuple(p for p in PARAMS if p in used)

    def frontend_s(self, num_prompt_tokens):
        """Time a request spends outside the engine before it (API server, tokenisation,
        first chunk), seconds: ``t_frontend_s + t_frontend_per_prompt_token_s * L_prompt``."""
        p = self.params
        return p["t_frontend_s"] + p["t_frontend_per_prompt_token_s"] * num_prompt_tokens

    @property
    def stream_per_token_s(self) -> float:
        """Time added per output token after the first between engine and client, seconds."""
        return self.params["t_stream_per_token_s"]

    def eval_components(self, num_prefill_tokens, num_decode_seqs, decode_context_tokens,
                        prefill_context_tokens=0, num_prefill_seqs=None, num_decode_tokens=None) -> dict:
        """The time of each term in steps with these features, seconds (lmfit's ``eval_components``).

        Arguments as :meth:`step_time_s` (scalars or arrays of one shape).

        Returns
        -------
        dict term name -> float64 array (the features' shape)
            Each of the model's terms but ``overlap``, in the model's order: the step time of
            that term alone with compute and memory time added (its own share); then
            ``"overlap"``: the step time minus that sum with the model's own fold, i.e.
            ``-(1 - overlap) min(c, m)``, the time hidden by running compute and memory at
            once (:data:`replay.cost.step_time.FORMULA`; present without the ``overlap`` term too:
            the seed's ``max`` hides all of the smaller). They sum to :meth:`step_time_s` to
            rounding; all 0 for a step with no tokens.

        Raises
        ------
        ValueError
            As :meth:`step_time_s`.
        """
        x = feature_arrays(num_prefill_tokens, num_prefill_seqs, num_decode_seqs, decode_context_tokens,
                           prefill_context_tokens, num_decode_tokens)
        features = dict(zip(("num_prefill_tokens", "num_prefill_seqs", "num_decode_seqs", "decode_context_tokens",
                             "prefill_context_tokens", "num_decode_tokens"), x))
        shape = self.shape

        def time_of(coef):
            return np.asarray(step_time_function(coef)(**features), float)

        out = {name: time_of(unfolded(_folded((name,), shape, self.params)))
               for name in self.terms if name != "overlap"}
        out["overlap"] = time_of(self.coefficients) - time_of(unfolded(self.coefficients))
        return out

    def prefill_time_s(self, num_tokens: int) -> float:
        """Seed's ``T_prefill(N)``: one prefill-only step of ``num_tokens`` tokens, seconds."""
        return self.step_time_s(num_tokens, 0, 0)

    def decode_time_s(self, batch_size: int, context_tokens: int) -> float:
        """Seed's ``T_decode(B, L_total)``: one decode-only step, seconds."""
        return self.step_time_s(0, batch_size, context_tokens)


def _folded(terms: tuple, shape: ReplicaShape, params: CostParams) -> Coefficients:
    """The coefficients of ``terms`` (names of :data:`~replay.cost.cost_terms.TERMS`) folded for ``shape``."""
    coef = Coefficients()
    for name in terms:
        TERMS[name].fold(shape, params, coef)
    return coef


def kv_transfer_time_s(num_prompt_tokens: int, model: ModelSpec, link: Link) -> float:
    """Time to move a prompt's KV cache between instances, seconds (:func:`kv_transfer_time_function`)."""
    return kv_transfer_time_function(model, link)(num_prompt_tokens)


def kv_transfer_time_function(model: ModelSpec, link: Link) -> Callable[[int], float]:
    """The KV transfer time over ``link`` of ``model``'s prompts: ``f(L_prompt tokens) -> seconds``,
    the model's bytes per token read (and checked) once, not at every transfer.

    Notes
    -----
    Seed, theory.md section 2: ``T = (L_prompt * D_kv + B_seq) / link_bw + latency``, with ``B_seq``
    what a sequence holds whatever its length (its window's KV in windowed layers, its linear-attention
    state: :meth:`schemas.spec_types.ModelSpec.seq_state_bytes_per_rank` at TP 1; 0 for full attention).
    """
    state_bytes, kv_bytes_per_token = model.seq_state_bytes_per_rank(1), model.kv_bytes_per_token
    bandwidth_bytes_per_s, latency_s = link.bandwidth_bytes_per_s, link.latency_s

    def transfer_time_s(num_prompt_tokens: int) -> float:
        return (num_prompt_tokens * kv_bytes_per_token + state_bytes) / bandwidth_bytes_per_s + latency_s

    return transfer_time_s


def cost_model_from_calibration(cal: Calibration, model: ModelSpec | None = None, tp: int | None = None,
                                dp: int | None = None, pp: int | None = None,
                                gpu: GpuSpec | None = None, expert_parallel: bool | None = None) -> RooflineCostModel:
    """The cost model of a calibration file, optionally for another model, tensor/data/pipeline-
    parallel degree or GPU.

    The fitted efficiencies (``eta_compute``, ``eta_mem``, ``eta_link``...) and host times
    (``t_step_s``, ``t_seq_s``, front end) carry over; with ``gpu`` they are applied to that
    GPU's datasheet peak FLOP/s, memory bandwidth and link (its ``tp_link`` preset) instead of
    the calibrated one's: an extrapolation, since efficiencies differ between GPU generations.
    ``expert_parallel`` (vLLM ``--enable-expert-parallel``; None: the calibration's) splits the
    routed experts over the TP x DP GPUs.

    Raises
    ------
    ConfigError
        An unknown term or an impossible parallelism (see :class:`RooflineCostModel`).
    """
    params = CostParams(**{k: p.value for k, p in cal.params.items()})
    return RooflineCostModel(model or cal.model, gpu or cal.gpu, params, tp or cal.tp, dp=dp or cal.dp,
                             expert_parallel=cal.expert_parallel if expert_parallel is None else expert_parallel,
                             terms=tuple(cal.terms), pp=pp or cal.pp)
