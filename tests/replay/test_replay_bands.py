"""``replay`` with the calibration's bands on one replay (issue 18 items 1 and 5): the PREDICTION
table and the band coverage line, the report, the band beyond the load the calibration saw
(issue #36 item 2), ITL's band and a band too wide to decide (issue 31 item 3). A replay unlike
the calibrated run (a what-if, sweeps, scheduler comparisons): ``test_replay_what_if_bands.py``."""
import re

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from replay.analysis.band_tables import NO_BAND_POINTS
from replay.analysis.bands import BAND_STATS
from replay.analysis.compare import ms_cell
from replay.config import EngineOptions, ReplayConfig
from replay.cost.cost_model import RooflineCostModel
from replay.simulate import replay_frame
from replay.text import WIDTH
from schemas.calibration import Calibration, FittedParam, sha256_of
from schemas.cost_params import CostParams
from schemas.specs import get_gpu, get_model
from schemas.tables import REQUEST_TRACE
from traces.synth import synth_requests

COST = RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb"),
                         CostParams(eta_compute=0.5, eta_mem=0.8, t_step_s=1e-4))
#: Two points of a confidence set: the per-step time 50 us lower and higher.
POINTS = [{"t_step_s": 0.5e-4}, {"t_step_s": 1.5e-4}]


def write_cal(path, points=POINTS, engine=None, tp=1, fitted_on=None):
    values = {k: v for k, v in COST.params.items() if v == v}
    Calibration(COST.model, COST.gpu, tp, {k: FittedParam(v, stderr=v / 10 or None, ci95=(v * 0.9, v * 1.1))
                                           for k, v in values.items()},
                terms=list(COST.terms), engine=engine or {}, band_points=list(points),
                source={"path": str(fitted_on or "fitted.parquet"),
                        "sha256": sha256_of(fitted_on) if fitted_on else "0" * 64, "kind": REQUEST_TRACE}).write(path)


def invoke(*args):
    from replay.cli import main

    return CliRunner().invoke(main, list(map(str, args)), prog_name="replay")


def widest(text):
    return max(map(len, text.splitlines()), default=0)


@pytest.fixture
def spaced(tmp_path, monkeypatch):
    """Three identical requests 10 s apart (100 prompt tokens, 2 output tokens), no measured
    latencies: each runs alone, so TTFT is one prefill step and TPOT one decode step."""
    from traces.io import write_trace

    monkeypatch.chdir(tmp_path)
    df = pd.DataFrame({"request_id": ["a", "b", "c"], "arrival_time_s": [0.0, 10.0, 20.0],
                       "num_prompt_tokens": [100] * 3, "num_output_tokens": [2] * 3})
    write_trace(df, REQUEST_TRACE, "t.parquet")
    write_cal("cal.json")
    return "t.parquet", "cal.json"


@pytest.fixture
def measured(tmp_path, monkeypatch):
    """300 requests with latencies measured on a slower 'cluster'; a calibration of COST with POINTS."""
    from traces.io import write_trace

    monkeypatch.chdir(tmp_path)
    df = synth_requests(300, 20.0, "lognormal:mean=800,sigma=0.8", "lognormal:mean=150,sigma=0.8", seed=1)
    truth = COST.with_params(COST.params.replace(t_step_s=1.2e-4))
    meas, _ = replay_frame(df, truth, ReplayConfig(EngineOptions(max_num_seqs=32)))
    df = df.assign(queue_wait_s=meas["pred_queue_wait_s"], ttft_s=meas["pred_ttft_s"], tpot_s=meas["pred_tpot_s"],
                   e2e_s=meas["pred_e2e_s"])
    write_trace(df, REQUEST_TRACE, "m.parquet")
    write_cal("cal.json", engine={"max_num_seqs": 32}, fitted_on="m.parquet")
    return "m.parquet", "cal.json"


def _row(output, metric):
    return next(line for line in output.splitlines() if line.split() and line.split()[0] == metric)


# -- item 1: the PREDICTION table ------------------------------------------------------------------------

def test_a_pure_what_if_prints_its_prediction_with_the_hand_known_p50_and_band(spaced):
    trace, cal = spaced
    res = invoke(trace, "--calibration", cal)
    assert res.exit_code == 0, res.output
    assert "PREDICTION" in res.output and "nothing to compare" in res.output
    assert widest(res.output) <= WIDTH, res.output
    # alone in the engine: TTFT = one prefill step of 100 tokens, at each point of the set
    ttft = [COST.with_params(COST.params.replace(**pt)).prefill_time_s(100) for pt in ({}, *POINTS)]
    assert ttft[1] < ttft[0] < ttft[2]
    cells = _row(res.output, "ttft")
    assert f"{ms_cell(ttft[0])} [{ms_cell(ttft[1])}, {ms_cell(ttft[2])}]" in cells, cells
    assert _row(res.output, "queue_wait").split()[1:4] == ["0.0", "[0.0,", "0.0]"]
    assert "the 2 points of the calibration's 95 % confidence set" in " ".join(res.output.split())
    assert "goodput" not in res.output  # no SLO given


