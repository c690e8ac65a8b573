"""Prefill/decode disaggregation (replay.core.disagg): hand-worked timelines, backpressure, invariants.

Hand-worked costs (LinearStepCost, step time = base + per_token * tokens in the step):
prefill pool 10 ms + 0.1 ms/token, decode pool 5 ms + 0.1 ms/token. The KV link moves
Llama-3.1-8B's D_kv = 131072 B/token at 1.31072e9 B/s (0.1 ms/token) plus 1 ms latency, so
T_transfer(L) = L * 0.1 ms + 1 ms (seed theory.md section 2).
"""

import numpy as np
import pandas as pd
import pytest

from helpers import LinearStepCost, replay_both_paths, step_rows
from replay.cost.cost_model import Link, RooflineCostModel, kv_transfer_time_s
from schemas.cost_params import CostParams
from replay.core.disagg import DisaggEngine
from replay.core.disagg_pools import resolve_link
from replay.core.engine_config import EngineConfig
from replay.core.kv_cache import KVCache
from replay.analysis.metrics import from_token_times
from replay.core.request import Request
from replay.schedulers.base import SchedulerConfig
from replay.config import DisaggOptions, EngineOptions, RecordOptions, ReplayConfig, SchedulingOptions
from replay.simulate import replay_frame
from schemas.specs import get_gpu, get_model

LLAMA = get_model("llama-3.1-8b")
PREFILL_COST = LinearStepCost(0.010, 1e-4)
DECODE_COST = LinearStepCost(0.005, 1e-4)
LINK = Link("test", LLAMA.kv_bytes_per_token * 1e4, 1e-3)  # 0.1 ms per prompt token + 1 ms

#: A (t=0, prompt 100, 3 tokens), B (t=5 ms, prompt 200, 2 tokens), C (t=10 ms, prompt 40, 6 tokens).
CASE = [("A", 0.0, 100, 3), ("B", 0.005, 200, 2), ("C", 0.010, 40, 6)]


def run_disagg(specs, first_token_from="prefill", max_num_seqs=2, prefill=1, decode=1, blocks=10**6,
               decode_blocks=10**6, budget=2048, link=LINK, kv_handoff="pull"):
    reqs = [Request(i, rid, a, p, o, record_token_times=True) for i, (rid, a, p, o) in enumerate(specs)]
    eng = DisaggEngine(PREFILL_COST, DECODE_COST, SchedulerConfig(max_num_seqs, budget),
                       EngineConfig(blocks, 16, None, True, True), decode_num_gpu_blocks=decode_blocks,
                       model=LLAMA, link=link, prefill_replicas=prefill, decode_replicas=decode,
                       first_token_from=first_token_from, kv_handoff=kv_handoff)
    eng.run(reqs)
    return {r.request_id: r for r in reqs}, eng


def metrics(r):
    return from_token_times(r.arrival_time_s, r.token_times_s)


def test_transfer_time_is_the_seeds_formula():
    assert kv_transfer_time_s(100, LLAMA, LINK) == pytest.approx(0.011)
    assert kv_transfer_time_s(200, LLAMA, LINK) == pytest.approx(0.021)
    assert kv_transfer_time_s(40, LLAMA, LINK) == pytest.approx(0.005)


