"""Import speed and peak memory of ``traces import azure`` on a 10-million-row CSV and a real trace.

Usage::

    python bench/import_speed.py [--rows 10000000] [--real PATH]

It writes an Azure-style CSV (``TIMESTAMP`` with 7 fractional digits, ``ContextTokens``,
``GeneratedTokens``; Poisson arrivals at 2,900 req/s, lognormal lengths, seed 0) into a
temporary folder, then runs ``traces import azure`` on it **in a fresh child process** and
reports the child's wall time and peak resident memory (``resource.getrusage(RUSAGE_SELF)
.ru_maxrss`` in the child, cross-checked with ``VmHWM`` of ``/proc/self/status``). The CSV is
generated in another child, so the parent stays small (Linux carries a parent's ``ru_maxrss``
into a child through fork + exec). It does the same for the real Azure conversation trace when
it is found (``../shared/data/real/azure_llm_2023_conv.csv`` by default). The temporary
folder is removed at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_REAL = ROOT.parent / "shared" / "data" / "real" / "azure_llm_2023_conv.csv"


def write_azure_csv(path: Path, rows: int, seed: int = 0, chunk: int = 1_000_000) -> None:
    """Write ``rows`` Azure-format rows in chunks (bounded memory)."""
    rng = np.random.default_rng(seed)
    start = np.datetime64("2024-05-10T00:00:00", "ns")
    t_ns = 0
    with open(path, "w") as fh:
        fh.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        done = 0
        while done < rows:
            n = min(chunk, rows - done)
            gaps = np.rint(rng.exponential(1e9 / 2900.0, n) / 100).astype(np.int64) * 100  # 100 ns ticks
            ts = t_ns + np.cumsum(gaps)
            t_ns = int(ts[-1])
            s = np.datetime_as_string(start + ts.astype("timedelta64[ns]"), unit="ns").tolist()
            ctx = np.maximum(1, np.rint(rng.lognormal(6.8, 0.9, n))).astype(np.int64).tolist()
            gen = np.maximum(1, np.rint(rng.lognormal(4.9, 0.9, n))).astype(np.int64).tolist()
            # 'YYYY-MM-DDTHH:MM:SS.nnnnnnnnn' -> 'YYYY-MM-DD HH:MM:SS.nnnnnnn' (7 digits, as the real trace)
            fh.write("\n".join(f"{a[:10]} {a[11:-2]},{b},{c}" for a, b, c in zip(s, ctx, gen)))
            fh.write("\n")
            done += n


def _child(src: str, out: str) -> None:
    """Run the import in this process and print wall time and peak RSS as JSON."""
    from click.testing import CliRunner

    from traces.cli import main

    t0 = time.perf_counter()
    res = CliRunner().invoke(main, ["import", "azure", src, "-o", out], catch_exceptions=False)
    wall = time.perf_counter() - t0
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    hwm_kib = None
    try:
        hwm_kib = int(next(x for x in Path("/proc/self/status").read_text().splitlines()
                           if x.startswith("VmHWM")).split()[1])
    except (OSError, StopIteration, ValueError):
        pass
    print(json.dumps({"exit_code": res.exit_code, "output": res.output.strip(), "wall_s": wall,
                      "peak_rss_mib": peak_kib / 1024, "vmhwm_mib": hwm_kib / 1024 if hwm_kib else None}))


def measure(src: Path, out: Path) -> dict:
    """Import ``src`` in a fresh child process; return its figures."""
    proc = subprocess.run([sys.executable, __file__, "--child", str(src), str(out)], capture_output=True, text=True,
                          check=True, cwd=ROOT)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def machine() -> str:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kib = int(next(x for x in Path("/proc/meminfo").read_text().splitlines()
                       if x.startswith("MemTotal")).split()[1])
        mem = f", {kib / 1024 ** 2:.0f} GiB RAM"
    except (OSError, StopIteration, ValueError):
        pass
    return f"{os.cpu_count()} CPUs (nproc {len(os.sched_getaffinity(0))}), {cpu}{mem}; {platform.platform()}; " \
           f"Python {platform.python_version()}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--real", type=Path, default=DEFAULT_REAL)
    ap.add_argument("--child", nargs=2, metavar=("SRC", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--generate", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(*args.child)
        return
    if args.generate:
        write_azure_csv(args.generate, args.rows)
        return
    import pyarrow

    print(f"machine: {machine()}; pyarrow {pyarrow.__version__}")
    with tempfile.TemporaryDirectory(prefix="servecal-bench-") as tmp:
        tmp = Path(tmp)
        big = tmp / "azure_big.csv"
        t0 = time.perf_counter()
        # generated in a child too: on Linux a child inherits its parent's ru_maxrss through
        # fork + exec, so this process must stay small for the children's figures to be theirs
        subprocess.run([sys.executable, __file__, "--generate", str(big), "--rows", str(args.rows)], check=True,
                       cwd=ROOT)
        print(f"generated {args.rows:,} rows, {big.stat().st_size / 2 ** 20:.0f} MiB "
              f"in {time.perf_counter() - t0:.1f} s")
        r = measure(big, tmp / "big.parquet")
        print(f"synthetic {args.rows:,} rows: wall {r['wall_s']:.1f} s, peak RSS {r['peak_rss_mib']:.0f} MiB "
              f"(VmHWM {r['vmhwm_mib']:.0f} MiB), "
              f"exit {r['exit_code']}, {(tmp / 'big.parquet').stat().st_size / 2 ** 20:.0f} MiB Parquet")
        print(f"  {r['output']}")
        if args.real.exists():
            r = measure(args.real, tmp / "real.parquet")
            print(f"real {args.real.name}: wall {r['wall_s']:.2f} s, peak RSS {r['peak_rss_mib']:.0f} MiB "
                  f"(VmHWM {r['vmhwm_mib']:.0f} MiB), "
                  f"exit {r['exit_code']}")
            print(f"  {r['output']}")
        else:
            print(f"real trace not found at {args.real}; skipped")


if __name__ == "__main__":
    main()
