"""``replay AGG[#K]`` (issue #32 item 2): aggregates replayed level by level, as the fit replays them,
each reported statistic beside the prediction and its band."""
import re
from pathlib import Path

import numpy as np
import pytest

from calibrate.aggregate_runs import aggregate_runs
from calibrate.aggregate_score import score_aggregates
from replay.config import ReplayConfig
from replay.cost.cost_model import RooflineCostModel
from schemas.calibration import Calibration, FittedParam
from schemas.cost_params import CostParams
from schemas.specs import get_gpu, get_model
from traces.io import read_trace, write_trace

from helpers import flat, invoke_servecal, write_calibration

SCRAPES = Path(__file__).resolve().parents[1] / "data" / "vllm_metrics_scrapes.txt"
COST = RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("rtx-pro-6000"),
                         CostParams(eta_compute=0.5, eta_mem=0.8, t_step_s=2e-4))


@pytest.fixture
def scrape(tmp_path):
    """The tests' five scrapes as two 30 s windows, and a calibration of the cost model COST."""
    agg, cal = tmp_path / "prod.parquet", tmp_path / "cal.json"
    assert invoke_servecal("traces", "import", "prometheus", SCRAPES, "--window-s", "30", "-o", agg).exit_code == 0
    write_calibration(COST, cal)
    return agg, cal


def _rows(output: str) -> dict:
    """{(level, metric, stat): (reported, predicted)} of the printed tables, ms."""
    out, level = {}, None
    for line in output.splitlines():
        head = re.match(r"\S+#(\d+): ", line)
        if head:
            level = int(head.group(1))
        row = re.match(r"\s+(TTFT|TPOT|E2E)\s+(\S+)\s+([\d.]+)\s+([\d.]+)", line)
        if row:
            out[level, row.group(1).lower(), row.group(2)] = (float(row.group(3)), float(row.group(4)))
    return out


def test_each_level_is_scored_as_calibrate_validate_scores_it(scrape):
    agg, cal = scrape
    res = invoke_servecal("replay", agg, "--calibration", cal, "--no-band")
    assert res.exit_code == 0, res.output
    printed = _rows(res.output)
    kind, frame, meta = read_trace(agg)
    runs = aggregate_runs(str(agg), frame, meta, ReplayConfig(), None)
    table = score_aggregates(runs, COST)  # the fit's own scoring of the same synthesized workloads
    assert len(table) == len(printed) > 0
    for r in table.itertuples():
        level = int(r.run.rpartition("#")[2])
        reported, predicted = printed[level, r.metric, r.statistic]
        assert reported == pytest.approx(1e3 * r.meas_s, abs=0.006)
        assert predicted == pytest.approx(1e3 * r.pred_s, abs=0.006)
    # the 30-60 s window: 7 held at 30 s (6 running, 1 waiting) and 44 + 14 - 7 = 51 arrived (14 held at 60 s)
    assert "prod.parquet#1: poisson rate 1.7, 44 requests reported; 58 synthesized" in flat(res.output)
    assert "a window of scrapes: its histograms counted the requests finished (TTFT: first token out) by its end, " \
           "30 s into the workload" in flat(res.output)
    means = [abs(e) for e in table.loc[table["statistic"] == "mean", "rel_err"]]
    assert f"median |error| of the reported means: {np.median(means):.1%} over 6" in flat(res.output)


def test_one_level_with_its_band(scrape, tmp_path):
    agg, plain = scrape
    res = invoke_servecal("replay", f"{agg}#1", "--calibration", plain)
    assert res.exit_code == 0 and "no band: the calibration has no band points" in flat(res.output), res.output
    cal = tmp_path / "banded.json"
    values = {k: v for k, v in COST.params.items() if v == v}
    Calibration(COST.model, COST.gpu, 1, {k: FittedParam(v) for k, v in values.items()}, terms=list(COST.terms),
                band_points=[{"eta_compute": 0.4}, {"eta_compute": 0.6}, {"eta_mem": 0.7}]).write(cal)
    res = invoke_servecal("replay", f"{agg}#1", "--calibration", cal)
    assert res.exit_code == 0, res.output
    assert "#0:" not in res.output and "prod.parquet#1:" in res.output
    banded = [line for line in res.output.splitlines() if re.search(r"\[[\d.]+, [\d.]+\]", line)]
    assert len(banded) == 9  # p50, p90, p99 of TTFT, TPOT and E2E
    assert all(line.rstrip().endswith((" in", " OUT")) for line in banded)
    inside = sum(line.rstrip().endswith(" in") for line in banded)
    assert f"{inside} of 9 reported percentiles inside their 95 % band" in flat(res.output)
    assert "each band also holds half its percentile's histogram bucket" in flat(res.output)
    # the window's band is of the statistics printed beside it (the requests its histograms counted, at each
    # band point), so it holds its own point (was: of every completed request, around another value)
    for line in banded:
        point, low, high = map(float, re.search(r"([\d.]+) \[([\d.]+), ([\d.]+)\]", line).groups())
        assert low <= point <= high, line


