"""The options of one replay: :class:`ReplayConfig`, composed of one part per concern.

=========================  ====================================================================
part                       what it holds
=========================  ====================================================================
:class:`EngineOptions`     one replica's vLLM engine arguments: limits, KV cache, preemption,
                           speculative decoding, seed
:class:`SchedulingOptions` the policy, the replicas and the router, the latency objectives
:class:`DisaggOptions`     ``--scheduler disagg``: the prefill and decode pools and their link
:class:`ClosedLoopOptions` clients that send on completion instead of at the traced times
:class:`RecordOptions`     what the replay keeps besides the latencies
=========================  ====================================================================

Each part checks its own values when it is made; :class:`ReplayConfig` checks the rules
between parts. Every error is a :class:`~replay.errors.ConfigError` naming the option as the
command line spells it (the CLI prints it and exits 2). The parts are frozen: derive one
with :func:`dataclasses.replace`, or with :meth:`ReplayConfig.with_options` by option name.

Example::

    cfg = ReplayConfig(EngineOptions(max_num_seqs=128, max_num_batched_tokens=2048),
                       SchedulingOptions("sjf", replicas=2, slo_ttft_s=0.5))
    cfg = ReplayConfig(scheduling=SchedulingOptions("disagg"), disagg=DisaggOptions(decode_replicas=2))
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace

from schemas.engine_settings import SETTINGS, canonical, problem

from .core.engine_config import check_setting
from .errors import ConfigError


def _flag(name: str) -> str:
    return SETTINGS[name].flag if name in SETTINGS else "--" + name.replace("_", "-")


def _check_fields(options) -> None:
    """Every field of ``options`` (a part of :class:`ReplayConfig`) checked against its declaration."""
    for f in fields(options):
        check_setting(f.name, getattr(options, f.name))


@dataclass(frozen=True)
class EngineOptions:
    """One replica's engine arguments, named as vLLM names them.

    Attributes
    ----------
    max_num_seqs, max_num_batched_tokens : int
        Requests running at once and token budget of one step (vLLM's defaults for its API
        server: 256 and 8192).
    long_prefill_token_threshold : int
        vLLM's per-request cap on the prompt tokens of one step, applied before the token
        budget to new and partially prefilled requests alike (0: none; v0.11-era rule, see
        :class:`replay.schedulers.base.SchedulerConfig`). ``fcfs`` and ``static`` admit whole
        prompts and ignore it.
    max_model_len : int | None
        Longest prompt + output; None takes the model's context length.
    block_size : int
        Tokens per KV block.
    num_gpu_blocks : int | None
        KV blocks per replica; None sizes the cache from GPU memory.
    gpu_memory_utilization : float
        Fraction of GPU memory vLLM may use (weights + KV), in (0, 1].
    enable_prefix_caching : bool
        Share full prompt blocks between requests (vLLM v1 automatic prefix caching), from
        the trace's ``block_hashes``.
    hash_block_size : int | None
        Tokens per hash block of ``block_hashes`` (Mooncake: 512); None: the trace's
        ``hash_block_tokens`` metadata (written by ``traces import mooncake``), else 16.
    preemption_mode : str
        ``recompute`` or ``swap`` (KV to host memory over ``swap_link`` and back).
    swap_link : str
        Host link of swap preemption, a catalog link (:data:`replay.cost.cost_model.LINKS`).
    num_speculative_tokens : int
        Speculative decoding: draft tokens ``K`` per decode and step (vLLM's name; the
        command line's ``--speculative-tokens``); 0: off. Each decode verifies ``K + 1`` positions (token
        budget and cost model count them all) and emits 1 + the accepted drafts.
    spec_acceptance_rate : float | None
        Speculative decoding: probability that a draft token is accepted given that those
        before it were; the accepted drafts are a prefix, drawn per decode from a generator
        seeded by ``seed``. Required with ``num_speculative_tokens`` > 0, refused without.
    seed : int
        Seed of the simulation's random draws (the accepted drafts), >= 0.
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    long_prefill_token_threshold: int = 0
    max_model_len: int | None = None
    block_size: int = 16
    num_gpu_blocks: int | None = None
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = False
    hash_block_size: int | None = None
    preemption_mode: str = "recompute"
    swap_link: str = "pcie4"
    num_speculative_tokens: int = 0
    spec_acceptance_rate: float | None = None
    seed: int = 0

    def __post_init__(self):
        _check_fields(self)
        a = self.spec_acceptance_rate
        if self.num_speculative_tokens and a is None:
            raise ConfigError(f"{_flag('num_speculative_tokens')} needs --spec-acceptance-rate (the probability that "
                              "a draft token is accepted given the ones before it were)")
        if a is not None and not self.num_speculative_tokens:
            raise ConfigError("--spec-acceptance-rate: only speculative decoding uses it; give "
                              f"{_flag('num_speculative_tokens')} K")


