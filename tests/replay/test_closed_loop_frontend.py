"""The closed loop keeps every front-end term of the open loop (issue 21, item 2): a send reaches
the engine ``t_frontend_s + t_frontend_per_prompt_token_s * L`` later, the client has the last
token ``t_stream_per_token_s`` per token after the first later, and the result has the
``pred_frontend_s``/``pred_stream_s`` columns of the open loop."""
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from helpers import LinearStepCost, replay_both_paths, replica_options
from replay.core.closed_loop import ClosedLoop
from replay.config import ClosedLoopOptions, RecordOptions, ReplayConfig
from replay.cost.cost_model import RooflineCostModel
from replay.core.engine import Engine
from replay.core.engine_config import EngineConfig
from replay.core.request import Request
from replay.schedulers import get_scheduler_factory
from replay.schedulers.base import SchedulerConfig
from replay.simulate import replay_frame
from schemas.cost_params import CostParams
from schemas.specs import get_gpu, get_model

FRONT = dict(t_frontend_s=0.02, t_frontend_per_prompt_token_s=1e-5, t_stream_per_token_s=1e-3)
COST = RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("a100-80gb"),
                         CostParams(eta_compute=0.6, eta_mem=0.8, t_step_s=2e-4, **FRONT))
COLUMNS = ["pred_queue_wait_s", "pred_ttft_s", "pred_tpot_s", "pred_e2e_s", "pred_frontend_s", "pred_stream_s"]


def trace(arrivals, prompts, outputs):
    return pd.DataFrame({"request_id": [f"r{i}" for i in range(len(arrivals))], "arrival_time_s": arrivals,
                         "num_prompt_tokens": prompts, "num_output_tokens": outputs})


def test_enough_clients_replay_the_open_loop_of_sends_at_zero_to_the_float():
    """With as many clients as requests every request is sent at 0: the closed loop is the open
    loop of a trace whose arrivals are all 0, front end included, column for column."""
    df = trace([0.0] * 6, [100, 2000, 300, 50, 1200, 700], [5, 3, 8, 1, 4, 6])
    opened, _ = replay_frame(df, COST, ReplayConfig())
    closed, _ = replay_frame(df, COST, ReplayConfig(closed_loop=ClosedLoopOptions(concurrency=6)))
    for col in COLUMNS:
        np.testing.assert_array_equal(closed[col].to_numpy(), opened[col].to_numpy(), err_msg=col)
    fe = 0.02 + 1e-5 * df["num_prompt_tokens"].to_numpy()
    np.testing.assert_allclose(closed["pred_frontend_s"], fe, rtol=1e-15)
    np.testing.assert_allclose(closed["pred_stream_s"], 1e-3 * (df["num_output_tokens"] - 1), rtol=1e-15)
    assert closed["pred_arrival_time_s"].tolist() == [0.0] * 6  # the sends, before the front end


def test_one_client_alone_has_the_latency_of_a_sparse_open_loop():
    """One client: each request runs alone, as in an open loop whose arrivals are far apart; the
    next send waits for the streamed last token. (The issue: TTFT was t_frontend_s lower.)"""
    df = trace([0.0, 100.0, 200.0], [100, 2000, 300], [5, 3, 8])
    sparse, _ = replay_frame(df, COST, ReplayConfig())
    closed, _ = replay_frame(df, COST, ReplayConfig(closed_loop=ClosedLoopOptions(concurrency=1)))
    for col in COLUMNS:
        np.testing.assert_allclose(closed[col], sparse[col], rtol=1e-9, err_msg=col)
    assert (sparse["pred_queue_wait_s"] == 0).all()
    sends = closed["pred_arrival_time_s"].to_numpy()
    np.testing.assert_allclose(sends[1:], sends[:-1] + closed["pred_e2e_s"].to_numpy()[:-1], rtol=1e-12)


def test_one_client_hand_worked():
    """Step 1 s + 0.25 s per token; front end 0.5 s, 0.1 s per streamed token after the first.
    A sent at 0 reaches the engine at 0.5: prefill 4 (2.0) -> 2.5, 2 decodes of 1.25 -> 5.0,
    streamed by 5.2; B sent at 5.2, at the engine 5.7, prefill 2 (1.5) -> 7.2, its only token;
    C sent at 7.2, at the engine 7.7, prefill 6 (2.5) -> 10.2."""
    rs = [Request(i, rid, 0.0, p, o) for i, (rid, p, o) in enumerate([("A", 4, 3), ("B", 2, 1), ("C", 6, 2)])]
    eng = Engine(LinearStepCost(1.0, 0.25), get_scheduler_factory("chunked"), SchedulerConfig(256, 2048),
                 EngineConfig(10**6, 16, None, False, False))
    loop = ClosedLoop(eng, rs, 1, frontend_s=np.full(3, 0.5), stream_per_token_s=0.1)
    loop.run()
    assert loop.sent_at_s == pytest.approx({0: 0.0, 1: 5.2, 2: 7.2}, rel=1e-15)
    assert [r.arrival_time_s for r in rs] == pytest.approx([0.5, 5.7, 7.7], rel=1e-15)
    assert [r.first_token_time_s for r in rs] == pytest.approx([2.5, 7.2, 10.2], rel=1e-15)
    assert rs[2].last_token_time_s == pytest.approx(11.45, rel=1e-15)


def test_closed_loop_token_times_are_the_clients():
    """Token times of the result are the client's (from its send), as in the open loop."""
    df = trace([0.0, 0.0], [100, 400], [4, 3])
    cfg = ReplayConfig(record=RecordOptions(token_times=True))
    opened, _ = replay_frame(df, COST, cfg)
    closed, _ = replay_frame(df, COST, ReplayConfig(record=RecordOptions(token_times=True),
                                                    closed_loop=ClosedLoopOptions(concurrency=2)))
    for a, b in zip(closed["pred_token_times_s"], opened["pred_token_times_s"]):
        np.testing.assert_array_equal(a, b)
    assert closed["pred_token_times_s"][0][0] == closed["pred_ttft_s"][0]


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 30), seed=st.integers(0, 2**16), scheduler=st.sampled_from(["chunked", "fcfs", "disagg"]),
       blocks=st.sampled_from([300, 100000]), replicas=st.sampled_from([1, 2]), concurrency=st.sampled_from([1, 3, 16]))
def test_fast_path_equals_step_by_step_with_a_front_end(n, seed, scheduler, blocks, replicas, concurrency):
    """Requests on their way to the engine bound the closed-form decode runs: the fast path
    still equals the step-by-step replay."""
    rng = np.random.default_rng(seed)
    df = trace(np.zeros(n), rng.integers(1, 3000, n), rng.integers(1, 300, n))
    base = dict(scheduler=scheduler, num_gpu_blocks=blocks, record_token_times=True, concurrency=concurrency)
    base.update(replica_options(scheduler, replicas))
    slow, fast = replay_both_paths(df, COST, **base)
    np.testing.assert_allclose(fast["pred_arrival_time_s"], slow["pred_arrival_time_s"], rtol=0, atol=1e-9)
    np.testing.assert_allclose(fast["pred_ttft_s"], slow["pred_ttft_s"], rtol=0, atol=1e-9)
