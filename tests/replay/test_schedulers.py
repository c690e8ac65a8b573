"""Schedulers: hand-worked timelines (static, sjf, edf, swap preemption) and invariants of every policy.

Step time in the hand-worked cases = base + per_token * (tokens in the step) (LinearStepCost).
"""
import math

import numpy as np
import pandas as pd
import pytest

from helpers import LinearStepCost, step_rows
from replay.core.engine import Engine
from replay.core.engine_config import EngineConfig
from replay.errors import ConfigError
from replay.core.kv_cache import PrefixCachingKVCache
from replay.analysis.metrics import goodput_rps
from replay.core.request import Request
from replay.schedulers import BUILTIN, get_scheduler_factory
from replay.schedulers.base import SchedulerConfig
from replay.schedulers.edf import next_token_deadline_s
from replay.schedulers.sjf import SjfScheduler

COST = LinearStepCost(0.010, 1e-4)
POLICIES = ["fcfs", "chunked", "static", "sjf", "edf"]


def make(specs):
    """Requests from (id, arrival_s, prompt, output[, {Request kwargs}]) tuples."""
    out = []
    for i, (rid, a, p, o, *kw) in enumerate(specs):
        out.append(Request(i, rid, a, p, o, record_token_times=True, **(kw[0] if kw else {})))
    return out


def run(reqs, cost=COST, scheduler="chunked", budget=2048, max_num_seqs=256, num_gpu_blocks=10**6,
        block_size=16, **engine_kw):
    factory = scheduler if callable(scheduler) else get_scheduler_factory(scheduler)
    eng = Engine(cost, factory, SchedulerConfig(max_num_seqs, budget),
                 EngineConfig(num_gpu_blocks, block_size, None, True, True, **engine_kw))
    eng.run(reqs)
    return {r.request_id: r for r in reqs}, eng


def times(r):
    return list(r.token_times_s)


def test_builtin_registry_has_every_policy_and_zero_arg_factories():
    for name in POLICIES:
        sched = get_scheduler_factory(name)()
        assert callable(sched.schedule) and sched.name == name
        assert name in BUILTIN


# -- static ---------------------------------------------------------------------------------------

def test_static_batch_runs_to_its_end_and_nothing_joins():
    # A alone at t=0: prefill 100 -> 0.020; decodes 0.0101 each -> 0.0301, 0.0402.
    # C and B arrive during A's batch and wait for it: batch [C, B] at 0.0402, prefill 250 tokens
    # (0.035) -> 0.0752; C+B decode (0.0102) -> 0.0854 (B done); C alone 0.0101 -> 0.0955, 0.1056.
    out, eng = run(make([("A", 0.0, 100, 3), ("C", 0.001, 50, 4), ("B", 0.002, 200, 2)]), scheduler="static")
    assert times(out["A"]) == pytest.approx([0.020, 0.0301, 0.0402])
    assert times(out["C"]) == pytest.approx([0.0752, 0.0854, 0.0955, 0.1056])
    assert times(out["B"]) == pytest.approx([0.0752, 0.0854])
    assert out["C"].first_scheduled_time_s == out["B"].first_scheduled_time_s == pytest.approx(0.0402)
    assert [s.num_prefill_tokens for s in step_rows(eng)] == [100, 0, 0, 250, 0, 0, 0]
    assert [s.num_decode_seqs for s in step_rows(eng)] == [0, 1, 1, 0, 2, 1, 1]
    # the same arrivals under continuous batching: C joins at A's first step end
    out_c, _ = run(make([("A", 0.0, 100, 3), ("C", 0.001, 50, 4), ("B", 0.002, 200, 2)]), scheduler="chunked")
    assert out_c["C"].first_scheduled_time_s == pytest.approx(0.020)


