"""Replay speed of servecal's engine, as ratios to a minimal reference loop measured in the same run.

Usage: python bench/replay_speed.py [--requests 1000000] [--quick]

Each case runs in its own process (so peak RSS is per case). Workloads:
  * the real Azure LLM inference 2023 conv trace (19,366 requests), when ../shared/data/real has it;
  * N synthetic requests (Poisson, lognormal lengths) at ~75 % of the engine's measured capacity;
  * the same at 2x capacity (overloaded), at N/10 and N to check linear growth.
Schedulers: chunked, fcfs, disagg (when available). The engine's step-by-step path
(--exact-steps) and a minimal reference loop (continuous batching with incremental
aggregates, no KV cache, no per-request bookkeeping beyond counters) run on the same
workload. sched-sim 0.2.1 is timed too when installed.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import platform
import resource
import time
from collections import deque
from pathlib import Path


REAL = Path(__file__).resolve().parents[2] / "shared" / "data" / "real"


def cost_model():
    from replay.cost_model import CostParams, RooflineCostModel
    from schemas.specs import get_gpu, get_model

    return RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb"), CostParams(0.6, 0.85, 3e-4))


def workload(kind: str, n: int, rate: float):
    if kind == "azure-conv":
        from traces.importers.azure import import_azure

        df, _ = import_azure(REAL / "azure_llm_2023_conv.csv")
        return df
    from traces.synth import synth_requests

    return synth_requests(n, rate, "lognormal:mean=512,sigma=0.8", "lognormal:mean=128,sigma=0.8", seed=0)


def run_engine(args):
    kind, n, rate, scheduler, exact = args
    from replay.simulate import ReplayConfig, replay_frame

    df = workload(kind, n, rate)
    t = time.perf_counter()
    res, eng = replay_frame(df, cost_model(), ReplayConfig(scheduler=scheduler, max_num_seqs=256,
                                                           max_num_batched_tokens=8192, exact_steps=exact))
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


def capacity_rps(n: int = 20000) -> float:
    """Completed requests/s of the chunked engine when every request is queued at once."""
    from replay.simulate import ReplayConfig, replay_frame
    from traces.synth import synth_requests

    df = synth_requests(n, 1e6, "lognormal:mean=512,sigma=0.8", "lognormal:mean=128,sigma=0.8", seed=0)
    res, _ = replay_frame(df, cost_model(), ReplayConfig(max_num_seqs=256, max_num_batched_tokens=8192))
    return n / float((res["arrival_time_s"] + res["pred_e2e_s"]).max())


def in_process(fn, args):
    with mp.get_context("spawn").Pool(1) as pool:
        return pool.apply(fn, (args,))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--schedulers", default="chunked,fcfs,disagg")
    args = ap.parse_args()
    cap = capacity_rps()
    n = args.requests
    cpu = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                if l.startswith("model name")), platform.processor())
    print(f"machine: {cpu}, {mp.cpu_count()} cores, Python {platform.python_version()}")
    print(f"engine capacity (chunked, H100 Llama-3.1-8B roofline, lognormal 512/128): {cap:.1f} req/s")
    cases = []
    if (REAL / "azure_llm_2023_conv.csv").exists():
        cases.append(("azure-conv", 0, 0.0))
    cases += [("synthetic-75%", n, 0.75 * cap), ("overloaded-2x", n // 10, 2 * cap), ("overloaded-2x", n, 2 * cap)]
    from replay.schedulers import BUILTIN

    scheds = [s for s in args.schedulers.split(",") if s in BUILTIN or s == "disagg"]
    print(f"{'workload':>14} {'requests':>9} {'scheduler':>9} {'path':>10} {'wall_s':>8} {'req/s':>9} "
          f"{'steps/s':>9} {'rss_MB':>7} {'vs ref':>7}")
    for kind, cn, rate in cases:
        wl = "synthetic" if kind != "azure-conv" else kind
        ref = in_process(run_reference, (wl, cn, rate))
        rows = [("reference", "loop", ref)]
        for s in scheds:
            rows.append((s, "fast", in_process(run_engine, (wl, cn, rate, s, False))))
            if s == "chunked":
                rows.append((s, "exact", in_process(run_engine, (wl, cn, rate, s, True))))
        for s, path, (wall, nr, steps, rss) in rows:
            print(f"{kind:>14} {nr:>9} {s:>9} {path:>10} {wall:>8.2f} {nr / wall:>9.0f} {steps / wall:>9.0f} "
                  f"{rss:>7.0f} {ref[0] / wall:>7.2f}")
    try:
        import sched_sim  # noqa: F401
        print("sched-sim is installed, but its driver is not wired in this script yet")
    except ImportError:
        print("sched-sim not installed: no comparison (pip install sched-sim==0.2.1 to add it)")


if __name__ == "__main__":
    main()
