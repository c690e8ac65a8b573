"""Render a ``replay --report`` HTML file in headless Chromium: check it, and save a screenshot.

    python bench/report_screenshot.py [--out bench/report_screenshot.png] [--width 1280]

Builds the report of the README's real run when ../shared/data/real is there (300 ShareGPT
requests of Llama-3.1-8B on an RTX PRO 6000, calibrated on the kernel profile, with vLLM's
measured time series), else of a synthetic trace; opens it in Debian's Chromium
(``apt-get install -y chromium``), checks what a reader would see (every figure decoded
with a non-zero size, no table cut: the page never scrolls sideways, a wide table scrolls in
its own box) and saves a full-page screenshot.

The same functions serve tests/replay/test_report_browser.py (skipped when Chromium is absent).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT.parent / "shared" / "data" / "real"

#: Flags for a root, offline, headless Chromium (no sandbox, no background connections).
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--mute-audio")

#: Injected into a copy of the report: on load, what the page shows, as JSON in <pre id="probe">.
PROBE = """<script>
window.addEventListener('load', () => {
  const r = {
    images: [...document.images].map(i => ({alt: i.alt, complete: i.complete, natural: [i.naturalWidth,
             i.naturalHeight], shown: [Math.round(i.getBoundingClientRect().width),
             Math.round(i.getBoundingClientRect().height)]})),
    scrollBoxes: [...document.querySelectorAll('.scroll')].map(d => ({scrollWidth: d.scrollWidth,
                  clientWidth: d.clientWidth, overflowX: getComputedStyle(d).overflowX})),
    tables: document.querySelectorAll('table').length,
    pageWidth: document.documentElement.scrollWidth, viewportWidth: window.innerWidth,
    pageHeight: document.documentElement.scrollHeight,
    verdict: (document.querySelector('.verdict') || {}).textContent || null,
    meta: Object.fromEntries([...document.querySelectorAll('dl.meta dt')].map(
            dt => [dt.textContent, dt.nextElementSibling.textContent])),
  };
  const pre = document.createElement('pre');
  pre.id = 'probe';
  pre.textContent = JSON.stringify(r);
  document.body.appendChild(pre);
});
</script>"""


def find_chromium() -> str | None:
    """Path of a Chromium executable, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _run(chromium: str, args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="servecal-chromium-") as profile:
        return subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=timeout, check=False)


def probe(report: Path, width: int = 1280, height: int = 900, chromium: str | None = None) -> dict:
    """Open a copy of ``report`` with :data:`PROBE` in headless Chromium; what the page showed.

    Returns
    -------
    dict
        ``images`` (per ``<img>``: ``natural`` and ``shown`` sizes, px), ``scrollBoxes``
        (per ``.scroll`` box: ``scrollWidth``, ``clientWidth``, ``overflowX``), ``tables``,
        ``pageWidth``, ``viewportWidth``, ``pageHeight`` (px), ``verdict`` and ``meta``
        (the header) as the browser rendered them.
    """
    chromium = chromium or find_chromium()
    text = Path(report).read_text()
    with tempfile.TemporaryDirectory(prefix="servecal-probe-") as tmp:
        page = Path(tmp) / "probe.html"
        page.write_text(text.replace("</body>", PROBE + "</body>"))
        res = _run(chromium, [f"--window-size={width},{height}", "--virtual-time-budget=10000", "--dump-dom",
                              page.as_uri()])
    m = re.search(r'<pre id="probe">(.*?)</pre>', res.stdout, re.S)
    if m is None:
        raise RuntimeError(f"chromium did not render the probe (exit {res.returncode}): {res.stderr[-2000:]}")
    import html

    return json.loads(html.unescape(m.group(1)))


def screenshot(report: Path, out: Path, width: int = 1280, height: int | None = None,
               chromium: str | None = None) -> dict:
    """Save a screenshot of ``report`` (the full page unless ``height``) as PNG; returns :func:`probe`'s result."""
    chromium = chromium or find_chromium()
    seen = probe(report, width, 900, chromium)
    height = height or min(int(seen["pageHeight"]) + 20, 16000)
    out = Path(out).resolve()
    res = _run(chromium, [f"--window-size={width},{height}", "--virtual-time-budget=10000",
                          f"--screenshot={out}", Path(report).resolve().as_uri()])
    if not out.exists():
        raise RuntimeError(f"chromium wrote no screenshot (exit {res.returncode}): {res.stderr[-2000:]}")
    return seen