def test_a_histogram_bucket_widens_the_band_in_quadrature():
    from replay.cli.aggregate_levels import _with_bucket

    # sides 0.2 and 0.3 s around 1 s, a bucket of 0.3 s: half of it, 0.15 s, in quadrature
    assert _with_bucket(1.0, 0.8, 1.3, 0.3) == pytest.approx((1.0 - 0.25, 1.0 + 0.33541019662))
    assert _with_bucket(1.0, 0.8, 1.3, None) == (0.8, 1.3)
    assert _with_bucket(0.1, 0.05, 0.2, 1.0)[0] == 0.0  # clipped at 0


@pytest.mark.parametrize("args, code, message", [
    (["-o", "pred.parquet"], 2, "-o needs a request trace: aggregates are replayed level by level"),
    (["--sweep", "rate-scale=1,2"], 2, "--sweep needs a request trace"),
    # a level sets its own load (was: --concurrency ignored, and with --think-time-s a contradictory error)
    (["--concurrency", "4"], 2, "--concurrency needs a request trace"),
    (["--concurrency", "1", "--think-time-s", "30"], 2, "--concurrency, --think-time-s need a request trace"),
])
def test_per_request_outputs_are_refused(scrape, tmp_path, args, code, message):
    agg, cal = scrape
    res = invoke_servecal("replay", agg, "--calibration", cal, *args)
    assert res.exit_code == code and message in flat(res.output), res.output
    assert not (tmp_path / "pred.parquet").exists()


def test_a_level_the_file_has_not_and_a_level_of_a_request_trace(scrape, tmp_path):
    agg, cal = scrape
    res = invoke_servecal("replay", f"{agg}#7", "--calibration", cal)
    assert res.exit_code == 1 and "prod.parquet#7: no such level (the file has 0, 1)" in flat(res.output)
    trace = tmp_path / "run.parquet"
    assert invoke_servecal("traces", "synth", "--requests", "20", "--rate", "2", "-o", trace).exit_code == 0
    res = invoke_servecal("replay", f"{trace}#1", "--calibration", cal)
    assert res.exit_code == 1 and "#K picks a level of aggregates" in flat(res.output), res.output


@pytest.mark.parametrize("suffix", [".md", ".html"])
def test_the_report_has_a_row_per_statistic_and_the_levels_figure(scrape, tmp_path, suffix):
    agg, _ = scrape
    cal = tmp_path / "banded.json"
    values = {k: v for k, v in COST.params.items() if v == v}
    Calibration(COST.model, COST.gpu, 1, {k: FittedParam(v) for k, v in values.items()}, terms=list(COST.terms),
                band_points=[{"eta_compute": 0.4}, {"eta_compute": 0.6}]).write(cal)
    report = tmp_path / f"levels{suffix}"
    res = invoke_servecal("replay", agg, "--calibration", cal, "--report", report)
    assert res.exit_code == 0, res.output
    text = report.read_text()
    printed = _rows(res.output)
    # every printed statistic is a row of the report, with the same reported and predicted values
    for (level, metric, stat), (reported, predicted) in printed.items():
        load = "poisson rate 1.16667" if level == 0 else "poisson rate 1.7"
        row = f"{level} | {load} | {metric.upper()} | {stat} | {reported:.2f} | {predicted:.2f}"
        assert row in text or row.replace(" | ", "</td><td>") in text, row
    inside = re.search(r"(\d+) of (\d+) reported percentiles inside", res.output)
    assert f"{inside.group(1)} of {inside.group(2)} reported percentiles inside their 95 % band" in text
    if suffix == ".md":
        assert (tmp_path / "levels_files" / "levels.png").read_bytes()[:4] == b"\x89PNG"
    else:
        assert "data:image/png;base64," in text and not (tmp_path / "levels_files").exists()


@pytest.mark.parametrize("suffix", ["#abc", "#-1", "#", "#1.0"])
def test_a_level_that_is_not_a_number_is_one_error_naming_the_form(scrape, suffix):
    agg, cal = scrape
    res = invoke_servecal("replay", f"{agg}{suffix}", "--calibration", cal)
    assert res.exit_code == 1 and f"prod.parquet{suffix}: expected FILE[#K] with K a level number" in flat(res.output)