def test_static_reserves_peak_kv_so_it_never_preempts():
    # 10 blocks of 16 tokens. X peaks at 100 + 20 - 1 = 119 tokens (8 blocks), Y at 24 (2 blocks):
    # both fit; Z (2 more blocks) waits for the next batch although its prompt would fit now.
    out, eng = run(make([("X", 0.0, 100, 20), ("Y", 0.0, 20, 5), ("Z", 0.0, 20, 5)]), scheduler="static",
                   num_gpu_blocks=10)
    assert sum(r.num_preemptions for r in out.values()) == 0
    assert out["Z"].first_scheduled_time_s == pytest.approx(out["X"].last_token_time_s)
    assert step_rows(eng)[0].num_prefill_tokens == 120 and step_rows(eng)[0].num_prefill_seqs == 2


def test_static_batch_size_is_max_num_seqs():
    out, _ = run(make([("a", 0.0, 10, 2), ("b", 0.0, 10, 2), ("c", 0.0, 10, 2)]), scheduler="static", max_num_seqs=2)
    assert out["a"].first_scheduled_time_s == out["b"].first_scheduled_time_s == 0.0
    assert out["c"].first_scheduled_time_s == pytest.approx(out["b"].last_token_time_s)


# -- sjf ------------------------------------------------------------------------------------------

SJF_CASE = [("A", 0.0, 100, 2), ("B", 0.001, 500, 1), ("C", 0.015, 50, 1)]


def test_sjf_shortest_prompt_first():
    # one slot: A runs 0 -> 0.020 (prefill) -> 0.0301 (decode). At 0.0301 C (50) goes before B (500):
    # C 0.010 + 0.005 -> 0.0451; B 0.010 + 0.050 -> 0.1051.
    out, _ = run(make(SJF_CASE), scheduler="sjf", max_num_seqs=1)
    assert times(out["A"]) == pytest.approx([0.020, 0.0301])
    assert times(out["C"]) == pytest.approx([0.0451])
    assert times(out["B"]) == pytest.approx([0.1051])
    fifo, _ = run(make(SJF_CASE), scheduler="chunked", max_num_seqs=1)
    assert times(fifo["B"]) == pytest.approx([0.0901]) and times(fifo["C"]) == pytest.approx([0.1051])


def test_sjf_aging_serves_old_requests_in_arrival_order_first():
    # aging 0.02 s: at 0.0301 B has waited 0.0291 s (> 0.02, aged), C only 0.0151 s -> B first:
    # B 0.0301 -> 0.0901, C 0.0901 -> 0.1051.
    out, _ = run(make(SJF_CASE), scheduler=lambda: SjfScheduler(aging_s=0.02), max_num_seqs=1)
    assert times(out["B"]) == pytest.approx([0.0901])
    assert times(out["C"]) == pytest.approx([0.1051])


def test_sjf_aging_bounds_the_wait_of_a_long_prompt_in_a_stream_of_short_ones():
    # a short request (10 tokens, 0.011 s) every 0.01 s keeps one slot busy; the long prompt
    # arriving at 0.005 starves without aging and is served soon after aging_s with it.
    specs = [("long", 0.005, 1000, 1)] + [(f"s{i}", 0.01 * i, 10, 1) for i in range(100)]
    specs.sort(key=lambda s: s[1])

    def wait(aging_s):
        out, _ = run(make(specs), scheduler=lambda: SjfScheduler(aging_s=aging_s), max_num_seqs=1)
        return out["long"].first_scheduled_time_s - 0.005

    assert wait(10.0) > 1.0  # after the whole stream (~100 x 0.011 s)
    assert 0.1 <= wait(0.1) <= 0.1 + 0.011 + 1e-9  # aged at 0.105; the running short one finishes first


def test_sjf_rejects_negative_aging():
    with pytest.raises(ValueError):
        SjfScheduler(aging_s=-1)


# -- edf ------------------------------------------------------------------------------------------

