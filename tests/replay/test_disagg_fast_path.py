"""Disaggregation's fast path: the decode pool's implicit decoders repeat in place when the step-end
hook would change nothing (Engine._close_step, DisaggEngine._quiet_step_end), and the replay is the
step-by-step one to the bit: every token time, transfer, wait and recorded step."""
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from helpers import replay_both_paths
from replay.config import RecordOptions, ReplayConfig
from replay.core.disagg import DisaggEngine
from replay.core.result_columns import steps_frame
from replay.cost.cost_model import RooflineCostModel
from replay.schedulers.implicit_decoders import LazyDecodes
from replay.simulate import replay_frame
from schemas.cost_params import CostParams
from schemas.specs import get_gpu, get_model

COST = RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb"),
                         CostParams(eta_compute=0.5, eta_mem=0.8, t_step_s=1e-4))
TRANSFER_COLUMNS = ["pred_decode_replica_id", "pred_kv_transfer_s", "pred_decode_queue_wait_s", "pred_handoff_wait_s"]


def steady_trace(seed: int, n: int = 120, gap_s: float = 0.03) -> pd.DataFrame:
    """Poisson arrivals, prompts of 1-2,000 tokens and outputs of 1-300: the decode pool holds a steady
    group of decoders between hand-overs (its implicit decoders then repeat)."""
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"request_id": [f"r{i}" for i in range(n)],
                         "arrival_time_s": np.cumsum(rng.exponential(gap_s, n)),
                         "num_prompt_tokens": rng.integers(1, 2000, n), "num_output_tokens": rng.integers(1, 300, n)})


def both_paths_bit_for_bit(trace, **config):
    """Replay ``trace`` step by step and on the fast path; assert the token times (to the bit), the
    transfer columns and the recorded steps agree. Returns the fast path's engine."""
    exact, fast = replay_both_paths(trace, COST, atol=0.0, record_token_times=True, scheduler="disagg", **config)
    for name in TRANSFER_COLUMNS:
        assert np.array_equal(exact[name].to_numpy(), fast[name].to_numpy(), equal_nan=True), name
    engines = [replay_frame(trace, COST, ReplayConfig.from_options(RecordOptions(steps=True), exact_steps=exact_steps,
                                                                   scheduler="disagg", **config))[1]
               for exact_steps in (True, False)]
    pd.testing.assert_frame_equal(*map(steps_frame, engines), check_exact=True)
    return engines[1]


@pytest.fixture
def repeats(monkeypatch):
    """Counts the implicit decoders' in-place repeats that succeed."""
    done = []
    repeat = LazyDecodes.repeat

    def counted(self, *args):
        ok = repeat(self, *args)
        done.append(ok)
        return ok

    monkeypatch.setattr(LazyDecodes, "repeat", counted)
    return done


@pytest.mark.parametrize("kv_handoff", ["pull", "prealloc", "push"])
@pytest.mark.parametrize("first_token_from", ["prefill", "decode"])
@pytest.mark.parametrize("decode_replicas,blocks", [(1, 100000), (2, 100000), (1, 600)])
def test_the_decode_pool_repeats_in_place_and_gives_the_step_by_step_replay(kv_handoff, first_token_from,
                                                                            decode_replicas, blocks, repeats):
    """Every hand-off mode and first-token mode, one or two decode instances, a cache large enough and one
    small enough that finished prompts wait for room (pull, prealloc) or the decode pool preempts (push)."""
    trace = steady_trace(seed=decode_replicas * 7 + blocks % 7 + len(kv_handoff))
    both_paths_bit_for_bit(trace, kv_handoff=kv_handoff, first_token_from=first_token_from,
                           decode_replicas=decode_replicas, num_gpu_blocks=blocks, max_num_batched_tokens=1024)
    assert sum(repeats) > 50  # the decode pool took the in-place repeat, not only the step-by-step path


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(1, 60), gap_s=st.sampled_from([0.0, 0.005, 0.05, 0.3]),
       kv_handoff=st.sampled_from(["pull", "prealloc", "push"]),
       first_token_from=st.sampled_from(["prefill", "decode"]), prefill_replicas=st.sampled_from([1, 2]),
       decode_replicas=st.sampled_from([1, 2]),
       blocks=st.sampled_from([200, 2000, 100000]), budget=st.sampled_from([256, 2048]),
       max_num_seqs=st.sampled_from([2, 16, 256]))
def test_disagg_fast_path_equals_step_by_step(seed, n, gap_s, kv_handoff, first_token_from, prefill_replicas,
                                              decode_replicas, blocks, budget, max_num_seqs):
    """Random traces, pools and caches (found: prealloc, a small cache, max_num_seqs 2: a closed-form decode run
    began with a transferred request just admitted, whose reserved blocks an arrival mid-run still saw held)."""
    both_paths_bit_for_bit(steady_trace(seed, n, gap_s), kv_handoff=kv_handoff, first_token_from=first_token_from,
                           prefill_replicas=prefill_replicas, decode_replicas=decode_replicas, num_gpu_blocks=blocks,
                           max_num_batched_tokens=budget, max_num_seqs=max_num_seqs)


def _hook_state(eng: DisaggEngine) -> tuple:
    """What DisaggEngine's step-end hook may change."""
    return (list(eng._unaccepted), list(eng._prealloc), list(eng._accepted_blocks), list(eng._unadmitted),
            list(eng._inbound), eng._num_in_flight, dict(eng._handoff_wait), dict(eng._reserved_at),
            list(eng.loop_busy_until_s), list(eng._migrated_until_s), len(eng._heap),
            sorted((i, t.decode_admitted_time_s) for i, t in eng.transfers.items()),
            [list(s.handed_over) for s in eng.prefill_schedulers], [s.kv.num_free_blocks for s in eng.replicas])


@pytest.mark.parametrize("kv_handoff", ["pull", "prealloc", "push"])
def test_a_quiet_step_end_is_one_the_hook_changes_nothing_at(kv_handoff, monkeypatch):
    """On the step-by-step path every step end calls the hook: whenever _quiet_step_end said it would change
    nothing, it changed nothing (the state it may touch is the same after it); both answers occur."""
    seen = []
    hook = DisaggEngine._after_step

    def checked(self, rid, now):
        quiet = self._quiet_step_end(rid)
        before = _hook_state(self) if quiet else None
        hook(self, rid, now)
        seen.append(quiet)
        if quiet:
            assert _hook_state(self) == before, (rid, now)

    monkeypatch.setattr(DisaggEngine, "_after_step", checked)
    config = dict(scheduler="disagg", kv_handoff=kv_handoff, decode_replicas=2, num_gpu_blocks=600,
                  max_num_batched_tokens=1024)
    replay_frame(steady_trace(seed=3), COST, ReplayConfig.from_options(exact_steps=True, **config))
    assert any(seen) and not all(seen)
