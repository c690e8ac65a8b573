"""Replay speed of servecal's engine, as ratios to a minimal reference loop measured in the same run.

Usage: python bench/replay_speed.py [--requests {requests}] [--schedulers {schedulers}]
                                    [--calibration | --calibration-only]

Each case runs in its own process (so peak RSS is per case). Workloads:
  * the real Azure LLM inference 2023 conv trace (19,366 requests), when ../shared/data/real has it;
  * N synthetic requests (Poisson, lognormal lengths) at ~75 % of the engine's measured capacity;
  * the same at 2x capacity (overloaded), at N/10 and N to check linear growth.
Schedulers: chunked, fcfs, disagg (when available). The engine's step-by-step path
(--exact-steps) and a minimal reference loop (continuous batching with incremental
aggregates, no KV cache, no per-request bookkeeping beyond counters) run on the same
workload. sched-sim 0.2.1 is timed too when installed (pip install sched-sim==0.2.1; bench only).

--calibration adds the calibration speed, each job in its own process: `calibrate fit` on a
synthetic step trace of {calibration_rows:,} rows (--calibration-rows), and the
simulation-in-the-loop fit (its starts on every core) on one synthetic request log and on
{calibration_logs} logs jointly (--calibration-logs), each of {calibration_requests:,} requests
(--calibration-requests); all generated with known parameters (CAL_TRUTH); and, when
../shared/data/real has it, the README's real CodeLlama-34B fit (`calibrate fit sweep.parquet#0
--vllm-log ...`: 40 synchronous requests, long prompts in 64-token chunks, prefix caching).
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import platform
import resource
import time
from pathlib import Path

from speed_workloads import (REAL, SCHED_SIM_HORIZON, cost_model, run_engine, run_reference, run_sched_sim,
                             sched_sim_version, workload)


#: The real files of the README's CodeLlama-34B recipe (a GuideLLM sweep and the server's log).
README_SWEEP = "guidellm_results_codellama34b_prefill_sweep.json"
README_LOG = "blis_eval_codellama34b_prefill_sweep_vllm.log"


#: The known parameters the calibration jobs must recover.
CAL_TRUTH = {"eta_compute": 0.6, "eta_mem": 0.85, "t_step_s": 1e-3}


def run_step_fit(rows: int):
    """``calibrate fit`` (forms max and sum, as its default) on a synthetic step trace.

    The shapes are those of tests/calibrate/test_fit.py; durations are the roofline at CAL_TRUTH times
    2 % lognormal noise. Only the command is timed (the trace is written before); the peak
    RSS is the process's. Returns wall, peak RSS in MB and the fitted parameters.
    """
    import contextlib
    import io
    import tempfile

    import numpy as np
    import pandas as pd

    from calibrate.cli import main as calibrate
    from schemas.calibration import Calibration
    from schemas.cost_params import CostParams
    from schemas.tables import STEP_TRACE
    from traces.io import write_trace

    rng = np.random.default_rng(0)
    pre = rng.choice([0, 0, 256, 1024, 2048], rows)
    dec = rng.integers(0, 128, rows)
    dec[(pre == 0) & (dec == 0)] = 1
    ctx = dec * rng.integers(100, 4000, rows)
    dur = cost_model().with_params(CostParams(**CAL_TRUTH)).step_time_s(pre, dec, ctx) * rng.lognormal(0, 0.02, rows)
    steps = pd.DataFrame({"replica_id": 0, "step_start_time_s": np.cumsum(dur) - dur, "step_duration_s": dur,
                          "num_prefill_tokens": pre, "num_prefill_seqs": (pre > 0).astype(int), "num_decode_seqs": dec,
                          "decode_context_tokens": ctx})
    with tempfile.TemporaryDirectory() as tmp:
        write_trace(steps, STEP_TRACE, f"{tmp}/steps.parquet")
        del steps, pre, dec, ctx, dur  # the command's peak RSS, not the generator's on top
        t = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):  # lmfit's reports
            calibrate.main(["fit", f"{tmp}/steps.parquet", "--model", "llama-3.1-8b", "--gpu", "h100-80gb",
                            "-o", f"{tmp}/cal.json"], standalone_mode=False)
        wall = time.perf_counter() - t
        cal = Calibration.read(f"{tmp}/cal.json")
    return wall, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, {k: cal.params[k].value for k in CAL_TRUTH}


def run_request_fit(args):
    """Simulation-in-the-loop fit (starts on every core) of TTFT and TPOT quantiles measured by replays at
    CAL_TRUTH: ``logs`` synthetic logs of ``n`` requests of one deployment at loads spread
    from 50 % to 110 % of ``rate`` (one log: at ``rate``), fitted jointly.

    Only the fit is timed, and one replay of the first log for the ratio. Returns wall, peak
    RSS in MB, the fitted parameters, the number of replays (the fit's and its confidence
    set's) and one replay's wall time.
    """
    n, rate, logs = args
    import numpy as np

    from calibrate.request_fit import fit_requests
    from calibrate.run_errors import Run
    from replay.config import EngineOptions, ReplayConfig
    from replay.simulate import replay_frame
    from schemas.cost_params import CostParams

    cm, cfg = cost_model(), ReplayConfig(EngineOptions(max_num_seqs=256, max_num_batched_tokens=8192))
    runs = []
    for i, scale in enumerate([1.0] if logs == 1 else list(np.linspace(0.5, 1.1, logs))):
        trace = workload("synthetic", n, rate * scale)
        measured, _ = replay_frame(trace, cm.with_params(CostParams(**CAL_TRUTH)), cfg)
        runs.append(Run(f"log{i}", trace.assign(ttft_s=measured["pred_ttft_s"], tpot_s=measured["pred_tpot_s"]),
                        cfg, {}))
    t = time.perf_counter()
    replay_frame(runs[0].trace, cm, cfg)
    one = time.perf_counter() - t
    t = time.perf_counter()
    fit = fit_requests(runs, cm)[0]
    wall = time.perf_counter() - t
    replays = fit.stats["n_replays"] + fit.stats["confidence_set"]["n_evals"] * len(runs)
    return wall, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, fit.values(), replays, one


def run_readme_fit(_args):
    """The README's CodeLlama-34B fit (its `calibrate validate`; docs/importers.md): GuideLLM's synchronous
    benchmark (40 requests, prompts ~3,000 tokens) under the vLLM log's settings (a 64-token
    budget, prefix caching), through the CLI in this process. Only ``calibrate fit`` is timed.

    Returns wall, peak RSS in MB, the fitted parameters, the number of replays and None (no
    single replay is timed).
    """
    import json
    import tempfile

    from click.testing import CliRunner

    from calibrate.umbrella import main as servecal

    with tempfile.TemporaryDirectory() as d:
        sweep, cal = Path(d) / "sweep.parquet", Path(d) / "codellama.json"
        CliRunner().invoke(servecal, ["traces", "import", "guidellm", str(REAL / README_SWEEP), "-o", str(sweep)])
        t = time.perf_counter()
        res = CliRunner().invoke(servecal, ["calibrate", "fit", f"{sweep}#0", "--model", "codellama-34b", "--gpu",
                                            "h100-80gb", "--vllm-log", str(REAL / README_LOG), "-o", str(cal)])
        wall = time.perf_counter() - t
        if res.exit_code:
            raise RuntimeError(res.output)
        saved = json.loads(cal.read_text())
    values = {k: v["value"] for k, v in saved["params"].items()}
    return wall, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, values, saved["fit"]["n_replays"], None


def capacity_rps(n: int = 20000) -> float:
    """Completed requests/s of the chunked engine when every request is queued at once."""
    from replay.config import EngineOptions, ReplayConfig
    from replay.simulate import replay_frame
    from traces.synth import synth_requests

    df = synth_requests(n, 1e6, "lognormal:mean=512,sigma=0.8", "lognormal:mean=128,sigma=0.8", seed=0)
    res, _ = replay_frame(df, cost_model(), ReplayConfig(EngineOptions(max_num_seqs=256, max_num_batched_tokens=8192)))
    return n / float((res["arrival_time_s"] + res["pred_e2e_s"]).max())


def in_process(fn, args, timeout: float | None = None):
    """``fn(args)`` in a fresh (non-daemonic: it may start workers of its own) process; past
    ``timeout`` s it is killed and ``multiprocessing.TimeoutError`` raised."""
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures import TimeoutError as FutureTimeout

    ex = ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"))
    try:
        return ex.submit(fn, args).result(timeout)
    except FutureTimeout:
        for proc in list(ex._processes.values()):
            proc.kill()
        raise mp.TimeoutError from None
    finally:
        ex.shutdown(wait=False, cancel_futures=True)


def best_of(k: int, fn, args) -> tuple:
    """``fn(args)`` run ``k`` times, each in a fresh process: the fastest wall time (the least
    disturbed by the machine, as timeit reports) with its counts, and the largest peak RSS."""
    runs = [in_process(fn, args) for _ in range(k)]
    wall, nr, steps, _ = min(runs)
    return wall, nr, steps, max(r[3] for r in runs)


def replay_cases(args, cap: float) -> None:
    """The replay table: each workload with the reference loop, our schedulers and sched-sim."""
    n = args.requests
    cases = []
    if (REAL / "azure_llm_2023_conv.csv").exists():
        cases.append(("azure-conv", 0, 0.0))
    cases += [("synthetic-75%", n, 0.75 * cap), ("overloaded-2x", n // 10, 2 * cap), ("overloaded-2x", n, 2 * cap)]
    from replay.schedulers import BUILTIN

    scheds = [s for s in args.schedulers.split(",") if s in BUILTIN or s == "disagg"]
    ss = sched_sim_version()
    print(f"{'workload':>14} {'requests':>9} {'scheduler':>9} {'path':>15} {'wall_s':>8} {'req/s':>9} "
          f"{'steps/s':>9} {'rss_MB':>7} {'vs ref':>7}")
    for kind, cn, rate in cases:
        wl = "synthetic" if kind != "azure-conv" else kind
        ref = best_of(args.repeat, run_reference, (wl, cn, rate))
        rows = [("reference", "loop", ref)]
        for s in scheds:
            rows.append((s, "fast", best_of(args.repeat, run_engine, (wl, cn, rate, s, False))))
            if s == "chunked":
                rows.append((s, "exact", best_of(args.repeat, run_engine, (wl, cn, rate, s, True))))
        for s, path, (wall, nr, steps, rss) in rows:
            print(f"{kind:>14} {nr:>9} {s:>9} {path:>15} {wall:>8.2f} {nr / wall:>9.0f} {steps / wall:>9.0f} "
                  f"{rss:>7.0f} {ref[0] / wall:>7.2f}")
        if ss:
            sched_sim_row(f"{kind:>14} {ref[1]:>9} {'chunked':>9} {'sched-sim ' + ss:>15}", (wl, cn, rate), ref, args)
    if ss:
        print(f"sched-sim {ss} (chunked, budget 8192, no cap on running sequences) has its own cost model and "
              "scheduling: it is timed on the same requests, its predictions differ from ours")
    else:
        print("sched-sim not installed: no comparison (pip install sched-sim==0.2.1 to add it)")


def sched_sim_row(head: str, case: tuple, ref: tuple, args) -> None:
    """Time sched-sim on one case in its own process and print its row after ``head``, or why there is none."""
    nr, limit = ref[1], args.sched_sim_timeout
    if nr > args.sched_sim_max_requests:
        print(f"{head}  skipped: more than --sched-sim-max-requests {args.sched_sim_max_requests}")
        return
    try:
        wall, _, steps, rss, done = in_process(run_sched_sim, case, limit)
    except mp.TimeoutError:  # killed at the limit: its time is a lower bound
        print(f"{head} {f'> {limit:g} s':>8} {f'< {nr / limit:.0f}':>9} {'-':>9} {'-':>7} "
              f"{f'< {ref[0] / limit:.2f}':>7}")
        return
    if done < nr:
        print(f"{head} {'stalled':>8}  {nr - done} requests unfinished at {SCHED_SIM_HORIZON}x the last arrival "
              "(simulated time): its run() would not return")
        return
    print(f"{head} {wall:>8.2f} {nr / wall:>9.0f} {steps / wall:>9.0f} {rss:>7.0f} {ref[0] / wall:>7.2f}")


def calibration_cases(args, cap: float) -> None:
    """The calibration table: the step-trace fit and the request-log fits (one log, and
    ``--calibration-logs`` logs jointly), each in its own process."""
    rows, n, logs = args.calibration_rows, args.calibration_requests, args.calibration_logs
    s_wall, s_rss, s_fit = in_process(run_step_fit, rows)
    jobs = [("calibrate fit (step trace)", f"{rows} rows", s_wall, s_rss, "", s_fit, None)]
    for k in sorted({1, logs}):
        wall, rss, fit, replays, one = in_process(run_request_fit, (n, 0.75 * cap, k))
        jobs.append((f"request fit, {k} log(s)", f"{k} x {n} req", wall, rss, replays, fit, one))
    if (REAL / README_SWEEP).exists():
        wall, rss, fit, replays, one = in_process(run_readme_fit, None)
        jobs.append(("README CodeLlama sync fit", "40 req, budget 64", wall, rss, replays, fit, one))
    print("calibration: Llama-3.1-8B on one H100; request logs at 75 % of capacity (several: 50-110 %), "
          "max_num_seqs 256, max_num_batched_tokens 8192; all terms, variants max, sum, blend")
    print(f"{'job':>26} {'size':>16} {'wall_s':>7} {'/replay':>7} {'rss_MB':>6} {'replays':>7} "
          f"{'eta_comp':>8} {'eta_mem':>7} {'t_step_ms':>9}")
    print(f"{'truth':>26} {'':>16} {'':>7} {'':>7} {'':>6} {'':>7} {CAL_TRUTH['eta_compute']:>8.4f} "
          f"{CAL_TRUTH['eta_mem']:>7.4f} {CAL_TRUTH['t_step_s'] * 1e3:>9.3f}")
    for job, size, wall, rss, rep, v, one in jobs:
        ratio = f"{wall / one:.0f}x" if one else ""
        print(f"{job:>26} {size:>16} {wall:>7.2f} {ratio:>7} {rss:>6.0f} {rep!s:>7} {v['eta_compute']:>8.4f} "
              f"{v['eta_mem']:>7.4f} {v['t_step_s'] * 1e3:>9.3f}")


def main():
    ap = argparse.ArgumentParser(formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--schedulers", default="chunked,fcfs,disagg")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs of each engine and reference case (fresh process each); the fastest is shown")
    ap.add_argument("--sched-sim-timeout", type=float, default=600.0,
                    help="wall-clock limit of each sched-sim case, s: killed past it, printed as a lower bound")
    ap.add_argument("--sched-sim-max-requests", type=int, default=1_000_000,
                    help="skip sched-sim on cases with more requests")
    ap.add_argument("--calibration", action="store_true", help="also time the calibration fits")
    ap.add_argument("--calibration-only", action="store_true", help="time the calibration fits only")
    ap.add_argument("--calibration-rows", type=int, default=1_000_000,
                    help="rows of the synthetic step trace (default: %(default)s)")
    ap.add_argument("--calibration-logs", type=int, default=4,
                    help="logs of the joint request fit (default: %(default)s)")
    ap.add_argument("--calibration-requests", type=int, default=5_000,
                    help="requests of each synthetic request log (default: %(default)s)")
    # the docstring names the options' defaults: its {dest} fields, filled from them
    ap.description = __doc__.format(**vars(ap.parse_args([])))
    args = ap.parse_args()
    cap = capacity_rps()
    cpu = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                if l.startswith("model name")), platform.processor())
    print(f"machine: {cpu}, {mp.cpu_count()} cores, Python {platform.python_version()}")
    if args.repeat > 1:
        print(f"each engine and reference row: the fastest of {args.repeat} runs, each in a fresh process")
    print(f"engine capacity (chunked, H100 Llama-3.1-8B roofline, lognormal 512/128): {cap:.1f} req/s")
    if not args.calibration_only:
        replay_cases(args, cap)
    if args.calibration or args.calibration_only:
        calibration_cases(args, cap)


if __name__ == "__main__":
    main()
