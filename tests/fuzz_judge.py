"""The fuzzer's judge of one outcome (run in the worker, where the CLI ran): the outcome rule of
``fuzzlib`` (exit 0 with an output that reads back, or exit 1/2 with one ``Error:`` naming an
input file, no output and no temporary file left), and the read-back of an output.

Part of the fuzzer of ``fuzzlib``; nothing here depends on pytest.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import output_paths


def judge(job: dict, exit_code: int, text: str) -> tuple[str, str]:
    """``("ok", "")`` or ``(fault, detail)`` for one finished job (not traceback/crash/hang)."""
    if job.get("special"):
        return output_paths.judge_special(job, exit_code, text)
    out = Path(job["output"]) if job["output"] else None
    folder = Path(job["dir"])
    if "RuntimeWarning" in text or "DeprecationWarning" in text:
        return "warning", _last(text)
    leftovers = [p.name for p in folder.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp")]
    if leftovers:
        return "temp-left", ", ".join(leftovers)
    if exit_code == 0:
        if out is None:
            return "ok", ""
        if not out.exists():
            return "no-output", _last(text)
        try:
            check_output(out, job["output_kind"])
        except Exception as exc:  # noqa: BLE001 - any failure to read back is a finding
            return "bad-output", f"{type(exc).__name__}: {str(exc)[:300]}"
        return "ok", ""
    if exit_code not in (1, 2):
        return "exit-code", f"{exit_code}: {_last(text)}"
    if out is not None and out.exists():
        return "partial-output", _last(text)
    errors = [l for l in text.splitlines() if l.startswith("Error:")]
    if len(errors) != 1:
        return "message", _last(text)
    msg = text[text.index("Error:"):]
    names = [p for p in job["inputs"]]
    if not any(p in msg or os.path.basename(p) in msg for p in names) and not _option_message(msg):
        return "no-file-named", msg[:300]
    return "ok", ""


def _option_message(msg: str) -> bool:
    """A usage error about an option (exit 2) names the option, not a file."""
    return bool(re.search(r"(^|\s)--[a-z]", msg))


def _last(text: str) -> str:
    s = [l for l in text.strip().splitlines() if l.strip()]
    return " | ".join(s[-3:])[:400]


def check_output(path: Path, kind: str) -> None:
    """Raise unless the output reads back: ``traces validate`` rules, or a loadable calibration."""
    if kind == "calibration":
        from schemas.calibration import Calibration

        Calibration.read(path)
        return
    from traces.io import read_trace

    got, frame, _ = read_trace(path)
    if got != kind:
        raise AssertionError(f"kind {got}, expected {kind}")

