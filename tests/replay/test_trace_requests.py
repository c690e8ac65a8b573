"""What a fit's many replays share replays exactly as one replay does: the trace read once
(TraceRequests, its prompts' block keys kept) and the predicted columns without the frame (replay_columns)."""
import pickle

import numpy as np
import pandas as pd
import pytest

from replay.config import RecordOptions, ReplayConfig
from replay.core.prompt_keys import prompt_block_keys
from replay.core.trace_requests import TraceRequests
from replay.cost.cost_model import RooflineCostModel
from replay.simulate import replay_columns, replay_frame
from schemas.cost_params import CostParams
from schemas.specs import get_gpu, get_model

COST = RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("a100-80gb"),
                         CostParams(eta_compute=0.6, eta_mem=0.8, t_step_s=2e-4))


def shared_prefix_trace(n: int = 40, seed: int = 0) -> pd.DataFrame:
    """Prompts of 200-2,000 tokens opening with one of two shared prefixes (16-token hash blocks),
    one failed row and per-row SLOs on some rows."""
    rng = np.random.default_rng(seed)
    prompts = rng.integers(200, 2000, n)
    shared = [rng.integers(0, 2**62, 60).tolist() for _ in range(2)]
    hashes = [shared[i % 2][:rng.integers(0, 60)] + rng.integers(0, 2**62, p // 16 + 1).tolist()
              for i, p in enumerate(prompts)]
    return pd.DataFrame({"request_id": [f"r{i}" for i in range(n)],
                         "arrival_time_s": np.cumsum(rng.exponential(0.05, n)), "num_prompt_tokens": prompts,
                         "num_output_tokens": rng.integers(1, 80, n),
                         "block_hashes": [np.array(h[:-(-p // 16)], np.int64) for h, p in zip(hashes, prompts)],
                         "status": ["ok"] * (n - 1) + ["error: 500"],
                         "slo_ttft_s": [np.nan, 0.2] * (n // 2)})


@pytest.mark.parametrize("hash_block_size", [16, 48])
def test_kept_prompt_keys_equal_the_keys_each_replay_computes(hash_block_size):
    df = shared_prefix_trace()
    rows = TraceRequests(df, keep_prompt_keys=True)
    keys = rows.prompt_keys(16, hash_block_size)
    assert keys == [prompt_block_keys(h, p, 16, hash_block_size)
                    for h, p in zip(df["block_hashes"], df["num_prompt_tokens"])]
    assert rows.prompt_keys(16, hash_block_size) is keys  # computed once per geometry
    reqs = rows.requests(block_geometry=(16, hash_block_size))
    assert [r.prompt_keys for r in reqs] == keys[:-1]  # the failed row is not simulated
    assert all(r.prompt_keys is None for r in TraceRequests(df).requests(block_geometry=(16, 16)))
    assert all(r.prompt_keys is None for r in rows.requests())  # no prefix caching: no keys


@pytest.mark.parametrize("options", [
    dict(num_gpu_blocks=400, max_num_batched_tokens=64, max_num_seqs=4),  # evictions, prefill runs
    dict(num_gpu_blocks=100_000, max_num_batched_tokens=512, max_num_seqs=16, hash_block_size=48),
    dict(num_gpu_blocks=300, max_num_batched_tokens=256, max_num_seqs=8, replicas=2, router="prefix_affinity",
         slo_tpot_s=0.05),
])
def test_replays_of_a_trace_read_once_equal_replays_of_its_frame(options):
    """Replayed three times from one TraceRequests (its prompt keys kept from the first replay on),
    a prefix-sharing trace gives the frame's replay to the bit each time, under cache pressure."""
    df = shared_prefix_trace()
    cfg = ReplayConfig.from_options(RecordOptions(token_times=True), enable_prefix_caching=True, **options)
    expected, _ = replay_frame(df, COST, cfg)
    assert (expected["pred_num_cached_tokens"] > 0).any()
    rows = TraceRequests(df, keep_prompt_keys=True)
    for _ in range(3):
        got, _ = replay_frame(rows, COST, cfg)
        pd.testing.assert_frame_equal(got, expected, check_exact=True)


def test_a_pickled_trace_is_read_again_from_its_frame():
    rows = TraceRequests(shared_prefix_trace(), keep_prompt_keys=True)
    rows.prompt_keys(16, 16)
    back = pickle.loads(pickle.dumps(rows))
    assert back.keep_prompt_keys and back.num_rows == rows.num_rows and not back._prompt_keys
    pd.testing.assert_frame_equal(back.frame, rows.frame)


@pytest.mark.parametrize("options", [
    dict(enable_prefix_caching=True, num_gpu_blocks=400, max_num_batched_tokens=64),
    dict(scheduler="disagg", prefill_replicas=1, decode_replicas=2),
    dict(num_speculative_tokens=2, spec_acceptance_rate=0.7, seed=3),
    dict(concurrency=4, think_time_s=0.01),
])
def test_replay_columns_are_the_columns_replay_frame_adds(options):
    """The columns a fit reads without the frame are replay_frame's new columns, in its order,
    value for value (disaggregation, speculative decoding and closed-loop columns included;
    front-end and streaming delays on)."""
    df = shared_prefix_trace()
    cost = COST.with_params(CostParams(eta_compute=0.6, eta_mem=0.8, t_step_s=2e-4, t_frontend_s=0.003,
                                       t_stream_per_token_s=1e-4))
    cfg = ReplayConfig.from_options(RecordOptions(token_times=True), **options)
    frame, _ = replay_frame(df, cost, cfg)
    columns, _ = replay_columns(TraceRequests(df), cost, cfg)
    assert list(columns) == [c for c in frame.columns if c not in df.columns]
    pd.testing.assert_frame_equal(pd.DataFrame(columns, index=df.index), frame[list(columns)], check_exact=True)
