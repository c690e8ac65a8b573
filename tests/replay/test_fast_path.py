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
@given(trace=traces(), scheduler=st.sampled_from(sorted(BUILTIN)), budget=st.sampled_from([512, 2048, 8192]),
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
