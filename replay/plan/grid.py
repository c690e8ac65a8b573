"""The candidate deployments of a plan: their grid, their cost, and what each one replays with.

A candidate is one GPU type, a tensor-parallel (TP) degree, pipeline stages (PP) and
data-parallel (DP) ranks per replica, a number of replicas behind the router (or, with the
``disagg`` scheduler, a prefill pool and a decode pool, each with its own TP), and the
engine's limits: ``max_num_seqs`` (requests running at once per DP rank) and
``max_num_batched_tokens`` (the token budget of one step). Every axis not given takes the
calibration's own value. Its cost is its GPU count (replicas x TP x PP x DP, each pool's with
``disagg``) times the GPU's price per hour when prices are given, else the GPU count.

Each candidate gets the cost model of the calibration of its GPU type, or the first
calibration's carried to its GPU's datasheet FLOP/s and bandwidth
(:func:`replay.cost.cost_model.cost_model_from_calibration`; an extrapolation), and a KV cache
sized from its GPU's memory at its TP (:func:`replay.cost.kv_capacity.kv_capacity_blocks`), never
the block count the calibrated run recorded. A candidate that cannot run (the model does not
fit, the TP does not divide the attention heads, the KV cache cannot hold the longest
request) is kept with the reason and skipped.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from schemas.calibration import Calibration
from schemas.spec_catalog import catalog_key, get_gpu

from ..analysis.band_basis import BandBasis, carried_across
from ..config import ReplayConfig
from ..cost.cost_model import RooflineCostModel, cost_model_from_calibration
from ..core.deployment import Deployment, resolve_deployment
from ..errors import ConfigError

#: Most candidates one plan evaluates.
MAX_CANDIDATES = 5000
#: Engine settings a candidate never takes from the calibration: its KV blocks are derived
#: from its own GPU's memory, and its axes are the plan's.
NOT_CARRIED = ("num_gpu_blocks", "scheduler", "max_num_seqs", "max_num_batched_tokens", "replicas", "seed")


@dataclass(frozen=True)
class Candidate:
    """One deployment.

    Attributes
    ----------
    gpu : str
        Catalog key of the GPU type.
    tp : int
        TP degree of a replica (``disagg``: of a prefill instance).
    replicas : int
        Replicas behind the router (``disagg``: 1; see the pools).
    max_num_seqs, max_num_batched_tokens : int
        vLLM's limits of each replica: requests running at once, token budget per step.
    scheduler : str
        ``chunked``, ``fcfs``, ... or ``disagg`` (prefill and decode pools).
    prefill_replicas, decode_replicas, tp_decode : int
        ``disagg`` only (0 otherwise): the pools' instances and the decode instances' TP.
    dp : int
        vLLM data-parallel ranks stepping in lock step as one replica (a MoE layout; each rank
        has ``tp x pp`` GPUs and the limits above).
    pp : int
        Pipeline stages of a replica (``disagg``: of an instance of either pool), each of
        ``tp`` GPUs holding ``1 / pp`` of the layers.
    """

    gpu: str
    tp: int
    replicas: int
    max_num_seqs: int
    max_num_batched_tokens: int
    scheduler: str
    prefill_replicas: int = 0
    decode_replicas: int = 0
    tp_decode: int = 0
    dp: int = 1
    pp: int = 1

    @property
    def disagg(self) -> bool:
        return self.scheduler == "disagg"

    @property
    def num_gpus(self) -> int:
        """GPUs the deployment occupies: replicas x TP x PP x DP (``disagg``: each pool's,
        summed), as :attr:`replay.core.deployment.Deployment.num_gpus` counts its pools."""
        if self.disagg:
            return (self.prefill_replicas * self.tp + self.decode_replicas * self.tp_decode) * self.pp * self.dp
        return self.replicas * self.tp * self.pp * self.dp

    def label(self) -> str:
        """``2 x h100-80gb TP2`` or ``P1xTP2 + D2xTP1 h100-80gb``, then ``PP2`` (pipeline stages)
        and ``DP2`` (data-parallel ranks) when more than one."""
        par = (f" PP{self.pp}" if self.pp > 1 else "") + (f" DP{self.dp}" if self.dp > 1 else "")
        if self.disagg:
            return (f"P{self.prefill_replicas}xTP{self.tp} + D{self.decode_replicas}xTP{self.tp_decode} "
                    f"{self.gpu}{par}")
        return f"{self.replicas} x {self.gpu} TP{self.tp}{par}"

    def replay_options(self) -> dict:
        """The options of :meth:`replay.config.ReplayConfig.from_options` this candidate sets."""
        out = {"scheduler": self.scheduler, "max_num_seqs": self.max_num_seqs,
               "max_num_batched_tokens": self.max_num_batched_tokens}
        if self.disagg:
            out.update(prefill_replicas=self.prefill_replicas, decode_replicas=self.decode_replicas,
                       tp_prefill=self.tp, tp_decode=self.tp_decode)
        else:
            out["replicas"] = self.replicas
        return out


@dataclass
class Axes:
    """The values of every axis of the grid (each a list, in the order given).

    ``prefill_replicas``, ``decode_replicas``, ``tp_prefill``, ``tp_decode`` apply to the
    ``disagg`` scheduler only; when neither pool size is given they range over ``replicas``
    and a disaggregated candidate may use at most as many GPUs as the largest colocated one of
    its PP and DP (``max(replicas) * max(tp) * pp * dp``), so the two layouts are compared on one
    GPU budget. ``pp`` and ``dp``: pipeline stages and DP ranks of a replica.
    """

    gpus: list
    tp: list
    replicas: list
    max_num_seqs: list
    max_num_batched_tokens: list
    schedulers: list
    prefill_replicas: list | None = None
    decode_replicas: list | None = None
    tp_prefill: list | None = None
    tp_decode: list | None = None
    dp: list = field(default_factory=lambda: [1])
    pp: list = field(default_factory=lambda: [1])

    def candidates(self) -> list[Candidate]:
        """Every combination, colocated schedulers first, in axis order.

        Raises
        ------
        ConfigError
            More than :data:`MAX_CANDIDATES`, or a ``disagg`` grid whose every layout exceeds its GPU
            budget (none).
        """
        out = []
        layouts = list(itertools.product(self.pp, self.dp))
        for sched in self.schedulers:
            if sched != "disagg":
                out += [Candidate(g, tp, r, s, b, sched, dp=dp, pp=pp) for g, tp, (pp, dp), r, s, b in
                        itertools.product(self.gpus, self.tp, layouts, self.replicas, self.max_num_seqs,
                                          self.max_num_batched_tokens)]
                continue
            pools_given = self.prefill_replicas is not None or self.decode_replicas is not None
            for g, tpp, tpd, (pp, dp), p, d, s, b in itertools.product(
                    self.gpus, self.tp_prefill or self.tp, self.tp_decode or self.tp, layouts,
                    self.prefill_replicas or self.replicas, self.decode_replicas or self.replicas,
                    self.max_num_seqs, self.max_num_batched_tokens):
                c = Candidate(g, tpp, 1, s, b, "disagg", p, d, tpd, dp, pp)
                if pools_given or c.num_gpus <= max(self.replicas) * max(self.tp) * pp * dp:
                    out.append(c)
        if "disagg" in self.schedulers and not any(c.disagg for c in out):  # each pool needs an instance
            budget = max(self.replicas) * max(self.tp)
            raise ConfigError(f"no disaggregated candidate fits the colocated GPU budget ({budget} GPUs x PP x DP: "
                              "the most replicas x TP): a prefill and a decode instance need more; give --replicas "
                              "a range (1:4), or --prefill-replicas and --decode-replicas")
        if len(out) > MAX_CANDIDATES:
            raise ConfigError(f"the grid has {len(out)} candidates, more than {MAX_CANDIDATES}: give fewer values "
                              "(--gpu, --tp, --pp, --dp, --replicas, --max-num-seqs, ...)")
        return out


def parse_int_list(option: str, text: str, low: int = 1) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]``; ``"1:8"`` -> ``[1, ..., 8]``; ``"1:8:2"`` -> ``[1, 3, 5, 7]``.

    Raises
    ------
    ConfigError
        No value, not integers, below ``low``, a range with stop < start or step < 1 or more
        values than :data:`MAX_CANDIDATES`, a value twice.
    """
    out: list[int] = []
    if not str(text).strip():
        raise ConfigError(f"{option} {text!r}: no value; expected integers or ranges, e.g. 1,2,4 or 1:8")
    for part in (p.strip() for p in str(text).split(",")):
        try:
            bits = [int(b) for b in part.split(":")]
        except ValueError:
            raise ConfigError(f"{option} {text}: {part!r} is not an integer or a range START:STOP[:STEP]") from None
        if len(bits) == 1:
            values = bits
        elif len(bits) in (2, 3) and bits[1] >= bits[0] and (len(bits) == 2 or bits[2] >= 1):
            values = range(bits[0], bits[1] + 1, bits[2] if len(bits) == 3 else 1)
            if len(values) > MAX_CANDIDATES:  # a range longer than any grid may be (built lazily: no list of it)
                raise ConfigError(f"{option} {text}: {part!r} has {len(values)} values, more than the "
                                  f"{MAX_CANDIDATES} candidates a plan may have")
        else:
            raise ConfigError(f"{option} {text}: {part!r}: expected START:STOP[:STEP] with STOP >= START, STEP >= 1")
        for v in values:
            if v < low:
                raise ConfigError(f"{option} {text}: {v} is below {low}")
            if v in out:
                raise ConfigError(f"{option} {text}: {v} given more than once")
            out.append(v)
    return out