def test_goodput_band_with_an_slo_and_no_band_legends(spaced, tmp_path):
    trace, cal = spaced
    res = invoke(trace, "--calibration", cal, "--slo-ttft-s", 10)
    assert res.exit_code == 0, res.output
    assert "goodput (ttft <= 10.0 s): " in res.output and "[" in _row(res.output, "goodput")
    off = invoke(trace, "--calibration", cal, "--no-band")
    assert off.exit_code == 0 and "no band (--no-band)" in off.output and "[" not in _row(off.output, "ttft")
    write_cal(tmp_path / "old.json", points=[])
    old = invoke(trace, "--calibration", "old.json")
    assert old.exit_code == 0 and NO_BAND_POINTS in " ".join(old.output.split())


def test_measured_run_keeps_the_comparison_and_counts_the_statistics_in_their_band(measured):
    trace, cal = measured
    res = invoke(trace, "--calibration", cal)
    assert res.exit_code == 0, res.output
    assert "PREDICTION" in res.output and "err_p50" in res.output and "change" not in res.output
    line = " ".join(res.output.split("inside their 95 % band: ")[1].split())
    inside, total = int(line.split()[0]), int(line.split()[2])
    assert total == 8  # p50 and p90 of queue_wait, ttft, tpot, e2e
    assert (inside == total) == ("outside" not in line)
    assert widest(res.output) <= WIDTH, res.output


# -- item 5: the report ----------------------------------------------------------------------------------

def test_report_of_a_pure_what_if_has_the_predicted_table_parameters_and_provenance(spaced):
    trace, cal = spaced
    res = invoke(trace, "--calibration", cal, "--report", "r.md")
    assert res.exit_code == 0, res.output
    text = open("r.md").read()
    assert "## Prediction" in text and "| ttft |" in text and "[" in text.split("## Prediction")[1]
    assert "## Calibration" in text and "| eta_compute | 0.5 |" in text and "identified" in text
    assert "out of sample" in text and "replay t.parquet --calibration cal.json --report r.md" in text


def test_report_in_sample_and_band_columns(measured):
    from schemas.calibration import sha256_of

    trace, cal = measured
    c = Calibration.read(cal)
    c.source = {"path": trace, "sha256": sha256_of(trace), "kind": REQUEST_TRACE}
    c.write(cal)
    res = invoke(trace, "--calibration", cal, "--report", "r.html")
    assert res.exit_code == 0, res.output
    text = open("r.html").read()
    assert "in sample: the calibration was fitted on this trace" in text
    assert "<th>band_p50</th>" in text and "<th>err_p50</th>" in text
    whatif = invoke(trace, "--calibration", cal, "--max-num-seqs", 8, "--report", "w.html")
    assert whatif.exit_code == 0, whatif.output
    text = open("w.html").read()
    assert "<th>change_p50</th>" in text and "<th>err_p50</th>" not in text and "what-if" in text


def test_band_cell_contains_the_point():
    from replay.analysis.bands import band_of_rows

    band = band_of_rows({s: 1.0 for s in BAND_STATS}, [{s: 0.9 for s in BAND_STATS}, {s: 1.2 for s in BAND_STATS}])
    assert band.cell("ttft_p50_s", fmt=ms_cell) == "1000 [833.3, 1200]"  # the farthest point, 1.2x, on both sides
    assert all(band.low[s] <= band.point[s] <= band.high[s] for s in BAND_STATS)
    assert np.isfinite(band.half_width("ttft_p50_s"))


# --- where the calibration stops (issue #36 item 2) -------------------------------------------


def _held_out_cal(path, rel_errs, fit=None):
    """A calibration with held-out errors measured at 1-2 req/s and ``fit`` statistics."""
    values = {k: v for k, v in COST.params.items() if v == v}
    errors = [{"part": f"run {i}", "metric": m, "pct": 50.0, "rel_err": e, "distance": 0.0}
              for i, e in enumerate(rel_errs) for m in ("ttft_s", "tpot_s", "e2e_s")]
    Calibration(COST.model, COST.gpu, 1, {k: FittedParam(v) for k, v in values.items()}, terms=list(COST.terms),
                band_points=list(POINTS), fit=fit or {},
                holdout={"method": "leave one run out", "errors": errors,
                         "fitted_range": {"rate_rps": [1.0, 2.0], "running": [0.2, 0.5]}}).write(path)


