"""A fingerprint of replays and cost coefficients at PP 1, to check that pipeline parallelism
changed nothing without it (tests/replay/test_pipeline_parallel.py).

``python tests/pp_golden.py OUT.json`` writes it. ``tests/data/pp1_golden.json`` was written by
running this file against the code *before* pipeline parallelism (main at 090a9a3:
``PYTHONPATH=<main checkout> python tests/pp_golden.py tests/data/pp1_golden.json``); it uses
only names that existed then. Rewritten since where a change was meant to move a PP-1 replay, each time
with every other entry checked bit-identical first: the cost coefficients' list when ``memory_per_seq``
was added (issue #35), the ``disagg`` replay when DistServe's decode loop began to migrate KV one request
at a time between its steps (issue #34).
"""
from __future__ import annotations

import hashlib
import json
import sys

from replay.config import DisaggOptions, EngineOptions, RecordOptions, ReplayConfig, SchedulingOptions
from replay.cost.cost_model import RooflineCostModel
from replay.simulate import replay_frame
from schemas.cost_params import CostParams
from schemas.specs import get_gpu, get_model
from schemas.step_record import StepRow
from traces.synth import synth_requests

PARAMS = CostParams(eta_compute=0.55, eta_mem=0.8, t_step_s=3e-4, t_seq_s=2e-5, overlap=0.3)


def cost_models() -> dict:
    """Cost models whose every term is non-zero somewhere (TP all-reduce, MoE with EP)."""
    llama, h100 = get_model("llama-3.1-8b"), get_gpu("h100-80gb")
    return {"llama_tp1": RooflineCostModel(llama, h100, PARAMS),
            "llama_tp2": RooflineCostModel(llama, h100, PARAMS, 2),
            "qwen3_moe_tp2_ep": RooflineCostModel(get_model("qwen3-30b-a3b"), h100, PARAMS, 2, expert_parallel=True)}


def _digest(result, engine) -> str:
    h = hashlib.sha256()
    for times in result["pred_token_times_s"]:
        h.update(b"|" + ",".join(float(t).hex() for t in (times if times is not None else [])).encode())
    for row in engine.steps:  # the step record's fields then (num_decode_tokens came later; = num_decode_seqs here)
        row = tuple(v for name, v in zip(StepRow._fields, row) if name != "num_decode_tokens")
        h.update(repr(tuple(float(v).hex() if isinstance(v, float) else v for v in row)).encode())
    return h.hexdigest()


def fingerprint() -> dict:
    out = {"coefficients": {k: [float(v).hex() for v in cm.coefficients.as_tuple()] for k, cm in cost_models().items()}}
    trace = synth_requests(300, 25.0, "lognormal:mean=700,sigma=0.8", "lognormal:mean=120,sigma=0.8", seed=7)
    record = RecordOptions(token_times=True, steps=True)
    cm = cost_models()["llama_tp2"]
    cases = {
        "chunked": ReplayConfig(EngineOptions(max_num_seqs=64, max_num_batched_tokens=1024), record=record),
        "chunked_exact": ReplayConfig(EngineOptions(max_num_seqs=64, max_num_batched_tokens=1024), record=record,
                                      exact_steps=True),
        "fcfs_swap": ReplayConfig(EngineOptions(num_gpu_blocks=400, preemption_mode="swap"),
                                  SchedulingOptions("fcfs", replicas=2, router="least_loaded"), record=record),
        "disagg": ReplayConfig(EngineOptions(max_num_batched_tokens=2048), SchedulingOptions("disagg"),
                               DisaggOptions(decode_replicas=2, tp_decode=1), record=record),
    }
    out["replays"] = {}
    for name, cfg in cases.items():
        result, engine = replay_frame(trace, cm, cfg)
        out["replays"][name] = {"digest": _digest(result, engine), "num_steps": engine.num_steps,
                                "kv_blocks": engine.replicas[0].kv.num_gpu_blocks,
                                "e2e_sum_hex": float(result["pred_e2e_s"].sum()).hex()}
    return out


if __name__ == "__main__":
    with open(sys.argv[1], "w") as f:
        json.dump(fingerprint(), f, indent=1)
        f.write("\n")
