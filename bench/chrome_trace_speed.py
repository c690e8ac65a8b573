"""Time and peak memory of ``replay --chrome-trace`` on a large synthetic trace.

    python bench/chrome_trace_speed.py [--requests 100000] [--rate 40] [--modes all,default,gz]

Each mode runs in a fresh process (spawn): the replay that records its steps and their
requests, then the Chrome trace written from it. Printed per mode: replay seconds, trace
seconds, file size, peak RSS of the process (ru_maxrss) and its growth while the trace was
written. Modes: ``none`` (replay only, the baseline memory), ``all`` (every request,
``--chrome-trace-max-requests 0``), ``default`` (the default cap), ``gz`` (every request,
``.json.gz``).
"""
from __future__ import annotations

import argparse
import inspect
import multiprocessing
import os
import resource
import sys
import tempfile
import time
from pathlib import Path


def _child(mode: str, requests: int, rate: float, out_dir: str, queue) -> None:
    from replay.analysis.chrome_trace import write_chrome_trace
    from replay.cost.cost_model import RooflineCostModel
    from replay.config import EngineOptions, RecordOptions, ReplayConfig
    from replay.simulate import replay_frame
    from schemas.cost_params import CostParams
    from schemas.specs import get_gpu, get_model
    from traces.synth import synth_requests

    cost = RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb"),
                             CostParams(eta_compute=0.5, eta_mem=0.8, t_step_s=3e-4))
    trace = synth_requests(requests, rate, "lognormal:mean=600,sigma=0.8", "lognormal:mean=150,sigma=0.8", seed=0)
    t0 = time.perf_counter()
    result, engine = replay_frame(trace, cost, ReplayConfig(EngineOptions(max_num_seqs=256),
                                                            record=RecordOptions(steps=True, step_requests=True)))
    t_replay = time.perf_counter() - t0
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    row = {"mode": mode, "steps": engine.num_steps, "replay_s": t_replay, "trace_s": float("nan"), "size_mb": 0.0,
           "rss_before_mb": rss_before}
    if mode != "none":
        path = Path(out_dir) / ("trace.json.gz" if mode == "gz" else "trace.json")
        kwargs = {}
        if "max_requests" in inspect.signature(write_chrome_trace).parameters:
            kwargs["max_requests"] = None if mode != "default" else 20_000
        elif mode == "default":
            row["note"] = "no request cap in this version"
        t0 = time.perf_counter()
        write_chrome_trace(path, engine, result, **kwargs)
        row["trace_s"] = time.perf_counter() - t0
        row["size_mb"] = path.stat().st_size / 1e6
    row["rss_peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    queue.put(row)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--rate", type=float, default=40.0, help="Arrival rate, requests/s.")
    ap.add_argument("--modes", default="none,all,default,gz")
    args = ap.parse_args(argv)
    ctx = multiprocessing.get_context("spawn")
    print(f"{args.requests} requests at {args.rate:g} req/s; python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    print(f"{'mode':>8} {'steps':>8} {'replay_s':>9} {'trace_s':>8} {'size_MB':>8} {'rss_MB':>7} {'+rss_MB':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes.split(","):
            q = ctx.Queue()
            p = ctx.Process(target=_child, args=(mode, args.requests, args.rate, tmp, q))
            p.start()
            row = q.get()
            p.join()
            print(f"{row['mode']:>8} {row['steps']:>8} {row['replay_s']:>9.1f} {row['trace_s']:>8.1f} "
                  f"{row['size_mb']:>8.1f} {row['rss_peak_mb']:>7.0f} {row['rss_peak_mb'] - row['rss_before_mb']:>8.0f}"
                  + (f"  ({row['note']})" if "note" in row else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