@dataclass(frozen=True)
class SchedulingOptions:
    """Which policy schedules the replicas, how many there are, and what latencies are wanted.

    Attributes
    ----------
    scheduler : str
        Built-in name (``chunked``, ``fcfs``, ...), ``disagg`` (prefill/decode pools, see
        :class:`replay.core.disagg.DisaggEngine` and :class:`DisaggOptions`) or
        ``package.module:ClassName``; loaded (and so checked) when the replay starts.
    replicas : int
        Replicas of a colocated scheduler (``disagg``: :class:`DisaggOptions`).
    router : str
        ``round_robin``, ``least_loaded`` or ``prefix_affinity`` (see :mod:`replay.core.routing`).
    slo_ttft_s, slo_tpot_s : float | None
        Latency objectives of requests whose trace row has none (``edf`` deadlines,
        goodput), seconds, > 0.
    """

    scheduler: str = "chunked"
    replicas: int = 1
    router: str = "round_robin"
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None

    def __post_init__(self):
        _check_fields(self)


def check_link_options(name: str | None, bandwidth_bytes_per_s: float | None, latency_s: float | None) -> None:
    """Raise a ConfigError for an unknown link preset, a bandwidth <= 0 or NaN, a latency < 0 or not finite."""
    if problem("link", name):
        raise ConfigError(f"--link {name}: unknown; known: {problem('link', name)[1]} "
                          "(or give --link-bandwidth-bytes-per-s and --link-latency-s)")
    check_setting("link_bandwidth_bytes_per_s", bandwidth_bytes_per_s)
    check_setting("link_latency_s", latency_s)


@dataclass(frozen=True)
class DisaggOptions:
    """The pools of ``--scheduler disagg`` (:class:`replay.core.disagg.DisaggEngine`).

    Attributes
    ----------
    prefill_replicas, decode_replicas : int
        Instances of the prefill and of the decode pool (P and D).
    tp_prefill, tp_decode : int | None
        Tensor-parallel degree of each pool; None: the cost model's ``tp``.
    pp_prefill, pp_decode : int | None
        Pipeline-parallel stages of an instance of each pool (DistServe's ``pp_prefill``/
        ``pp_decode``; :mod:`replay.core.pipeline`); None: the cost model's ``pp``.
    link : str | None
        Prefill-to-decode KV link, a catalog link (:data:`replay.cost.cost_model.LINKS`);
        None: the GPUs' own ``tp_link`` (both pools in one node, as DistServe places them).
    link_bandwidth_bytes_per_s, link_latency_s : float | None
        Explicit link bandwidth (bytes/s) and one-way latency (seconds), overriding the preset's.
    first_token_from : str
        ``prefill`` (DistServe: the prefill instance emits token 1) or ``decode`` (the first
        decode step after the transfer does).
    kv_handoff : str
        ``pull`` (DistServe: a finished prompt waits on its prefill instance until a decode instance
        has room), ``prealloc`` (SGLang: a decode instance reserves room before the prefill starts) or
        ``push`` (:class:`replay.core.disagg.DisaggEngine`).
    """

    prefill_replicas: int = 1
    decode_replicas: int = 1
    tp_prefill: int | None = None
    tp_decode: int | None = None
    pp_prefill: int | None = None
    pp_decode: int | None = None
    link: str | None = None
    link_bandwidth_bytes_per_s: float | None = None
    link_latency_s: float | None = None
    first_token_from: str = "prefill"
    kv_handoff: str = "pull"

    def __post_init__(self):
        check_link_options(self.link, self.link_bandwidth_bytes_per_s, self.link_latency_s)  # with its hint
        _check_fields(self)


@dataclass(frozen=True)
class ClosedLoopOptions:
    """Closed loop (:class:`replay.core.closed_loop.ClosedLoop`), or the open loop of the trace.

    Attributes
    ----------
    concurrency : int | None
        This many clients send the trace's requests in trace order, each when its previous
        one completes; arrival times are ignored. None: open loop, requests arrive at
        ``arrival_time_s``.
    think_time_s : float
        A client's pause between a completion and its next send, seconds, >= 0 and finite;
        only with ``concurrency``.
    """

    concurrency: int | None = None
    think_time_s: float = 0.0

    def __post_init__(self):
        if self.concurrency is None and self.think_time_s:
            raise ConfigError("--think-time-s is the pause of a closed-loop client: give --concurrency too")
        _check_fields(self)


@dataclass(frozen=True)
class RecordOptions:
    """What a replay keeps besides each request's latencies.

    Attributes
    ----------
    token_times : bool
        Every output token's time (``pred_token_times_s``), needed for ITL.
    steps : bool
        The simulated step trace.
    step_requests : bool
        The request ids of every step (for the Chrome trace); implies ``steps``.
    """

    token_times: bool = False
    steps: bool = False
    step_requests: bool = False


