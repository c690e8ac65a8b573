"""``sjf`` and ``edf`` keep their waiting queue in heaps (O(log n) per admission): the replay is
the same as with the previous implementation, which re-sorted the whole queue at every step
(kept here as the reference)."""
import math

import numpy as np
import pandas as pd
import pytest

from replay.cost.cost_model import RooflineCostModel
from schemas.cost_params import CostParams
from replay.schedulers.chunked import ChunkedScheduler
from replay.schedulers.edf import next_token_deadline_s
from replay.schedulers.keyed_queue import KeyedWaiting
from replay.config import ReplayConfig
from replay.simulate import replay_frame
from schemas.specs import get_gpu, get_model

COST = RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("a100-80gb"),
                         CostParams(eta_compute=0.6, eta_mem=0.8, t_step_s=2e-4))


class OldSjf(ChunkedScheduler):
    """The sort-per-step SJF of before (reference)."""

    name = "sjf"
    implicit_decoders = True
    decode_runs = False

    def __init__(self, aging_s: float = 10.0):
        self.aging_s = aging_s

    def waiting_key(self, now):
        cutoff = now - self.aging_s

        def key(req):
            if req.arrival_time_s < cutoff:
                return (0, req.arrival_time_s, req.index)
            return (1, req.num_uncomputed_tokens, req.arrival_time_s, req.index)

        return key


class OldEdf(ChunkedScheduler):
    """The sort-per-step EDF of before (reference)."""

    name = "edf"
    implicit_decoders = True

    def waiting_key(self, now):
        return lambda req: (next_token_deadline_s(req), req.arrival_time_s, req.index)


def trace(seed, n=400):
    rng = np.random.default_rng(seed)
    # bursts of simultaneous arrivals between quiet gaps, so queues build up and drain
    arrivals = np.sort(np.round(rng.exponential(0.02, n).cumsum() * (rng.random(n) < 0.7), 1))
    df = pd.DataFrame({"request_id": [str(i) for i in range(n)], "arrival_time_s": arrivals,
                       "num_prompt_tokens": rng.integers(1, 900, n), "num_output_tokens": rng.integers(1, 60, n)})
    slo = rng.choice([0.5, 2.0, 5.0, np.nan], n)
    df["slo_ttft_s"] = slo
    return df.sort_values("arrival_time_s", kind="stable").reset_index(drop=True)


CONFIGS = [dict(max_num_seqs=16, max_num_batched_tokens=512, num_gpu_blocks=400),
           dict(max_num_seqs=64, max_num_batched_tokens=2048, num_gpu_blocks=120, preemption_mode="swap"),
           dict(max_num_seqs=8, max_num_batched_tokens=256, num_gpu_blocks=10_000, exact_steps=True),
           dict(max_num_seqs=32, max_num_batched_tokens=1024, num_gpu_blocks=300, replicas=2)]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("cfg", range(len(CONFIGS)))
@pytest.mark.parametrize("new,old", [("sjf", "test_sched_heap:OldSjf"), ("edf", "test_sched_heap:OldEdf")])
def test_same_replay_as_the_sort_per_step_policy(seed, cfg, new, old):
    df = trace(seed)
    cost = COST
    kw = dict(CONFIGS[cfg], max_model_len=4096, block_size=16)
    got, e1 = replay_frame(df, cost, ReplayConfig.from_options(scheduler=new, **kw))
    ref, e2 = replay_frame(df, cost, ReplayConfig.from_options(scheduler=old, **kw))
    assert e1.num_steps == e2.num_steps
    pd.testing.assert_frame_equal(got, ref)


class R:
    def __init__(self, i, arrival, n):
        self.index, self.arrival_time_s, self.num_uncomputed_tokens = i, arrival, n


def test_keyed_waiting_is_a_priority_deque_with_aging():
    q = KeyedWaiting(lambda r: (r.num_uncomputed_tokens, r.arrival_time_s, r.index), aging_s=10.0)
    rs = [R(0, 0.0, 500), R(1, 5.0, 10), R(2, 6.0, 20), R(3, 6.0, 10)]
    q.extend(rs)
    q.now = 8.0
    assert len(q) == 4 and q[0] is rs[1]
    q.now = 10.5  # request 0 waited 10.5 s > 10: it goes first
    assert q.popleft() is rs[0] and q[0] is rs[1]
    q.remove(rs[1])
    assert [q.popleft().index for _ in range(2)] == [3, 2] and not q
    with pytest.raises(IndexError):
        q[0]
    q.appendleft(rs[2])
    assert list(q) == [rs[2]] and math.isclose(q.now, 10.5)
