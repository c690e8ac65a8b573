"""Every output of every command, and output paths that must never be written (issue 21).

Shared by ``test_output_paths.py`` (one test per command, output and kind of path) and the
long fuzz profile (``fuzzlib``, target ``output-path``). The commands' inputs are the file
names of :data:`INPUT_FILES`, created in the working folder: an output is refused before any
input is read, so their content does not matter.
"""
from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

#: The input files the commands below name (their content is never read before the refusal).
INPUT_FILES = ("t.parquet", "s.parquet", "cal.json", "in.csv", "in.json", "in.jsonl", "in.log", "in.yaml")

REPLAY = ("replay",)
#: (command path, its other arguments, the output option): every output option of every command.
OUTPUTS = [
    *[(("traces", "import", fmt), [src], "-o") for fmt, src in [
        ("vllm-request-stats", "in.jsonl"), ("llmservingsim-profile", "in.yaml"), ("azure", "in.csv"),
        ("vidur", "in.csv"), ("burstgpt", "in.csv"), ("mooncake", "in.jsonl"), ("vllm-bench", "in.json"),
        ("sglang-bench", "in.jsonl"), ("distserve", "in.log"), ("genai-perf", "in.json"), ("guidellm", "in.json"),
        ("blis-observe", "in.yaml"), ("vllm-otlp", "in.jsonl"), ("vllm-log", "in.log")]],
    (("traces", "import", "csv"), ["in.csv", "--map", "a=arrival_time_s"], "-o"),
    (("traces", "import", "llmperf"), ["in.json", "--concurrency", "2"], "-o"),
    (("traces", "import", "vllm-log"), ["in.log", "-o", "new.parquet"], "--timeseries-csv"),
    (("traces", "describe"), ["t.parquet"], "--plot"),
    (("traces", "export", "vidur"), ["t.parquet"], "-o"),
    (("traces", "synth"), ["--requests", "5", "--rate", "1"], "-o"),
    (("traces", "slice"), ["t.parquet"], "-o"),
    (("traces", "scale"), ["t.parquet", "--rate-scale", "2"], "-o"),
    (("calibrate", "fit"), ["s.parquet", "--model", "llama-3.1-8b", "--gpu", "h100-80gb"], "-o"),
    *[(("calibrate", "validate"), ["--fit-on", "s.parquet", "--score-on", "s.parquet", "--model", "llama-3.1-8b",
                                   "--gpu", "h100-80gb"], opt) for opt in ("-o", "--table-out")],
    *[(REPLAY, ["t.parquet", "--calibration", "cal.json"], opt)
      for opt in ("-o", "--steps-out", "--chrome-trace", "--report")],
    (REPLAY, ["t.parquet", "--calibration", "cal.json", "--sweep", "max-num-seqs=1,2"], "--sweep-out"),
    *[(("plan",), ["t.parquet", "--calibration", "cal.json", "--slo", "ttft_p90=2s"], opt) for opt in ("-o", "--report")],
]

#: How a refusal spells each option (ours ``-o/--output``, click's ``'-o' / '--output'``).
SPELLED = {"-o": "--output"}

#: The kinds of path an output may not be (a name in the working folder, or ``/dev/null``).
KINDS = ("device", "fifo", "directory", "symlink-file", "symlink-dangling", "symlink-dir", "symlink-device",
         "symlink-loop", "socket")


def make_inputs(folder: Path) -> None:
    """Write the (placeholder) input files of :data:`OUTPUTS` into ``folder``."""
    for name in INPUT_FILES:
        (folder / name).write_bytes(b"placeholder\n")


def make_special(folder: Path, kind: str, name: str) -> str:
    """Make ``folder/name`` a path of ``kind`` (:data:`KINDS`) and return the output path to
    give (``/dev/null`` itself for ``device``). A link's target file, ``victim``, holds
    ``KEEP``."""
    path = folder / name
    victim = folder / "victim"
    if kind == "device":
        return os.devnull
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(path))
    elif kind == "symlink-loop":
        path.symlink_to(name)
    else:
        target = {"symlink-file": victim, "symlink-dangling": folder / "nowhere", "symlink-dir": folder,
                  "symlink-device": Path(os.devnull)}[kind]
        if kind == "symlink-file":
            victim.write_text("KEEP")
        path.symlink_to(target)
    return str(path)


def snapshot(path: str) -> tuple:
    """What must not change at ``path``: its type, device number, link target, and the content
    of a link's regular target file."""
    st = os.lstat(path)
    link = os.readlink(path) if stat.S_ISLNK(st.st_mode) else None
    content = None
    if link is not None and os.path.isfile(path):
        content = Path(path).read_bytes()
    return stat.S_IFMT(st.st_mode), st.st_rdev, link, content
