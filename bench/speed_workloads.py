"""The workloads and the reference simulators bench/replay_speed.py measures servecal's engine against.

The cost model and workloads every case shares (:func:`cost_model`, :func:`workload`), the minimal
continuous-batching loop the engine's speed is a ratio to (:func:`run_reference`), the engine itself on
the same workload (:func:`run_engine`), and sched-sim
0.2.1 on the same requests when it is installed (:func:`run_sched_sim`). Each ``run_*`` takes one
tuple of arguments and returns ``(wall s, requests, steps, peak RSS MB, ...)``, so that
bench/replay_speed.py can run it in a fresh process.
"""
from __future__ import annotations

import resource
import time
from collections import deque
from pathlib import Path

REAL = Path(__file__).resolve().parents[2] / "shared" / "data" / "real"


def cost_model():
    from replay.cost.cost_model import RooflineCostModel
    from schemas.cost_params import CostParams
    from schemas.specs import get_gpu, get_model

    return RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb"),
                             CostParams(eta_compute=0.6, eta_mem=0.85, t_step_s=3e-4))


def workload(kind: str, n: int, rate: float):
    if kind == "azure-conv":
        from traces.importers.azure import import_azure

        df, _ = import_azure(REAL / "azure_llm_2023_conv.csv")
        return df
    from traces.synth import synth_requests

    return synth_requests(n, rate, "lognormal:mean=512,sigma=0.8", "lognormal:mean=128,sigma=0.8", seed=0)


def run_engine(args):
    kind, n, rate, scheduler, exact = args
    from replay.config import EngineOptions, ReplayConfig, SchedulingOptions
    from replay.simulate import replay_frame

    df = workload(kind, n, rate)
    t = time.perf_counter()
    res, eng = replay_frame(df, cost_model(), ReplayConfig(EngineOptions(max_num_seqs=256, max_num_batched_tokens=8192),
                                                           SchedulingOptions(scheduler), exact_steps=exact))
    wall = time.perf_counter() - t
    return wall, len(df), eng.num_steps, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_reference(args):
    """Minimal continuous-batching loop: decode-first, chunked prefill, aggregates only."""
    kind, n, rate = args
    df = workload(kind, n, rate)
    cm = cost_model()
    arr = df["arrival_time_s"].to_numpy().tolist()
    prompt = df["num_prompt_tokens"].to_numpy().tolist()
    out = df["num_output_tokens"].to_numpy().tolist()
    t0 = time.perf_counter()
    budget, max_seqs = 8192, 256
    now, i, n_req, steps = 0.0, 0, len(arr), 0
    waiting, running = deque(), []  # a request: [prompt tokens left, output tokens left, context]
    while i < n_req or waiting or running:
        while i < n_req and arr[i] <= now:
            waiting.append([prompt[i], out[i], 0])
            i += 1
        if not waiting and not running:
            now = arr[i]
            continue
        while waiting and len(running) < max_seqs:
            running.append(waiting.popleft())
        left, pre, dec, ctx = budget, 0, 0, 0
        fed = []
        for r in running:  # decodes first, then prompt chunks in admission order
            if r[0] == 0:
                dec += 1
                ctx += r[2] + 1
                left -= 1
        for r in running:
            if r[0] > 0 and left > 0:
                c = min(r[0], left)
                pre += c
                left -= c
                fed.append((r, c))
        now += cm.step_time_s(pre, dec, ctx, 0)
        steps += 1
        for r in running:  # decodes emit a token
            if r[0] == 0:
                r[1] -= 1
                r[2] += 1
        for r, c in fed:
            r[0] -= c
            r[2] += c
            if r[0] == 0:
                r[1] -= 1  # the last chunk emits the first token
        running = [r for r in running if r[1] > 0]
    wall = time.perf_counter() - t0
    return wall, n_req, steps, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def sched_sim_version() -> str | None:
    """The installed sched-sim's version, None when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sched-sim")
    except PackageNotFoundError:
        return None


#: sched-sim runs stop at this multiple of the last arrival, in simulated time (see run_sched_sim).
SCHED_SIM_HORIZON = 10


def run_sched_sim(args):
    """sched-sim's chunked-prefill scheduler on the same requests: ``submit_workload`` + ``run()`` timed.

    Its cost model and scheduling differ from ours, so the ratio is about simulator speed on
    the same request stream, not about identical predictions. The hardware is its "h100"
    preset (which carries Llama-3-70B) with the model fields of its only Llama-3-8B preset
    ("a100"), and our GPU's peaks, efficiencies and launch time; its roofline is then ours
    without the prefill context's KV reads. Its chunked scheduler takes the token budget
    (8192) but ignores ``max_batch_size``, so nothing caps the running sequences at 256 but
    the KV cache; preemption recomputes; a request takes one more decode step than ours (its
    last prefill chunk emits no token). Building its pydantic Requests is not timed.

    Returns wall, requests, iterations (forward passes), peak RSS in MB and completed requests.
    """
    kind, n, rate = args
    from sched_sim.core.event_engine import Simulator
    from sched_sim.core.request import Request
    from sched_sim.hardware.presets import PRESETS
    from sched_sim.memory.preemption import PreemptionMode
    from sched_sim.schedulers.factory import create_scheduler

    df = workload(kind, n, rate)
    cm, llama8b = cost_model(), PRESETS["a100"]
    hw = PRESETS["h100"].model_copy(update={
        **{k: getattr(llama8b, k) for k in ("model_name", "parameter_count_billions", "num_layers", "hidden_size",
                                            "num_heads", "num_kv_heads", "head_dim", "dtype_bytes")},
        "fp16_tflops": cm.gpu.peak_flops / 1e12, "tensor_core_efficiency": cm.params.eta_compute,
        "memory_bandwidth_gb_s": cm.params.eta_mem * cm.gpu.mem_bandwidth_bytes_per_s / 1e9,
        "kernel_launch_overhead_ms": cm.params.t_step_s * 1e3})
    arr = df["arrival_time_s"].to_numpy().tolist()
    prompt, out = df["num_prompt_tokens"].to_numpy().tolist(), df["num_output_tokens"].to_numpy().tolist()
    reqs = [Request(request_id=str(i), arrived_at=a, prompt_tokens=pr, output_tokens=o)
            for i, (a, pr, o) in enumerate(zip(arr, prompt, out))]
    sched = create_scheduler("chunked", hw, PreemptionMode.RECOMPUTE, token_budget=8192, max_batch_size=256)
    sim = Simulator(hw, sched, PreemptionMode.RECOMPUTE)
    t = time.perf_counter()
    sim.submit_workload(reqs)
    # Once the KV cache is full, 0.2.1 preempts the same (already freed) victim again, and the
    # decode that needed the slot goes back to the waiting queue fully prefilled, where it is
    # never scheduled again: run() then polls every 5 ms forever. A simulated-time horizon far
    # past any finishing run ends it, with fewer requests completed.
    m = sim.run(max_duration_s=SCHED_SIM_HORIZON * max(arr))
    wall = time.perf_counter() - t
    return wall, len(reqs), m.total_iterations, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, \
        m.completed_requests