def test_edf_earliest_ttft_deadline_first_then_no_slo():
    # one slot; A runs until 0.0301. Deadlines: B 0.001 + 1.0, C 0.002 + 0.2, D none (inf).
    # EDF: C (500 tokens, 0.060) -> 0.0901; B (50, 0.015) -> 0.1051; D (10, 0.011) -> 0.1161.
    specs = [("A", 0.0, 100, 2), ("B", 0.001, 50, 1, {"slo_ttft_s": 1.0}),
             ("C", 0.002, 500, 1, {"slo_ttft_s": 0.2}), ("D", 0.003, 10, 1)]
    out, _ = run(make(specs), scheduler="edf", max_num_seqs=1)
    assert times(out["C"]) == pytest.approx([0.0901])
    assert times(out["B"]) == pytest.approx([0.1051])
    assert times(out["D"]) == pytest.approx([0.1161])
    sjf, _ = run(make(specs), scheduler="sjf", max_num_seqs=1)  # the opposite order
    assert times(sjf["D"]) == pytest.approx([0.0411]) and times(sjf["C"]) == pytest.approx([0.1161])


def test_edf_deadlines():
    r = Request(0, "r", 1.0, 10, 5, slo_ttft_s=0.5, slo_tpot_s=0.1)
    assert next_token_deadline_s(r) == pytest.approx(1.5)
    r.deadline_s = 1.2  # an explicit first-token deadline caps the SLO one
    assert next_token_deadline_s(r) == pytest.approx(1.2)
    r.num_generated_tokens, r.first_token_time_s = 3, 1.4  # token 4 due at 1.4 + 3 x 0.1
    assert next_token_deadline_s(r) == pytest.approx(1.7)
    assert next_token_deadline_s(Request(1, "n", 0.0, 10, 5)) == math.inf


@pytest.mark.parametrize("policy", ["sjf", "edf"])
def test_sjf_and_edf_match_chunked_when_the_queue_order_does_not_matter(policy):
    # BR-05 "mixed": one waiting request at a time, so the timelines equal chunked's.
    reqs = [("A", 0.0, 100, 4), ("B", 0.015, 1000, 2)]
    ref, _ = run(make(reqs), scheduler="chunked")
    out, _ = run(make(reqs), scheduler=policy)
    for k in ("A", "B"):
        assert times(out[k]) == pytest.approx(times(ref[k]))
    assert times(out["A"]) == pytest.approx([0.020, 0.1301, 0.1403, 0.1504])


# -- swap preemption ------------------------------------------------------------------------------

@pytest.mark.parametrize("scheduler", ["chunked", "fcfs"])
def test_swap_preemption_moves_kv_instead_of_recomputing(scheduler):
    # BR-08's setting (4 blocks of 16, constant 0.010 s steps) with swap at 0.001 s per block.
    # Step 4 (0.03): A needs a 3rd block, B (2 blocks, 32 tokens of KV) is swapped out: 0.010 + 2 x 0.001.
    # A then runs to tok20 at 0.042 + 16 x 0.010 = 0.202. B comes back with its 2 blocks swapped in
    # (0.012 s step, no recompute): tok4 at 0.214, tok5 at 0.224.
    out, eng = run(make([("A", 0.0, 30, 20), ("B", 0.0, 30, 5)]), cost=LinearStepCost(0.010, 0.0),
                   scheduler=scheduler, num_gpu_blocks=4, preemption_mode="swap", swap_time_per_block_s=0.001)
    a, b = out["A"], out["B"]
    assert times(b) == pytest.approx([0.01, 0.02, 0.03, 0.214, 0.224])
    assert a.last_token_time_s == pytest.approx(0.202)
    assert (b.num_preemptions, b.num_recomputed_tokens, b.num_cached_tokens) == (1, 0, 0)
    durations = [s.step_duration_s for s in step_rows(eng)]
    assert durations[3] == pytest.approx(0.012) and durations[-2] == pytest.approx(0.012)
    assert sum(d > 0.0105 for d in durations) == 2
    assert step_rows(eng)[-2].num_prefill_seqs == 0  # the swapped-in request decodes; nothing is prefilled again


