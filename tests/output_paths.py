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
        ("blis-observe", "in.yaml"), ("vllm-otlp", "in.jsonl"), ("vllm-log", "in.log"), ("prometheus", "in.log"),
        ("inference-perf", "in.json"), ("aiperf", "in.jsonl")]],
    (("traces", "import", "csv"), ["in.csv", "--map", "a=arrival_time_s"], "-o"),
    (("traces", "import", "llmperf"), ["in.json", "--concurrency", "2"], "-o"),
    (("traces", "import", "summary"), ["llmperf", "in.json"], "-o"),
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
    *[(("plan",), ["t.parquet", "--calibration", "cal.json", "--slo", "ttft_p90=2s"], opt)
      for opt in ("-o", "--report")],
]

#: How a refusal spells each option (ours ``-o/--output``, click's ``'-o' / '--output'``).
SPELLED = {"-o": "--output"}

#: The kinds of path an output may not be (a name in the working folder, or ``/dev/null``).
KINDS = ("device", "fifo", "directory", "symlink-file", "symlink-dangling", "symlink-dir", "symlink-device",
         "symlink-loop", "socket")


def make_inputs(folder: Path, content: bytes = b"placeholder\n") -> None:
    """Write the input files of :data:`OUTPUTS` into ``folder``, each holding ``content``."""
    for name in INPUT_FILES:
        (folder / name).write_bytes(content)


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


def snapshot(path: str) -> list | None:
    """What must not change at ``path`` (JSON-able): its type, device number, link target, and
    the content of a link's regular target file; None when nothing is there."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    link = os.readlink(path) if stat.S_ISLNK(st.st_mode) else None
    content = None
    if link is not None and os.path.isfile(path):
        content = Path(path).read_bytes().decode("latin-1")
    return [stat.S_IFMT(st.st_mode), st.st_rdev, link, content]


# --- the long fuzz profile's target ``output-path`` (fuzz_targets) -----------------------------------

#: The name of the special path in a fuzz job's folder (``fuzz_jobs.run_console`` removes ``out.*``).
FUZZ_NAME = "dest.x"


def fuzz_argv(folder: Path, files: dict, rng) -> tuple[list[str], dict]:
    """One fuzz job: a random output of a random command given a path of a random kind
    (:data:`KINDS`, or in a folder that does not exist), spelled relative, ``./``-prefixed or
    absolute. Returns the command line and what :func:`judge_special` needs."""
    path, args, option = rng.choice(OUTPUTS)
    kind = rng.choice([*KINDS, "missing-folder"])
    make_inputs(folder, files["in.txt"].read_bytes())
    if kind == "missing-folder":
        given = str(folder / "nowhere" / FUZZ_NAME)
    else:
        given = make_special(folder, kind, FUZZ_NAME)
    if kind == "device":
        given = rng.choice([given, "/dev/../dev/null", "//dev/null"])
    else:
        rel = os.path.relpath(given, folder)
        given = rng.choice([given, rel, "./" + rel])
    return [*path, *args, option, given], {"path": given, "option": option, "before": snapshot_in(folder, given)}


def snapshot_in(folder: Path, given: str) -> list | None:
    """:func:`snapshot` of ``given`` as seen from ``folder`` (the job's working folder)."""
    return snapshot(given if os.path.isabs(given) else str(folder / given))


def judge_special(job: dict, exit_code: int, text: str) -> tuple[str, str]:
    """``("ok", "")`` when the job's special output path was refused (exit 2, one ``Error:``
    message naming the option and the path) and left as it was, no temporary file behind;
    else ``(fault, detail)``."""
    folder = Path(job["dir"])
    special = job["special"]
    last = " | ".join(line for line in text.strip().splitlines()[-3:])[:400]
    leftovers = [p.name for p in folder.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp")]
    if leftovers:
        return "temp-left", ", ".join(leftovers)
    if snapshot_in(folder, special["path"]) != special["before"]:
        return "output-path-changed", f"{special['path']}: {special['before']} -> " \
                                      f"{snapshot_in(folder, special['path'])}; {last}"
    if exit_code != 2:
        return "output-path-not-refused", f"exit {exit_code}: {last}"
    if sum(line.startswith("Error:") for line in text.splitlines()) != 1:
        return "message", last
    msg = " ".join(text[text.index("Error:"):].split())
    if SPELLED.get(special["option"], special["option"]) not in msg or special["path"] not in msg:
        return "no-option-named", msg[:300]
    return "ok", ""
