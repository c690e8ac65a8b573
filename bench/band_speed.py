"""What a prediction band costs, as a ratio to one replay measured in the same run (issue #18).

A band replays the what-if at each of the calibration's band points (replay/analysis/bands.py). This
script calibrates on a synthetic step log of the demo's cluster (a step fit: 2 points per
parameter with a standard error), then times, on an N-request trace: one replay, and the band's
replays beyond that one (what ``replay`` adds to its own replay) here one after the other and in
worker processes (what ``replay`` does when the replays take longer than a few seconds in all);
above 40,000 requests they run on windows of the trace (``replay.analysis.band_windows``).

    python bench/band_speed.py [--requests 10000] [--repeat 3]
"""
from __future__ import annotations

import argparse
import os
import time
from functools import partial

import numpy as np

from calibrate.demo import TRUTH, NoisyCostModel
from calibrate.step_fit import fit_steps, set_ci95
from replay.analysis import band_windows
from replay.analysis.bands import BandJob, predict_with_band, prediction_row
from replay.config import EngineOptions, RecordOptions, ReplayConfig
from replay.cost.cost_model import RooflineCostModel
from replay.parallel import worker_pool
from replay.core.result_columns import steps_frame
from replay.simulate import replay_frame
from schemas.cost_params import CostParams
from schemas.specs import get_gpu, get_model
from traces.synth import synth_requests

LENGTHS = ("lognormal:mean=1024,sigma=0.8", "lognormal:mean=256,sigma=0.7")


def calibrated() -> tuple:
    """The demo's step fit (cost model at its values, band points)."""
    base = RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb"), CostParams())
    cfg = ReplayConfig(EngineOptions(max_num_seqs=128, max_num_batched_tokens=2048), record=RecordOptions(steps=True))
    trace = synth_requests(2000, 8.0, *LENGTHS, seed=0)
    _, engine = replay_frame(trace, NoisyCostModel(base.with_params(TRUTH), 0.03, np.random.default_rng(0)), cfg)
    fit = fit_steps(steps_frame(engine), base)[0][0]
    set_ci95(fit, "stderr")
    return base.with_params(fit.cost_params()), fit.stats["band_points"]


def best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=10.0, help="Arrival rate, requests/s (the demo's cluster "
                                                             "runs ~11 req/s at most).")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    cm, points = calibrated()
    trace = synth_requests(args.requests, args.rate, *LENGTHS, seed=1)
    cfg = ReplayConfig(EngineOptions(max_num_seqs=128, max_num_batched_tokens=2048))
    job = BandJob(trace, {}, cm, cfg, points)
    one = best_of(lambda: prediction_row(replay_frame(trace, cm, cfg)[0]), args.repeat)
    row = prediction_row(replay_frame(trace, cm, cfg)[0])
    serial = best_of(lambda: predict_with_band(job, point_row=row), args.repeat)
    workers = os.cpu_count() or 1
    with worker_pool(workers) as mapper:
        mapper(partial(abs), [0] * workers)  # the workers' start-up is not the band's cost
        pooled = best_of(lambda: predict_with_band(job, point_row=row, mapper=mapper), args.repeat)
    how = (f"on {band_windows.NUM_WINDOWS} windows of the trace" if band_windows.windowed(trace, cfg)
           else "whole")
    print(f"{args.requests} requests at {args.rate:g} req/s, {len(points)} band points, best of {args.repeat}, "
          f"{workers} CPU(s); the band's replays beyond the point's ({len(points)} points, {how}):")
    print(f"  one replay                 {one:7.2f} s  1.0x")
    print(f"  band, one after the other  {serial:7.2f} s  {serial / one:.1f}x")
    print(f"  band, {workers} worker processes  {pooled:7.2f} s  {pooled / one:.1f}x")


if __name__ == "__main__":
    main()