def test_a_level_without_latency_statistics_says_so_and_its_report_is_written(scrape, tmp_path):
    agg, cal = scrape
    kind, frame, meta = read_trace(agg)
    bare = tmp_path / "bare.parquet"
    write_trace(frame[frame["metric"].str.startswith("num_")], kind, bare, metadata=meta)
    res = invoke_servecal("replay", bare, "--calibration", cal, "--report", tmp_path / "bare.md")
    assert res.exit_code == 0, res.output
    assert "bare.parquet#0 reports no TTFT, TPOT or E2E statistic: nothing to compare" in flat(res.output)
    assert (tmp_path / "bare.md").exists()


def test_the_deployment_each_level_replays_on_is_said(scrape):
    agg, cal = scrape
    res = invoke_servecal("replay", agg, "--calibration", cal, "--tp", "2", "--no-band")
    assert res.exit_code == 0, res.output
    assert "replaying 2 level(s) of" in flat(res.output) and "TP=2" in flat(res.output), res.output
    assert "predicted ms [95 % band]" not in res.output  # --no-band: no band column


def test_describe_with_a_calibration_refuses_aggregates_before_any_output(scrape):
    agg, cal = scrape
    res = invoke_servecal("traces", "describe", agg, "--calibration", cal)
    assert res.exit_code == 1 and res.output.startswith("Error:"), res.output
    assert "prod.parquet: is an aggregate_targets/1; --calibration needs a request trace" in flat(res.output)


def test_a_window_s_percentiles_are_of_the_requests_its_histograms_counted():
    import pandas as pd

    from replay.analysis.metrics import window_percentiles
    from schemas.status import OK
    from traces.scrape_window import OBSERVED_UNTIL

    # arrivals 0, 0.2, 0.3 s; first tokens at 0.1, 0.3, 0.6 s; ends at 0.5, 0.7, 1.3 s; a fourth request failed.
    # A window ending at 0.65 s counted all three first tokens and the first request's end only.
    result = pd.DataFrame({"arrival_time_s": [0.0, 0.2, 0.3, 0.0], "pred_status": [OK, OK, OK, "rejected"],
                           "pred_ttft_s": [0.1, 0.1, 0.3, np.nan], "pred_e2e_s": [0.5, 0.5, 1.0, np.nan],
                           "pred_tpot_s": [0.01, 0.02, 0.03, np.nan]})
    got = window_percentiles(result, {OBSERVED_UNTIL: "0.65"})
    assert got["ttft_p50_s"] == pytest.approx(0.1) and got["ttft_p90_s"] == pytest.approx(0.26)
    assert got["e2e_p50_s"] == got["e2e_p99_s"] == pytest.approx(0.5)  # not 0.5 and 1.0 of every completed one
    assert got["tpot_p50_s"] == pytest.approx(0.01)
    assert window_percentiles(result, {}) == {}  # not a window: the prediction row's own statistics stand


def test_a_window_s_band_is_around_the_statistics_printed_beside_it(scrape):
    from replay.analysis.bands import BandJob, predict_with_band
    from replay.analysis.metrics import statistics
    from replay.simulate import replay_frame
    from schemas.status import OK
    from traces.aggregate_workload import level_workload
    from traces.scrape_window import observed, observed_until

    agg, _ = scrape
    kind, frame, meta = read_trace(agg)
    _, workload, level_meta = level_workload(frame, 1, meta, agg)
    until_s = observed_until(level_meta)
    assert until_s is not None
    band = predict_with_band(BandJob(workload, level_meta, COST, ReplayConfig(), [{"eta_mem": 0.7}]))
    result, _ = replay_frame(workload, COST, ReplayConfig(), level_meta)
    done = result[result["pred_status"] == OK]
    for m in ("ttft", "tpot", "e2e"):
        values = done[f"pred_{m}_s"].to_numpy(float)
        seen = values[observed(done["arrival_time_s"], done, f"{m}_s", until_s)]
        for q, value in zip((50, 90, 99), statistics(seen[np.isfinite(seen)], np.array([50.0, 90.0, 99.0]))):
            assert band.point[f"{m}_p{q}_s"] == pytest.approx(value)
            assert band.low[f"{m}_p{q}_s"] <= value <= band.high[f"{m}_p{q}_s"]
    # the window left requests unfinished: every completed request's E2E p90 is another number
    assert np.percentile(done["pred_e2e_s"], 90) != pytest.approx(band.point["e2e_p90_s"])
