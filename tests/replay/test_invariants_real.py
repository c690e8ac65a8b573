"""Invariants on every built-in scheduler's replay of the real traces (issue #4)."""
import numpy as np
import pytest

from replay.cost.cost_model import RooflineCostModel
from schemas.cost_params import CostParams
from replay.schedulers import BUILTIN
from replay.config import EngineOptions, RecordOptions, ReplayConfig, SchedulingOptions
from replay.simulate import replay_frame
from schemas.specs import get_gpu, get_model
from traces.importers.mooncake import import_mooncake
from traces.importers.vllm_request_stats import import_vllm_request_stats

COST = RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("rtx-pro-6000"),
                         CostParams(eta_compute=0.93, eta_mem=0.89, t_step_s=0.0, overlap=1.0))


@pytest.fixture(scope="module")
def real_traces(real_data_dir):
    llama, _ = import_vllm_request_stats(real_data_dir / "lss_vllm_rtxpro6000_llama31_8b_requests.jsonl")
    mooncake, meta = import_mooncake(real_data_dir / "mooncake_synthetic_trace.jsonl")
    return {"llama": (llama, {}), "mooncake": (mooncake.iloc[:400].reset_index(drop=True), meta)}


@pytest.mark.parametrize("trace", ["llama", "mooncake"])
@pytest.mark.parametrize("scheduler", [*sorted(BUILTIN), "disagg"])
def test_invariants_on_real_traces(real_traces, trace, scheduler):
    df, meta = real_traces[trace]
    # a small KV cache (about 30 long Mooncake prompts) makes preemption and rejection happen
    cfg = ReplayConfig(EngineOptions(max_num_seqs=128, max_num_batched_tokens=2048, num_gpu_blocks=30000,
                                     enable_prefix_caching=trace == "mooncake"),
                       SchedulingOptions(scheduler), record=RecordOptions(token_times=True))
    res, eng = replay_frame(df, COST, cfg, meta)
    ok = res["pred_status"] == "ok"
    assert (ok | res["pred_status"].str.startswith("rejected")).all()  # every request completed or given a status
    assert ok.sum() > 0.9 * len(res)
    for times, n, status in zip(res["pred_token_times_s"], res["num_output_tokens"], res["pred_status"]):
        if status != "ok":
            continue
        t = np.asarray(times)
        assert len(t) == n  # tokens conserved: each output token emitted exactly once
        assert t[0] > 0  # relative to arrival: no token before arrival
        assert np.all(np.diff(t) > 0)  # monotone per request
    assert (res.loc[ok, "pred_queue_wait_s"] >= 0).all()
    assert (res.loc[ok, "pred_ttft_s"] >= res.loc[ok, "pred_queue_wait_s"]).all()
    for state in eng.replicas:  # every block returned, never more than the capacity
        assert state.kv.num_free_blocks == state.kv.num_gpu_blocks
        assert not state.running and not state.waiting