@pytest.fixture
def at_rate(tmp_path, monkeypatch):
    """Traces of 200 requests at 1.5 and 8 req/s (4x the largest fitted 2 req/s)."""
    from traces.io import write_trace

    monkeypatch.chdir(tmp_path)
    for name, rate in (("near.parquet", 1.5), ("far.parquet", 8.0)):
        write_trace(synth_requests(200, rate, "fixed:300", "fixed:40", seed=3), REQUEST_TRACE, name)
    return tmp_path


def test_a_what_if_at_4x_the_fitted_rate_warns_and_has_a_wider_band_than_at_1_5x(at_rate):
    from replay.analysis.band_tables import PART_NAMES

    _held_out_cal("cal.json", [0.02, -0.04, 0.03])
    near = invoke("near.parquet", "--calibration", "cal.json", "--wide")
    far = invoke("far.parquet", "--calibration", "cal.json", "--wide")
    assert near.exit_code == 0 and far.exit_code == 0, far.output
    text = " ".join(far.output.split())
    # 7 req/s of ~0.26 s requests: ~1.8 running (Little), 3.6x the largest fitted 0.5; at 1.5 req/s 0.4
    assert re.search(r"warning: the mean requests running \(Little's law on E2E less queue wait\) 1\.\d+ requests is "
                     r"3\.\dx the largest fitted \(0\.5 requests\): outside the load the calibration saw, its model "
                     r"error widened x3\.\d", text), text
    assert "outside the load" not in near.output

    def e2e_p50_band(out):
        row = next(line for line in out.splitlines() if line.strip().startswith("e2e") and "[" in line)
        point, lo, hi = (float(x) for x in row.replace("[", " ").replace("]", " ").replace(",", " ").split()[1:4])
        return (hi - lo) / 2 / point

    assert e2e_p50_band(far.output) > e2e_p50_band(near.output) > 0
    # --wide: the breakdown, every part named; the model part at 1.5x is the largest held-out error, 4 %
    assert "band parts" in near.output and all(p in near.output for p in PART_NAMES)
    e2e = next(line.split() for line in near.output.splitlines() if line.strip().startswith("e2e p50"))
    assert e2e[3] == "4.0%"  # statistic (2 words), parameters, model


def test_a_calibration_graded_poor_says_its_bands_are_not_meaningful(at_rate):
    poor = {"residual_by_run": {"r": {"ttft_s": {"p50": 0.4, "p90": -0.3}, "tpot_s": {"p50": 0.2, "p90": 0.25}}}}
    _held_out_cal("cal.json", [0.02, -0.04, 0.03], fit=poor)
    res = invoke("near.parquet", "--calibration", "cal.json")
    assert res.exit_code == 0, res.output
    assert "warning: the calibration is graded poor: its bands are not meaningful" in " ".join(res.output.split())


def test_a_replay_with_token_times_prints_itl_with_its_band(spaced):
    trace, cal = spaced
    res = invoke(trace, "--calibration", cal, "--token-times")
    assert res.exit_code == 0, res.output
    row = next(line for line in res.output.splitlines() if line.strip().startswith("itl"))
    assert "[" in row  # point [low, high]
    assert "itl" not in invoke(trace, "--calibration", cal).output.split("PREDICTION")[1].split("throughput")[0]


# -- issue 31 item 3: a band too wide to decide points to calibrate advise -------------------------------

def test_a_band_straddling_the_slo_or_spanning_a_factor_2_prints_the_advise_command(spaced, tmp_path):
    trace, cal = spaced
    ttft = COST.prefill_time_s(100)  # the point: the low end meets this SLO, the high end does not
    res = invoke(trace, "--calibration", cal, "--slo-ttft-s", f"{ttft:.6f}")
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "too wide to decide: its TTFT p90 band [" in text and f"straddles the SLO {float(f'{ttft:.6f}'):g} s" in text
    assert (f"calibrate advise {cal} --what-if rate=0.1,prompt_tokens=100,output_tokens=2,max_num_seqs=" in text
            and ",max_num_batched_tokens=" in text)
    assert widest(res.output) <= WIDTH
    assert "too wide" not in invoke(trace, "--calibration", cal).output  # within a factor 2, no SLO
    write_cal(tmp_path / "wide.json", points=[{"t_step_s": 1e-6}, {"t_step_s": 0.05}])
    wide = " ".join(invoke(trace, "--calibration", "wide.json").output.split())
    assert "too wide to decide: its TTFT p90 band [" in wide and "spans more than a factor 2" in wide


def test_a_replay_of_the_measured_run_does_not_point_to_advise(measured):
    trace, cal = measured
    res = invoke(trace, "--calibration", cal, "--slo-ttft-s", 1e-6)
    assert res.exit_code == 0 and "too wide" not in res.output
    what_if = invoke(trace, "--calibration", cal, "--max-num-seqs", 8, "--slo-ttft-s", 1e-6)
    assert what_if.exit_code == 0 and "too wide" not in what_if.output  # the whole band breaks it: decided
