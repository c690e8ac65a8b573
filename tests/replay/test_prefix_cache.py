"""Prefix caching (vLLM v1 semantics): BR-14 hash-block mapping, BR-15 hit rules, BR-08 recompute != hit."""
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from helpers import LinearStepCost, step_rows
from replay.cost.cost_model import RooflineCostModel
from replay.core.engine import Engine
from replay.core.engine_config import EngineConfig
from replay.core.kv_cache import KVCache, PrefixCachingKVCache, make_kv_cache
from replay.core.prompt_keys import prompt_block_keys
from replay.core.request import Request
from replay.schedulers import get_scheduler_factory
from replay.schedulers.base import ReplicaState, SchedulerConfig
from replay.config import EngineOptions, ReplayConfig
from replay.simulate import replay_frame
from schemas.specs import get_gpu, get_model

COST = LinearStepCost(0.010, 1e-4)


def run(reqs, scheduler="chunked", num_gpu_blocks=10**5, block_size=16, hash_block_size=None, prefix=True):
    eng = Engine(COST, get_scheduler_factory(scheduler), SchedulerConfig(256, 2048),
                 EngineConfig(num_gpu_blocks, block_size, None, True, True, enable_prefix_caching=prefix,
                              hash_block_size=hash_block_size))
    eng.run(reqs)
    return {r.request_id: r for r in reqs}, eng


# -- BR-15: block size 4, tokens as letters ---------------------------------------------------------

def letters(prefix, n, start=0):
    return [f"{prefix}{i}" for i in range(start, start + n)]


R0 = letters("T", 14)
R1 = letters("T", 10) + letters("U", 4, 10)
R2 = letters("T", 12)
R3 = letters("T", 14) + letters("V", 2, 14)
_IDS: dict = {}


def hash_ids(tokens, size=4):
    """Mooncake-style ids: one per ``size``-token chunk (the last may be partial), equal chunks equal ids."""
    return [_IDS.setdefault(tuple(tokens[i:i + size]), len(_IDS)) for i in range(0, len(tokens), size)]


def req(i, name, tokens, arrival=0.0, output=1):
    return Request(i, name, arrival, len(tokens), output, block_hashes=hash_ids(tokens), record_token_times=True)


def test_br15_engine_hits_full_blocks_only_and_recomputes_the_last_token():
    reqs = [req(0, "R0", R0, 0.0), req(1, "R1", R1, 1.0), req(2, "R2", R2, 2.0)]
    out, eng = run(reqs, block_size=4, hash_block_size=4)
    # R1: blocks [T0-3], [T4-7] hit; [T8,T9,U10,U11] only half matches -> 8, compute 6.
    # R2: all 3 blocks resident, but the cap is floor((12 - 1) / 4) = 2 blocks -> 8, compute 4.
    assert [out[k].num_cached_tokens for k in ("R0", "R1", "R2")] == [0, 8, 8]
    assert [s.num_prefill_tokens for s in step_rows(eng)] == [14, 6, 4]  # prefill tokens computed
    assert [s.prefill_context_tokens for s in step_rows(eng)] == [0, 8, 8]  # the hit is attended to as context
    # the shorter prefill shortens TTFT: 0.010 + 1e-4 x 6 for R1
    assert out["R1"].first_token_time_s - 1.0 == pytest.approx(0.0106)


def test_br15_a_missing_first_block_breaks_the_chain():
    kv = PrefixCachingKVCache(100, block_size=4, hash_block_size=4)
    r0 = req(0, "R0", R0)
    assert kv.lookup(r0) == 0
    kv.allocate(r0, 14)
    assert kv.num_cached_blocks == 3  # [T12, T13] is partial: never cached
    r0.num_generated_tokens = 1
    kv.free(r0)
    r1, r2, r3 = req(1, "R1", R1), req(2, "R2", R2), req(3, "R3", R3)
    assert (kv.lookup(r1), kv.lookup(r2), kv.lookup(r3)) == (8, 8, 12)
    kv.evict(kv.block_keys(r3)[0])  # evict [T0-T3], keep the other two
    assert kv.num_cached_blocks == 2
    assert kv.lookup(r3) == 0 and kv.num_resident_prefix_blocks(r3) == 0  # not 8: hits are contiguous from 0
    kv.check_invariants()