def test_hand_worked_timeline_first_token_from_prefill():
    # Prefill instance (id 0), max_num_seqs 2:
    #   0      A prefill 100 tok: 10 + 10 ms            -> 0.020  A token 1 (TTFT 20 ms); A's KV leaves
    #   0.020  B and C (queued since 5 and 10 ms) prefill 240 tok: 10 + 24 ms -> 0.054: tokens 1 of B, C
    # Migrations (pull, DistServe: the idle decode loop accepts at once and awaits each in turn;
    # 0.1 ms/token + 1 ms): A 0.020 -> 0.031; B 0.054 -> 0.075, then C 0.075 -> 0.080 (C waits 21 ms for B's).
    # Decode instance (id 1), step = 5 ms + 0.1 ms per sequence:
    #   0.031  A admitted at once: [A] -> 0.0361 (A t2), [A] -> 0.0412 (A t3, done)
    #   0.075  B's migration ends, but the loop migrates C until 0.080: no step before
    #   0.080  [B, C] 5.2 ms -> 0.0852: B t2 (done), C t2; [C] -> 0.0903, 0.0954, 0.1005, 0.1056 (C t3..t6)
    # A: TTFT 20 ms (queue 0 + prefill 20); ITL [16.1 = migration 11 + decode queue 0 + step 5.1, 5.1]; E2E 41.2
    # B: TTFT 49 ms (queue 15 + prefill 34); ITL [31.2 = migration 21 + decode queue 5 + step 5.2]; E2E 80.2
    # C: TTFT 44 ms (queue 10 + prefill 34); ITL [31.2 = handoff 21 + migration 5 + 0 + 5.2, 5.1 x 4]; E2E 95.6
    out, eng = run_disagg(CASE)
    a, b, c = (metrics(out[k]) for k in "ABC")
    assert a["ttft_s"] == pytest.approx(0.020)
    assert a["itl_s"] == pytest.approx([0.0161, 0.0051])
    assert a["e2e_s"] == pytest.approx(0.0412)
    assert b["ttft_s"] == pytest.approx(0.049)
    assert b["itl_s"] == pytest.approx([0.0312])
    assert b["e2e_s"] == pytest.approx(0.0802)
    assert c["ttft_s"] == pytest.approx(0.044)
    assert c["itl_s"] == pytest.approx([0.0312, 0.0051, 0.0051, 0.0051, 0.0051])
    assert c["e2e_s"] == pytest.approx(0.0956)
    # queue waits: prefill (pred_queue_wait_s), handoff (the loop's earlier migrations) and decode, each once
    assert [out[k].first_scheduled_time_s - out[k].arrival_time_s for k in "ABC"] == pytest.approx([0, 0.015, 0.010])
    t = {k: eng.transfers[out[k].index] for k in "ABC"}
    assert [t[k].start_time_s for k in "ABC"] == pytest.approx([0.020, 0.054, 0.075])
    assert [t[k].end_time_s - t[k].start_time_s for k in "ABC"] == pytest.approx([0.011, 0.021, 0.005])
    assert [t[k].decode_admitted_time_s - t[k].end_time_s for k in "ABC"] == pytest.approx([0.0, 0.005, 0.0])
    assert [eng.result_columns(3)["pred_handoff_wait_s"][out[k].index] for k in "ABC"] == pytest.approx([0, 0, 0.021])
    assert c["itl_s"][0] == pytest.approx(0.021 + 0.005 + 0.0 + 0.0052)  # handoff + migration + decode queue + step
    # step trace: the prefill instance is replica 0, the decode instance replica 1, each with its own cost
    steps = [(s.replica_id, round(s.step_start_time_s, 6), round(s.step_duration_s, 6), s.num_prefill_tokens,
              s.num_decode_seqs) for s in step_rows(eng)]
    assert steps == [(0, 0.0, 0.020, 100, 0), (0, 0.020, 0.034, 240, 0),
                     (1, 0.031, 0.0051, 0, 1), (1, 0.0361, 0.0051, 0, 1),
                     (1, 0.080, 0.0052, 0, 2), (1, 0.0852, 0.0051, 0, 1), (1, 0.0903, 0.0051, 0, 1),
                     (1, 0.0954, 0.0051, 0, 1), (1, 0.1005, 0.0051, 0, 1)]
    # every KV block is back: the prefill instance freed each prompt's KV when its migration ended
    assert all(s.kv.num_free_blocks == s.kv.num_gpu_blocks for s in eng.replicas)


