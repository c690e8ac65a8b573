"""The closed-form decode runs give the same per-request times as the step-by-step path."""
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from helpers import replay_both_paths
from replay.cost.cost_model import RooflineCostModel
from schemas.cost_params import CostParams
from replay.schedulers import BUILTIN
from schemas.specs import get_gpu, get_model

COST = RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("a100-80gb"),
                         CostParams(eta_compute=0.6, eta_mem=0.8, t_step_s=2e-4))


@st.composite
def traces(draw):
    n = draw(st.integers(1, 40))
    gaps = draw(st.lists(st.floats(0, 0.2), min_size=n, max_size=n))
    prompts = draw(st.lists(st.integers(1, 3000), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 300), min_size=n, max_size=n))
    return pd.DataFrame({"request_id": [f"r{i}" for i in range(n)], "arrival_time_s": np.cumsum(gaps),
                         "num_prompt_tokens": prompts, "num_output_tokens": outputs})


@settings(max_examples=60, deadline=None)
@given(trace=traces(), scheduler=st.sampled_from(sorted(BUILTIN)), budget=st.sampled_from([64, 512, 2048, 8192]),
       max_num_seqs=st.sampled_from([1, 4, 64]), blocks=st.sampled_from([300, 2000, 100000]),
       form=st.sampled_from(["max", "sum"]), replicas=st.sampled_from([1, 2]))
def test_fast_path_equals_step_by_step(trace, scheduler, budget, max_num_seqs, blocks, form, replicas):
    cost = COST.with_params(CostParams(eta_compute=0.6, eta_mem=0.8, t_step_s=2e-4,
                                       overlap={"max": 0.0, "sum": 1.0}[form]))
    replay_both_paths(trace, cost, scheduler=scheduler, max_num_batched_tokens=budget, max_num_seqs=max_num_seqs,
                      num_gpu_blocks=blocks, replicas=replicas, record_token_times=True)


@pytest.mark.parametrize("scheduler", sorted(BUILTIN))
def test_fast_path_equals_step_by_step_on_the_real_run(real_data_dir, scheduler):
    from traces.importers.vllm_request_stats import import_vllm_request_stats

    trace, _ = import_vllm_request_stats(real_data_dir / "lss_vllm_rtxpro6000_llama31_8b_requests.jsonl")
    # 5000 blocks (80k tokens) force preemptions, so implicit decoders are made explicit mid-run too
    replay_both_paths(trace, COST, atol=0.0, scheduler=scheduler, max_num_batched_tokens=2048, max_num_seqs=128,
                      num_gpu_blocks=5000, record_token_times=True)


