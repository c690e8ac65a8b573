"""NC-09: speculative decoding. A decode verifies K + 1 positions (token budget and cost model count
them all) and advances by 1 + the accepted drafts; every token of a step shares the step's end time."""

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st

from helpers import LinearStepCost, replay_both_paths, step_rows
from replay.cost.cost_model import RooflineCostModel
from replay.core.engine import Engine
from replay.core.engine_config import EngineConfig
from replay.errors import ConfigError
from replay.core.kv_cache import KVCache
from schemas.metrics import tpot_s
from replay.core.request import Request
from replay.schedulers import BUILTIN, get_scheduler_factory
from replay.schedulers.base import Batch, ReplicaState, SchedulerConfig
from replay.schedulers.loops import schedule_running
from replay.config import ClosedLoopOptions, EngineOptions, RecordOptions, ReplayConfig
from replay.core.result_columns import spec_decode_stats, steps_frame
from replay.simulate import replay_frame
from schemas.cost_params import CostParams
from schemas.specs import GpuSpec, ModelSpec, get_gpu, get_model

K = 3


class VerifyCost:
    """NC-09's clock: a step with prefill tokens takes 0.100 s (TTFT), every verify step 0.030 s."""

    supports_arrays = False

    def step_time_s(self, num_prefill_tokens, num_decode_seqs, decode_context_tokens, prefill_context_tokens=0,
                    num_prefill_seqs=None, num_decode_tokens=None):
        return 0.100 if num_prefill_tokens else 0.030


def _pattern(accepted):
    """An ``accept_drafts`` replacement that hands out ``accepted`` in order (one per verifying
    decode, at most its drafts)."""
    it = iter(accepted)
    return lambda rid, drafts: [min(next(it), d) for d in drafts]


def nc09_engine(accepted=(2, 0, 1, 3), scheduler="chunked", exact=False):
    eng = Engine(VerifyCost(), get_scheduler_factory(scheduler), SchedulerConfig(256, 2048, num_speculative_tokens=K),
                 EngineConfig(10**6, 16, None, True, True, exact_steps=exact, spec_acceptance_rate=0.5))
    eng.accept_drafts = _pattern(accepted)
    req = Request(0, "r", 0.0, 100, 11, record_token_times=True)
    eng.run([req])
    return eng, req


@pytest.mark.parametrize("scheduler", ["chunked", "fcfs", "static", "sjf", "edf"])
@pytest.mark.parametrize("exact", [False, True])
def test_nc09_timeline_tpot_below_the_step_time(scheduler, exact):
    eng, req = nc09_engine(scheduler=scheduler, exact=exact)
    # first token at 0.100, then verify steps emitting 3, 1, 2, 4 tokens: N = 11 after 4 steps
    assert req.token_times_s == pytest.approx([0.1] + [0.13] * 3 + [0.16] + [0.19] * 2 + [0.22] * 4, abs=1e-12)
    assert req.status == "ok" and req.num_generated_tokens == 11
    ttft, e2e = req.first_token_time_s, req.last_token_time_s
    assert (ttft, e2e) == pytest.approx((0.100, 0.220), abs=1e-12)  # not 0.190 (K + 1 tokens per step, wrong)
    assert float(tpot_s(ttft, e2e, 11)) == pytest.approx(0.012, abs=1e-12)  # (E2E - TTFT) / (N - 1), below 0.030
    chunks = np.unique(req.token_times_s)
    assert np.diff(chunks) == pytest.approx([0.030] * 4, abs=1e-12)  # ITL per chunk: 4 entries
    assert sum(t < 1.0 for t in req.token_times_s) == 11 and len(chunks) == 5  # 11 tokens in the 1 s bucket, 5 chunks
    # every verify step fed K + 1 = 4 positions
    steps = step_rows(eng)[1:]
    assert [s.num_decode_seqs for s in steps] == [1, 1, 1, 1] and [s.num_decode_tokens for s in steps] == [4, 4, 4, 4]
    st_ = spec_decode_stats(eng)
    assert (st_["num_drafts"], st_["num_draft_tokens"], st_["num_accepted_tokens"]) == (4, 12, 6)
    assert st_["acceptance_rate"] == pytest.approx(0.5) and st_["acceptance_length"] == pytest.approx(2.5)


