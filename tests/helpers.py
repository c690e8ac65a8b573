"""Test helpers shared by several test modules (not fixtures)."""
from __future__ import annotations

from replay.engine import Engine, EngineConfig
from replay.request import Request
from replay.schedulers import get_scheduler_factory
from replay.schedulers.base import SchedulerConfig


class LinearStepCost:
    """step time = base_s + per_token_s * tokens in the step (the cases' hand-worked cost)."""

    def __init__(self, base_s: float, per_token_s: float):
        self.base_s, self.per_token_s = base_s, per_token_s

    def step_time_s(self, num_prefill_tokens, num_decode_seqs, decode_context_tokens, prefill_context_tokens=0):
        tokens = num_prefill_tokens + num_decode_seqs
        return self.base_s + self.per_token_s * tokens if tokens else 0.0


def run(reqs, cost, scheduler="chunked", budget=2048, max_num_seqs=256, num_gpu_blocks=10**6, block_size=16,
        max_model_len=None, replicas=1):
    """Run requests given as (id, arrival_s, prompt, output) tuples; return {id: Request} and the engine."""
    rs = [Request(i, rid, a, p, o, record_token_times=True) for i, (rid, a, p, o) in enumerate(reqs)]
    eng = Engine(cost, get_scheduler_factory(scheduler), SchedulerConfig(max_num_seqs, budget),
                 EngineConfig(num_gpu_blocks, block_size, max_model_len, True, True), num_replicas=replicas)
    eng.run(rs)
    return {r.request_id: r for r in rs}, eng