def _long_prompts(n: int, gap_s: float, seed: int) -> pd.DataFrame:
    """Long prompts sharing a leading prefix (block hashes, 16 tokens each), some overlapping."""
    rng = np.random.default_rng(seed)
    prompts = rng.integers(1500, 5000, n)
    shared = rng.integers(0, 2**62, 40).tolist()
    hashes = [shared[:rng.integers(0, 40)] + rng.integers(0, 2**62, p // 16).tolist() for p in prompts]
    return pd.DataFrame({"request_id": [f"r{i}" for i in range(n)],
                         "arrival_time_s": np.cumsum(rng.exponential(gap_s, n)), "num_prompt_tokens": prompts,
                         "num_output_tokens": rng.integers(1, 60, n),
                         "block_hashes": [h[:p // 16] for h, p in zip(hashes, prompts)]})


@pytest.mark.parametrize("gap_s,threshold,blocks", [(2.0, 0, 100000), (0.05, 0, 100000), (0.3, 48, 100000),
                                                    (0.3, 0, 700)])
def test_prefill_runs_give_the_step_by_step_timeline_and_steps(gap_s, threshold, blocks, monkeypatch):
    """Long prompts chunked by a small token budget: a prompt prefilling alone is advanced in
    closed-form runs of chunks (alone, overlapped by arrivals, capped by the long-prefill
    threshold, cut short by a small KV cache); every token time and every recorded step
    (start, duration, features) equals the step-by-step path's to the bit."""
    from replay.core.decode_runs import DecodeRuns
    from replay.core.result_columns import steps_frame

    taken = []
    plan = DecodeRuns.plan_prefill

    def counted(self, *args):
        run = plan(self, *args)
        taken.append(run is not None)
        return run

    monkeypatch.setattr(DecodeRuns, "plan_prefill", counted)
    trace = _long_prompts(30, gap_s, seed=int(gap_s * 100) + threshold)
    config = dict(scheduler="chunked", max_num_batched_tokens=64, max_num_seqs=4, num_gpu_blocks=blocks,
                  long_prefill_token_threshold=threshold, enable_prefix_caching=True)
    replay_both_paths(trace, COST, atol=0.0, record_token_times=True, **config)
    assert sum(taken) > 0  # the runs were taken, not only asked for
    from replay.config import RecordOptions, ReplayConfig
    from replay.simulate import replay_frame

    frames = [steps_frame(replay_frame(trace, COST, ReplayConfig.from_options(
        RecordOptions(steps=True), exact_steps=exact, **config))[1]) for exact in (True, False)]
    pd.testing.assert_frame_equal(*frames, check_exact=True)


def test_a_prefill_run_stops_before_a_chunk_whose_blocks_are_not_free_and_before_the_last_chunk():
    """Hand-counted: a 2,000-token prompt, 100 tokens computed, chunks of 64 tokens, 16-token
    blocks. Chunks that leave the prompt unfinished: (2000 - 100 - 1) // 64 = 29; with 7 blocks
    held and 40 free, (47 * 16 - 100) // 64 = 10 chunks find blocks."""
    from replay.core.decode_runs import DecodeRuns
    from replay.core.kv_cache import KVCache
    from replay.core.request import Request
    from replay.schedulers.base import Batch

    req = Request(0, "r0", 0.0, 2000, 10)
    req.num_computed_tokens, req.num_blocks = 100, 7
    kv = KVCache(1000)
    runs = DecodeRuns(COST)
    for free, k in ((40, 10), (1000 - 7, 29), (11, 0)):  # 11 free blocks: 2 chunks, below MIN_RUN
        kv.num_free_blocks = free
        batch = Batch()
        batch.add(req, 64)
        run = runs.plan_prefill(batch, kv, 0.0, lambda: np.inf)
        assert (0 if run is None else len(run[0])) == k
        if run is not None:
            ends, durations, ctx = run
            assert ctx.tolist() == [100 + 64 * i for i in range(k)]
            assert durations.tolist() == [COST.step_time_s(64, 0, 0, 100 + 64 * i, 1) for i in range(k)]


_SHARED27 = list(range(27)) + list(range(100, 145))
_SHARED36 = list(range(36)) + list(range(100, 137))


@pytest.mark.parametrize("prompts,outputs,hashes,gap_s,budget,blocks,hit", [
    ((676, 1156, 449), (190, 142, 1), (list(range(42)), _SHARED27, _SHARED27[:28]), 0.0004, 16, 109, 432),
    ((929, 1172, 593), (225, 206, 1), (list(range(36)) + list(range(200, 222)), _SHARED36, _SHARED36[:37]), 0.009,
     32, 123, 576)])
def test_a_prefill_run_leaves_the_prefix_cache_as_step_by_step_does(prompts, outputs, hashes, gap_s, budget, blocks,
                                                                    hit):
    """Found by trying to break the runs: two prompts sharing a prefix contend for a small cache
    (one is preempted and comes back without a hit), then a probe of the second's first blocks
    arrives alone. A prefill run that took all its chunks' blocks at once evicted a cached copy
    of one of its own later blocks before reaching it, then cached it itself: the probe hit one
    block more (448 tokens instead of 432; 592 instead of 576) and was priced a step short.
    The run now takes its chunks' blocks chunk by chunk."""
    trace = pd.DataFrame({"request_id": ["r0", "r1", "probe"], "arrival_time_s": [0.0, gap_s, 40.0],
                          "num_prompt_tokens": prompts, "num_output_tokens": outputs, "block_hashes": list(hashes)})
    exact, fast = replay_both_paths(trace, COST, atol=0.0, record_token_times=True, scheduler="chunked",
                                    max_num_batched_tokens=budget, max_num_seqs=2, num_gpu_blocks=blocks,
                                    enable_prefix_caching=True)
    assert exact["pred_num_cached_tokens"].tolist()[2] == fast["pred_num_cached_tokens"].tolist()[2] == hit
