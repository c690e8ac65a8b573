"""The settings of the engine's replicas (:class:`EngineConfig`) and their checks against the
declared engine settings (:func:`check_setting`; :func:`check_settings`, called by
:class:`~replay.core.engine.Engine`)."""
from __future__ import annotations

from dataclasses import dataclass

from schemas.engine_settings import SETTINGS, problem

from ..errors import ConfigError, OptionError


@dataclass
class EngineConfig:
    """Per-replica engine settings.

    Attributes
    ----------
    num_gpu_blocks : int
        KV cache blocks per replica.
    block_size : int
        Tokens per KV block.
    max_model_len : int | None
        Longest prompt + output accepted; longer requests are rejected (vLLM's check).
    record_token_times : bool
        Keep every output token's time (needed for ITL); costs memory on big traces.
    record_steps : bool
        Keep one row per simulated step (the step trace of the replay).
    enable_prefix_caching : bool
        Share full prompt blocks between requests (vLLM v1 automatic prefix caching).
    hash_block_size : int | None
        Tokens per hash block of the requests' ``block_hashes`` (None: ``block_size``).
    preemption_mode : str
        ``"recompute"`` or ``"swap"`` (the victim's KV goes to host memory and back).
    swap_time_per_block_s : float
        Seconds to move one KV block over the host link; a step that swaps ``k`` blocks
        (out and in) lasts ``k * swap_time_per_block_s`` longer.
    record_step_requests : bool
        With ``record_steps``, keep the ids of each step's requests (``step_requests``).
    exact_steps : bool
        Simulate every step one by one through the event heap, every request explicit: no
        implicit decoders, no closed-form runs, no in-place step ends (the reference the
        fast path is tested against).
    spec_acceptance_rate : float
        Speculative decoding: probability in [0, 1] that one draft token is accepted, given
        that the drafts before it were (see :meth:`Engine.accept_drafts`).
    seed : int
        Seed of the engine's random draws (accepted drafts); one ``numpy.random.Generator``
        per replica, so a run is deterministic.
    max_request_blocks : int | None
        The most KV blocks one request may hold (None: the whole cache): one DP rank's share
        when ``dp`` ranks are simulated as one replica, since a request lives on one rank.
    """

    num_gpu_blocks: int
    block_size: int = 16
    max_model_len: int | None = None
    record_token_times: bool = False
    record_steps: bool = False
    enable_prefix_caching: bool = False
    hash_block_size: int | None = None
    preemption_mode: str = "recompute"
    swap_time_per_block_s: float = 0.0
    record_step_requests: bool = False
    exact_steps: bool = False
    spec_acceptance_rate: float = 0.0
    seed: int = 0
    max_request_blocks: int | None = None


def check_setting(name: str, value) -> None:
    """Refuse a value outside engine setting ``name``'s declaration
    (:func:`schemas.engine_settings.problem`).

    Raises
    ------
    OptionError
        ``<flag> must be <expected>, not <value>`` for a number out of range.
    ConfigError
        ``<flag> <value>: unknown; known: ...`` for an unknown name.
    """
    why = problem(name, value)
    if why is None:
        return
    kind, text = why
    if kind == "choice":
        raise ConfigError(f"{SETTINGS[name].flag} {value}: unknown; known: {text}")
    raise OptionError(SETTINGS[name].flag, value, text)


def check_settings(engine_config: EngineConfig, scheduler_config, num_replicas: int) -> None:
    """Refuse settings an engine cannot simulate, before it is built.

    Parameters
    ----------
    engine_config : EngineConfig
    scheduler_config : replay.schedulers.base.SchedulerConfig
    num_replicas : int

    Raises
    ------
    ConfigError
        Naming the option as the command line spells it (:func:`check_setting`).
    """
    for name, value in (("replicas", num_replicas), ("preemption_mode", engine_config.preemption_mode),
                        ("num_speculative_tokens", scheduler_config.num_speculative_tokens),
                        ("spec_acceptance_rate", engine_config.spec_acceptance_rate),
                        ("long_prefill_token_threshold", scheduler_config.long_prefill_token_threshold)):
        check_setting(name, value)
