"""The fuzzer's jobs: one written (``make_job``: a target's seed files, one of them mutated, in a
fresh folder, and its command line), then run in a long-lived worker process with a per-job
timeout (``Worker``: ``fuzz_worker.py``, restarted after a crash or a hang) or through the
installed console script (``run_console``).

Part of the fuzzer of ``fuzzlib``; nothing here depends on pytest.
"""
from __future__ import annotations

import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from fuzz_judge import _last, judge
from fuzz_table_mutation import mutate_table_file
from fuzz_targets import Target
from fuzz_text_mutation import mutate_text

HERE = Path(__file__).resolve().parent


def make_job(target: Target, seed: int, index: int, root: Path, mutate: bool = True) -> dict:
    """Write the input files of one job under ``root`` and return the job (a JSON-able dict)."""
    rng = random.Random(f"{seed}/{target.name}/{index}")
    d = root / f"{target.name}-{index:05d}"
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    files, mutations = {}, []
    victim = rng.choice(target.mutate) if mutate else None
    for name, content in target.seeds.items():
        p = d / name
        files[name] = p
        if isinstance(content, list):  # parquet: one of several bases
            src = rng.choice(content)
            if name == victim:
                mutations = mutate_table_file(rng, src, p)
            else:
                shutil.copyfile(src, p)
            continue
        data = content
        if name == victim:
            data, mutations = mutate_text(rng, data, target.kind[name])
        p.write_bytes(data)
    argv, special = target.argv(d, files, rng), None
    if isinstance(argv, tuple):  # the output-path target: the command line and the path it must not write
        argv, special = argv
    return {"target": target.name, "index": index, "dir": str(d), "argv": argv, "special": special,
            "inputs": [str(p) for p in files.values()] + [a for a in argv if a.endswith(".json") and "out" not in a],
            "output": str(d / target.output) if target.output else None, "output_kind": target.output_kind,
            "mutations": mutations}


# ---------------------------------------------------------------------------
# Running jobs: a worker process with a per-job timeout
# ---------------------------------------------------------------------------

class Worker:
    """A ``fuzz_worker.py`` process fed one job at a time; restarted after a crash or a hang."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.proc = None

    def _start(self):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
        self.proc = subprocess.Popen([sys.executable, str(HERE / "fuzz_worker.py")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=str(HERE.parent),
                                     start_new_session=True)
        line = self._readline(120)
        if line is None or line.strip() != b"ready":
            err = self.proc.stderr.read1(4000) if self.proc.poll() is not None else b""
            raise RuntimeError(f"fuzz worker did not start: {line!r} {err!r}")

    def _readline(self, timeout):
        fd = self.proc.stdout.fileno()
        buf = b""
        end = time.monotonic() + timeout
        while not buf.endswith(b"\n"):
            left = end - time.monotonic()
            if left <= 0:
                return None
            r, _, _ = select.select([fd], [], [], left)
            if not r:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return buf if buf else b""
            buf += chunk
        return buf

    def run(self, job: dict) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        t0 = time.monotonic()
        self.proc.stdin.write((json.dumps(job) + "\n").encode())
        self.proc.stdin.flush()
        line = self._readline(self.timeout_s)
        dt = time.monotonic() - t0
        if line is None:
            self.kill()
            return {**job, "fault": "hang", "detail": f"no answer in {self.timeout_s:g} s", "seconds": dt}
        if not line:
            rc = self.proc.wait()
            err = self.proc.stderr.read().decode("utf-8", "replace")[-600:]
            self.proc = None
            return {**job, "fault": "crash", "detail": f"worker died, returncode {rc}: {err}", "seconds": dt}
        res = json.loads(line)
        return {**job, **res, "seconds": dt}

    def kill(self):
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
            self.proc = None

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None


def run_console(job: dict, timeout_s: float) -> dict:
    """Run one job through the installed console script (``traces``, ``replay``, ``calibrate``;
    ``servecal`` for the commands only it has, ``plan`` and ``demo``)."""
    argv = list(job["argv"])
    if argv[0] not in ("traces", "replay", "calibrate"):
        argv = ["servecal", *argv]
    exe = shutil.which(argv[0]) or argv[0]
    folder = Path(job["dir"])
    for p in folder.iterdir():  # the in-process run's output
        if p.name.startswith("out."):
            p.unlink()
    try:
        cp = subprocess.run([exe, *argv[1:]], capture_output=True, timeout=timeout_s, cwd=str(folder))
    except subprocess.TimeoutExpired:
        return {**job, "fault": "hang", "detail": f"console script ran over {timeout_s:g} s"}
    text = (cp.stdout + cp.stderr).decode("utf-8", "replace")
    if cp.returncode < 0:
        return {**job, "fault": "crash", "detail": f"killed by signal {-cp.returncode}: {_last(text)}"}
    if "Traceback" in text:
        return {**job, "fault": "traceback", "detail": _last(text)}
    fault, detail = judge(job, cp.returncode, text)
    return {**job, "fault": None if fault == "ok" else fault, "detail": detail, "exit": cp.returncode}
