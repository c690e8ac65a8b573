"""The simulator's view of one request: its shape and its progress through an engine."""
from __future__ import annotations

import math

from schemas.status import WAITING


class Request:
    """One request inside the engine.

    Attributes
    ----------
    index : int
        Row of the request in the input trace.
    num_computed_tokens : int
        Tokens whose KV is in the cache (reset to 0 by a recompute preemption).
    num_generated_tokens : int
        Output tokens emitted so far.
    num_blocks : int
        KV blocks held.
    first_scheduled_time_s, first_token_time_s, last_token_time_s : float
        Absolute simulation times (NaN until they happen).
    token_times_s : list[float] | None
        Absolute time of every output token, when the engine records them.
    deadline_s : float
        Absolute time by which the first token is due (``inf``: none); ``edf`` uses it.
    slo_ttft_s, slo_tpot_s : float
        Latency objectives of this request, seconds (``inf``: none); ``edf`` derives its
        deadlines from them.
    prompt_keys : list[int] | None
        Content keys of its full prompt blocks at the engine's block geometry
        (:func:`~replay.core.prompt_keys.prompt_block_keys`): given when the trace's keys were
        computed once for many replays (:class:`~replay.core.trace_requests.TraceRequests`), else
        set by a prefix-caching KV cache when it first needs them; None again once it finished.
    """

    __slots__ = ("index", "request_id", "arrival_time_s", "num_prompt_tokens", "num_output_tokens",
                 "priority", "deadline_s", "block_hashes", "num_computed_tokens",
                 "num_generated_tokens", "num_blocks", "num_cached_tokens",
                 "first_scheduled_time_s", "first_token_time_s", "last_token_time_s",
                 "token_times_s", "num_preemptions", "num_recomputed_tokens", "status",
                 "lazy_step", "lazy_computed", "lazy_generated", "lazy_reserved",
                 "replica_id", "last_scheduled_time_s", "slo_ttft_s", "slo_tpot_s", "admission_number",
                 "prompt_keys")

    def __init__(self, index: int, request_id: str, arrival_time_s: float, num_prompt_tokens: int,
                 num_output_tokens: int, priority: int = 0, deadline_s: float = math.inf,
                 block_hashes=None, record_token_times: bool = False, slo_ttft_s: float = math.inf,
                 slo_tpot_s: float = math.inf, prompt_keys: list[int] | None = None):
        self.index = index
        self.request_id = request_id
        self.arrival_time_s = arrival_time_s
        self.num_prompt_tokens = num_prompt_tokens
        self.num_output_tokens = num_output_tokens
        self.priority = priority
        self.deadline_s = deadline_s
        self.slo_ttft_s = slo_ttft_s
        self.slo_tpot_s = slo_tpot_s
        self.block_hashes = block_hashes
        self.prompt_keys = prompt_keys
        self.num_computed_tokens = 0
        self.num_generated_tokens = 0
        self.num_blocks = 0
        self.num_cached_tokens = 0
        self.first_scheduled_time_s = math.nan
        self.last_scheduled_time_s = math.nan
        self.first_token_time_s = math.nan
        self.last_token_time_s = math.nan
        self.token_times_s: list[float] | None = [] if record_token_times else None
        self.num_preemptions = 0
        self.num_recomputed_tokens = 0
        self.status = WAITING
        self.replica_id = -1
        self.admission_number = 0  # order of its latest admission on its replica (ReplicaState.admit)
        # implicit decoding (replay.schedulers.implicit_decoders.LazyDecodes): the replica's step index at
        # which it joined (-1: explicit) and its counts then
        self.lazy_step = -1
        self.lazy_computed = 0
        self.lazy_generated = 0
        self.lazy_reserved = False  # its blocks already cover its peak: it takes none while implicit

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens: what the KV must hold before the next token."""
        return self.num_prompt_tokens + self.num_generated_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens still to feed before the next output token (1 while decoding)."""
        return self.num_prompt_tokens + self.num_generated_tokens - self.num_computed_tokens

    @property
    def is_decoding(self) -> bool:
        """True once the prompt (and any recomputation) is in the KV cache."""
        return self.num_computed_tokens >= self.num_tokens - 1 and self.num_generated_tokens > 0

    @property
    def peak_kv_tokens(self) -> int:
        """KV slots at the last step: prompt + output - 1 (the last token is never fed back)."""
        return self.num_prompt_tokens + self.num_output_tokens - 1

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, arrival={self.arrival_time_s}, prompt={self.num_prompt_tokens}, "
                f"output={self.num_output_tokens}, computed={self.num_computed_tokens}, "
                f"generated={self.num_generated_tokens}, status={self.status!r})")
