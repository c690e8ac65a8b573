"""Admission cost of the ordered policies: N simultaneous arrivals under chunked, sjf and edf.

    python bench/sched_speed.py [--requests 100000] [--repeat 1] [--reference 20000]

Every request arrives at t=0 (the worst case for a policy that re-sorts its queue: the whole
burst waits). ``sjf`` and ``edf`` keep the queue in heaps (``replay.schedulers.keyed_queue``),
O(log n) per admission; the check is that they stay within 2x of ``chunked`` (FIFO, no
ordering). ``--reference N`` also times the previous sort-per-step implementations on N
requests (they are quadratic: 100k did not finish in 120 s).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from replay.cost.cost_model import RooflineCostModel  # noqa: E402
from schemas.cost_params import CostParams  # noqa: E402
from replay.config import EngineOptions, ReplayConfig, SchedulingOptions  # noqa: E402
from replay.simulate import replay_frame  # noqa: E402
from schemas.specs import get_gpu, get_model  # noqa: E402

COST = RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb"),
                         CostParams(eta_compute=0.6, eta_mem=0.8, t_step_s=2e-4))


def burst(n: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"request_id": [str(i) for i in range(n)], "arrival_time_s": np.zeros(n),
                         "num_prompt_tokens": np.clip(rng.lognormal(np.log(512), 0.8, n), 1, 8000).astype(np.int64),
                         "num_output_tokens": np.clip(rng.lognormal(np.log(128), 0.8, n), 1, 2000).astype(np.int64),
                         "slo_ttft_s": rng.choice([5.0, 30.0, 120.0], n)})


def timed(df, scheduler, repeat):
    cfg = ReplayConfig(EngineOptions(max_num_seqs=256, max_num_batched_tokens=8192), SchedulingOptions(scheduler))
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        replay_frame(df, COST, cfg)
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--reference", type=int, default=0, help="also time the old sort-per-step policies on N requests")
    a = ap.parse_args(argv)
    df = burst(a.requests)
    t = {s: timed(df, s, a.repeat) for s in ("chunked", "sjf", "edf")}
    print(f"{a.requests} simultaneous arrivals, best of {a.repeat}:")
    for s, v in t.items():
        print(f"  {s:8s} {v:7.2f} s   {v / t['chunked']:.2f}x chunked")
    ok = max(t["sjf"], t["edf"]) <= 2 * t["chunked"]
    print("within 2x of chunked:", "yes" if ok else "NO")
    if a.reference:
        small = burst(a.reference)
        tc = timed(small, "chunked", 1)
        print(f"{a.reference} simultaneous arrivals: chunked {tc:.2f} s")
        for s, ref in (("sjf", "test_sched_heap:OldSjf"), ("edf", "test_sched_heap:OldEdf")):
            print(f"  {s}: {timed(small, s, 1):.2f} s now, {timed(small, ref, 1):.2f} s sort-per-step")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
