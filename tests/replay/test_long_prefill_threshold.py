"""NC-05: vLLM's long_prefill_token_threshold, a per-request cap applied before the token budget,
to requests admitted from the waiting queue and to partially prefilled running requests alike."""
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from helpers import LinearStepCost, replay_both_paths, step_rows
from replay.core.engine import Engine
from replay.core.engine_config import EngineConfig
from replay.core.kv_cache import KVCache
from replay.core.request import Request
from replay.schedulers import BUILTIN, get_scheduler_factory
from replay.schedulers.base import ReplicaState, SchedulerConfig
from replay.schedulers.disagg import PrefillScheduler

# NC-05: budget 2,048; step time = 0.004 + 2e-5 x scheduled tokens; D decoding; A (1,500) then B (300) wait at t = 0
COST = LinearStepCost(0.004, 2e-5)
BUDGET = 2048


def _decoding(index, rid, prompt=100, output=50):
    """A request whose prompt is in the KV and whose first token is out (decoding since before t = 0)."""
    r = Request(index, rid, -1.0, prompt, output, record_token_times=True)
    r.num_computed_tokens, r.num_generated_tokens = prompt, 1
    r.first_token_time_s = r.last_token_time_s = -0.5
    return r


def nc05(threshold, scheduler="chunked"):
    """Run NC-05 on ``scheduler``; return the engine and the requests D, A, B."""
    eng = Engine(COST, get_scheduler_factory(scheduler),
                 SchedulerConfig(256, BUDGET, long_prefill_token_threshold=threshold),
                 EngineConfig(10**6, 16, None, True, True))
    d = _decoding(0, "D")
    state = eng.replicas[0]
    state.kv.allocate(d, 0)
    state.admit(d, -1.0)
    a, b = Request(1, "A", 0.0, 1500, 10), Request(2, "B", 0.0, 300, 10)
    eng.run([a, b])
    return eng, d, a, b


@pytest.mark.parametrize("scheduler", ["chunked", "sjf", "edf"])
def test_nc05_threshold_512_caps_new_and_running_prefills(scheduler):
    eng, d, a, b = nc05(512, scheduler)
    steps = step_rows(eng)[:3]
    # step 1: D 1, A 512, B 300 (813 tokens); step 2: D 1, A 512, B 1 (514); step 3: D 1, A 476, B 1 (478)
    assert [(s.num_prefill_tokens, s.num_decode_seqs) for s in steps] == [(812, 1), (512, 2), (476, 2)]
    assert [s.step_duration_s for s in steps] == pytest.approx([0.02026, 0.01428, 0.01356], abs=1e-12)
    assert b.first_token_time_s == pytest.approx(0.02026, abs=1e-12)
    assert a.first_token_time_s == pytest.approx(0.04810, abs=1e-12)
    assert a.first_token_time_s != pytest.approx(0.04406)  # the cap applied only at admission (wrong)
    assert b.first_token_time_s != pytest.approx(0.0521)  # the cap as a per-step total of all prefills (wrong)
    # D's gaps in steps 1-3 (from t = 0, when the steps start)
    assert np.diff([0.0, *d.token_times_s[:3]]) == pytest.approx([0.02026, 0.01428, 0.01356], abs=1e-12)


@pytest.mark.parametrize("threshold", [0, 2048, 16_384])
def test_nc05_threshold_zero_or_at_least_the_budget_changes_nothing(threshold):
    eng, d, a, b = nc05(threshold)
    first = step_rows(eng)[0]
    assert (first.num_prefill_tokens, first.num_decode_seqs) == (1800, 1)  # 1,801 tokens
    assert first.step_duration_s == pytest.approx(0.04002, abs=1e-12)
    assert a.first_token_time_s == b.first_token_time_s == pytest.approx(0.04002, abs=1e-12)
    assert d.token_times_s[0] == pytest.approx(0.04002, abs=1e-12)


def test_nc05_scheduler_batches():
    """The batches themselves, from the shared loops (schedule_running, then admit_waiting)."""
    state = ReplicaState(0, SchedulerConfig(256, BUDGET, long_prefill_token_threshold=512), KVCache(10**6))
    d = _decoding(0, "D")
    state.kv.allocate(d, 0)
    state.admit(d, -1.0)
    a, b = Request(1, "A", 0.0, 1500, 10), Request(2, "B", 0.0, 300, 10)
    state.waiting.extend([a, b])
    sched = BUILTIN["chunked"]()
    batch = sched.schedule(0.0, state)
    assert ([(r.request_id, n) for r, n in zip(batch.requests, batch.num_new_tokens)]
            == [("D", 1), ("A", 512), ("B", 300)])
    assert batch.num_tokens == 813
    # the step's end: D and B advance, A has 512 of 1,500 computed and stays running, capped again
    d.num_computed_tokens += 1
    d.num_generated_tokens += 1
    a.num_computed_tokens = 512
    b.num_computed_tokens, b.num_generated_tokens = 300, 1
    batch = sched.schedule(0.02026, state)
    assert [(r.request_id, n) for r, n in zip(batch.requests, batch.num_new_tokens)] == [("D", 1), ("A", 512), ("B", 1)]


def test_disagg_prefill_instances_honour_the_threshold():
    state = ReplicaState(0, SchedulerConfig(256, BUDGET, long_prefill_token_threshold=512), KVCache(10**6))
    state.waiting.extend([Request(0, "A", 0.0, 1500, 10), Request(1, "B", 0.0, 300, 10)])
    batch = PrefillScheduler().schedule(0.0, state)
    assert batch.num_new_tokens == [512, 300]


@pytest.mark.parametrize("scheduler", ["fcfs", "static"])
def test_whole_prompt_policies_ignore_the_threshold(scheduler):
    """fcfs and static admit whole prompts (vLLM v0 without chunked prefill: the threshold does not chunk)."""
    _, _, a0, b0 = nc05(0, scheduler)
    _, _, a1, b1 = nc05(512, scheduler)
    assert (a1.first_token_time_s, b1.first_token_time_s) == (a0.first_token_time_s, b0.first_token_time_s)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 25), seed=st.integers(0, 2**16), scheduler=st.sampled_from(sorted(BUILTIN)),
       threshold=st.sampled_from([0, 1, 64, 700]), budget=st.sampled_from([256, 2048]),
       blocks=st.sampled_from([300, 100000]))
def test_fast_path_equals_step_by_step_with_a_threshold(n, seed, scheduler, threshold, budget, blocks):
    from replay.cost.cost_model import RooflineCostModel
    from schemas.cost_params import CostParams
    from schemas.specs import get_gpu, get_model

    rng = np.random.default_rng(seed)
    trace = pd.DataFrame({"request_id": [f"r{i}" for i in range(n)],
                          "arrival_time_s": np.cumsum(rng.uniform(0, 0.2, n)),
                          "num_prompt_tokens": rng.integers(1, 3000, n), "num_output_tokens": rng.integers(1, 200, n)})
    cost = RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("a100-80gb"),
                             CostParams(eta_compute=0.6, eta_mem=0.8, t_step_s=2e-4))
    replay_both_paths(trace, cost, scheduler=scheduler, max_num_batched_tokens=budget, num_gpu_blocks=blocks,
                      long_prefill_token_threshold=threshold, record_token_times=True)