#: The parts whose fields are options of ``replay`` (their settings: :data:`schemas.engine_settings.SETTINGS`).
_OPTION_PARTS = {"engine": EngineOptions, "scheduling": SchedulingOptions, "disagg": DisaggOptions,
                 "closed_loop": ClosedLoopOptions}
#: Option name -> the part of :class:`ReplayConfig` that holds it (declared in :mod:`schemas.engine_settings`).
OPTION_PART = {s.name: s.part for s in SETTINGS.values() if s.part in _OPTION_PARTS}


@dataclass(frozen=True)
class ReplayConfig:
    """The options of one replay (:func:`replay.simulate.replay_frame`).

    Attributes
    ----------
    engine : EngineOptions
    scheduling : SchedulingOptions
    disagg : DisaggOptions | None
        The pools, with ``scheduling.scheduler == "disagg"`` only (their defaults when None).
    closed_loop : ClosedLoopOptions
    record : RecordOptions
    exact_steps : bool
        Simulate every step and request one by one (``EngineConfig.exact_steps``); same
        results, slower.

    Raises
    ------
    ConfigError
        A part given options its scheduler does not use: ``disagg`` without
        ``scheduler="disagg"``, ``replicas`` other than 1 with it. The checks that need the
        cost model (pool TPs under swap preemption) and the loading of the scheduler wait
        for the replay.
    """

    engine: EngineOptions = field(default_factory=EngineOptions)
    scheduling: SchedulingOptions = field(default_factory=SchedulingOptions)
    disagg: DisaggOptions | None = None
    closed_loop: ClosedLoopOptions = field(default_factory=ClosedLoopOptions)
    record: RecordOptions = field(default_factory=RecordOptions)
    exact_steps: bool = False

    def __post_init__(self):
        scheduler = self.scheduling.scheduler
        if scheduler != "disagg":
            if self.disagg is not None:
                given = [f.name for f in fields(DisaggOptions) if getattr(self.disagg, f.name) != f.default]
                names = ", ".join(_flag(n) for n in given or [f.name for f in fields(DisaggOptions)])
                raise ConfigError(f"{names}: only --scheduler disagg uses these (the scheduler is {scheduler})",
                                  options=tuple(given))
            return
        if self.scheduling.replicas != 1:
            raise ConfigError("--replicas: with --scheduler disagg give --prefill-replicas and --decode-replicas")
        if self.disagg is None:
            object.__setattr__(self, "disagg", DisaggOptions())

    @classmethod
    def from_options(cls, record: RecordOptions | None = None, exact_steps: bool = False,
                     **options) -> ReplayConfig:
        """A configuration from options by name (``replay``'s, which are vLLM's: ``max_num_seqs=128``).

        The vocabulary of the command line and of the engine settings recorded with a
        calibration or a trace. A ``disagg`` part is made when one of its options is given
        (not None). Options left out keep their defaults; an older name
        (``speculative_tokens``, :data:`schemas.engine_settings.ALIASES`) is read as the current one.

        Raises
        ------
        ConfigError
            An unknown name, or a value or combination that :class:`ReplayConfig` refuses.
        """
        options = canonical(options)
        unknown = [n for n in options if n not in OPTION_PART]
        if unknown:
            raise ConfigError(f"{', '.join(map(_flag, unknown))}: not an option of a replay")
        by_part: dict[str, dict] = {}
        for name, value in options.items():
            if OPTION_PART[name] == "disagg" and value is None:
                continue
            by_part.setdefault(OPTION_PART[name], {})[name] = value
        parts = {part: _OPTION_PARTS[part](**kw) for part, kw in by_part.items()}
        return cls(**parts, record=record or RecordOptions(), exact_steps=exact_steps)

    def options(self) -> dict:
        """Every option by name (:meth:`from_options` inverts it); the ``disagg`` ones only with ``disagg``."""
        out = {}
        for part in _OPTION_PARTS:
            value = getattr(self, part)
            if value is not None:
                out.update(asdict(value))
        return out

    def with_options(self, **options) -> ReplayConfig:
        """This configuration with the options named changed (:meth:`from_options`), checked again."""
        return ReplayConfig.from_options(self.record, self.exact_steps, **{**self.options(), **canonical(options)})

    def with_scheduler(self, name: str, disagg: DisaggOptions | None = None) -> ReplayConfig:
        """This configuration under scheduler ``name``, for comparisons across schedulers.

        ``disagg`` gets the pools ``disagg`` (else this configuration's, else the defaults)
        and one replica (its pools replace ``replicas``); any other scheduler gets no pools.
        """
        if name == "disagg":
            return replace(self, scheduling=replace(self.scheduling, scheduler=name, replicas=1),
                           disagg=disagg or self.disagg or DisaggOptions())
        return replace(self, scheduling=replace(self.scheduling, scheduler=name), disagg=None)
