"""The engine settings of a replay, declared once.

Every setting a replay takes (one replica's vLLM engine arguments, the scheduler and its
replicas, the disaggregated pools, the closed loop, the parallelism of the cost model) is
declared here with its Python name, the flags that spell it on the command line (vLLM's
among them), its type, default, unit and range, and where it comes from. What derives
from this one table:

- the command-line options of ``replay``, ``calibrate fit``, ``calibrate validate`` and
  (the ones it varies) ``servecal plan``: flags, click types and ranges, help
  (:mod:`replay.cli.options`);
- the checks of :mod:`replay.config`'s parts (:func:`problem`) and the part each option
  belongs to (``part``);
- the settings a calibration records and a vLLM log, a trace or a calibration fills in
  (``recorded``, under ``vllm``'s name), and those a trace's ``engine_settings`` metadata
  may carry (``in_trace``, :func:`traces.io.recorded_engine_settings`).

The dataclasses of :mod:`replay.config` spell their fields and defaults out (a reader sees
them there); a test holds them equal to this table. It lives in ``schemas`` because the
trace metadata and the calibration file's ``engine`` record use these names.

Sources: vLLM 0.11.0 ``vllm/engine/arg_utils.py`` (``EngineArgs`` and its flags),
``vllm/config/scheduler.py``, ``vllm/config/cache.py``, ``vllm/config/speculative.py``;
DistServe (Zhong et al., OSDI 2024) for the disaggregated pools.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

#: The parts of a replay's configuration (:mod:`replay.config`), and ``hardware``: the
#: parallelism of the cost model (:class:`replay.cost.cost_model.RooflineCostModel`).
PARTS = ("engine", "scheduling", "disagg", "closed_loop", "hardware")


@dataclass(frozen=True)
class SettingSpec:
    """One engine setting.

    Attributes
    ----------
    name : str
        Python name: the field of its part, the keyword of
        :meth:`replay.config.ReplayConfig.from_options`, the click parameter.
    part : str
        One of :data:`PARTS`.
    type : type
        ``int``, ``float``, ``bool`` or ``str``; a default of None means "not set" (derived
        from something else, see ``meaning``).
    default
        The value when nothing sets it.
    unit : str
        ``s``, ``tokens``, ``bytes/s``... (``""``: a count, fraction, flag or name).
    flags : tuple of str
        Every spelling the commands accept; messages print the first. vLLM's flag, when it
        has one, is among them. Empty: a library option only.
    meaning : str
        What it is (the commands' ``--help``).
    vllm : str | None
        vLLM's name of it (``EngineArgs`` field, the key of its logs and of the trace
        metadata); None: servecal's own setting.
    vllm_flag : str | None
        vLLM's command-line flag (``vllm serve``); None: vLLM has none.
    low, high : float | None
        Range (None: unbounded on that side); ``low_open``/``high_open`` exclude the bound.
        A ``high`` of ``inf`` (open) asks for a finite value.
    choices : tuple or callable | None
        The names accepted (a callable: read from the catalog when asked).
    note : str
        Appended to the range in a message (``"0: no cap"``).
    integral : bool
        The value must be a whole number (the message says "an integer").
    recorded : bool
        A calibration records it (``engine``), and a vLLM log, a trace's metadata or a
        calibration fills it in when not given (under ``vllm`` or else ``name``).
    in_trace : bool
        A trace's ``engine_settings`` metadata may carry it (under ``vllm``).
    aliases : tuple of str
        Older Python names still read (a calibration written before the rename).
    source : str
        Where its default and meaning come from.
    """

    name: str
    part: str
    type: type
    default: object
    unit: str
    flags: tuple
    meaning: str
    vllm: str | None = None
    vllm_flag: str | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple | Callable | None = None
    note: str = ""
    integral: bool = False
    recorded: bool = False
    in_trace: bool = False
    aliases: tuple = ()
    source: str = ""

    @property
    def flag(self) -> str:
        """The flag messages print (``--max-num-seqs``); ``--`` + the name for a library option."""
        return self.flags[0] if self.flags else "--" + self.name.replace("_", "-")

    def known(self) -> tuple | None:
        """The names accepted, or None for a number or flag."""
        return tuple(self.choices()) if callable(self.choices) else self.choices

    def expected(self) -> str:
        """What the setting accepts, as a message says it (``>= 1``, ``in (0, 1]``)."""
        lo = "(" if self.low_open else "["
        hi = ")" if self.high_open else "]"
        if self.low is not None and self.high is not None and math.isfinite(self.high):
            text = f"in {lo}{self.low:g}, {self.high:g}{hi}"
        else:
            text = f"{'>' if self.low_open else '>='} {self.low:g}"
            text += " seconds" if self.unit == "s" else ""
            text += " and finite" if self.high == math.inf else ""
        text = f"an integer {text}" if self.integral else text
        return f"{text} ({self.note})" if self.note else text


def _links() -> tuple:
    from .specs import link_presets

    return tuple(link_presets())


_V = "vLLM 0.11.0 EngineArgs"
_S = (
    SettingSpec("scheduler", "scheduling", str, "chunked", "", ("--scheduler",),
                "chunked | fcfs | static | sjf | edf | disagg (prefill/decode pools), or package.module:ClassName.",
                recorded=True, in_trace=True, source="servecal (replay.schedulers); vLLM v1 schedules as chunked"),
    SettingSpec("max_num_seqs", "engine", int, 256, "requests", ("--max-num-seqs",),
                "Requests running at once per replica.", "max_num_seqs", "--max-num-seqs", low=1,
                recorded=True, in_trace=True, source=f"{_V} (the API server's default on small GPUs: 256)"),
    SettingSpec("max_num_batched_tokens", "engine", int, 8192, "tokens", ("--max-num-batched-tokens",),
                "Token budget per step.", "max_num_batched_tokens", "--max-num-batched-tokens", low=1,
                recorded=True, in_trace=True, source=f"{_V} (the API server's default on large GPUs: 8192)"),
    SettingSpec("num_gpu_blocks", "engine", int, None, "blocks", ("--num-gpu-blocks", "--num-gpu-blocks-override"),
                "KV blocks per replica [default: from GPU memory].", "num_gpu_blocks", "--num-gpu-blocks-override",
                low=1, recorded=True, in_trace=True,
                source=f"{_V} num_gpu_blocks_override; vLLM logs the count as num_gpu_blocks"),
    SettingSpec("gpu_memory_utilization", "engine", float, 0.9, "", ("--gpu-memory-utilization",),
                "Fraction of GPU memory for weights + KV.", "gpu_memory_utilization", "--gpu-memory-utilization",
                low=0, high=1, low_open=True, recorded=True, in_trace=True, source=_V),
    SettingSpec("block_size", "engine", int, 16, "tokens", ("--block-size",), "Tokens per KV block.",
                "block_size", "--block-size", low=1, recorded=True, in_trace=True,
                source="vLLM 0.11.0 CacheConfig (16 on CUDA)"),
    SettingSpec("max_model_len", "engine", int, None, "tokens", ("--max-model-len",),
                "Longest prompt + output [default: the model's context length].", "max_model_len",
                "--max-model-len", low=1, recorded=True, in_trace=True, source=f"{_V} (else the model's config)"),
    SettingSpec("enable_prefix_caching", "engine", bool, False, "", ("--enable-prefix-caching",),
                "Share full prompt KV blocks between requests (vLLM v1), from block_hashes.",
                "enable_prefix_caching", "--enable-prefix-caching", recorded=True,
                source="vLLM v1 automatic prefix caching (on by default in vLLM; off here: a trace needs "
                       "block_hashes)"),
    SettingSpec("preemption_mode", "engine", str, "recompute", "", ("--preemption-mode",),
                "What preemption does with the victim's KV.", "preemption_mode", "--preemption-mode",
                choices=("recompute", "swap"), recorded=True,
                source="vLLM v0 EngineArgs preemption_mode (v1 recomputes)"),
    SettingSpec("replicas", "scheduling", int, 1, "", ("--replicas",),
                "Replicas of a colocated scheduler (disagg: --prefill-replicas, --decode-replicas).", low=1,
                recorded=True, source="servecal (replay.core.routing): replicas behind a router"),
    SettingSpec("router", "scheduling", str, "round_robin", "", ("--router",),
                "How arrivals are spread over replicas.", choices=("round_robin", "least_loaded", "prefix_affinity"),
                recorded=True, source="servecal (replay.core.routing)"),
    SettingSpec("long_prefill_token_threshold", "engine", int, 0, "tokens", ("--long-prefill-token-threshold",),
                "vLLM's per-request cap on the prompt tokens of one step, applied before the token budget to new "
                "and partially prefilled requests alike (chunked, sjf, edf, disagg prefill; fcfs and static admit "
                "whole prompts); 0: none, >= the budget: no effect.", "long_prefill_token_threshold",
                "--long-prefill-token-threshold", low=0, note="0: no cap", recorded=True,
                source="vLLM 0.11.0 SchedulerConfig (v0.11-era rule)"),
    SettingSpec("num_speculative_tokens", "engine", int, 0, "tokens",
                ("--speculative-tokens", "--num-speculative-tokens"),
                "Speculative decoding: draft tokens K per decode and step (vLLM's num_speculative_tokens). Each "
                "decode verifies K+1 positions (token budget and cost model count them) and emits 1 + the accepted "
                "drafts; 0: off.", "num_speculative_tokens", "--num-speculative-tokens", low=0,
                note="0: no speculative decoding", recorded=True, aliases=("speculative_tokens",),
                source="vLLM 0.11.0 SpeculativeConfig num_speculative_tokens (--speculative-config; a flag of its "
                       "own up to v0.6)"),
    SettingSpec("spec_acceptance_rate", "engine", float, None, "", ("--spec-acceptance-rate",),
                "Speculative decoding: probability A that a draft token is accepted given the ones before it were "
                "(a prefix is accepted); vLLM's mean acceptance length is (1 - A^(K+1)) / (1 - A). Required with "
                "--speculative-tokens.", low=0, high=1, recorded=True,
                source="servecal: measured (vLLM's spec-decode acceptance metrics), not an engine argument"),
    SettingSpec("hash_block_size", "engine", int, None, "tokens", ("--hash-block-size",),
                "Tokens per block of the trace's block_hashes (Mooncake: 512) [default: the trace's "
                "hash_block_tokens metadata, else 16].", low=1, source="the trace's block_hashes (Mooncake: 512)"),
    SettingSpec("swap_link", "engine", str, "pcie4", "", (), "Host link of swap preemption.", choices=_links,
                source="servecal link catalog (schemas/catalog)"),
    SettingSpec("seed", "engine", int, 0, "", ("--seed",),
                "Seed of the simulation's random draws (accepted draft tokens of --speculative-tokens).", "seed",
                "--seed", low=0, recorded=True, source="servecal; vLLM has a seed of its own sampling"),
    SettingSpec("slo_ttft_s", "scheduling", float, None, "s", ("--slo-ttft-s",),
                "TTFT objective, seconds, of requests without a slo_ttft_s column (edf, goodput).", low=0,
                high=math.inf, low_open=True, high_open=True, source="servecal (DistServe's goodput)"),
    SettingSpec("slo_tpot_s", "scheduling", float, None, "s", ("--slo-tpot-s",),
                "TPOT objective, seconds, of requests without a slo_tpot_s column (edf, goodput).", low=0,
                high=math.inf, low_open=True, high_open=True, source="servecal (DistServe's goodput)"),
    SettingSpec("prefill_replicas", "disagg", int, 1, "", ("--prefill-replicas",),
                "disagg: prefill instances [default: 1].", low=1, source="DistServe: prefill instances"),
    SettingSpec("decode_replicas", "disagg", int, 1, "", ("--decode-replicas",),
                "disagg: decode instances [default: 1].", low=1, source="DistServe: decode instances"),
    SettingSpec("tp_prefill", "disagg", int, None, "", ("--tp-prefill", "--prefill-tp"),
                "disagg: tensor-parallel degree of a prefill instance [default: --tp].", "tp_prefill", low=1,
                recorded=True, in_trace=True, source="DistServe tp_prefill (traces import distserve records it)"),
    SettingSpec("tp_decode", "disagg", int, None, "", ("--tp-decode", "--decode-tp"),
                "disagg: tensor-parallel degree of a decode instance [default: --tp].", "tp_decode", low=1,
                recorded=True, in_trace=True, source="DistServe tp_decode (traces import distserve records it)"),
    SettingSpec("pp_prefill", "disagg", int, None, "", ("--pp-prefill",),
                "disagg: pipeline-parallel stages of a prefill instance [default: --pp].", "pp_prefill", low=1,
                recorded=True, in_trace=True, source="DistServe pp_prefill (traces import distserve records it)"),
    SettingSpec("pp_decode", "disagg", int, None, "", ("--pp-decode",),
                "disagg: pipeline-parallel stages of a decode instance [default: --pp].", "pp_decode", low=1,
                recorded=True, in_trace=True, source="DistServe pp_decode (traces import distserve records it)"),
    SettingSpec("link", "disagg", str, None, "", ("--link",),
                "disagg: prefill-to-decode KV link [default: the GPU's own tp_link].", choices=_links,
                source="servecal link catalog; DistServe places both pools in one node"),
    SettingSpec("link_bandwidth_bytes_per_s", "disagg", float, None, "bytes/s", ("--link-bandwidth-bytes-per-s",),
                "disagg: KV link bandwidth, bytes/s [default: --link's].", low=0, low_open=True,
                source="servecal: overrides the link preset's"),
    SettingSpec("link_latency_s", "disagg", float, None, "s", ("--link-latency-s",),
                "disagg: KV link one-way latency, seconds [default: --link's].", low=0, high=math.inf,
                high_open=True, source="servecal: overrides the link preset's"),
    SettingSpec("first_token_from", "disagg", str, "prefill", "", ("--first-token-from",),
                "disagg: instance that emits output token 1 [default: prefill, as DistServe].",
                choices=("prefill", "decode"), source="DistServe: the prefill instance emits token 1"),
    SettingSpec("kv_handoff", "disagg", str, "pull", "", ("--kv-handoff",),
                "disagg: how a finished prompt's KV reaches a decode instance: pull (DistServe: it waits, its KV "
                "still on the prefill instance, until a decode instance has room), prealloc (SGLang: a request "
                "starts prefill only once a decode instance has reserved room for it) or push (at once, into an "
                "unbounded buffer: the replay before issue #34) [default: pull].",
                choices=("pull", "prealloc", "push"), recorded=True,
                source="LLMServe/DistServe decoding_stage_scheduler.py: its unaccepted queue, "
                       "waiting_block_prop_threshold"),
    SettingSpec("concurrency", "closed_loop", int, None, "clients", ("--concurrency",),
                "Closed loop: N clients send the trace's requests in order, each when its previous one completes "
                "(llmperf, GenAI-Perf, vllm bench --max-concurrency); arrival times are ignored [default: open "
                "loop, arrivals as traced].", low=1, integral=True,
                source="vllm bench serve --max-concurrency, llmperf, GenAI-Perf"),
    SettingSpec("think_time_s", "closed_loop", float, 0.0, "s", ("--think-time-s",),
                "Closed loop: a client's pause between a completion and its next send, seconds.", low=0,
                high=math.inf, high_open=True, source="servecal (closed-loop benchmark clients)"),
    SettingSpec("tp", "hardware", int, 1, "GPUs", ("--tp", "--tensor-parallel-size"),
                "Tensor-parallel degree of one replica.", "tensor_parallel_size", "--tensor-parallel-size", low=1,
                recorded=True, in_trace=True, source=_V),
    SettingSpec("dp", "hardware", int, 1, "ranks", ("--data-parallel-size", "--dp"),
                "vLLM data-parallel ranks stepping in lock step (MoE); engine limits are per rank.",
                "data_parallel_size", "--data-parallel-size", low=1, recorded=True, in_trace=True, source=_V),
    SettingSpec("pp", "hardware", int, 1, "stages", ("--pp", "--pipeline-parallel-size"),
                "Pipeline-parallel stages of one replica (vLLM --pipeline-parallel-size): each holds 1/PP of the "
                "layers, up to PP micro-batches in flight.", "pipeline_parallel_size", "--pipeline-parallel-size",
                low=1, recorded=True, source=_V),
    SettingSpec("expert_parallel", "hardware", bool, False, "", ("--enable-expert-parallel",),
                "vLLM expert parallelism: routed experts split over the tp x dp GPUs.", "enable_expert_parallel",
                "--enable-expert-parallel", recorded=True, source=_V),
)

#: Every engine setting by Python name, in the order the commands list them.
SETTINGS: Mapping[str, SettingSpec] = MappingProxyType({s.name: s for s in _S})
#: Older Python names -> the current one (read from calibrations written before a rename).
ALIASES: Mapping[str, str] = MappingProxyType({a: s.name for s in _S for a in s.aliases})


def of_part(part: str) -> tuple[SettingSpec, ...]:
    """The settings of one part (:data:`PARTS`), in table order."""
    return tuple(s for s in SETTINGS.values() if s.part == part)


def canonical(settings: Mapping) -> dict:
    """``settings`` with older names (:data:`ALIASES`) under the current ones; a current name wins."""
    out = {ALIASES.get(k, k): v for k, v in settings.items() if k in ALIASES}
    out.update({k: v for k, v in settings.items() if k not in ALIASES})
    return out


def problem(name: str, value) -> tuple[str, str] | None:
    """Why ``value`` is not a valid setting ``name`` (None when it is; None is valid, "not set", for a
    setting whose default is None).

    Returns
    -------
    ``("range", expected)`` for a number outside the range (:meth:`SettingSpec.expected`),
    ``("choice", known)`` for an unknown name (``known``: the names, comma separated).
    """
    spec = SETTINGS[name]
    known = spec.known()
    if value is None and spec.default is None:
        return None
    if known is not None:
        return None if value in known else ("choice", ", ".join(known))
    if spec.low is None:
        return None if value is not None else ("range", f"a {spec.type.__name__}")
    try:
        ok = (value > spec.low if spec.low_open else value >= spec.low)
        if spec.high is not None:
            ok = ok and (value < spec.high if spec.high_open else value <= spec.high)
        ok = ok and (not spec.integral or int(value) == value)
    except (TypeError, ValueError, OverflowError):
        ok = False
    return None if ok else ("range", spec.expected())
