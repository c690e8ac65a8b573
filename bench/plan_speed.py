"""Speed of ``servecal plan``: a plan over >= 200 candidates, as a ratio to one replay of its trace.

Usage: python bench/plan_speed.py [--requests 10000] [--rate 60] [--jobs N] [--confidence band]

The trace is synthetic (traces.synth.synth_requests: Poisson arrivals, lognormal lengths of
mean 1,024 prompt / 128 output tokens); the calibration is hand-made: Llama-3.1-8B on one
H100 (eta_compute 0.6, eta_mem 0.85, t_step 0.3 ms) with six band points (each of the three
moved to an end of a plausible 95 % interval). The grid is h100-80gb and a100-80gb (the
latter carried from the H100 calibration), TP 1, 2, 4, replicas 1..8, max_num_seqs 64, 128,
256 and token budgets 2,048 and 8,192: 288 candidates. SLO: TTFT p90 <= 500 ms and TPOT p90
<= 50 ms at the target rate. One replay of the trace (2 x H100 TP1 at the target rate,
in this process) is timed first, in the same run, and the plan's wall time is given as a
multiple of it.
"""
from __future__ import annotations

import argparse
import os
import platform
import time

from replay.config import ReplayConfig
from replay.cost.cost_model import cost_model_from_calibration
from replay.cost.cost_terms import DEFAULT_TERMS
from replay.plan import Axes, Calibrations, parse_slo, plan_deployments
from replay.simulate import replay_frame
from schemas.calibration import Calibration, FittedParam
from schemas.specs import get_gpu, get_model
from traces.synth import synth_requests

VALUES = {"eta_compute": 0.6, "eta_mem": 0.85, "t_step_s": 3e-4}
CI = {"eta_compute": (0.45, 0.75), "eta_mem": (0.8, 0.9), "t_step_s": (1e-4, 5e-4)}
ENGINE = {"max_num_seqs": 256, "max_num_batched_tokens": 8192, "block_size": 16, "gpu_memory_utilization": 0.9,
          "scheduler": "chunked", "replicas": 1}
SLO = "ttft_p90=500ms,tpot_p90=50ms"


def calibration() -> Calibration:
    params = {k: FittedParam(v, ci95=CI[k]) for k, v in VALUES.items()}
    points = [{k: end} for k, (lo, hi) in CI.items() for end in (lo, hi)]
    return Calibration(get_model("llama-3.1-8b"), get_gpu("h100-80gb"), 1, params, terms=list(DEFAULT_TERMS),
                       engine=dict(ENGINE), band_points=points)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=60.0, help="target rate, req/s")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--confidence", default="band", choices=("band", "point"))
    args = ap.parse_args()

    trace = synth_requests(args.requests, args.rate, "lognormal:mean=1024,sigma=0.8",
                           "lognormal:mean=128,sigma=0.8", seed=0)
    cal = calibration()
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    cfg = ReplayConfig.from_options(max_num_seqs=256, max_num_batched_tokens=8192, replicas=2)
    replay_frame(trace, cost_model_from_calibration(cal), cfg)
    one = time.perf_counter() - t0

    axes = Axes(["h100-80gb", "a100-80gb"], [1, 2, 4], list(range(1, 9)), [64, 128, 256], [2048, 8192],
                ["chunked"])
    t0 = time.perf_counter()
    plan = plan_deployments(trace, {}, Calibrations([("bench", cal)]), axes, parse_slo([SLO]), rate_rps=args.rate,
                            confidence=args.confidence, jobs=args.jobs)
    wall = time.perf_counter() - t0
    res = plan.result
    n = len(res.evaluations)
    print(f"machine: {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}")
    print(f"trace: {args.requests} requests at {args.rate:g} req/s; one replay (2 x h100-80gb TP1): {one:.2f} s")
    print(f"plan: {n} candidates, {res.replays} replays, confidence {args.confidence}: {wall:.1f} s wall "
          f"= {wall / one:.0f}x one replay (points and bands {res.timings_s['points_and_bands']:.1f} s, "
          f"max rate {res.timings_s['max_rate']:.1f} s); load average before/after "
          f"{load0[0]:.1f}/{os.getloadavg()[0]:.1f}")
    status = {}
    for ev in res.evaluations:
        status[ev.status] = status.get(ev.status, 0) + 1
    print("statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(status.items())))
    if res.answer is not None:
        a = res.answer
        print(f"answer: {a.candidate.label()} max_num_seqs={a.candidate.max_num_seqs} "
              f"budget={a.candidate.max_num_batched_tokens}, ttft_p90 {a.point['ttft_p90_s'] * 1e3:.0f} ms "
              f"[{a.band.low['ttft_p90_s'] * 1e3:.0f}, {a.band.high['ttft_p90_s'] * 1e3:.0f}], "
              f"max rate {a.max_rate_rps:.1f} req/s")


if __name__ == "__main__":
    main()