def parse_gpus(text: str) -> list[str]:
    """``"h100-80gb,A100 80GB"`` -> catalog keys (``calibrate catalog``), in order.

    Raises
    ------
    SpecError
        An unknown GPU (naming the closest).
    ConfigError
        No GPU named (``--gpu ","``).
    """
    keys = []
    for name in (p.strip() for p in str(text).split(",") if p.strip()):
        key = catalog_key(name) or get_gpu(name).name
        if key not in keys:
            keys.append(key)
    if not keys:
        raise ConfigError(f"--gpu {text!r}: no GPU named; expected catalog keys, e.g. h100-80gb,a100-80gb")
    return keys


def parse_prices(text: str | None, gpus: list[str]) -> dict[str, float]:
    """``"h100-80gb=2.5,a100-80gb=1.8"`` -> price per GPU-hour by catalog key (any currency).

    Raises
    ------
    ConfigError
        A bad part (no GPU, a price <= 0 or not a number), a GPU priced twice, or a GPU of
        the grid without a price.
    """
    if text is None:
        return {}
    out = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, value = part.partition("=")
        try:
            price = float(value)
        except ValueError:
            price = math.nan
        if not sep or not name.strip() or not 0 < price < math.inf:
            raise ConfigError(f"--price {part!r}: expected GPU=PRICE per GPU-hour, e.g. h100-80gb=2.5")
        key = parse_gpus(name)[0]
        if key in out:
            raise ConfigError(f"--price {text}: {key} priced more than once")
        out[key] = price
    if not out:
        raise ConfigError(f"--price {text!r}: no price given; expected GPU=PRICE,..., e.g. h100-80gb=2.5")
    missing = [g for g in gpus if g not in out]
    if missing:
        raise ConfigError(f"--price: no price for {', '.join(missing)}; give every --gpu a price, or none")
    return out