def test_hand_worked_timeline_first_token_from_decode():
    # Same prefill steps and migrations; the decode instance's first step of a request feeds the
    # last prompt token (1 token, same cost as a decode) and emits token 1:
    #   0.031  [A] -> 0.0361 A t1, -> 0.0412 A t2, -> 0.0463 A t3
    #   0.080  (after migrating B, then C) [B, C] -> 0.0852: B t1, C t1; [B, C] -> 0.0904: B t2, C t2;
    #          [C] -> 0.0955, 0.1006, 0.1057, 0.1108 (C t3..t6)
    # TTFT = prefill queue + prefill + handoff + migration + decode queue + first decode-instance step:
    #   A 0 + 20 + 0 + 11 + 0 + 5.1 = 36.1 ms; B 15 + 34 + 0 + 21 + 5 + 5.2 = 80.2 ms;
    #   C 10 + 34 + 21 + 5 + 0 + 5.2 = 75.2 ms
    out, eng = run_disagg(CASE, first_token_from="decode")
    a, b, c = (metrics(out[k]) for k in "ABC")
    assert a["ttft_s"] == pytest.approx(0 + 0.020 + 0.011 + 0 + 0.0051)
    assert a["itl_s"] == pytest.approx([0.0051, 0.0051])
    assert a["e2e_s"] == pytest.approx(0.0463)
    assert b["ttft_s"] == pytest.approx(0.015 + 0.034 + 0.021 + 0.005 + 0.0052)
    assert b["itl_s"] == pytest.approx([0.0052])
    assert b["e2e_s"] == pytest.approx(0.0854)
    assert c["ttft_s"] == pytest.approx(0.010 + 0.034 + 0.021 + 0.005 + 0 + 0.0052)
    assert c["itl_s"] == pytest.approx([0.0052, 0.0051, 0.0051, 0.0051, 0.0051])
    assert c["e2e_s"] == pytest.approx(0.1008)
    # the prefill steps are charged for whole prompts; the decode instance feeds 1 token per request first
    assert [s.num_prefill_tokens for s in step_rows(eng) if s.replica_id == 0] == [100, 240]
    assert [(s.num_prefill_tokens, s.num_decode_seqs) for s in step_rows(eng) if s.replica_id == 1][:2] == [(1, 0),
                                                                                                              (0, 1)]
    assert all(s.kv.num_free_blocks == s.kv.num_gpu_blocks for s in eng.replicas)


def test_a_prompt_ending_during_a_decode_step_migrates_after_it():
    # DistServe's decode loop accepts only between steps (post_process): A decodes on the decode
    # instance from 0.031 (steps of 5.1 ms: 0.031 -> 0.0361 -> 0.0412 -> ...); D (prompt 20, arrives at
    # 0.0201, after A's prefill) ends its prefill at 0.0201 + 10 + 2 = 0.0321, during A's step 0.031 -> 0.0361:
    # accepted at 0.0361, migrated 0.0361 -> 0.0361 + 0.003 = 0.0391 while A waits, then [A, D] from 0.0391.
    out, eng = run_disagg([("A", 0.0, 100, 6), ("D", 0.0201, 20, 3)])
    t = eng.transfers[out["D"].index]
    assert (t.start_time_s, t.end_time_s) == pytest.approx((0.0361, 0.0391))
    assert eng.result_columns(2)["pred_handoff_wait_s"][out["D"].index] == pytest.approx(0.0361 - 0.0321)
    steps = [(round(s.step_start_time_s, 6), s.num_decode_seqs) for s in step_rows(eng) if s.replica_id == 1]
    assert steps[:3] == [(0.031, 1), (0.0391, 2), (0.0443, 2)]


def test_one_token_request_ends_on_the_prefill_instance_unless_decode_emits_it():
    out, eng = run_disagg([("x", 0.0, 100, 1)])
    assert out["x"].token_times_s == pytest.approx([0.020]) and not eng.transfers
    out, eng = run_disagg([("x", 0.0, 100, 1)], first_token_from="decode")
    assert out["x"].token_times_s == pytest.approx([0.020 + 0.011 + 0.0051]) and len(eng.transfers) == 1


def test_decode_instances_are_chosen_least_loaded():
    # x and y prefill together and transfer at the same instant: x -> instance 1, y -> instance 2
    out, eng = run_disagg([("x", 0.0, 100, 5), ("y", 0.0, 100, 5), ("z", 0.5, 100, 5)], decode=2)
    assert [eng.transfers[out[k].index].decode_replica_id for k in "xyz"] == [1, 2, 1]
    assert {s.replica_id for s in step_rows(eng)} == {0, 1, 2}
    assert out["x"].token_times_s == pytest.approx(out["y"].token_times_s)


