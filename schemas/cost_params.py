"""The cost model's parameters, declared once.

Every parameter of the step-time model and of the front-end terms is declared here, with
its unit, physical range, default and meaning. The engine's cost model
(:mod:`replay.cost.cost_model`, :mod:`replay.cost.cost_terms`), both fits (``calibrate``) and the
calibration file (:mod:`schemas.calibration`) read this one table: a bound or a default
changes here and nowhere else. It lives in ``schemas`` because the calibration file's
contract holds these names and ranges.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from .errors import ParamError


@dataclass(frozen=True)
class ParamSpec:
    """One parameter of the cost model.

    Attributes
    ----------
    name : str
        Identifier, with its unit as suffix (``_s``, ``_tokens``; none for a fraction).
    unit : str
        Printed unit (``""`` for a dimensionless fraction).
    lower, upper : float
        Physical range, both included; a calibration outside it is refused.
    default : float
        Value when neither fitted nor given (the seed's or a datasheet's); NaN: taken from
        the hardware by the term that reads it (a link's latency).
    fit_scale : float
        The fitters work on ``value / fit_scale`` so every free parameter is of order 1
        (docs/CASES.md BR-18: the solver never sees 1e-15 s/FLOP or 1e-6 s).
    meaning : str
        What it is and where it comes from (printed by ``calibrate fit``).
    """

    name: str
    unit: str
    lower: float
    upper: float
    default: float
    fit_scale: float
    meaning: str


def _p(*args) -> ParamSpec:
    return ParamSpec(*args)


#: The parameters, in print order.
PARAMS: MappingProxyType = MappingProxyType({p.name: p for p in (
    _p("eta_compute", "", 0.01, 1.0, 0.5, 1.0,
       "fraction of the dense peak FLOP/s reached by large GEMMs (seed section 1)"),
    _p("n_half_tokens", "tokens", 0.0, 8192.0, 0.0, 100.0,
       "tokens per step and per GPU (tp x dp) at which GEMM efficiency is half of eta_compute: small "
       "decode GEMMs do not fill the GPU (saturating efficiency eta(N) = eta N / (N + tp dp n_half), "
       "Williams et al. 2009 roofline with a latency-bound knee; replay.cost.cost_terms.DenseCompute)"),
    _p("eta_mem", "", 0.01, 1.0, 0.8, 1.0,
       "fraction of the datasheet memory bandwidth reached reading weights and KV (seed section 1)"),
    _p("eta_prefill_kv", "", 0.01, 1.0, 0.5, 1.0,
       "fraction of the memory bandwidth reached by chunked-prefill attention re-reading the KV "
       "history once per query head (replay.cost.cost_terms.PrefillAttentionKV); default from "
       "LLMServingSim's attention profiles of Llama-3.1-8B on RTX PRO 6000 and RTX 4090"),
    _p("overlap", "", 0.0, 1.0, 0.0, 1.0,
       "how much of the smaller of compute and memory time is NOT hidden under the larger: "
       "0 = max (the seed's roofline), 1 = sum (no overlap)"),
    _p("t_step_s", "s", 0.0, 0.1, 1e-4, 1e-3,
       "per-step constant: kernel launches (seed T_launch) and the engine's CPU time per step "
       "(scheduling, input preparation)"),
    _p("t_seq_s", "s", 0.0, 0.01, 0.0, 1e-4,
       "CPU time per sequence in a step (sampling, detokenising, output processing)"),
    _p("t_allreduce_hop_s", "s", 0.0, 1e-3, math.nan, 1e-5,
       "latency of one hop of a ring all-reduce (tensor parallelism; Patarasuk & Yuan 2009); "
       "the link preset's latency unless fitted"),
    _p("eta_link", "", 0.01, 1.0, 1.0, 1.0,
       "fraction of the link's one-way bandwidth the tensor-parallel all-reduces and expert-parallel "
       "all-to-alls reach (NCCL over PCIe without NVLink reaches far less than the nominal)"),
    _p("t_alltoall_s", "s", 0.0, 1e-2, math.nan, 1e-4,
       "latency of one expert-parallel all-to-all (dispatch or combine) per MoE layer"),
    _p("t_frontend_s", "s", 0.0, 10.0, 0.0, 1e-2,
       "per request, before the engine: API server, tokenisation, first SSE chunk (client TTFT "
       "minus engine TTFT)"),
    _p("t_frontend_per_prompt_token_s", "s", 0.0, 1e-3, 0.0, 1e-6,
       "per prompt token before the engine (tokenisation, request transfer)"),
    _p("t_stream_per_token_s", "s", 0.0, 0.1, 0.0, 1e-3,
       "per output token after the first, between engine and client (detokenise, SSE)"),
    _p("t_kv_migrate_s", "s", 0.0, 1.0, 0.0, 1e-2,
       "per request whose KV moves from a prefill to a decode instance (--scheduler disagg): the "
       "engine's cost of the transfer beyond the link's bytes and latency (a call to every worker, "
       "one copy per block and layer: DistServe's _migrate_blocks)"),
)})


def check_value(name: str, value: float, label: str | None = None) -> str | None:
    """Why ``value`` is not a valid ``name`` (None when it is): unknown name, not a finite
    number, or outside the declared range. ``label`` names the value in the message
    (default: ``name``)."""
    label = label or name
    spec = PARAMS.get(name)
    if spec is None:
        return f"unknown cost parameter {name!r}; known: {', '.join(PARAMS)}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{label} is {value!r}; expected a finite number"
    if math.isnan(value) and math.isnan(spec.default):
        return None  # not set: the term takes it from the hardware
    if not math.isfinite(value):
        return f"{label} is {value!r}; expected a finite number"
    if not spec.lower <= value <= spec.upper:
        unit = f" {spec.unit}" if spec.unit and spec.unit != "tokens" else (" tokens" if spec.unit else "")
        return f"{label} is {value!r}; expected {spec.lower:g} to {spec.upper:g}{unit} ({spec.meaning.split(':')[0]})"
    return None


class CostParams(Mapping):
    """Values of the cost parameters: every name of :data:`PARAMS`, defaults filled in.

    ``CostParams(eta_compute=0.6, t_step_s=2e-4)`` is an immutable mapping
    (``p["eta_mem"]``), also read by attribute (``p.eta_mem``); ``p.replace(eta_mem=0.9)``
    gives a copy.

    Raises
    ------
    ParamError
        An unknown name, or a value outside its declared range (:func:`check_value`).
    """

    __slots__ = ("_values",)

    def __init__(self, **values):
        full = {name: spec.default for name, spec in PARAMS.items()}
        for name, v in values.items():
            problem = check_value(name, v)
            if problem:
                raise ParamError(problem)
            full[name] = float(v)
        object.__setattr__(self, "_values", full)

    def __getitem__(self, name):
        return self._values[name]

    def __iter__(self):
        return iter(self._values)

    def __len__(self):
        return len(self._values)

    def __getattr__(self, name):
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        raise AttributeError("CostParams is immutable; use replace()")

    def __eq__(self, other):  # NaN (not set) equals NaN
        if not isinstance(other, CostParams):
            return NotImplemented
        return all(a == b or (a != a and b != b) for a, b in zip(self._values.values(), other._values.values()))

    def __hash__(self):
        return hash(tuple("nan" if v != v else v for v in self._values.values()))

    def __repr__(self):
        return "CostParams(" + ", ".join(f"{k}={v!r}" for k, v in self._values.items()) + ")"

    def replace(self, **values) -> "CostParams":
        """A copy with ``values`` changed."""
        return CostParams(**{**self._values, **values})

    @property
    def form(self) -> str:
        """``max``, ``sum`` or ``blend`` (the value of ``overlap``), for printing."""
        return {0.0: "max", 1.0: "sum"}.get(self._values["overlap"], "blend")

    def __reduce__(self):  # picklable (worker processes of fits and sweeps)
        return (_rebuild, (dict(self._values),))


def _rebuild(values: dict) -> CostParams:
    return CostParams(**values)


#: How compute and memory combine, the variants a fit tries: the seed's max (``overlap`` 0),
#: the sum (1), or a fitted blend (None: ``overlap`` free).
VARIANTS = {"max": 0.0, "sum": 1.0, "blend": None}
#: Parameters a request-log fit frees by default (when they have an effect on the hardware).
#: Not ``eta_link``: a TP or EP run alone cannot tell it from ``eta_compute`` (both cost time per
#: token); free it on top of a TP-1 calibration of the GPU (``calibrate fit --fix-from``).
REQUEST_FIT_FREE = ("eta_compute", "n_half_tokens", "eta_mem", "t_step_s", "t_seq_s", "t_allreduce_hop_s",
                    "t_alltoall_s", "t_frontend_s")


# -- a parameter as printed (calibrate's summary, replay's report) --------------------------------

def unit_scale(unit: str, value: float) -> tuple[str, float]:
    """A printed unit and its scale: seconds as ms or us where that reads better."""
    if unit != "s":
        return (f" {unit}" if unit else ""), 1.0
    if abs(value) >= 0.1 or value == 0:
        return " s", 1.0
    return (" ms", 1e-3) if abs(value) >= 1e-4 else (" us", 1e-6)


def format_param(name: str, value: float) -> str:
    """``value`` of parameter ``name`` with its unit, 3 significant digits (``0.489 ms``)."""
    unit, scale = unit_scale(PARAMS[name].unit, value)
    return f"{value / scale:.3g}{unit}"


@dataclass
class FittedParam:
    """One parameter of a calibration.

    Attributes
    ----------
    value : float
        Best estimate, natural units (:data:`schemas.cost_params.PARAMS`: fractions, seconds, tokens).
    stderr : float | None
        Standard error; None when the data cannot identify the parameter.
    identifiable : bool
        False when the data do not pin the parameter down (then ``bound`` says what is known).
    bound : str | None
        E.g. ``">= 0.41"``, or why it is not identified (``correlated with eta_mem (r=-0.99)``).
    vary : bool
        False when the parameter was held fixed (then ``bound`` may say at what source).
    ci95 : tuple[float, float] | None
        95 % confidence interval when computed.
    """

    value: float
    stderr: float | None = None
    identifiable: bool = True
    bound: str | None = None
    vary: bool = True
    ci95: tuple | None = None



def param_cells(name: str, p: FittedParam) -> tuple[str, str, str]:
    """A parameter as printed: value with unit, its 95 % interval (or what bound the data
    give), and its state (``identified``, ``NOT IDENTIFIED`` or ``fixed``)."""
    unit, scale = unit_scale(PARAMS[name].unit, p.value)
    val = f"{p.value / scale:.4g}{unit}"
    if not p.vary:
        return val, "", "fixed"
    if not p.identifiable:
        bound = p.bound.split("the data give ")[-1] if p.bound and "the data give " in p.bound else ""
        return val, bound if bound != "nothing more" else "", "NOT IDENTIFIED"
    ci = p.ci95 or ((p.value - 1.96 * p.stderr, p.value + 1.96 * p.stderr) if p.stderr is not None else None)
    return val, f"[{ci[0] / scale:.4g}, {ci[1] / scale:.4g}]" if ci else "", "identified"
