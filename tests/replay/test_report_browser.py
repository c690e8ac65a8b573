"""The HTML report as a browser shows it: headless Chromium (Debian's ``chromium``) renders
``replay --report r.html`` and every figure is decoded with a non-zero size, the header and
the verdict are there, and no table is cut. Skipped where Chromium is not installed (CI)."""
import importlib.util
from pathlib import Path

import pytest
from click.testing import CliRunner

from test_compare import make_cli_inputs

_BENCH = Path(__file__).resolve().parents[2] / "bench" / "report_screenshot.py"
_spec = importlib.util.spec_from_file_location("report_screenshot", _BENCH)
shot = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(shot)

# A system package pip cannot install: on a machine without it the rendered check cannot run
# (bench/report_screenshot.py and its committed screenshot cover the same page).
pytestmark = pytest.mark.skipif(shot.find_chromium() is None, reason="chromium is not installed "
                                "(apt-get install -y chromium)")


def test_report_renders_in_chromium_with_every_figure(tmp_path):
    from replay.cli import main

    trace, cal, opts = make_cli_inputs(tmp_path, error=0.05, n=40)
    report = tmp_path / "r.html"
    res = CliRunner().invoke(main, [str(trace), "--calibration", str(cal), *opts, "--report", str(report),
                                    "--tolerance", "ttft_p50=0.01,e2e_p50=0.5"])
    assert res.exit_code == 3, res.output
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".png") == []  # one file, nothing beside it
    seen = shot.probe(report, width=1000)
    assert shot.problems(seen) == []
    assert len(seen["images"]) >= 3  # scatter, CDF, steps
    for img in seen["images"]:
        assert img["complete"] and min(img["natural"]) > 100 and min(img["shown"]) > 50, img
    assert seen["verdict"].startswith("FAIL: 1 of 2 tolerances broken (ttft_p50)")
    assert seen["meta"]["trace"] == str(trace) and seen["meta"]["calibration"] == str(cal)
    assert seen["meta"]["model"] == "llama-3.1-8b" and seen["meta"]["servecal"]
    assert "max_num_batched_tokens=512" in seen["meta"]["engine"]
    # the main table's box scrolls when the table is wider than it (overflow-x: auto), so the page never does,
    # at 1000 px nor at the narrowest window headless Chromium lays out (about 500 px: the table wraps there)
    for view in (seen, shot.probe(report, width=320)):
        assert view["scrollBoxes"][0]["overflowX"] == "auto"
        assert view["pageWidth"] <= view["viewportWidth"], view["pageWidth"]


def test_screenshot_is_not_blank(tmp_path):
    from matplotlib.image import imread

    trace, cal, opts = make_cli_inputs(tmp_path, error=0.05, n=40)
    from replay.cli import main

    report = tmp_path / "r.html"
    res = CliRunner().invoke(main, [str(trace), "--calibration", str(cal), *opts, "--report", str(report)])
    assert res.exit_code == 0
    png = tmp_path / "shot.png"
    shot.screenshot(report, png, width=1000, height=1200)
    img = imread(png)
    assert img.shape[:2] == (1200, 1000)
    gray = img[..., :3].mean(axis=2)
    assert (gray < 0.5).mean() > 0.01 and gray.std() > 0.05  # text and figures, not a white page