def test_lru_evicts_the_least_recently_freed_block_tail_first():
    kv = PrefixCachingKVCache(4, block_size=4, hash_block_size=4)
    r0 = req(0, "R0", R0)
    kv.allocate(r0, 14)  # all 4 blocks
    assert kv.num_free_blocks == 0
    r0.num_generated_tokens = 1
    kv.free(r0)  # freed last block first: free queue = [partial, T8-11, T4-7, T0-3]
    x = Request(1, "x", 0.0, 8, 1, block_hashes=[10**6, 10**6 + 1])
    kv.allocate(x, 8)  # takes the partial block and evicts [T8-11]
    r3 = req(3, "R3", R3)
    assert kv.num_resident_prefix_blocks(r3) == 2
    z = Request(2, "z", 0.0, 4, 1, block_hashes=[10**6 + 2])
    kv.allocate(z, 4)  # evicts [T4-7]; [T0-3], freed last, is evicted last
    assert kv.num_resident_prefix_blocks(r3) == 1 and kv.lookup(r3) == 4
    kv.check_invariants()


def test_hit_blocks_nobody_uses_count_against_free_blocks():
    kv = PrefixCachingKVCache(4, block_size=4, hash_block_size=4)
    r0 = req(0, "R0", R0)
    kv.allocate(r0, 14)
    r0.num_generated_tokens = 1
    kv.free(r0)
    w = Request(1, "w", 0.0, 4, 1, block_hashes=[10**6])
    kv.allocate(w, 4)  # the uncached partial block
    r2 = req(2, "R2", R2)
    hit = kv.lookup(r2)
    assert hit == 8 and kv.num_free_blocks == 3
    assert kv.can_allocate(r2, 4, hit)  # 2 free-but-cached hit blocks + 1 new = 3
    kv.allocate(r2, 4, hit)
    assert kv.num_free_blocks == 0 and r2.num_blocks == 3
    assert (r2.num_computed_tokens, r2.num_cached_tokens) == (8, 8)
    assert not kv.can_allocate(Request(3, "v", 0.0, 1, 1), 1)
    kv.check_invariants()


# -- BR-14: Mooncake 512-token hash blocks on 16-token engine blocks ------------------------------------

BR14 = [("row1", 0.0, 1200, 10, [0, 1, 2]), ("row2", 0.5, 1100, 10, [0, 1, 3]), ("row4", 1.0, 1024, 4, [0, 1])]


def test_br14_hash_blocks_map_onto_engine_blocks():
    reqs = [Request(i, k, a, p, o, block_hashes=h, record_token_times=True) for i, (k, a, p, o, h) in enumerate(BR14)]
    out, eng = run(reqs, hash_block_size=512)
    assert out["row1"].last_token_time_s < 0.5  # row 1 is done (and cached) before row 2 arrives
    # row 2 shares hash blocks 0, 1: 2 x 512 = 1024 cached, 76 computed; row 4 is a full hit capped
    # at floor(1023 / 16) x 16 = 1008, 16 computed.
    assert [out[k].num_cached_tokens for k in ("row1", "row2", "row4")] == [0, 1024, 1008]
    assert [s.num_prefill_tokens for s in step_rows(eng) if s.num_prefill_seqs] == [1200, 76, 16]
    # reading the 512-token ids as 16-token blocks would find only 2 blocks (32 tokens)
    reqs = [Request(i, k, a, p, o, block_hashes=h) for i, (k, a, p, o, h) in enumerate(BR14)]
    out, _ = run(reqs, hash_block_size=16)
    assert [out[k].num_cached_tokens for k in ("row1", "row2", "row4")] == [0, 32, 32]


def test_br14_through_replay_frame_with_trace_metadata():
    df = pd.DataFrame({"request_id": [r[0] for r in BR14], "arrival_time_s": [r[1] for r in BR14],
                       "num_prompt_tokens": [r[2] for r in BR14], "num_output_tokens": [r[3] for r in BR14],
                       "block_hashes": [r[4] for r in BR14]})
    cost = RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb"))
    cfg = ReplayConfig(EngineOptions(num_gpu_blocks=10_000, enable_prefix_caching=True))
    res, _ = replay_frame(df, cost, cfg, metadata={"hash_block_tokens": "512"})
    assert res["pred_num_cached_tokens"].tolist() == [0, 1024, 1008]
    res, _ = replay_frame(df, cost, ReplayConfig(EngineOptions(num_gpu_blocks=10_000, enable_prefix_caching=True,
                                                               hash_block_size=512)))
    assert res["pred_num_cached_tokens"].tolist() == [0, 1024, 1008]
    res, _ = replay_frame(df, cost, ReplayConfig(EngineOptions(num_gpu_blocks=10_000)),
                          metadata={"hash_block_size": "512"})
    assert "pred_num_cached_tokens" not in res  # prefix caching is off unless enabled
    assert (res["pred_status"] == "ok").all()