def test_unknown_preemption_mode_is_a_config_error():
    with pytest.raises(ConfigError):
        run(make([("a", 0.0, 1, 1)]), preemption_mode="drop")


# -- invariants of every policy -------------------------------------------------------------------

def random_requests(seed=3, n=80):
    rng = np.random.default_rng(seed)
    arrivals = np.sort(rng.uniform(0, 1.5, n))
    prefixes = [list(rng.integers(0, 2**40, 40)) for _ in range(3)]  # shared "system prompts"
    specs = []
    for i in range(n):
        prompt, output = int(rng.integers(1, 600)), int(rng.integers(1, 60))
        nb = -(-prompt // 16)
        k = int(rng.integers(0, 3))
        hashes = (prefixes[k][:nb // 2] + list(rng.integers(0, 2**40, nb)))[:nb]
        specs.append((f"q{i}", float(arrivals[i]), prompt, output,
                      {"block_hashes": hashes, "slo_ttft_s": float(rng.choice([0.1, 0.5, math.inf]))}))
    specs.append(("too-big", 1.6, 900, 200, {}))  # peak 1099 tokens > 64 blocks x 16: rejected
    return specs


class Checked:
    """Wraps a scheduler: after every schedule() the KV bookkeeping must add up."""

    def __init__(self, inner):
        self.inner = inner
        self.decode_runs = getattr(inner, "decode_runs", False)  # keep the engine's fast path on

    def schedule(self, now, state):
        batch = self.inner.schedule(now, state)
        kv = state.kv
        assert 0 <= kv.num_free_blocks <= kv.num_gpu_blocks
        assert all(r.num_blocks == 0 for r in state.waiting)
        assert len(state.running) <= state.config.max_num_seqs
        if isinstance(kv, PrefixCachingKVCache):
            kv.check_invariants()
        else:
            assert kv.num_free_blocks + sum(r.num_blocks for r in state.running) == kv.num_gpu_blocks
        for r, n in zip(batch.requests, batch.num_new_tokens):
            assert r.status == "running" and n >= 1 and r.arrival_time_s <= now
            assert r.num_blocks >= kv.blocks_for(r.num_computed_tokens + n)
        return batch


@pytest.mark.parametrize("prefix_caching", [False, True])
@pytest.mark.parametrize("preemption_mode", ["recompute", "swap"])
@pytest.mark.parametrize("policy", POLICIES)
def test_invariants_on_a_random_trace_with_a_small_kv_cache(policy, preemption_mode, prefix_caching):
    inner = get_scheduler_factory(policy)
    out, eng = run(make(random_requests()), cost=LinearStepCost(0.005, 1e-4), scheduler=lambda: Checked(inner()),
                   budget=512, max_num_seqs=8, num_gpu_blocks=64, preemption_mode=preemption_mode,
                   swap_time_per_block_s=1e-4, enable_prefix_caching=prefix_caching)
    assert out["too-big"].status == "rejected: exceeds KV cache capacity"
    assert out["too-big"].token_times_s == []
    for r in out.values():
        if r.request_id == "too-big":
            continue
        assert r.status == "ok", r
        t = np.array(r.token_times_s)
        assert len(t) == r.num_output_tokens  # every token emitted exactly once
        assert r.arrival_time_s <= r.first_scheduled_time_s < t[0]  # no work or token before arrival
        assert np.all(np.diff(t) > 0)
        assert (r.first_token_time_s, r.last_token_time_s) == (t[0], t[-1])
        assert r.num_blocks == 0
        if preemption_mode == "swap":
            assert r.num_recomputed_tokens == 0
        assert r.num_cached_tokens <= (r.num_prompt_tokens - 1) // 16 * 16
        if not prefix_caching:
            assert r.num_cached_tokens == 0
    for state in eng.replicas:
        assert state.kv.num_free_blocks == state.kv.num_gpu_blocks and not state.running and not state.waiting
    starts = [s.step_start_time_s for s in step_rows(eng)]
    ends = [s.step_start_time_s + s.step_duration_s for s in step_rows(eng)]
    assert all(e <= s2 + 1e-12 for e, s2 in zip(ends, starts[1:]))  # one step at a time per replica
    # tokens fed = prompts - hits + decodes + recomputation; a recompute-preempted request that had
    # generated g tokens re-feeds prompt + g (its num_recomputed_tokens, BR-08), of which the last was
    # never fed before, hence the range
    total = sum(s.num_prefill_tokens + s.num_decode_seqs for s in step_rows(eng))
    ok = [r for r in out.values() if r.status == "ok"]
    base = sum(r.num_prompt_tokens - r.num_cached_tokens + r.num_output_tokens - 1 for r in ok)
    recomputed, preemptions = (sum(r.num_recomputed_tokens for r in ok), sum(r.num_preemptions for r in ok))
    assert base + recomputed - preemptions <= total <= base + recomputed
    if preemption_mode == "swap":
        assert total == base
    if policy == "static":
        assert sum(r.num_preemptions for r in out.values()) == 0
    if prefix_caching:
        assert sum(r.num_cached_tokens for r in out.values()) > 0


@pytest.mark.parametrize("preemption_mode", ["recompute", "swap"])
@pytest.mark.parametrize("policy", POLICIES)
def test_closed_form_decode_runs_give_the_step_by_step_timeline(policy, preemption_mode):
    kw = dict(cost=LinearStepCost(0.005, 1e-4), scheduler=policy, budget=512, max_num_seqs=8, num_gpu_blocks=64,
              preemption_mode=preemption_mode, swap_time_per_block_s=1e-4, enable_prefix_caching=True)
    fast, eng_fast = run(make(random_requests()), **kw)
    exact, eng_exact = run(make(random_requests()), exact_steps=True, **kw)
    for k, r in exact.items():
        assert fast[k].token_times_s == pytest.approx(r.token_times_s, abs=1e-12, rel=0)
        assert (fast[k].num_cached_tokens, fast[k].num_preemptions) == (r.num_cached_tokens, r.num_preemptions)
    assert eng_fast.num_steps == eng_exact.num_steps


# -- goodput --------------------------------------------------------------------------------------

def test_goodput_counts_completed_requests_meeting_every_slo():
    df = pd.DataFrame({
        "arrival_time_s": [0.0, 1.0, 2.0, 3.0, 4.0],
        "pred_ttft_s": [0.1, 0.3, 0.1, 0.1, np.nan],
        "pred_tpot_s": [0.01, 0.01, 0.05, np.nan, np.nan],
        "pred_e2e_s": [1.0, 1.0, 1.0, 0.1, np.nan],
        "pred_status": ["ok", "ok", "ok", "ok", "rejected: exceeds max_model_len"],
    })
    # good: row 0 (meets both), row 3 (1 token: no TPOT to break); row 1 breaks TTFT, row 2 TPOT.
    # span = last completion (row 3: 3.0 + 0.1) - first arrival 0.0 = 3.1 s.
    assert goodput_rps(df, 0.2, 0.02) == pytest.approx(2 / 3.1)
    assert goodput_rps(df, None, None) == pytest.approx(4 / 3.1)
    assert goodput_rps(df, 0.2, None) == pytest.approx(3 / 3.1)
    assert goodput_rps(df.assign(pred_status="rejected"), 1, 1) == 0.0
    measured = df.rename(columns=lambda c: c.replace("pred_", "")).drop(columns="status")
    assert goodput_rps(measured, 0.2, 0.02, prefix="") == pytest.approx(2 / 3.1)
