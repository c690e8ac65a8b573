"""A seeded fuzzer of the servecal CLI: mutated real and fixture files through every importer,
``traces validate``, ``calibrate fit`` and ``replay``, and every command's outputs given paths
that must never be written (a device, a FIFO, a folder, a link: target ``output-path``).

Every input is a job (a command line over mutated files in a fresh folder). Jobs run in a
long-lived worker process (``fuzz_worker.py``) that invokes the CLI in-process, so an abort
or a segfault of a native library kills the worker, not the test, and a job that outlives
its timeout is a hang; the worker is then restarted. A sample of jobs also runs through the
installed console scripts in a subprocess with a timeout (entry points, real stderr).

The outcome rule, per job: exit 0 with an output that passes ``traces validate`` (a
calibration that loads, for ``calibrate fit``), or exit 1/2 with one ``Error:`` message that
names an input file, no output and no temporary file left behind; never a traceback, a
RuntimeWarning on the terminal, a signal death or a hang.

Used by ``tests/test_fuzz.py`` (a quick profile in the default run, a long one behind
``-m fuzz``). Nothing here depends on pytest.

Here the profile runner (``run_profile``, ``summarize``); its parts are ``fuzz_text_mutation``
and ``fuzz_table_mutation`` (the mutators), ``fuzz_targets`` (what is mutated, the command that
reads it), ``fuzz_jobs`` (a job written and run: the worker, the console scripts) and
``fuzz_judge`` (the outcome rule).
"""
from __future__ import annotations

import shutil
from pathlib import Path

# the worker (fuzz_worker.py) judges its outcomes with fuzzlib.judge and fuzzlib._last
from fuzz_judge import _last, judge  # noqa: F401
from fuzz_jobs import Worker, make_job, run_console
from fuzz_targets import DATA, Target, _head, importer_targets, output_target, parquet_targets


def summarize(results: list[dict]) -> dict:
    """Counts by target and by fault."""
    by = {}
    for r in results:
        t = by.setdefault(r["target"], {"inputs": 0, "exit0": 0, "exit1": 0, "exit2": 0})
        t["inputs"] += 1
        if r.get("fault"):
            t[r["fault"]] = t.get(r["fault"], 0) + 1
        elif r.get("exit") in (0, 1, 2):
            t[f"exit{r['exit']}"] += 1
    return by


# ---------------------------------------------------------------------------
# Profiles
# ---------------------------------------------------------------------------

def _cli(*argv) -> None:
    from click.testing import CliRunner

    import calibrate.umbrella as umbrella

    res = CliRunner().invoke(umbrella.main, [str(a) for a in argv])
    if res.exit_code != 0:
        raise RuntimeError(f"{' '.join(map(str, argv))}: {res.output}")


def build_bases(root: Path, real: Path) -> dict[str, Path]:
    """Valid files the Parquet targets mutate: a request trace with measured latencies, one with
    token times and statuses, a step trace (80 steps of a real profile), a calibration fitted on
    it and a replay result."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    root.mkdir(parents=True, exist_ok=True)
    b = {k: root / f"base_{k}.parquet" for k in ("requests", "tokens", "steps", "result")}
    b["cal"] = root / "base_cal.json"
    (root / "r.jsonl").write_bytes(_head(real / "lss_vllm_rtxpro6000_llama31_8b_requests.jsonl", 40))
    _cli("traces", "import", "vllm-request-stats", root / "r.jsonl", "-o", b["requests"])
    _cli("traces", "import", "vllm-bench", DATA / "vllm_bench_small.json", "-o", b["tokens"])
    p = "lss_profile_rtx4090_llama31_8b_"
    _cli("traces", "import", "llmservingsim-profile", *[real / f"{p}{k}" for k in
         ("meta.yaml", "tp1_dense.csv", "tp1_attention.csv", "tp1_per_sequence.csv")], "-o", root / "all_steps.parquet")
    t = pq.read_table(root / "all_steps.parquet")
    idx = np.linspace(0, t.num_rows - 1, 80).astype(np.int64)
    pq.write_table(t.take(pa.array(idx)), b["steps"])
    _cli("calibrate", "fit", b["steps"], "--model", "llama-3.1-8b", "--gpu", "rtx-4090", "-o", b["cal"])
    _cli("replay", b["requests"], "--calibration", b["cal"], "-o", b["result"])
    return b


def all_targets(root: Path, real: Path | None) -> list[Target]:
    targets = importer_targets(real) + [output_target()]
    if real is not None and real.is_dir():
        targets += parquet_targets(build_bases(root / "bases", real))
    return targets


def available(target: Target) -> bool:
    """Whether the command of ``target`` exists (importers of other branches may not yet)."""
    if not target.optional:
        return True
    from calibrate.umbrella import traces_cli

    return target.name in traces_cli.commands["import"].commands


def run_profile(root: Path, real: Path | None, per_target: dict | int, *, seed: int = 0, timeout_s: float = 60,
                console_every: int = 0, console_timeout_s: float = 120, workers: int = 1,
                console_targets=None, log=None) -> list[dict]:
    """Run ``per_target`` mutated inputs of every target (plus the unmutated seed, index 0).

    ``console_every`` > 0 also runs every n-th input through the console script in a
    subprocess (crash and hang detection with real entry points and stderr).
    Returns one result per run (``fault`` None when the outcome rule held).
    """
    import concurrent.futures as cf

    targets = [t for t in all_targets(root, real) if available(t)]
    jobs = []
    for t in targets:
        n = per_target if isinstance(per_target, int) else per_target.get(t.name, per_target["default"])
        for i in range(n + 1):
            jobs.append((t, i))
    results = []
    pool = [Worker(timeout_s) for _ in range(workers)]

    skipped = set()

    def run_slice(w: Worker, part):
        out = []
        for t, i in part:
            if t.name in skipped:
                continue
            job = make_job(t, seed, i, root / "jobs", mutate=i > 0)
            r = w.run(job)
            if i == 0 and r.get("fault") is None and r.get("exit") != 0 and not job["special"]:  # a refusal is right
                if t.optional:  # another branch's importer whose options this harness guessed wrong
                    skipped.add(t.name)
                    continue
                r = {**r, "fault": "seed-fails", "detail": r.get("message", "")}
            out.append(r)
            if console_every and i % console_every == 1 and (console_targets is None or t.name in console_targets):
                c = run_console(job, console_timeout_s)
                c["target"] = t.name + "@console"
                out.append(c)
            shutil.rmtree(job["dir"], ignore_errors=True) if r.get("fault") is None else None
            if log:
                log(r)
        return out

    try:
        results += run_slice(pool[0], [j for j in jobs if j[1] == 0])  # the seeds first: skips are known
        jobs = [j for j in jobs if j[1] > 0]
        with cf.ThreadPoolExecutor(workers) as ex:
            futs = [ex.submit(run_slice, pool[k], jobs[k::workers]) for k in range(workers)]
            for f in futs:
                results += f.result()
    finally:
        for w in pool:
            w.close()
    return results
