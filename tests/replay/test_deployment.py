"""The deployment a replay resolves before building its engine (replay/core/deployment.py), by hand.

The model and GPU of case NC-04 (tests/replay/test_kv_capacity.py) without its activation and
non-torch memory: 16 GiB of weights, 80 GiB x 0.9 = 72 GiB requested per GPU, a KV block of 16
tokens over all 32 layers of 2 MiB (8 KV heads x 128 x 2 (K, V) x 2 B x 32 layers x 16 tokens).
"""
from __future__ import annotations

import pandas as pd
import pytest

from replay.config import DisaggOptions, EngineOptions, ReplayConfig, SchedulingOptions
from replay.core.deployment import resolve_deployment
from replay.cost.cost_model import RooflineCostModel
from replay.errors import ConfigError
from replay.simulate import replay_frame
from schemas.specs import GpuSpec, ModelSpec

GiB = 2**30
MODEL = ModelSpec(name="nc04", num_params=8 * GiB, num_active_params=8 * GiB, num_layers=32, hidden_size=4096,
                  num_attention_heads=32, num_kv_heads=8, head_dim=128, dtype_bytes=2, max_model_len=32768)
GPU = GpuSpec("80gib", 1e15, 2e12, 80 * GiB)
TRACE = pd.DataFrame({"request_id": ["a", "b"], "arrival_time_s": [0.0, 0.1], "num_prompt_tokens": [10, 20],
                      "num_output_tokens": [2, 3]})


def test_disaggregated_pipelined_pools_by_hand():
    cfg = ReplayConfig(scheduling=SchedulingOptions("disagg"),
                       disagg=DisaggOptions(prefill_replicas=2, decode_replicas=3, pp_prefill=2, tp_decode=2,
                                            pp_decode=2, link="100gbe"))
    dep = resolve_deployment(RooflineCostModel(MODEL, GPU), cfg)
    p, d = dep.prefill, dep.decode
    assert (p.replicas, p.tp, p.pp, p.dp) == (2, 1, 2, 1)
    assert (d.replicas, d.tp, d.pp, d.dp) == (3, 2, 2, 1)
    assert (p.cost_model.tp, p.cost_model.pp, d.cost_model.tp, d.cost_model.pp) == (1, 2, 2, 2)
    # prefill, TP 1 x PP 2: (72 - 16 / 2) GiB / (2 MiB / 2) = 65,536 per replica; 32,768 per virtual engine
    assert p.num_gpu_blocks == 64 * 1024 // 2 == 32_768
    assert p.kv_how == "65536 sized from 80gib memory at --gpu-memory-utilization 0.9 // PP 2"
    # decode, TP 2 x PP 2: (72 - 16 / 4) GiB / (2 MiB / 2 / 2) = 139,264 per replica; 69,632 per virtual engine
    assert d.num_gpu_blocks == 68 * 2048 // 2 == 69_632
    assert d.kv_how == "139264 sized from 80gib memory at --gpu-memory-utilization 0.9 // PP 2"
    assert dep.link.name == "100gbe" and dep.policy is None and dep.pipelined
    assert dep.engine_config.num_gpu_blocks == 32_768 and dep.engine_config.exact_steps
    assert dep.engine_config.max_request_blocks is None
    # the engine holds what the record says: 2 x 2 prefill virtual engines, then 3 x 2 decode ones
    _, engine = replay_frame(TRACE, RooflineCostModel(MODEL, GPU), cfg)
    assert [s.kv.num_gpu_blocks for s in engine.replicas] == [32_768] * 4 + [69_632] * 6


def test_data_parallel_replicas_by_hand():
    cfg = ReplayConfig(EngineOptions(max_num_seqs=128, max_num_batched_tokens=4096),
                       SchedulingOptions("fcfs", replicas=2))
    dep = resolve_deployment(RooflineCostModel(MODEL, GPU, dp=2), cfg)
    p = dep.prefill
    assert (p.replicas, p.tp, p.pp, p.dp) == (2, 1, 1, 2) and dep.decode is None and dep.link is None
    # a rank: (72 - 16) GiB / 2 MiB = 28,672 blocks; the replica of 2 lock-step ranks holds both
    assert p.num_gpu_blocks == 2 * 28_672 == 57_344
    assert p.kv_how == "28672 sized from 80gib memory at --gpu-memory-utilization 0.9 x DP 2"
    assert dep.engine_config.num_gpu_blocks == 57_344 and dep.engine_config.max_request_blocks == 28_672
    s = dep.scheduler_config
    assert (s.max_num_seqs, s.max_num_batched_tokens, s.long_prefill_token_threshold) == (256, 8192, 4096)
    assert not dep.pipelined and not dep.engine_config.exact_steps
    _, engine = replay_frame(TRACE, RooflineCostModel(MODEL, GPU, dp=2), cfg)
    assert [s.kv.num_gpu_blocks for s in engine.replicas] == [57_344] * 2


def test_given_blocks_and_metadata():
    cfg = ReplayConfig(EngineOptions(num_gpu_blocks=1000, enable_prefix_caching=True))
    dep = resolve_deployment(RooflineCostModel(MODEL, GPU, dp=2), cfg, {"hash_block_tokens": 512})
    assert dep.prefill.num_gpu_blocks == 2000 and dep.prefill.kv_how == "--num-gpu-blocks 1000 x DP 2"
    assert dep.engine_config.hash_block_size == 512


def test_errors_before_any_engine():
    with pytest.raises(ConfigError, match="--pp with --data-parallel-size is not modelled"):
        resolve_deployment(RooflineCostModel(MODEL, GPU, dp=2, pp=2), ReplayConfig())
    with pytest.raises(ConfigError, match="--pp-decode 4: each virtual engine needs at least one KV block"):
        resolve_deployment(RooflineCostModel(MODEL, GPU),
                           ReplayConfig(EngineOptions(num_gpu_blocks=3), SchedulingOptions("disagg"),
                                        DisaggOptions(pp_decode=4)))
    with pytest.raises(ConfigError, match="--scheduler nope: unknown"):
        resolve_deployment(RooflineCostModel(MODEL, GPU), ReplayConfig(scheduling=SchedulingOptions("nope")))