def test_nc09_progress_never_beyond_the_remaining_tokens():
    """With every draft accepted the request still ends at its 11th token: the last verify step
    feeds only the positions it has left."""
    eng, req = nc09_engine(accepted=(3, 3, 3))
    assert req.num_generated_tokens == 11 and req.token_times_s[-1] == pytest.approx(0.190)
    assert [s.num_decode_tokens for s in step_rows(eng)[1:]] == [4, 4, 2]  # 1 + 4 + 4 + 2 = 11


def test_nc09_budget_counts_k_plus_1_per_decode():
    """600 decoding requests, budget 2,048, K = 3: at most 2,048 / 4 = 512 decodes per step."""
    state = ReplicaState(0, SchedulerConfig(1024, 2048, num_speculative_tokens=K), KVCache(10**6))
    for i in range(600):
        r = Request(i, f"r{i}", 0.0, 100, 50)
        r.num_computed_tokens, r.num_generated_tokens = 100, 1
        state.kv.allocate(r, 0)
        state.admit(r, 0.0)
    batch = Batch()
    budget, preempted = schedule_running(state, batch, 2048)
    assert (batch.num_decode_seqs, batch.num_spec_tokens, budget, preempted) == (512, 3 * 512, 0, False)
    assert batch.num_tokens == batch.num_decode_tokens == 2048
    # each decode holds the blocks of its 4 positions (101..104 tokens: 7 blocks)
    assert state.running[0].num_blocks == 7
    # a budget that ends mid-decode truncates that decode's drafts (vLLM v1)
    batch = Batch()
    schedule_running(state, batch, 2050)
    assert batch.num_decode_seqs == 513 and batch.num_new_tokens[-1] == 2


def test_nc09_budget_in_the_engine():
    cost = LinearStepCost(0.004, 2e-5)
    eng = Engine(cost, get_scheduler_factory("chunked"), SchedulerConfig(1024, 2048, num_speculative_tokens=K),
                 EngineConfig(10**6, 16, None, False, True, spec_acceptance_rate=0.7))
    eng.run([Request(i, f"r{i}", 0.0, 16, 400) for i in range(600)])
    frame = steps_frame(eng)
    assert frame["num_decode_seqs"].max() == 512
    assert frame["num_decode_tokens"].max() <= 2048
    assert (frame["num_prefill_tokens"] + frame["num_decode_tokens"]).max() <= 2048
    # the step time was priced on the positions
    s = frame.iloc[-1]
    assert s["step_duration_s"] == pytest.approx(0.004 + 2e-5 * (s["num_prefill_tokens"] + s["num_decode_tokens"]))


# -- the cost model: K + 1 positions per decode -----------------------------------------------------

GPU = GpuSpec(name="g", peak_flops=1e15, mem_bandwidth_bytes_per_s=2e12, mem_bytes=80 * 2**30)
LLAMA = ModelSpec(name="8b", num_params=8e9, num_active_params=8e9, num_layers=32, hidden_size=4096,
                  num_attention_heads=32, num_kv_heads=8, head_dim=128, dtype_bytes=2, max_model_len=8192)


def _cm(terms, **params):
    return RooflineCostModel(LLAMA, GPU, CostParams(**params), terms=tuple(terms))


