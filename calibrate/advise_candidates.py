"""Candidate experiments for ``calibrate advise``: benchmark runs a team can launch, each a workload of
fixed prompt and output lengths at a request rate (open loop) or a concurrency (closed loop), under
the calibrated engine's settings or changed ``max_num_seqs``/``max_num_batched_tokens``.

Fixed lengths are what the benchmark tools generate from a length pair (GuideLLM's
``prompt_tokens=...,output_tokens=...``, ``vllm bench serve --dataset-name random`` with a range ratio of
0, inference-perf's ``random`` data with a zero spread), so the synthesized workload replayed here is
the one the emitted command runs. Prompts are unique (no prefix-cache hits), as those tools' random
prompts are.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

#: Seconds a candidate run at a rate lasts (its requests: rate x this, within the bounds below).
RUN_S = 120.0
#: Requests of a candidate run, at least and at most (the p90 of fewer is a few requests).
MIN_REQUESTS, MAX_REQUESTS = 100, 300
#: Requests per client of a closed-loop run.
REQUESTS_PER_CLIENT = 8
#: Multiples of the fitted rate, and of the fitted running requests for concurrencies, tried.
RATE_FACTORS = (2.0, 4.0, 0.5, 8.0)
CONCURRENCY_FACTORS = (4, 16, 2, 32)
#: The length mixes tried besides the fitted one: name -> (prompt factor, output factor).
MIXES = {"prefill-heavy": (4.0, 0.25), "decode-heavy": (0.25, 4.0)}
#: The keys a ``--what-if`` takes.
WHAT_IF_KEYS = ("rate", "concurrency", "prompt_tokens", "output_tokens", "requests", "max_num_seqs",
                "max_num_batched_tokens")


#: The engine settings a candidate or a what-if may change (vLLM names), in the order they are printed.
ENGINE_KEYS = ("max_num_seqs", "max_num_batched_tokens")


class WhatIfError(ValueError):
    """A ``--what-if`` that cannot be read (the message says what is expected)."""


@dataclass(frozen=True)
class FittedLoad:
    """What the calibration's runs were: mean lengths (tokens), the highest arrival rate (requests/s)
    and mean requests running (Little's law) among them, and the engine settings (vLLM names)."""

    prompt_tokens: float
    output_tokens: float
    rate_rps: float
    running: float
    engine: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Workload:
    """One benchmark run: ``num_requests`` requests of ``prompt_tokens`` + ``output_tokens`` tokens at
    ``rate_rps`` requests/s (open loop) or from ``concurrency`` clients (closed loop, all starting at
    0); ``engine`` the server settings it changes ((vLLM name, value) pairs); ``why`` in words."""

    prompt_tokens: int
    output_tokens: int
    num_requests: int
    rate_rps: float | None = None
    concurrency: int | None = None
    engine: tuple = ()
    why: str = ""

    def load_words(self) -> str:
        """``"2.4 req/s"`` or ``"concurrency 16"``."""
        return f"concurrency {self.concurrency}" if self.concurrency else f"{self.rate_rps:.3g} req/s"

    def label(self) -> str:
        """The run in one line: load, lengths, requests, engine changes."""
        eng = "".join(f", {k} {v}" for k, v in self.engine)
        return (f"{self.load_words()}, prompts {self.prompt_tokens} / outputs {self.output_tokens} tokens, "
                f"{self.num_requests} requests{eng}")

    def trace(self, poisson: bool, seed: int = 0) -> pd.DataFrame:
        """The synthesized request trace (``request_trace/1`` columns, seconds and tokens): arrivals
        every ``1 / rate`` s, or Poisson of that rate (``poisson``, seeded), or all at 0 for a closed
        loop."""
        n = self.num_requests
        if self.concurrency:
            arrival = np.zeros(n)
        elif poisson:
            gaps = np.random.default_rng(seed).exponential(1.0 / self.rate_rps, n - 1)
            arrival = np.concatenate([[0.0], np.cumsum(gaps)])
        else:
            arrival = np.arange(n) / self.rate_rps
        return pd.DataFrame({"request_id": [str(i + 1) for i in range(n)], "arrival_time_s": arrival,
                             "num_prompt_tokens": np.full(n, self.prompt_tokens, np.int64),
                             "num_output_tokens": np.full(n, self.output_tokens, np.int64)})

    def config(self, base):
        """``base`` (:class:`replay.config.ReplayConfig`) with this run's concurrency and engine changes."""
        return base.with_options(concurrency=self.concurrency, **dict(self.engine))

    @property
    def metadata(self) -> dict:
        """The trace's metadata (none: a synthesized workload, unique prompts)."""
        return {}


@dataclass(frozen=True, eq=False)
class MeasuredRun:
    """A run already measured, as a candidate (``calibrate advise --candidates``: which of these runs to
    add to the fit): its own requests, arrivals, metadata and engine settings are replayed, so its
    score is that of the measurement that exists, not of a synthesized look-alike.

    ``run`` is a :class:`calibrate.request_fit.Run`; the attributes :class:`Workload` has for printing
    are its means (tokens) and its arrival rate (requests/s: requests after the first over the span of
    their arrivals; None when all arrive at once)."""

    run: object
    why: str = "a measured run"
    engine: tuple = ()
    concurrency: None = None

    @property
    def num_requests(self) -> int:
        """Requests of the run (all replayed)."""
        return len(self.run.trace)

    @property
    def prompt_tokens(self) -> int:
        """Mean prompt length, tokens."""
        return round(float(self.run.trace["num_prompt_tokens"].mean()))

    @property
    def output_tokens(self) -> int:
        """Mean output length, tokens."""
        return round(float(self.run.trace["num_output_tokens"].mean()))

    @property
    def rate_rps(self) -> float | None:
        """The measured arrival rate, requests/s (None: every request sent at once)."""
        t = self.run.trace["arrival_time_s"]
        span = float(t.max() - t.min())
        return (len(t) - 1) / span if span > 0 else None

    def load_words(self) -> str:
        """``"1.5 req/s"`` (measured arrivals) or ``"all at once"``."""
        return f"{self.rate_rps:.3g} req/s" if self.rate_rps else "all requests at once"

    def label(self) -> str:
        """The run's name, its load, mean lengths and requests."""
        return (f"{self.run.name}: {self.load_words()}, prompts {self.prompt_tokens} / outputs "
                f"{self.output_tokens} tokens (means), {self.num_requests} requests")

    def trace(self, poisson: bool, seed: int = 0):
        """The measured requests (their own arrivals, whatever ``poisson`` and ``seed``)."""
        return self.run.trace

    def config(self, base):
        """The run's own engine settings (its :class:`replay.config.ReplayConfig`, not ``base``)."""
        return self.run.config

    @property
    def metadata(self) -> dict:
        """The run's trace metadata (its hash block size for prefix-cache hits, ...)."""
        return self.run.metadata


def requests_for(rate_rps: float | None, concurrency: int | None) -> int:
    """Requests of a run: :data:`RUN_S` of arrivals at a rate, :data:`REQUESTS_PER_CLIENT` per client,
    within [:data:`MIN_REQUESTS`, :data:`MAX_REQUESTS`]."""
    n = concurrency * REQUESTS_PER_CLIENT if concurrency else rate_rps * RUN_S
    return int(min(max(round(n), MIN_REQUESTS), MAX_REQUESTS))


def _lengths(base: FittedLoad, prompt_factor: float, output_factor: float, max_len: int) -> tuple[int, int]:
    """The fitted mean lengths times the factors, whole tokens >= 1, prompt + output within ``max_len``."""
    out = max(1, round(base.output_tokens * output_factor))
    prompt = max(1, min(round(base.prompt_tokens * prompt_factor), max_len - out))
    return prompt, out


def _run(prompt_out: tuple, rate: float | None = None, conc: int | None = None, engine=(), why="") -> Workload:
    """A :class:`Workload` of ``prompt_out`` (tokens) at ``rate`` or ``conc``; ``engine`` pairs or a dict,
    kept in :data:`ENGINE_KEYS` order."""
    eng = dict(engine)
    return Workload(prompt_out[0], prompt_out[1], requests_for(rate, conc), rate, conc,
                    tuple((k, eng[k]) for k in ENGINE_KEYS if k in eng), why)


def candidates(base: FittedLoad, max_model_len: int, budget: int, engine: tuple = ()) -> list[Workload]:
    """At most ``budget`` candidate runs, the axes interleaved so that a small budget still spans them:
    the fitted mix at other rates (:data:`RATE_FACTORS` x the fitted rate) and concurrencies
    (:data:`CONCURRENCY_FACTORS` x the fitted running requests, within ``max_num_seqs``), the
    :data:`MIXES` at the fitted and twice the fitted rate, and at twice the fitted rate a 4x token budget
    and a quarter of ``max_num_seqs``.

    The engine settings rule: every candidate runs under ``engine`` ((vLLM name, value) pairs: the
    what-if's ``max_num_seqs``/``max_num_batched_tokens``, :attr:`Workload.engine`), since a measurement
    under the settings asked about tells most about them; only the candidates whose point is to vary a
    setting (the engine axis) change it, that one setting, from the what-if's value (else the
    calibration's) and keep the what-if's other."""
    asked = dict(engine)
    mix = _lengths(base, 1.0, 1.0, max_model_len)
    rate, running = base.rate_rps, max(1, round(base.running))
    max_seqs = int(asked.get("max_num_seqs") or base.engine.get("max_num_seqs") or 256)
    loads = [_run(mix, rate=rate * f, engine=engine, why=f"{f:g}x the fitted rate") for f in RATE_FACTORS]
    concs = sorted({min(running * f, max_seqs) for f in CONCURRENCY_FACTORS} - {running})
    loads_c = [_run(mix, conc=c, engine=engine, why=f"{c / running:.3g}x the fitted running requests")
               for c in concs if c > 1]
    mixes = [_run(_lengths(base, *MIXES[name], max_model_len), rate=rate * f, engine=engine,
                  why=f"{name} mix at {f:g}x the rate") for f in (1.0, 2.0) for name in MIXES]
    varied = []
    budget_tokens = asked.get("max_num_batched_tokens") or base.engine.get("max_num_batched_tokens")
    if budget_tokens:
        varied.append(_run(mix, rate=rate * 2, engine={**asked, "max_num_batched_tokens": int(budget_tokens) * 4},
                           why="4x the token budget at 2x the rate"))
    if max_seqs >= 4:
        varied.append(_run(mix, rate=rate * 2, engine={**asked, "max_num_seqs": max_seqs // 4},
                           why="a quarter of max_num_seqs at 2x the rate"))
    axes = [loads, loads_c, mixes, varied]
    out: list[Workload] = []
    while len(out) < budget and any(axes):
        for axis in axes:
            if axis and len(out) < budget:
                w = axis.pop(0)
                if all(replace(w, why="") != replace(o, why="") for o in out):
                    out.append(w)
    return out


def parse_what_if(text: str | None, base: FittedLoad, max_model_len: int) -> Workload:
    """The what-if run of ``--what-if`` (``rate=4``, ``concurrency=16,prompt_tokens=2000``,
    ``max_num_batched_tokens=8192``: keys :data:`WHAT_IF_KEYS`, comma-separated); keys not given take
    the fitted mix, and without a rate or concurrency twice the fitted rate. None: that default alone.

    Raises
    ------
    WhatIfError
        An unknown key, a value that is not a positive number (a whole one for all but ``rate``),
        both ``rate`` and ``concurrency``, or lengths over ``max_model_len``.
    """
    given: dict = {}
    for part in (text or "").split(","):
        if not part.strip() and text is not None and not text.strip():
            raise WhatIfError("is empty; expected KEY=VALUE[,KEY=VALUE...], e.g. rate=4")
        if not part.strip():
            continue
        key, eq, value = (s.strip() for s in part.partition("="))
        if key not in WHAT_IF_KEYS or not eq:
            raise WhatIfError(f"{part.strip()!r}: expected KEY=VALUE with KEY one of {', '.join(WHAT_IF_KEYS)}")
        try:
            number = float(value) if key == "rate" else int(value)
        except ValueError:
            number = -1
        if not (np.isfinite(number) and number > 0):
            kind = "a number of requests/s" if key == "rate" else "a whole number"
            raise WhatIfError(f"{key}={value}: expected {kind} > 0")
        given[key] = number
    if "rate" in given and "concurrency" in given:
        raise WhatIfError("give rate or concurrency, not both")
    prompt = int(given.get("prompt_tokens", max(1, round(base.prompt_tokens))))
    out = int(given.get("output_tokens", max(1, round(base.output_tokens))))
    if prompt + out > max_model_len:
        raise WhatIfError(f"prompt_tokens + output_tokens = {prompt + out} exceeds max_model_len {max_model_len}")
    conc = given.get("concurrency")
    rate = None if conc else given.get("rate", 2.0 * base.rate_rps)
    engine = tuple((k, given[k]) for k in ENGINE_KEYS if k in given)
    n = int(given.get("requests", requests_for(rate, conc)))
    why = "the what-if given" if text else "no --what-if: twice the fitted rate"
    return Workload(prompt, out, n, rate, conc, engine, why)