def problems(seen: dict) -> list[str]:
    """What a reader would see wrong in a :func:`probe` result (empty: nothing)."""
    out = []
    if not seen["images"]:
        out.append("no figure")
    for img in seen["images"]:
        if not img["complete"] or min(img["natural"]) <= 0 or min(img["shown"]) <= 0:
            out.append(f"figure {img['alt']!r} not shown: natural {img['natural']}, shown {img['shown']}")
    if seen["pageWidth"] > seen["viewportWidth"]:
        out.append(f"the page scrolls sideways: {seen['pageWidth']} px in a {seen['viewportWidth']} px window")
    if len(seen["scrollBoxes"]) != seen["tables"]:
        out.append(f"{seen['tables']} tables but {len(seen['scrollBoxes'])} scroll boxes")
    for box in seen["scrollBoxes"]:
        if box["scrollWidth"] > box["clientWidth"] and box["overflowX"] != "auto":
            out.append(f"a table is cut: {box}")
    return out


def build_report(folder: Path, name: str = "report.html") -> Path:
    """Write the README's real-run report (or a synthetic one) to ``folder``; its path."""
    from click.testing import CliRunner

    from replay.cli import main as replay_main

    folder.mkdir(parents=True, exist_ok=True)
    trace, cal, ts = folder / "trace.parquet", folder / "cal.json", None
    requests = REAL / "lss_vllm_rtxpro6000_llama31_8b_requests.jsonl"
    opts = ["--scheduler", "chunked", "--max-num-seqs", "128", "--max-num-batched-tokens", "2048"]
    if requests.exists():
        from calibrate.umbrella import traces_cli
        from calibrate.cli import main as calibrate_main

        runner = CliRunner()
        for cmd, args in ((traces_cli, ["import", "vllm-request-stats", str(requests), "-o", str(trace)]),
                          (traces_cli, ["import", "llmservingsim-profile",
                                        *map(str, sorted(REAL.glob("lss_profile_rtxpro6000_llama31_8b_*"))),
                                        "-o", str(folder / "steps.parquet")]),
                          (calibrate_main, ["fit", str(folder / "steps.parquet"), "--model", "llama-3.1-8b",
                                            "--gpu", "rtx-pro-6000", "-o", str(cal)])):
            res = runner.invoke(cmd, args)
            if res.exit_code != 0:
                raise RuntimeError(f"{args[:2]}: {res.output}")
        ts = REAL / "lss_vllm_rtxpro6000_llama31_8b_timeseries.csv"
    else:
        sys.path.insert(0, str(ROOT / "tests"))
        from test_compare import make_cli_inputs

        trace, cal, opts = make_cli_inputs(folder, error=0.05)
    report = folder / name
    args = [str(trace), "--calibration", str(cal), *opts, "--report", str(report),
            "--tolerance", "ttft_p50=0.15,tpot_p50=0.15,e2e_p50=0.15"]
    if ts is not None:
        args += ["--measured-timeseries", str(ts)]
    res = CliRunner().invoke(replay_main, args)
    if res.exit_code not in (0, 3):
        raise RuntimeError(res.output)
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "report_screenshot.png")
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--report", type=Path, default=None, help="An existing .html report [default: build one].")
    args = ap.parse_args(argv)
    chromium = find_chromium()
    if chromium is None:
        print("no chromium on PATH: apt-get install -y chromium", file=sys.stderr)
        return 2
    version = subprocess.run([chromium, "--version"], capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="servecal-report-") as tmp:
        report = args.report or build_report(Path(tmp))
        seen = screenshot(report, args.out, args.width, chromium=chromium)
        size = os.path.getsize(report)
    print(f"{version}; report {size / 1024:.0f} KiB, one file")
    print(f"rendered at {args.width} px: page {seen['pageWidth']} x {seen['pageHeight']} px, {seen['tables']} tables, "
          f"{len(seen['images'])} figures " + ", ".join(f"{i['natural'][0]}x{i['natural'][1]}" for i in seen["images"]))
    print(f"verdict: {seen['verdict']}")
    for box in seen["scrollBoxes"]:
        if box["scrollWidth"] > box["clientWidth"]:
            print(f"a table {box['scrollWidth']} px wide scrolls in its {box['clientWidth']} px box")
    bad = problems(seen)
    for p in bad:
        print(f"PROBLEM: {p}")
    print(f"wrote {args.out}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