@dataclass
class Calibrations:
    """The calibrations of a plan: the first is the reference (model, engine settings, the GPU
    types without a calibration of their own), each other one applies to its own GPU type.

    Attributes
    ----------
    items : list of (path, Calibration)
    """

    items: list = field(default_factory=list)

    def __post_init__(self):
        first = self.items[0][1]
        seen: dict[str, str] = {}
        for path, cal in self.items:
            if cal.model.name != first.model.name:
                raise ConfigError(f"--calibration {path}: fitted on {cal.model.name}, the first on {first.model.name}: "
                                  "a plan is for one model")
            if cal.gpu.name in seen:
                raise ConfigError(f"--calibration {path}: a second calibration of {cal.gpu.name} (the first: "
                                  f"{seen[cal.gpu.name]}); give one per GPU type")
            seen[cal.gpu.name] = path

    @property
    def reference(self) -> Calibration:
        return self.items[0][1]

    def for_gpu(self, gpu: str) -> tuple[str, Calibration, bool]:
        """``(path, calibration, own)`` of GPU type ``gpu``: its own calibration (``own``), or the
        reference's, to be carried to it."""
        for path, cal in self.items:
            if cal.gpu.name == gpu:
                return path, cal, True
        return self.items[0][0], self.items[0][1], False