def test_cost_model_prices_k_plus_1_positions_per_decode():
    # one decode at context 100 (decode_context_tokens 101) verifying 4 positions: they attend to
    # 101 + 102 + 103 + 104 = 410 keys, feed 4 tokens, read 104 tokens of KV; one sequence for the CPU
    per_pair = 524_288 / (0.5 * 1e15)
    att = _cm(["attention_compute"], eta_compute=0.5)
    assert att.step_time_s(0, 1, 101, num_decode_tokens=4) == pytest.approx(410 * per_pair, rel=1e-12)
    assert att.step_time_s(0, 1, 101) == pytest.approx(101 * per_pair, rel=1e-12)
    dense = _cm(["dense_compute"], eta_compute=0.5)
    assert dense.step_time_s(0, 1, 101, num_decode_tokens=4) == pytest.approx(4 * 2 * 8e9 / 0.5e15, rel=1e-12)
    kv = _cm(["kv_memory"], eta_mem=1.0)
    assert kv.step_time_s(0, 1, 101, num_decode_tokens=4) == pytest.approx(104 * 131_072 / 2e12, rel=1e-12)
    cpu = _cm(["step_overhead"], t_step_s=1e-3, t_seq_s=1e-5)
    assert cpu.step_time_s(0, 8, 800, num_decode_tokens=32) == pytest.approx(1e-3 + 8e-5, rel=1e-12)
    # two decodes of 4 positions with 200 context tokens in all: 4 * 200 + 2 * 4 * 3 / 2 pairs
    assert att.step_time_s(0, 2, 200, num_decode_tokens=8) == pytest.approx(812 * per_pair, rel=1e-12)
    # mixed with a prefill chunk, and on arrays, the same
    full = _cm(list(TERMS_ALL), eta_compute=0.5, eta_mem=0.8, t_step_s=1e-4, t_seq_s=1e-5)
    scal = full.step_time_s(256, 5, 5000, 300, 1, num_decode_tokens=20)
    vec = full.step_time_s(np.array([256]), np.array([5]), np.array([5000]), np.array([300]), np.array([1]),
                           num_decode_tokens=np.array([20]))
    assert vec.tolist() == [scal]
    with pytest.raises(ValueError):
        full.step_time_s(0, 4, 400, num_decode_tokens=3)


from replay.cost.cost_terms import DEFAULT_TERMS as TERMS_ALL  # noqa: E402


def test_cost_model_without_drafts_is_bit_equal():
    cm = RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb"),
                           CostParams(eta_compute=0.6, eta_mem=0.8, t_step_s=2e-4, overlap=0.3))
    rng = np.random.default_rng(1)
    p, d = rng.integers(0, 4000, 50), rng.integers(0, 300, 50)
    cd, cp, s = d * rng.integers(1, 3000, 50), np.where(p > 0, rng.integers(0, 9000, 50), 0), (p > 0).astype(np.int64)
    assert cm.step_time_s(p, d, cd, cp, s, num_decode_tokens=d).tolist() == cm.step_time_s(p, d, cd, cp, s).tolist()
    for row in zip(p.tolist(), d.tolist(), cd.tolist(), cp.tolist(), s.tolist()):
        assert cm.step_time_s(*row, num_decode_tokens=row[1]) == cm.step_time_s(*row)


def test_a_cost_model_without_num_decode_tokens_is_refused():
    class Old:
        def step_time_s(self, num_prefill_tokens, num_decode_seqs, decode_context_tokens, prefill_context_tokens=0,
                        num_prefill_seqs=None):
            return 0.01

    eng = Engine(Old(), get_scheduler_factory("chunked"), SchedulerConfig(num_speculative_tokens=2),
                 EngineConfig(1000, spec_acceptance_rate=0.5))
    with pytest.raises(ConfigError, match="num_decode_tokens"):
        eng.run([Request(0, "r", 0.0, 10, 5)])
    # without speculative decoding it is never asked for it
    eng = Engine(Old(), get_scheduler_factory("chunked"), SchedulerConfig(), EngineConfig(1000))
    eng.run([Request(0, "r", 0.0, 10, 5)])


# -- the draws -------------------------------------------------------------------------------------

COST = RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("a100-80gb"),
                         CostParams(eta_compute=0.6, eta_mem=0.8, t_step_s=2e-4))


def _trace(n=60, seed=0, rate=20.0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"request_id": [f"r{i}" for i in range(n)],
                         "arrival_time_s": np.cumsum(rng.exponential(1 / rate, n)),
                         "num_prompt_tokens": rng.integers(10, 2000, n), "num_output_tokens": rng.integers(1, 400, n)})


