"""Closed-loop replay (``replay --concurrency N``): hand-worked timelines, Little's law, fast path = exact."""
import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st

from helpers import LinearStepCost, replay_both_paths, replica_options
from replay.core.closed_loop import ClosedLoop, on_send_times
from replay.cost.cost_model import RooflineCostModel
from schemas.cost_params import CostParams
from replay.core.engine import Engine
from replay.core.engine_config import EngineConfig
from replay.errors import ConfigError
from replay.analysis.metrics import goodput_rps
from replay.core.request import Request
from replay.schedulers import BUILTIN, get_scheduler_factory
from replay.schedulers.base import SchedulerConfig
from replay.config import ClosedLoopOptions, ReplayConfig, SchedulingOptions
from replay.simulate import replay_frame
from schemas.specs import get_gpu, get_model
from traces.synth import synth_requests

COST = RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("a100-80gb"),
                         CostParams(eta_compute=0.6, eta_mem=0.8, t_step_s=2e-4))


def closed_loop(reqs, concurrency, think_time_s=0.0, max_model_len=None, replicas=1):
    """Run (id, prompt, output) tuples through `concurrency` clients; step time 1 s + 0.25 s per token."""
    rs = [Request(i, rid, 0.0, p, o, record_token_times=True) for i, (rid, p, o) in enumerate(reqs)]
    eng = Engine(LinearStepCost(1.0, 0.25), get_scheduler_factory("chunked"), SchedulerConfig(256, 2048),
                 EngineConfig(10**6, 16, max_model_len, True, True), num_replicas=replicas)
    ClosedLoop(eng, rs, concurrency, think_time_s).run()
    return {r.request_id: r for r in rs}


def timeline(r):
    """(send, queue wait, TTFT, E2E) of a request, seconds."""
    return (r.arrival_time_s, r.first_scheduled_time_s - r.arrival_time_s, r.first_token_time_s - r.arrival_time_s,
            r.last_token_time_s - r.arrival_time_s)


def test_one_client_sends_each_request_when_the_previous_completes():
    # A: prefill 4 tokens (1 + 4 * 0.25 = 2.0), 2 decodes of 1.25 -> done at 4.5
    # B sent at 4.5: prefill 2 (1.5), one token -> done at 6.0
    # C sent at 6.0: prefill 6 (2.5) -> 8.5, one decode -> 9.75
    got = closed_loop([("A", 4, 3), ("B", 2, 1), ("C", 6, 2)], concurrency=1)
    assert timeline(got["A"]) == (0.0, 0.0, 2.0, 4.5)
    assert timeline(got["B"]) == (4.5, 0.0, 1.5, 1.5)
    assert timeline(got["C"]) == (6.0, 0.0, 2.5, 3.75)


def test_two_clients_hand_worked():
    # t=0    A, B sent; one step prefills 4 + 2 tokens: 1 + 6 * 0.25 = 2.5
    # t=2.5  A token 1; B (1 token) done -> C sent at 2.5, after the step that starts at 2.5
    #        (A's decode, 1.25 s) has been scheduled: C waits for it
    # t=3.75 A token 2; A decode + C prefill 6 tokens: 1 + 7 * 0.25 = 2.75
    # t=6.5  A token 3: done -> D sent; C token 1; C decode 1.25
    # t=7.75 C done; D prefill 2 (1.5) -> 9.25 token 1, decode 1.25 -> 10.5
    got = closed_loop([("A", 4, 3), ("B", 2, 1), ("C", 6, 2), ("D", 2, 2)], concurrency=2)
    assert timeline(got["A"]) == (0.0, 0.0, 2.5, 6.5)
    assert timeline(got["B"]) == (0.0, 0.0, 2.5, 2.5)
    assert timeline(got["C"]) == (2.5, 1.25, 4.0, 5.25)
    assert timeline(got["D"]) == (6.5, 1.25, 2.75, 4.0)


