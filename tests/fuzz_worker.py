"""Fuzz worker: read one job (JSON) per line on stdin, run it through the CLI in-process, answer one line.

Started by :class:`fuzz_jobs.Worker`. An abort or a hang here costs this process, not the test
run: the parent restarts it and records the job as a crash or a hang.
"""
from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.setrecursionlimit(max(sys.getrecursionlimit(), 1000))


def main() -> None:
    from click.testing import CliRunner

    from schemas.quiet import quiet_warnings

    quiet_warnings()  # as the console scripts do
    import calibrate.umbrella as umbrella
    import fuzzlib

    out = sys.stdout
    sys.stdout = sys.stderr  # stray prints must not break the protocol
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        job = json.loads(line)
        os.chdir(job["dir"])
        res = CliRunner().invoke(umbrella.main, job["argv"], catch_exceptions=True)
        text = res.output
        if res.exception is not None and not isinstance(res.exception, SystemExit):
            tb = "".join(traceback.format_exception(res.exception))
            ans = {"fault": "traceback", "exit": res.exit_code,
                   "detail": f"{type(res.exception).__name__}: {str(res.exception)[:200]} @ "
                             + " | ".join(l.strip() for l in tb.strip().splitlines()[-6:-1])[:600]}
        elif "Traceback" in text:
            ans = {"fault": "traceback", "exit": res.exit_code, "detail": fuzzlib._last(text)}
        else:
            fault, detail = fuzzlib.judge(job, res.exit_code, text)
            ans = {"fault": None if fault == "ok" else fault, "detail": detail, "exit": res.exit_code,
                   "message": fuzzlib._last(text)[:200]}
        out.write(json.dumps(ans) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
