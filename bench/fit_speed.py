"""Wall time of a request fit and of a plan against earlier revisions, same machine, same run (issue #30).

Usage: python bench/fit_speed.py [--baseline REV[,REV...]] [--repeat 3] [--cases fit,plan] [--plan-requests 10000]

Cases (bench/profile.py's e and d):
  fit   `calibrate fit` of the README's CodeLlama-34B GuideLLM log (40 synchronous requests, ~3k-token
        prompts in 64-token chunks, prefix caching; --jobs 1), when ../shared/data/real has it;
  plan  plan_deployments on --plan-requests synthetic requests at 60 req/s (bench/plan_speed.py's trace,
        calibration and SLO), h100 x TP 1,2 x replicas 1-4 x max_num_seqs 128,256: 16 candidates,
        confidence band, jobs=1.

Each baseline revision (default: main; several, comma-separated, to time a series of commits) is
exported with `git archive` to a temporary folder; each case runs in a fresh process against each
revision's packages and this tree's, one after the other, ``--repeat`` times (the machine's speed
drifts; the rounds expose every tree to the same drift), and the fastest wall of each is kept (as
timeit reports), with its CPU time (the process's: on a shared machine it moves less than the wall,
as waiting for a core is not counted). Each run also digests what the case produced (the calibration file, paths
normalised; every candidate's status, point, band and max rate): the table says whether every tree's
results are identical. Speedups are against the first revision.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
REAL = ROOT.parent / "shared" / "data" / "real"
SWEEP = REAL / "guidellm_results_codellama34b_prefill_sweep.json"
LOG = REAL / "blis_eval_codellama34b_prefill_sweep_vllm.log"


def fit_case(tmp: str) -> tuple[float, float, str, str]:
    """The CodeLlama fit: wall and CPU seconds (the fit alone), digest of the calibration file, replays."""
    from click.testing import CliRunner

    from calibrate.umbrella import main as servecal

    sweep, out = f"{tmp}/sweep.parquet", f"{tmp}/codellama.json"
    res = CliRunner().invoke(servecal, ["traces", "import", "guidellm", str(SWEEP), "-o", sweep])
    if res.exit_code:
        raise RuntimeError(res.output)
    t, cpu = time.perf_counter(), time.process_time()
    res = CliRunner().invoke(servecal, ["calibrate", "fit", f"{sweep}#0", "--model", "codellama-34b", "--gpu",
                                        "h100-80gb", "--vllm-log", str(LOG), "--jobs", "1", "-o", out])
    wall, cpu = time.perf_counter() - t, time.process_time() - cpu
    if res.exit_code:
        raise RuntimeError(res.output)
    text = Path(out).read_text().replace(tmp, "TMP")
    return wall, cpu, hashlib.sha256(text.encode()).hexdigest()[:12], f"{json.loads(text)['fit']['n_replays']} replays"


def plan_case(n: int) -> tuple[float, float, str, str]:
    """The small plan: wall and CPU seconds, digest of every candidate's outcome, replays."""
    sys.path.insert(0, str(HERE))
    import plan_speed
    from replay.plan import Axes, Calibrations, parse_slo, plan_deployments
    from traces.synth import synth_requests

    trace = synth_requests(n, 60.0, "lognormal:mean=1024,sigma=0.8", "lognormal:mean=128,sigma=0.8", seed=0)
    axes = Axes(["h100-80gb"], [1, 2], [1, 2, 3, 4], [128, 256], [8192], ["chunked"])
    t, cpu = time.perf_counter(), time.process_time()
    plan = plan_deployments(trace, {}, Calibrations([("bench", plan_speed.calibration())]), axes,
                            parse_slo([plan_speed.SLO]), rate_rps=60.0, confidence="band", jobs=1)
    wall, cpu = time.perf_counter() - t, time.process_time() - cpu
    res = plan.result
    outcome = [(ev.candidate.label(), ev.candidate.max_num_seqs, ev.status, ev.reason, ev.point,
                None if ev.band is None else (ev.band.low, ev.band.high), ev.attainment_band, ev.band_rows,
                ev.max_rate_rps) for ev in res.evaluations]
    digest = hashlib.sha256(repr(outcome).encode()).hexdigest()[:12]
    return wall, cpu, digest, f"{res.replays} replays"


def run_case(case: str, plan_requests: int) -> None:
    """One case in this process; prints its result as one JSON line."""
    with tempfile.TemporaryDirectory() as tmp:
        wall, cpu, digest, what = fit_case(tmp) if case == "fit" else plan_case(plan_requests)
    print(json.dumps({"wall": wall, "cpu": cpu, "digest": digest, "what": what}))


def in_tree(tree: Path, case: str, plan_requests: int) -> dict:
    """:func:`run_case` in a fresh process importing the packages of ``tree``."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, __file__, "--run-case", case, "--plan-requests", str(plan_requests)],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", default="main", help="git revision to compare with (default: %(default)s)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cases", default="fit,plan")
    ap.add_argument("--plan-requests", type=int, default=10_000)
    ap.add_argument("--run-case", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run_case:
        run_case(args.run_case, args.plan_requests)
        return
    cases = [c for c in args.cases.split(",") if c != "fit" or SWEEP.exists()]
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    revs = [subprocess.run(["git", "rev-parse", "--short", r], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.strip() for r in args.baseline.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        trees = {}
        for rev in revs:
            archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True).stdout
            (Path(tmp) / rev).mkdir()
            subprocess.run(["tar", "-x", "-C", str(Path(tmp) / rev)], input=archive, check=True)
            trees[rev] = Path(tmp) / rev
        trees[f"this tree ({head.strip()})"] = ROOT
        load0 = os.getloadavg()[0]
        runs: dict = {(c, t): [] for c in cases for t in trees}
        for _ in range(args.repeat):
            for c in cases:
                for name, tree in trees.items():
                    runs[c, name].append(in_tree(tree, c, args.plan_requests))
    print(f"machine: {os.cpu_count()} CPUs, Python {platform.python_version()}; best of {args.repeat} rounds "
          f"(each tree once a round); load average before/after {load0:.1f}/{os.getloadavg()[0]:.1f}\n")
    print("| case | tree | best wall s | speedup | best CPU s | speedup (CPU) | all walls s | identical results |")
    print("|---|---|---:|---:|---:|---:|---|---|")
    for c in cases:
        first = runs[c, revs[0]]
        for name in trees:
            rs = runs[c, name]
            wall, cpu = min(r["wall"] for r in rs), min(r["cpu"] for r in rs)
            same = {r["digest"] for r in rs} == {first[0]["digest"]}
            walls = ", ".join(f"{r['wall']:.1f}" for r in rs)
            print(f"| {c} ({rs[0]['what']}) | {name} | {wall:.2f} | {min(r['wall'] for r in first) / wall:.2f}x | "
                  f"{cpu:.2f} | {min(r['cpu'] for r in first) / cpu:.2f}x | {walls} | {'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