def test_think_time_delays_the_next_send():
    got = closed_loop([("A", 4, 3), ("B", 2, 1), ("C", 6, 2)], concurrency=1, think_time_s=1.0)
    assert [got[k].arrival_time_s for k in "ABC"] == [0.0, 5.5, 8.0]
    assert all(timeline(got[k])[1] == 0.0 for k in "ABC")


def test_a_rejected_request_completes_at_its_send_time():
    got = closed_loop([("A", 4, 3), ("R", 100, 5), ("B", 2, 1)], concurrency=1, max_model_len=50)
    assert got["R"].status.startswith("rejected") and got["R"].arrival_time_s == 4.5
    assert timeline(got["B"]) == (4.5, 0.0, 1.5, 1.5)


def test_more_clients_than_requests():
    got = closed_loop([("A", 4, 3), ("B", 2, 1)], concurrency=8)
    assert got["A"].arrival_time_s == got["B"].arrival_time_s == 0.0
    assert all(r.status == "ok" for r in got.values())


def test_rows_failed_in_the_trace_are_not_sent():
    trace = _trace(6).assign(status=["ok", "failed: 500", None, "ok", "failed: timeout", "ok"])
    res, _ = replay_frame(trace, COST, ReplayConfig(closed_loop=ClosedLoopOptions(1)))
    sent = res["pred_arrival_time_s"]
    assert sent.isna().tolist() == [False, True, False, False, True, False]
    # one client: each of the 4 simulated requests is sent when the previous one completes
    ok = res[sent.notna()]
    assert np.allclose(ok["pred_arrival_time_s"].iloc[1:].to_numpy(),
                       (ok["pred_arrival_time_s"] + ok["pred_e2e_s"]).iloc[:-1].to_numpy(), rtol=0, atol=1e-12)
    assert np.isfinite(goodput_rps(on_send_times(res), None, None))  # unsent rows do not break the rates


def _trace(n, seed=0):
    return synth_requests(n, 1.0, "lognormal:mean=600,sigma=0.8", "lognormal:mean=120,sigma=0.8", seed=seed)


@pytest.mark.parametrize("concurrency, scheduler", [(8, "chunked"), (32, "fcfs")])
def test_littles_law(concurrency, scheduler):
    # N clients with no think time keep N requests in the system: throughput x mean E2E = N,
    # up to the drain at the end of the trace
    res, _ = replay_frame(_trace(5000), COST, ReplayConfig(scheduling=SchedulingOptions(scheduler),
                                                               closed_loop=ClosedLoopOptions(concurrency)))
    assert (res["pred_status"] == "ok").all()
    throughput = goodput_rps(on_send_times(res), None, None)
    assert throughput * res["pred_e2e_s"].mean() == pytest.approx(concurrency, rel=0.02)
    # send times: non-decreasing in trace order, the first N at 0
    sends = res["pred_arrival_time_s"].to_numpy()
    assert (sends[:concurrency] == 0).all() and (np.diff(sends) >= 0).all()


def test_arrival_times_of_the_trace_are_ignored():
    trace = _trace(60)
    a, _ = replay_frame(trace, COST, ReplayConfig(closed_loop=ClosedLoopOptions(4)))
    b, _ = replay_frame(trace.assign(arrival_time_s=0.0), COST, ReplayConfig(closed_loop=ClosedLoopOptions(4)))
    cols = ["pred_arrival_time_s", "pred_ttft_s", "pred_e2e_s"]
    pd.testing.assert_frame_equal(a[cols], b[cols])


@st.composite
def traces(draw):
    n = draw(st.integers(1, 40))
    prompts = draw(st.lists(st.integers(1, 3000), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 300), min_size=n, max_size=n))
    return pd.DataFrame({"request_id": [f"r{i}" for i in range(n)], "arrival_time_s": np.zeros(n),
                         "num_prompt_tokens": prompts, "num_output_tokens": outputs})