def test_kv_blocks_bound_the_prefill_pool_until_transfers_end():
    # prefill cache of 10 blocks (160 tokens): B (100 tokens, 7 blocks) cannot start while A's
    # 7 blocks are on the link; it starts when A's transfer ends (0.020 + 0.011).
    out, _ = run_disagg([("A", 0.0, 100, 2), ("B", 0.001, 100, 2)], blocks=10)
    assert out["B"].first_scheduled_time_s == pytest.approx(0.031)
    assert out["B"].first_token_time_s == pytest.approx(0.031 + 0.020)


def test_a_full_decode_pool_holds_finished_prompts_on_the_prefill_instance_and_preempts_nothing():
    """Issue #34, pull (DistServe): decode cache 13 blocks, so the 5 % gate (0.65 block) lets a decode
    instance accept a prompt only when it holds no accepted, unbatched one; prefill cache 14 blocks.
    Prompts of 100 tokens (7 blocks), 3 output tokens; transfers 11 ms; decode steps 5.1 ms.

      0      A and B prefill together, 10 + 20 ms     -> 0.030: tokens 1; both prompts finished
      0.030  decode accepts A (held 0, 13 free); B waits: A's 7 blocks are accepted, unbatched
      0.031  C arrives: the prefill cache is full (A's and B's KV stay there): C waits
      0.041  A's transfer ends: the prefill frees A's 7 blocks and admits C (queue wait 10 ms);
             decode [A] -> 0.0461 (A t2): A batched; B needs 7 blocks, 13 - 7 = 6 free: still waits
      0.0461 [A] -> 0.0512 (A t3, done, 7 blocks freed): decode accepts B (handoff wait 21.2 ms)
      0.061  C's prompt ends (10 + 10 ms): B is accepted, unbatched: C waits
      0.0622 B's transfer ends: [B] -> 0.0673 (B t2), then 6 blocks free < 7: C waits; -> 0.0724 (B t3)
      0.0724 decode accepts C (handoff wait 11.4 ms); transfer -> 0.0834; [C] -> 0.0885, 0.0936
    """
    out, eng = run_disagg([("A", 0.0, 100, 3), ("B", 0.0, 100, 3), ("C", 0.031, 100, 3)],
                          blocks=14, decode_blocks=13)
    a, b, c = out["A"], out["B"], out["C"]
    assert [t for t in a.token_times_s] == pytest.approx([0.030, 0.0461, 0.0512])
    assert [t for t in b.token_times_s] == pytest.approx([0.030, 0.0673, 0.0724])
    assert [t for t in c.token_times_s] == pytest.approx([0.061, 0.0885, 0.0936])
    assert c.first_scheduled_time_s == pytest.approx(0.041)  # the queue formed in front of prefill
    assert [eng.transfers[i].start_time_s for i in range(3)] == pytest.approx([0.030, 0.0512, 0.0724])
    cols = eng.result_columns(3)
    assert cols["pred_handoff_wait_s"] == pytest.approx([0.0, 0.0212, 0.0114])
    assert all(r.num_preemptions == 0 for r in out.values())


def test_prealloc_reserves_decode_room_before_the_prefill_starts():
    """Issue #34, prealloc (SGLang): the same requests; a request is queued for prefill only once the decode
    instance's free blocks, less those reserved for requests it has not batched, hold its prompt (7 blocks).

      0      A reserved (13 free) and prefilled alone: 10 + 10 ms -> 0.020 (A t1); transfer -> 0.031
             B: 13 - 7 reserved = 6 < 7: waits for a reservation
      0.031  C arrives behind B; decode [A] -> 0.0361 (A t2): A batched, but it holds 7 blocks: 6 free
      0.0412 [A] -> 0.0412 (A t3, done, 13 free): B reserved (waited 41.2 ms), prefill -> 0.0612 (B t1),
             transfer -> 0.0722, [B] -> 0.0773 (B t2), 0.0824 (B t3, done)
      0.0824 C reserved (waited 51.4 ms), prefill -> 0.1024 (C t1), transfer -> 0.1134, [C] -> 0.1185, 0.1236
    """
    out, eng = run_disagg([("A", 0.0, 100, 3), ("B", 0.0, 100, 3), ("C", 0.031, 100, 3)],
                          blocks=14, decode_blocks=13, kv_handoff="prealloc")
    a, b, c = out["A"], out["B"], out["C"]
    assert list(a.token_times_s) == pytest.approx([0.020, 0.0361, 0.0412])
    assert list(b.token_times_s) == pytest.approx([0.0612, 0.0773, 0.0824])
    assert list(c.token_times_s) == pytest.approx([0.1024, 0.1185, 0.1236])
    assert b.first_scheduled_time_s == pytest.approx(0.0412) and c.first_scheduled_time_s == pytest.approx(0.0824)
    assert [eng.transfers[i].start_time_s for i in range(3)] == pytest.approx([0.020, 0.0612, 0.1024])
    assert eng.result_columns(3)["pred_handoff_wait_s"] == pytest.approx([0.0, 0.0412, 0.0514])
    assert all(r.num_preemptions == 0 for r in out.values())


