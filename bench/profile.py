"""Where servecal's time goes: cProfile of five cases, written as markdown (bench/PROFILE.md).

Usage: python bench/profile.py [--requests 100000] [--plan-requests 10000] [--out bench/PROFILE.md]

Cases, each profiled in this process, one core (workers off so that cProfile sees everything):
  a  the engine's fast path (chunked) on N synthetic requests at 75 % of capacity (bench/replay_speed.py's
     workload and cost model), via replay_frame;
  b  `replay` (the CLI, in-process) of the same trace with its default 95 % band, the calibration holding
     six band points (bench/plan_speed.py's); band points replayed here, not in workers (SERIAL_BELOW_S = inf);
  c  `replay --scheduler disagg --no-band` (1 prefill + 1 decode replica) of the same trace;
  d  `servecal plan` (plan_deployments, jobs=1, confidence band) over a small grid on --plan-requests;
  e  `calibrate fit` of the README's CodeLlama GuideLLM log (simulation in the loop), when
     ../shared/data/real has it, else a synthetic 1,000-request log at 75 % (fit_requests, jobs=1).
Walls are under cProfile (its overhead inflates Python-heavy code, ~1.3-2x); case a is also timed without.
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# this file's folder first on sys.path would make it the stdlib's `profile`, which cProfile imports
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
import argparse  # noqa: E402
import contextlib  # noqa: E402
import cProfile  # noqa: E402
import io  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import pstats  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

sys.path.append(str(HERE))
import plan_speed  # noqa: E402
import replay_speed as rs  # noqa: E402

TOP = 12
READING = "## Reading"
#: Where a function's self time is counted in the "by area" line (first match of the file path).
AREAS = [("engine core", "/replay/core/"), ("schedulers", "/replay/schedulers/"), ("cost model", "/replay/cost/"),
         ("bands/analysis", "/replay/analysis/"), ("plan", "/replay/plan/"), ("calibrate", "/calibrate/"),
         ("replay other", "/replay/"), ("traces/schemas", "/traces/"), ("traces/schemas", "/schemas/"),
         ("pandas", "/pandas/"), ("numpy", "/numpy/"), ("scipy/lmfit", "/scipy/"), ("scipy/lmfit", "/lmfit/"),
         ("pyarrow", "/pyarrow/"), ("heapq", "heapq"), ("builtins", "~")]


#: Wrappers left out of the cumulative table (they hold ~100 % and say nothing).
WRAPPERS = ("bench/profile.py", "/click/", "traces/cli/support.py", "profile.py:")
#: Functions whose cumulative share is printed on one line: (file ends with, function).
KEY = [("replay/simulate.py", "replay_frame"), ("core/engine.py", "run"), ("core/engine.py", "_start_step"),
       ("core/engine.py", "_close_step"), ("cost/step_time.py", "step_time_s"), ("core/kv_cache.py", "allocate"),
       ("core/kv_cache.py", "prompt_block_keys"), ("~", "<built-in method _heapq.heappush>"),
       ("~", "<built-in method _heapq.heappop>"), ("analysis/bands.py", "predict_with_band"),
       ("plan/search.py", "max_rates")]


def short(key) -> str:
    f, line, fn = key
    if f == "~":
        return fn
    for root in (f"{HERE.parent}/", "site-packages/", "/lib/python3"):  # this checkout's root, wherever it is
        if root in f:
            f = f.split(root, 1)[1]
            break
    return f"{f}:{line}:{fn}"


def area(f: str) -> str:
    return next((name for name, pat in AREAS if pat in f), "other")


def profiled(fn):
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    with contextlib.redirect_stdout(io.StringIO()):
        out = fn()
    prof.disable()
    return time.perf_counter() - t, pstats.Stats(prof), out


def section(title: str, what: str, wall: float, st: pstats.Stats, extra: str = "") -> str:
    rows = st.stats  # (file, line, func) -> (primitive calls, calls, tottime, cumtime, callers)
    total = sum(v[2] for v in rows.values())
    lines = [f"## {title}", "", what, "", f"Wall {wall:.2f} s under cProfile (profiled time {total:.2f} s). {extra}",
             ""]
    by_area = {}
    for k, v in rows.items():
        by_area[area(k[0])] = by_area.get(area(k[0]), 0.0) + v[2]
    lines += ["Self time by area: " + ", ".join(f"{a} {t / total:.0%}" for a, t in
                                                 sorted(by_area.items(), key=lambda x: -x[1]) if t / total >= 0.005),
              ""]
    key = [f"`{fn}` {v[3] / total:.0%}" for f, fn in KEY for k, v in rows.items()
           if k[0].endswith(f) and k[2] == fn]
    lines += ["Cumulative shares of key functions: " + ", ".join(key), ""]
    for label, idx in (("cumulative", 3), ("self (tottime)", 2)):
        lines += [f"Top {TOP} by {label}:", "", "| function | calls | self s | cum s | share |",
                  "|---|---:|---:|---:|---:|"]
        ranked = sorted(((k, v) for k, v in rows.items() if not any(w in k[0] for w in WRAPPERS)),
                        key=lambda kv: -kv[1][idx])
        for k, v in ranked[:TOP]:
            lines.append(f"| `{short(k)}` | {v[1]:,} | {v[2]:.2f} | {v[3]:.2f} | {v[idx] / total:.1%} |")
        lines.append("")
    return "\n".join(lines)


def write_inputs(tmp: str, n: int, rate: float) -> tuple[str, str]:
    from schemas.tables import REQUEST_TRACE
    from traces.io import write_trace

    trace, cal = f"{tmp}/synth.parquet", f"{tmp}/cal.json"
    write_trace(rs.workload("synthetic", n, rate), REQUEST_TRACE, trace)
    plan_speed.calibration().write(cal)
    return trace, cal


def cli(main, args):
    from click.testing import CliRunner

    res = CliRunner().invoke(main, [str(a) for a in args])
    if res.exit_code:
        raise RuntimeError(f"{args}: {res.output}\n{res.exception!r}")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000, help="requests of cases a-c (default: %(default)s)")
    ap.add_argument("--plan-requests", type=int, default=10_000, help="requests of case d (default: %(default)s)")
    ap.add_argument("--cases", default="abcde")
    ap.add_argument("--out", default=str(HERE / "PROFILE.md"))
    args = ap.parse_args()
    import replay.cli.band_run as band_run
    from calibrate.umbrella import main as servecal
    from replay.config import EngineOptions, ReplayConfig, SchedulingOptions
    from replay.simulate import replay_frame

    band_run.SERIAL_BELOW_S = math.inf  # the band's points replayed in this process, where cProfile sees them
    cap, n = rs.capacity_rps(), args.requests
    parts = [f"# Profile of servecal (issue #30, item 1)\n\nRegenerate: `python bench/profile.py --requests {n}`. "
             f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}; cProfile, one process, workers "
             f"off. Engine capacity {cap:.1f} req/s (Llama-3.1-8B on one H100, lognormal 512/128); cases a-c at "
             f"75 % of it ({0.75 * cap:.1f} req/s) on **{n:,} synthetic requests** (not 1M, to keep the run short). "
             "Shares are of the profiled time (the sum of self times); cProfile's overhead inflates Python-heavy "
             "code, so the shares of the per-step loop are upper bounds.\n"]
    cm, df = rs.cost_model(), rs.workload("synthetic", n, 0.75 * cap)
    cfg = ReplayConfig(EngineOptions(max_num_seqs=256, max_num_batched_tokens=8192), SchedulingOptions("chunked"))
    with tempfile.TemporaryDirectory() as tmp:
        trace, cal = write_inputs(tmp, n, 0.75 * cap)
        if "a" in args.cases:
            t = time.perf_counter()
            replay_frame(df, cm, cfg)
            bare = time.perf_counter() - t
            wall, st, (_, eng) = profiled(lambda: replay_frame(df, cm, cfg))
            parts.append(section("a. Engine fast path, chunked, 75 % load", f"`replay_frame` on {n:,} requests "
                                 "(max_num_seqs 256, budget 8192), as bench/replay_speed.py's engine row.", wall, st,
                                 f"Without cProfile {bare:.2f} s ({n / bare:,.0f} req/s, {eng.num_steps:,} steps)."))
        if "b" in args.cases:
            wall, st, _ = profiled(lambda: cli(servecal, ["replay", trace, "--calibration", cal]))
            parts.append(section("b. `replay` with its default 95 % band", f"`servecal replay` (CLI, in-process) "
                                 f"of the same {n:,} requests with a calibration of six band points.", wall, st))
        if "c" in args.cases:
            wall, st, _ = profiled(lambda: cli(servecal, ["replay", trace, "--calibration", cal, "--scheduler",
                                                          "disagg", "--no-band"]))
            parts.append(section("c. Disaggregated replay", f"`servecal replay --scheduler disagg --no-band` "
                                 f"(1 prefill + 1 decode replica) of the same {n:,} requests.", wall, st))
        if "d" in args.cases:
            parts.append(plan_case(args.plan_requests))
        if "e" in args.cases:
            parts.append(fit_case(tmp, servecal, cap))
    out = Path(args.out)  # a hand-written "## Reading" of an earlier run is kept, after the tables
    kept = out.read_text().split(READING, 1) if out.exists() else []
    if len(kept) == 2:  # it ends where the first case's section begins
        parts.insert(1, READING + kept[1].split("\n## ", 1)[0].rstrip() + "\n")
    out.write_text("\n".join(parts).rstrip() + "\n")
    print(f"wrote {args.out}")


def plan_case(n: int) -> str:
    from replay.plan import Axes, Calibrations, parse_slo, plan_deployments
    from traces.synth import synth_requests

    rate = 60.0
    tr = synth_requests(n, rate, "lognormal:mean=1024,sigma=0.8", "lognormal:mean=128,sigma=0.8", seed=0)
    axes = Axes(["h100-80gb"], [1, 2], [1, 2, 3, 4], [128, 256], [8192], ["chunked"])
    cals = Calibrations([("bench", plan_speed.calibration())])
    wall, st, plan = profiled(lambda: plan_deployments(tr, {}, cals, axes, parse_slo([plan_speed.SLO]),
                                                       rate_rps=rate, confidence="band", jobs=1))
    res = plan.result
    return section("d. `servecal plan`, small grid", f"plan_deployments on {n:,} requests at {rate:g} req/s "
                   "(bench/plan_speed.py's trace, calibration and SLO), h100 x TP 1,2 x replicas 1-4 x max_num_seqs "
                   f"128,256 x budget 8192: {len(res.evaluations)} candidates, {res.replays} replays, "
                   "confidence band, jobs=1.", wall, st)


def fit_case(tmp: str, servecal, cap: float) -> str:
    if (rs.REAL / rs.README_SWEEP).exists():
        sweep = f"{tmp}/sweep.parquet"
        cli(servecal, ["traces", "import", "guidellm", rs.REAL / rs.README_SWEEP, "-o", sweep])
        args = ["calibrate", "fit", f"{sweep}#0", "--model", "codellama-34b", "--gpu", "h100-80gb", "--vllm-log",
                rs.REAL / rs.README_LOG, "--jobs", "1", "-o", f"{tmp}/codellama.json"]
        wall, st, _ = profiled(lambda: cli(servecal, args))
        import json

        reps = json.loads(Path(f"{tmp}/codellama.json").read_text())["fit"]["n_replays"]
        return section("e. Request fit (`calibrate fit`, simulation in the loop)", "The README's CodeLlama-34B "
                       "GuideLLM log (40 synchronous requests, ~3k-token prompts, 64-token budget, prefix caching), "
                       f"`--jobs 1`: {reps} replays.", wall, st)
    wall, st, (_, _, _, reps, _) = profiled(lambda: rs.run_request_fit((1000, 0.75 * cap, 1)))
    return section("e. Request fit (simulation in the loop)", "bench/replay_speed.py's synthetic request fit, "
                   f"1,000 requests at 75 %: {reps} replays.", wall, st)


if __name__ == "__main__":
    main()