@dataclass
class Prepared:
    """A candidate ready to replay, or why it cannot run.

    Attributes
    ----------
    candidate : Candidate
    cost : float
        Price per hour (GPUs x price) with prices, else the GPU count.
    skip : str | None
        Why it cannot run (then the rest is None).
    cost_model : RooflineCostModel | None
        Its replica's, at its TP, PP and DP (``disagg``: the prefill instance's; the decode TP
        is in ``cfg``).
    cfg : ReplayConfig | None
        Its replay options; ``num_gpu_blocks`` None: the replay sizes each pool's cache from GPU
        memory, as :attr:`deployment` has it.
    deployment : Deployment | None
        Its pools as ``replay`` resolves them (:func:`replay.core.deployment.resolve_deployment`).
    kv_blocks : tuple of int
        KV blocks of one (virtual) engine of each pool (``disagg``: prefill, decode): a
        replica's blocks (its DP ranks' together) // its PP, from GPU memory
        (:attr:`replay.core.deployment.Pool.num_gpu_blocks`).
    calibration : str
        Path of the calibration its cost model comes from.
    extrapolated : bool
        Its GPU type has no calibration of its own.
    band_points : list of dict
        That calibration's band points.
    basis : replay.analysis.bands.BandBasis
        The rest of what a band takes from that calibration; carried to another GPU type when
        ``extrapolated``, or to another parallelism than the calibration's.
    """

    candidate: Candidate
    cost: float
    skip: str | None = None
    cost_model: RooflineCostModel | None = None
    cfg: ReplayConfig | None = None
    deployment: Deployment | None = None
    kv_blocks: tuple = ()
    calibration: str = ""
    extrapolated: bool = False
    band_points: list = field(default_factory=list)
    basis: BandBasis = field(default_factory=BandBasis)


def prepare(c: Candidate, cals: Calibrations, base_options: dict, prices: dict, longest_tokens: int) -> Prepared:
    """Build the cost model, the KV cache and the replay options of one candidate.

    Parameters
    ----------
    base_options : dict
        Options of :meth:`ReplayConfig.from_options` every candidate shares (the calibration's
        engine settings but :data:`NOT_CARRIED`, the SLOs of the goodput).
    longest_tokens : int
        Prompt + output tokens of the trace's longest request: a KV cache that cannot hold it
        would reject it, so such a candidate is skipped.
    """
    cost = c.num_gpus * prices[c.gpu] if prices else float(c.num_gpus)
    path, cal, own = cals.for_gpu(c.gpu)
    out = Prepared(c, cost, calibration=path, extrapolated=not own, band_points=list(cal.band_points),
                   basis=BandBasis.of(cal, new_sample=True))
    try:
        cm = cost_model_from_calibration(cal, tp=c.tp, dp=c.dp, pp=c.pp, gpu=get_gpu(c.gpu))
        out.basis = BandBasis.of(cal, carried_across(cal, cm), new_sample=True,
                                 scheduler="disagg" if c.disagg else cal.engine.get("scheduler", "chunked"))
        # num_gpu_blocks None: each pool's cache sized from its GPU's memory, by the replay's own rule
        cfg = ReplayConfig.from_options(**{**base_options, **c.replay_options(), "num_gpu_blocks": None})
        dep = resolve_deployment(cm, cfg)
    except ConfigError as exc:
        out.skip = str(exc).split("; raise --tp")[0]
        return out
    pools = (dep.prefill,) if dep.decode is None else (dep.prefill, dep.decode)
    # a request lives on one virtual engine (one DP rank of it when data parallel)
    room = min([dep.engine_config.max_request_blocks or dep.prefill.num_gpu_blocks]
               + [p.num_gpu_blocks for p in pools[1:]])
    block_size = cfg.engine.block_size
    if -(-longest_tokens // block_size) > room:
        out.skip = (f"its KV cache ({room} blocks of {block_size} tokens) cannot hold the longest request "
                    f"({longest_tokens} tokens)")
        return out
    out.cost_model, out.cfg, out.deployment = cm, cfg, dep
    out.kv_blocks = tuple(p.num_gpu_blocks for p in pools)
    return out