def test_prealloc_releases_the_reservation_of_a_request_that_ends_on_prefill():
    """A one-token request ends on its prefill instance (first token from prefill): its reservation is
    released, so the next request is reserved at once."""
    out, eng = run_disagg([("A", 0.0, 100, 1), ("B", 0.001, 100, 3)], decode_blocks=13, kv_handoff="prealloc")
    assert out["B"].first_scheduled_time_s == pytest.approx(0.020)  # after A's prefill, not after any decode
    assert eng._accepted_blocks == [0] and not eng._reserved_at


def test_push_hands_every_prompt_over_at_once_into_an_unbounded_buffer():
    """The same requests with push (the replay before issue #34): both transfers start at 0.030, the
    prefill cache frees at 0.041, and B waits in the decode queue with its KV outside the cache."""
    out, eng = run_disagg([("A", 0.0, 100, 3), ("B", 0.0, 100, 3), ("C", 0.031, 100, 3)],
                          blocks=14, decode_blocks=13, kv_handoff="push")
    assert [eng.transfers[i].start_time_s for i in range(2)] == pytest.approx([0.030, 0.030])
    assert eng.result_columns(3)["pred_handoff_wait_s"][:2] == pytest.approx([0.0, 0.0])
    assert out["C"].first_scheduled_time_s == pytest.approx(0.041)


def test_requests_that_fit_no_pool_are_rejected():
    out, _ = run_disagg([("big_prompt", 0.0, 200, 2), ("long_output", 0.0, 50, 200), ("ok", 0.0, 50, 2)],
                        blocks=10, decode_blocks=8)
    assert out["big_prompt"].status == "rejected: exceeds KV cache capacity (prefill instance)"
    assert out["long_output"].status == "rejected: exceeds KV cache capacity (decode instance)"
    assert out["ok"].status == "ok"


# -- invariants on random traces ------------------------------------------------------------------------

COST = RooflineCostModel(LLAMA, get_gpu("h100-80gb"), CostParams(eta_compute=0.5, eta_mem=0.8, t_step_s=1e-4))


def random_trace(seed, n=80):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"request_id": [f"r{i}" for i in range(n)],
                         "arrival_time_s": np.cumsum(rng.exponential(rng.choice([0.005, 0.1]), n)),
                         "num_prompt_tokens": rng.integers(1, 2500, n), "num_output_tokens": rng.integers(1, 200, n)})