def test_accepted_drafts_are_a_prefix_of_bernoulli_trials():
    """A = 0.5, K = 3: mean accepted = 0.5 + 0.25 + 0.125 = 0.875, mean acceptance length 1.875;
    P(all 3 accepted) = 0.125; deterministic for a seed."""
    eng = Engine(COST, get_scheduler_factory("chunked"), SchedulerConfig(num_speculative_tokens=3),
                 EngineConfig(1000, spec_acceptance_rate=0.5, seed=7))
    a = np.array(eng.sample_accepted_drafts(0, [3] * 200_000))
    assert a.min() == 0 and a.max() == 3
    assert a.mean() == pytest.approx(0.875, abs=0.01)
    assert (a == 3).mean() == pytest.approx(0.125, abs=0.005) and (a == 0).mean() == pytest.approx(0.5, abs=0.005)
    again = Engine(COST, get_scheduler_factory("chunked"), SchedulerConfig(num_speculative_tokens=3),
                   EngineConfig(1000, spec_acceptance_rate=0.5, seed=7))
    assert again.sample_accepted_drafts(0, [3] * 1000) == a[:1000].tolist()
    assert all(x <= d for x, d in zip(eng.sample_accepted_drafts(0, [2, 0, 1] * 100), [2, 0, 1] * 100))


def test_replay_reports_acceptance_and_tpot_below_the_step_time():
    trace = _trace(rate=1.0)  # light load: decodes mostly in decode-only steps
    cfg = ReplayConfig(EngineOptions(num_speculative_tokens=3, spec_acceptance_rate=0.5),
                       record=RecordOptions(token_times=True, steps=True))
    res, eng = replay_frame(trace, COST, cfg)
    base, base_eng = replay_frame(trace, COST, ReplayConfig(record=RecordOptions(steps=True)))
    assert (res["pred_status"] == "ok").all()
    st_ = spec_decode_stats(eng)
    # per-draft 0.5: accepted / drafts = (0.875 - truncation) / 3, acceptance length near 1.875
    assert st_["acceptance_length"] == pytest.approx(1.875, abs=0.1)
    assert res["pred_num_accepted_tokens"].sum() == st_["num_accepted_tokens"]
    assert res["pred_num_draft_tokens"].sum() == st_["num_draft_tokens"]
    long = res["num_output_tokens"] > 50
    assert res.loc[long, "pred_acceptance_length"].between(1.0, 4.0).all()
    # fewer steps than without speculation, and the typical TPOT under the typical decode-only step
    steps = steps_frame(eng)
    decode_step = steps.loc[steps["num_prefill_tokens"] == 0, "step_duration_s"].median()
    assert res["pred_tpot_s"].median() < decode_step
    assert eng.num_steps < base_eng.num_steps
    # the same seed gives the same run; another seed another one
    again, _ = replay_frame(trace, COST, cfg)
    pd.testing.assert_frame_equal(res, again)
    other, _ = replay_frame(trace, COST, ReplayConfig(EngineOptions(num_speculative_tokens=3, spec_acceptance_rate=0.5,
                                                                    seed=1), record=RecordOptions(token_times=True)))
    assert not other["pred_e2e_s"].equals(res["pred_e2e_s"])


def test_acceptance_zero_emits_one_token_per_step_at_a_higher_cost():
    """A = 0: every draft rejected, the timeline is one token per step, each step priced on K + 1 positions."""
    trace = _trace(20)
    res, _ = replay_frame(trace, COST, ReplayConfig(EngineOptions(num_speculative_tokens=3, spec_acceptance_rate=0.0)))
    base, _ = replay_frame(trace, COST, ReplayConfig())
    assert (res["pred_e2e_s"] >= base["pred_e2e_s"] - 1e-12).all()
    assert (res["pred_num_accepted_tokens"] == 0).all()


@pytest.mark.parametrize("bad,needle", [(dict(num_speculative_tokens=2), "needs --spec-acceptance-rate"),
                                        (dict(spec_acceptance_rate=0.5), "give --speculative-tokens"),
                                        (dict(num_speculative_tokens=2, spec_acceptance_rate=1.5), r"\[0, 1\]"),
                                        (dict(long_prefill_token_threshold=-1), ">= 0")])
