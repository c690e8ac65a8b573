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
    return Workload(prompt_out[0], prompt_out[1], requests_for(rate, conc), rate, conc, tuple(engine), why)


def candidates(base: FittedLoad, max_model_len: int, budget: int) -> list[Workload]:
    """At most ``budget`` candidate runs, the axes interleaved so that a small budget still spans them:
    the fitted mix at other rates (:data:`RATE_FACTORS` x the fitted rate) and concurrencies
    (:data:`CONCURRENCY_FACTORS` x the fitted running requests, within ``max_num_seqs``), the
    :data:`MIXES` at the fitted and twice the fitted rate, and at twice the fitted rate a 4x token budget
    and a quarter of ``max_num_seqs``."""
    mix = _lengths(base, 1.0, 1.0, max_model_len)
    rate, running = base.rate_rps, max(1, round(base.running))
    max_seqs = int(base.engine.get("max_num_seqs") or 256)
    loads = [_run(mix, rate=rate * f, why=f"{f:g}x the fitted rate") for f in RATE_FACTORS]
    concs = sorted({min(running * f, max_seqs) for f in CONCURRENCY_FACTORS} - {running})
    loads_c = [_run(mix, conc=c, why=f"{c / running:.3g}x the fitted running requests") for c in concs if c > 1]
    mixes = [_run(_lengths(base, *MIXES[name], max_model_len), rate=rate * f, why=f"{name} mix at {f:g}x the rate")
             for f in (1.0, 2.0) for name in MIXES]
    engine = []
    budget_tokens = base.engine.get("max_num_batched_tokens")
    if budget_tokens:
        engine.append(_run(mix, rate=rate * 2, engine=[("max_num_batched_tokens", int(budget_tokens) * 4)],
                           why="4x the token budget at 2x the rate"))
    if max_seqs >= 4:
        engine.append(_run(mix, rate=rate * 2, engine=[("max_num_seqs", max_seqs // 4)],
                           why="a quarter of max_num_seqs at 2x the rate"))
    axes = [loads, loads_c, mixes, engine]
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
    engine = tuple((k, given[k]) for k in ("max_num_seqs", "max_num_batched_tokens") if k in given)
    n = int(given.get("requests", requests_for(rate, conc)))
    why = "the what-if given" if text else "no --what-if: twice the fitted rate"
    return Workload(prompt, out, n, rate, conc, engine, why)