@pytest.fixture
def kv_watch(monkeypatch):
    """Check after every allocate/free that no KV cache has negative (or too many) free blocks."""
    seen = []

    def wrap(name):
        orig = getattr(KVCache, name)

        def checked(self, *a, **kw):
            out = orig(self, *a, **kw)
            assert 0 <= self.num_free_blocks <= self.num_gpu_blocks
            seen.append(self.num_free_blocks)
            return out

        monkeypatch.setattr(KVCache, name, checked)

    wrap("allocate")
    wrap("free")
    return seen


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("first_token_from", ["prefill", "decode"])
@pytest.mark.parametrize("kv_handoff", ["pull", "prealloc", "push"])
def test_invariants_under_disagg(seed, first_token_from, kv_handoff, kv_watch):
    trace = random_trace(seed)
    blocks = [400, 100000][seed % 2]  # 400 blocks: the decode pool preempts (push) or backs up (pull, prealloc)
    cfg = DisaggOptions(prefill_replicas=1 + seed % 2, decode_replicas=1 + (seed // 2) % 2,
                        first_token_from=first_token_from, link="100gbe", kv_handoff=kv_handoff)  # the pools
    replay_cfg = ReplayConfig(EngineOptions(num_gpu_blocks=blocks, max_num_batched_tokens=1024),
                              SchedulingOptions("disagg"), cfg, record=RecordOptions(token_times=True, steps=True))
    res, eng = replay_frame(trace, COST, replay_cfg)
    assert (res["pred_status"] == "ok").all()
    assert kv_watch and min(kv_watch) >= 0
    assert all(s.kv.num_free_blocks == s.kv.num_gpu_blocks for s in eng.replicas)
    p = cfg.prefill_replicas
    steps = pd.DataFrame(step_rows(eng))
    prefill_steps = steps[steps["replica_id"] < p]
    assert (prefill_steps["num_decode_seqs"] == 0).all()  # the prefill pool never decodes
    assert set(steps["replica_id"]) <= set(range(p + cfg.decode_replicas))
    for row in res.itertuples():
        times = np.asarray(row.pred_token_times_s) + row.arrival_time_s
        assert len(times) == row.num_output_tokens  # every output token once
        assert times[0] > row.arrival_time_s and np.all(np.diff(times) >= 0)  # none before arrival, in order
        assert row.pred_ttft_s + np.diff(times).sum() == pytest.approx(row.pred_e2e_s, abs=1e-9)
        t = eng.transfers.get(row.Index)
        if t is None:  # ended on its prefill instance: one token, first token from prefill
            assert first_token_from == "prefill" and row.num_output_tokens == 1
            continue
        assert t.end_time_s == pytest.approx(t.start_time_s + kv_transfer_time_s(row.num_prompt_tokens, LLAMA,
                                                                                  cfg_link(cfg)))
        assert t.decode_admitted_time_s >= t.end_time_s
        # decode tokens come only after the transfer; with first-token-from prefill token 1 at its start
        after = times[1:] if first_token_from == "prefill" else times
        assert np.all(after > t.decode_admitted_time_s)
        # pull: the transfer starts when a decode instance accepts the finished prompt, never before its end;
        # prealloc: the wait for the reservation comes before the prefill (a part of the queue wait)
        assert row.pred_handoff_wait_s >= 0
        after_prompt = 0.0 if kv_handoff == "prealloc" else row.pred_handoff_wait_s
        if kv_handoff == "prealloc":
            assert row.pred_queue_wait_s >= row.pred_handoff_wait_s - 1e-12
        if first_token_from == "prefill":
            assert times[0] == pytest.approx(t.start_time_s - after_prompt)
    if blocks == 100000 and not res["pred_num_preemptions"].any():
        # no preemption: every prompt token is fed once on a prefill instance, every later token
        # once on a decode instance (plus the re-fed last prompt token with first-token-from decode)
        moved = len(eng.transfers) if first_token_from == "decode" else 0
        assert prefill_steps["num_prefill_tokens"].sum() == trace["num_prompt_tokens"].sum()
        decode_steps = steps[steps["replica_id"] >= p]
        assert ((decode_steps["num_prefill_tokens"] + decode_steps["num_decode_seqs"]).sum()
                == (trace["num_output_tokens"] - 1).sum() + moved)


def cfg_link(cfg):
    return resolve_link(cfg.link, cfg.link_bandwidth_bytes_per_s, cfg.link_latency_s, COST.tp_link)


@pytest.mark.parametrize("seed", range(12))
def test_fast_path_equals_step_by_step_under_disagg(seed):
    trace = random_trace(10 + seed, n=50)
    base = dict(scheduler="disagg", decode_replicas=1 + seed % 2, prefill_replicas=1 + seed // 6,
                num_gpu_blocks=[300, 100000][seed % 2],
                max_num_batched_tokens=1024, record_token_times=True,
                first_token_from=["prefill", "decode"][seed % 2])
    replay_both_paths(trace, COST, **base)
