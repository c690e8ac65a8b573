"""Hand-worked engine timelines from shared/cases (BR-04, BR-05, BR-06, BR-07, BR-08)."""
import numpy as np
import pytest

from helpers import LinearStepCost, run, step_rows
from replay.analysis.metrics import from_token_times


def times(r):
    return np.array(r.token_times_s)


def test_br04a_chunked_ttft_is_at_last_chunk():
    cost = LinearStepCost(0.010, 4e-4)
    out, eng = run([("a", 0.0, 5000, 3)], cost)
    a = out["a"]
    steps = [s.num_prefill_tokens for s in step_rows(eng)]
    assert steps[:3] == [2048, 2048, 904]
    assert a.first_token_time_s == pytest.approx(0.8292 + 0.8292 + 0.3716)
    assert times(a) == pytest.approx([2.0300, 2.0404, 2.0508])
    assert np.diff(times(a)) == pytest.approx([0.0104, 0.0104])


def test_br04b_cotenant_decode_gets_a_token_every_chunk_step():
    cost = LinearStepCost(0.010, 4e-4)
    # D arrives first with a 1-token prompt and a long output, so it is decoding when P arrives.
    out, eng = run([("d", 0.0, 1, 50), ("p", 0.0105, 5000, 2)], cost)
    chunks = [s.num_prefill_tokens for s in step_rows(eng) if s.num_prefill_tokens > 1]
    assert chunks == [2047, 2047, 906]
    d_gaps = np.diff(times(out["d"]))
    slow = d_gaps[d_gaps > 0.1]
    assert slow == pytest.approx([0.8292, 0.8292, 0.3728])


def test_br04b_without_chunking_cotenant_stalls_for_whole_prefill():
    cost = LinearStepCost(0.010, 4e-4)
    out, _ = run([("d", 0.0, 1, 50), ("p", 0.0105, 5000, 2)], cost, scheduler="fcfs", budget=8192)
    # a prefill-only step, then the D+P decode
    assert np.diff(times(out["d"])).max() == pytest.approx((0.010 + 4e-4 * 5000) + (0.010 + 4e-4 * 2))


def test_br05_vllm_v0_prefill_priority():
    cost = LinearStepCost(0.010, 1e-4)
    out, _ = run([("A", 0.0, 100, 4), ("B", 0.015, 1000, 2)], cost, scheduler="fcfs")
    a, b = from_token_times(0.0, times(out["A"])), from_token_times(0.015, times(out["B"]))
    assert a["ttft_s"] == pytest.approx(0.020)
    assert a["itl_s"] == pytest.approx([0.1202, 0.0101, 0.0101])
    assert a["e2e_s"] == pytest.approx(0.1604)
    assert b["ttft_s"] == pytest.approx(0.115)
    assert b["itl_s"] == pytest.approx([0.0102])
    assert b["e2e_s"] == pytest.approx(0.1252)


def test_br05_mixed_decode_first():
    cost = LinearStepCost(0.010, 1e-4)
    out, _ = run([("A", 0.0, 100, 4), ("B", 0.015, 1000, 2)], cost, scheduler="chunked")
    a, b = from_token_times(0.0, times(out["A"])), from_token_times(0.015, times(out["B"]))
    assert a["ttft_s"] == pytest.approx(0.020)
    assert a["itl_s"] == pytest.approx([0.1101, 0.0102, 0.0101])
    assert a["e2e_s"] == pytest.approx(0.1504)
    assert b["ttft_s"] == pytest.approx(0.1151)
    assert b["itl_s"] == pytest.approx([0.0102])
    assert b["e2e_s"] == pytest.approx(0.1253)


@pytest.mark.parametrize("scheduler", ["chunked", "fcfs"])
def test_br08_recompute_preemption_accounting(scheduler):
    cost = LinearStepCost(0.010, 0.0)
    out, eng = run([("A", 0.0, 30, 20), ("B", 0.0, 30, 5)], cost, scheduler=scheduler, num_gpu_blocks=4)
    a, b = out["A"], out["B"]
    assert a.first_token_time_s == pytest.approx(0.01)
    assert a.last_token_time_s == pytest.approx(0.20)
    assert np.diff(times(a)) == pytest.approx([0.01] * 19)
    assert b.first_token_time_s == pytest.approx(0.01)
    assert np.diff(times(b)) == pytest.approx([0.01, 0.01, 0.18, 0.01])
    assert b.last_token_time_s == pytest.approx(0.22)
    assert (b.num_preemptions, a.num_preemptions) == (1, 0)
    assert b.num_recomputed_tokens == 33
    assert b.num_cached_tokens == 0


def test_br06_requests_that_can_never_fit_are_rejected_and_run_terminates():
    cost = LinearStepCost(0.001, 1e-6)
    reqs = [("r1", 0.0, 8000, 100), ("r2", 0.1, 8000, 500), ("r3", 0.2, 9000, 1), ("r4", 0.3, 4096, 4096)]
    out, _ = run(reqs, cost, max_model_len=8192, num_gpu_blocks=512)
    assert {k: r.status for k, r in out.items()} == {
        "r1": "ok", "r2": "rejected: exceeds max_model_len", "r3": "rejected: exceeds max_model_len", "r4": "ok"}
    out, _ = run(reqs, cost, max_model_len=8192, num_gpu_blocks=256)
    assert out["r1"].status == out["r4"].status == "rejected: exceeds KV cache capacity"


def test_br07_every_request_has_n_minus_1_itls_and_ttft_plus_itls_is_e2e():
    cost = LinearStepCost(0.005, 1e-4)
    rng = np.random.default_rng(1)
    reqs = [(f"q{i}", float(t), int(p), int(o)) for i, (t, p, o) in
            enumerate(zip(np.sort(rng.uniform(0, 2, 60)), rng.integers(1, 3000, 60), rng.integers(1, 80, 60)))]
    for sched in ("chunked", "fcfs"):
        out, _ = run(reqs, cost, scheduler=sched, num_gpu_blocks=400, budget=1024, max_num_seqs=16)
        for (rid, arr, _, n) in reqs:
            m = from_token_times(arr, times(out[rid]))
            assert len(m["itl_s"]) == n - 1
            assert m["ttft_s"] + m["itl_s"].sum() == pytest.approx(m["e2e_s"], abs=1e-9)
            assert m["ttft_s"] > 0