def test_br14_end_to_end_from_the_mooncake_jsonl(tmp_path):
    from traces.importers.mooncake import import_mooncake

    path = tmp_path / "mooncake.jsonl"
    path.write_text('{"timestamp": 0,    "input_length": 1200, "output_length": 10, "hash_ids": [0, 1, 2]}\n'
                    '{"timestamp": 500,  "input_length": 1100, "output_length": 10, "hash_ids": [0, 1, 3]}\n'
                    '{"timestamp": 500,  "input_length": 20,   "output_length": 8,  "hash_ids": [0, 1]}\n'
                    '{"timestamp": 1000, "input_length": 1024, "output_length": 4,  "hash_ids": [0, 1]}\n')
    df, meta = import_mooncake(path, invalid="flag")  # row 3 has 2 ids for 20 tokens: flagged, not replayed
    cost = RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb"))
    res, _ = replay_frame(df, cost, ReplayConfig(EngineOptions(num_gpu_blocks=10_000, enable_prefix_caching=True)),
                          metadata=meta)
    assert res["arrival_time_s"].tolist() == [0.0, 0.5, 0.5, 1.0]
    assert res["pred_num_cached_tokens"].tolist() == [0, 1024, 0, 1008]
    assert res["pred_status"].tolist()[2].startswith("not simulated")


def test_prompt_block_keys():
    # 16-token engine blocks in 512-token hash blocks: 32 per hash block; past the hashes: not cacheable
    assert len(prompt_block_keys([7], 1200, 16, 512)) == 32
    a, b = prompt_block_keys([7, 8, 9], 1200, 16, 512), prompt_block_keys([7, 8, 5], 1200, 16, 512)
    assert len(a) == 75 and a[:64] == b[:64] and not set(a[64:]) & set(b[64:])
    # a hash block that does not align: engine block 1 (tokens 16-31) ends in hash block 1 (24-47)
    c, d = prompt_block_keys([1, 2], 48, 16, 24), prompt_block_keys([1, 3], 48, 16, 24)
    assert c[0] == d[0] and c[1] != d[1]
    # the same content at another position is another block (chained hashes)
    assert prompt_block_keys([5, 5], 32, 16, 16)[0] != prompt_block_keys([5, 5], 32, 16, 16)[1]
    assert prompt_block_keys(None, 100, 16, 16) == []


# -- BR-08: recomputation after preemption is not a cache hit ------------------------------------------

@pytest.mark.parametrize("scheduler", ["chunked", "fcfs"])
def test_br08_with_prefix_caching_on_recompute_is_not_a_hit(scheduler):
    cost = LinearStepCost(0.010, 0.0)
    reqs = [Request(0, "A", 0.0, 30, 20, block_hashes=[1, 2], record_token_times=True),
            Request(1, "B", 0.0, 30, 5, block_hashes=[3, 4], record_token_times=True)]
    eng = Engine(cost, get_scheduler_factory(scheduler), SchedulerConfig(256, 2048),
                 EngineConfig(4, 16, None, True, True, enable_prefix_caching=True))
    eng.run(reqs)
    a, b = reqs
    assert np.diff(b.token_times_s) == pytest.approx([0.01, 0.01, 0.18, 0.01])
    assert a.last_token_time_s == pytest.approx(0.20) and b.last_token_time_s == pytest.approx(0.22)
    assert (b.num_preemptions, b.num_recomputed_tokens, b.num_cached_tokens) == (1, 33, 0)