@settings(max_examples=60, deadline=None)
@given(trace=traces(), scheduler=st.sampled_from(sorted(BUILTIN) + ["disagg"]),
       budget=st.sampled_from([512, 2048, 8192]), max_num_seqs=st.sampled_from([1, 4, 64]),
       blocks=st.sampled_from([300, 2000, 100000]), replicas=st.sampled_from([1, 2]),
       concurrency=st.sampled_from([1, 3, 16]), think_time_s=st.sampled_from([0.0, 0.05]))
def test_fast_path_equals_step_by_step_in_closed_loop(trace, scheduler, budget, max_num_seqs, blocks, replicas,
                                                      concurrency, think_time_s):
    base = dict(scheduler=scheduler, max_num_batched_tokens=budget, max_num_seqs=max_num_seqs, num_gpu_blocks=blocks,
                record_token_times=True, concurrency=concurrency, think_time_s=think_time_s)
    base.update(replica_options(scheduler, replicas))
    slow, fast = replay_both_paths(trace, COST, **base)
    np.testing.assert_allclose(fast["pred_arrival_time_s"], slow["pred_arrival_time_s"], rtol=0, atol=1e-9)


@pytest.mark.parametrize("replicas", [1, 2])
def test_closed_form_runs_still_cover_most_steps(monkeypatch, replicas):
    run_steps = []
    original = Engine._start_run

    def counting(self, rid, state, batch, now):
        ok = original(self, rid, state, batch, now)
        if ok:
            run_steps.append(len(batch.run_end_times_s))
        return ok

    monkeypatch.setattr(Engine, "_start_run", counting)
    _, eng = replay_frame(_trace(300), COST, ReplayConfig(scheduling=SchedulingOptions(replicas=replicas),
                                                          closed_loop=ClosedLoopOptions(8)))
    assert sum(run_steps) > 0.5 * eng.num_steps


@pytest.mark.parametrize("kwargs, needle", [
    (dict(concurrency=0), "--concurrency must be an integer >= 1"),
    (dict(concurrency=2, think_time_s=-1.0), "--think-time-s must be >= 0"),
    (dict(think_time_s=0.5), "give --concurrency too"),
])
def test_bad_closed_loop_options(kwargs, needle):
    with pytest.raises(ConfigError, match=needle):
        replay_frame(_trace(3), COST, ReplayConfig(closed_loop=ClosedLoopOptions(**kwargs)))


def _cli_files(tmp_path, n=40):
    from helpers import write_calibration
    from schemas.tables import REQUEST_TRACE
    from traces.io import write_trace

    trace, cal = tmp_path / "t.parquet", tmp_path / "cal.json"
    write_trace(_trace(n), REQUEST_TRACE, trace)
    p = COST.params
    write_calibration(COST.with_params(p), cal)
    return trace, cal


def test_cli_concurrency(tmp_path):
    from replay.cli import main

    trace, cal = _cli_files(tmp_path)
    out = tmp_path / "pred.parquet"
    res = CliRunner().invoke(main, [str(trace), "--calibration", str(cal), "--concurrency", "4",
                                    "--think-time-s", "0.1", "--slo-ttft-s", "1", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "closed loop: 4 clients, think time 0.1 s" in res.output
    pred = pd.read_parquet(out)
    expected, _ = replay_frame(pd.read_parquet(trace), COST, ReplayConfig(closed_loop=ClosedLoopOptions(4, 0.1)))
    np.testing.assert_array_equal(pred["pred_arrival_time_s"], expected["pred_arrival_time_s"])
    assert (pred["pred_arrival_time_s"].iloc[:4] == 0).all()


@pytest.mark.parametrize("args, needle", [
    (("--think-time-s", "0.5"), "give --concurrency too"),
    (("--concurrency", "0"), "--concurrency"),
])
def test_cli_bad_closed_loop_options_exit_2(tmp_path, args, needle):
    from replay.cli import main

    trace, cal = _cli_files(tmp_path, n=3)
    res = CliRunner().invoke(main, [str(trace), "--calibration", str(cal), *args])
    assert res.exit_code == 2, res.output
    assert needle in res.output and "Traceback" not in res.output