def test_bad_options(bad, needle):
    with pytest.raises(ConfigError, match=needle):
        replay_frame(_trace(3), COST, ReplayConfig(EngineOptions(**bad)))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 30), seed=st.integers(0, 2**16), scheduler=st.sampled_from(sorted(BUILTIN) + ["disagg"]),
       k=st.sampled_from([1, 3, 5]), a=st.sampled_from([0.0, 0.3, 0.8, 1.0]), budget=st.sampled_from([64, 2048]),
       blocks=st.sampled_from([300, 100000]), replicas=st.sampled_from([1, 2]), threshold=st.sampled_from([0, 200]))
def test_fast_path_equals_step_by_step_with_speculation(n, seed, scheduler, k, a, budget, blocks, replicas, threshold):
    extra = {} if scheduler == "disagg" else {"replicas": replicas}
    slow, fast = replay_both_paths(_trace(n, seed), COST, atol=0.0, scheduler=scheduler, max_num_batched_tokens=budget,
                                   num_gpu_blocks=blocks, speculative_tokens=k, spec_acceptance_rate=a, seed=seed,
                                   long_prefill_token_threshold=threshold, record_token_times=True, **extra)
    assert slow["pred_num_accepted_tokens"].tolist() == fast["pred_num_accepted_tokens"].tolist()
    ok = slow["pred_status"] == "ok"
    assert (slow.loc[ok, "pred_token_times_s"].map(len) == slow.loc[ok, "num_output_tokens"]).all()


def test_closed_loop_with_speculation():
    trace = _trace(30)
    res, _ = replay_frame(trace, COST, ReplayConfig(EngineOptions(num_speculative_tokens=2, spec_acceptance_rate=0.6),
                                                    closed_loop=ClosedLoopOptions(4)))
    assert (res["pred_status"] == "ok").all()


# -- the command line ---------------------------------------------------------------------------------

@pytest.fixture
def trace_and_calibration(tmp_path):
    from helpers import write_calibration
    from traces.io import write_trace
    from schemas.tables import REQUEST_TRACE

    cal, trace = tmp_path / "cal.json", tmp_path / "t.parquet"
    write_calibration(COST, cal)
    write_trace(_trace(40), REQUEST_TRACE, trace)
    return trace, cal


def test_replay_cli_options(trace_and_calibration, tmp_path):
    from replay.cli import main

    trace, cal = trace_and_calibration
    out = tmp_path / "pred.parquet"
    r = CliRunner().invoke(main, [str(trace), "--calibration", str(cal), "--speculative-tokens", "3",
                                  "--spec-acceptance-rate", "0.6", "--long-prefill-token-threshold", "512",
                                  "--seed", "3", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "speculative decoding: K=3, acceptance 0.6" in r.output and "long_prefill_token_threshold=512" in r.output
    assert "mean acceptance length" in r.output
    from traces.io import read_trace

    _, res, _ = read_trace(out)
    assert {"pred_num_draft_tokens", "pred_num_accepted_tokens", "pred_acceptance_length"} <= set(res.columns)
    r = CliRunner().invoke(main, [str(trace), "--calibration", str(cal), "--spec-acceptance-rate", "0.6"])
    assert r.exit_code == 2 and "--speculative-tokens" in r.output
    r = CliRunner().invoke(main, [str(trace), "--calibration", str(cal), "--speculative-tokens", "2",
                                  "--spec-acceptance-rate", "1.2"])
    assert r.exit_code == 2


def test_calibrate_fit_has_the_options_and_records_them():
    from calibrate.cli import main as calibrate
    from calibrate.request_fit import engine_settings

    help_text = CliRunner().invoke(calibrate, ["fit", "--help"]).output
    for opt in ("--long-prefill-token-threshold", "--speculative-tokens", "--spec-acceptance-rate"):
        assert opt in help_text
    rec = engine_settings(ReplayConfig(EngineOptions(long_prefill_token_threshold=512, num_speculative_tokens=3,
                                                     spec_acceptance_rate=0.7)))
    assert (rec["long_prefill_token_threshold"], rec["num_speculative_tokens"],
            rec["spec_acceptance_rate"]) == (512, 3, 0.7)