def test_a_preempted_request_is_not_looked_up_again():
    kv = PrefixCachingKVCache(100, block_size=16)
    state = ReplicaState(0, SchedulerConfig(), kv)
    r = Request(0, "r", 0.0, 40, 5, block_hashes=[1, 2, 3])
    kv.allocate(r, 40)
    state.admit(r, 0.0)
    r.num_computed_tokens, r.num_generated_tokens = 40, 1
    state.preempt(r)
    assert kv.num_resident_prefix_blocks(r) == 2  # its blocks are still cached...
    assert kv.lookup(r) == 0  # ...but it recomputes (BR-08) and its hit stays the first admission's
    assert (r.num_recomputed_tokens, r.num_cached_tokens) == (41, 0)


def test_prefix_caching_is_off_by_default():
    reqs = [Request(i, k, a, p, o, block_hashes=h) for i, (k, a, p, o, h) in enumerate(BR14)]
    out, _ = run(reqs, hash_block_size=512, prefix=False)
    assert all(r.num_cached_tokens == 0 for r in out.values())
    assert type(make_kv_cache(10)) is KVCache and KVCache(10).lookup(reqs[0]) == 0


# -- a run's chunks taken in one call ----------------------------------------------------------------

def _cache_state(kv, reqs):
    """Everything a later allocation or lookup can see: free queue order, references, contents, holdings."""
    return (list(kv._free), list(kv._ref), list(kv._key_of), dict(kv._block_of), kv.num_free_blocks,
            [(r.num_blocks, r.num_computed_tokens, r.num_cached_tokens, kv._held.get(r, [None])[0]) for r in reqs])


_PROMPTS = st.lists(st.tuples(st.sampled_from("ABC"), st.integers(0, 40), st.integers(1, 60)), min_size=1,
                    max_size=5)
_OPS = st.lists(st.tuples(st.sampled_from(["start", "continue", "free"]), st.integers(0, 9),
                          st.sampled_from([2, 4, 6, 8, 12]), st.integers(1, 6), st.booleans()), max_size=30)


@settings(max_examples=300, deadline=None)
@given(prompts=_PROMPTS, ops=_OPS, num_gpu_blocks=st.integers(4, 30))
def test_allocate_chunks_equals_allocating_chunk_by_chunk(prompts, ops, num_gpu_blocks):
    """A run of prompt chunks taken in one call (``allocate_chunks``, the prefill runs' path)
    leaves a small, contended prefix cache exactly as ``allocate(req, i * n)`` chunk by chunk:
    the same blocks taken in the same order, the same evictions, the same contents cached."""
    # prompts sharing prefixes (a letter's first tokens) with their own tails, 4-token blocks
    texts = [letters(base, shared) + letters(f"t{i}_", tail) for i, (base, shared, tail) in enumerate(prompts)]
    caches = [PrefixCachingKVCache(num_gpu_blocks, block_size=4, hash_block_size=4) for _ in range(2)]
    active: list[tuple[Request, Request]] = []
    for n_op, (kind, i, n, k, finished) in enumerate(ops):
        if kind == "free" and active:
            pair = active.pop(i % len(active))
            for kv, r in zip(caches, pair):
                r.num_generated_tokens = r.num_output_tokens if finished else 0
                kv.free(r)
            continue
        if kind == "start":
            tokens = texts[i % len(texts)]
            pair = tuple(Request(n_op, f"r{n_op}", 0.0, len(tokens), 1, block_hashes=hash_ids(tokens))
                         for _ in caches)
            hit = caches[0].lookup(pair[0])
            assert caches[1].lookup(pair[1]) == hit
            take = min(n, pair[0].num_prompt_tokens - hit)
            if not caches[0].can_allocate(pair[0], take, hit):
                continue
            for kv, r in zip(caches, pair):
                kv.allocate(r, take, hit)
                r.num_computed_tokens += take
            active.append(pair)
        elif kind != "continue" or not active:
            continue
        ra, rb = active[-1] if kind == "start" else active[i % len(active)]
        c = ra.num_computed_tokens
        k = min(k, (ra.num_prompt_tokens - c) // n, ((ra.num_blocks + caches[0].num_free_blocks) * 4 - c) // n)
        if k < 1:
            continue
        caches[0].allocate_chunks(ra, n, k)
        for j in range(1, k + 1):
            caches[1].allocate(rb, j * n)
        for r in (ra, rb):
            r.num_computed_tokens += k * n
        assert _cache_state(caches[0], [p[0] for p in active]) == _cache_state(caches[1], [p[1] for p in active])
        caches[0].check_invariants()
