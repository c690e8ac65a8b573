"""``servecal plan``: the cheapest deployment meeting a percentile SLO, with the stated confidence.

A hand-made calibration of Llama-3.1-8B on one H100 (eta_compute 0.5) and a synthetic trace
whose answer is known: at a token budget of 512 the prompts are compute-bound, TTFT p90 is
0.43 s on one replica, 0.11 s on two; a band point at eta_compute 0.25 makes two replicas
0.74 s, three 0.25 s and four 0.17 s.
"""
import math

import pandas as pd
import pytest
from click.testing import CliRunner

from calibrate.umbrella import main as servecal
from replay.analysis.bands import prediction_row
from replay.config import ReplayConfig
from replay.cost.cost_model import RooflineCostModel, cost_model_from_calibration
from replay.cost.cost_terms import DEFAULT_TERMS
from replay.cost.kv_capacity import kv_capacity_blocks
from replay.plan import Axes, Calibrations, base_options, parse_slo, plan_deployments
from replay.plan.advice import deciding_parameters, not_identified
from replay.plan.grid import Candidate, parse_int_list, prepare
from replay.plan.search import MEETS, POINT_ONLY
from replay.plan.table import plan_frame
from replay.simulate import replay_frame
from replay.errors import ConfigError
from schemas.calibration import Calibration, FittedParam
from schemas.cost_params import CostParams
from schemas.specs import get_gpu, get_model
from schemas.tables import REQUEST_TRACE
from traces.io import write_trace
from traces.synth import synth_requests

MODEL, GPU = get_model("llama-3.1-8b"), get_gpu("h100-80gb")
VALUES = {"eta_compute": 0.5, "eta_mem": 0.8, "t_step_s": 2e-4}
ENGINE = {"max_num_seqs": 64, "max_num_batched_tokens": 512, "num_gpu_blocks": 1000, "block_size": 16,
          "gpu_memory_utilization": 0.9, "scheduler": "chunked", "replicas": 1}
TRACE = synth_requests(200, 20.0, "lognormal:mean=1500,sigma=0.5", "lognormal:mean=60,sigma=0.5", seed=1)
SLO = "ttft_p90=200ms"
#: A point of the confidence set where prefill runs at half the speed.
SLOW = {"eta_compute": 0.25}


def calibration(band_points=(), **params) -> Calibration:
    values = {**VALUES, **params}
    fitted = {k: FittedParam(v, ci95=(v * 0.5, min(v * 1.5, 1.0))) for k, v in values.items()}
    fitted["eta_compute"] = FittedParam(values["eta_compute"], identifiable=False, vary=False, ci95=(0.25, 1.0),
                                        bound="NOT IDENTIFIED (no effect on these data: any value in [0.25, 1] "
                                              "fits them equally); held at its declared value")
    return Calibration(MODEL, GPU, 1, fitted, terms=list(DEFAULT_TERMS), engine=dict(ENGINE),
                       band_points=[dict(p) for p in band_points])


def plan_files(tmp_path, num_requests: int) -> tuple:
    """The first ``num_requests`` of TRACE and :func:`calibration`, written in ``tmp_path``: ``(trace, cal)``."""
    trace, cal = tmp_path / "t.parquet", tmp_path / "cal.json"
    write_trace(TRACE.head(num_requests), REQUEST_TRACE, trace)
    calibration().write(cal)
    return trace, cal


def plan_cli(trace, cal, *args):
    """``servecal plan TRACE --calibration CAL`` in one process, no probes, then ``args``."""
    return CliRunner().invoke(servecal, ["plan", str(trace), "--calibration", str(cal), "--jobs", "1", "--probes", "0",
                                         *map(str, args)])


def ttft_p90(replicas: int, **params) -> float:
    cm = RooflineCostModel(MODEL, GPU, CostParams(**{**VALUES, **params}))
    cfg = ReplayConfig.from_options(max_num_seqs=64, max_num_batched_tokens=512, replicas=replicas,
                                    block_size=16)
    res, _ = replay_frame(TRACE, cm, cfg)
    return prediction_row(res)["ttft_p90_s"]


def run_plan(cal, confidence="band", replicas=(1, 2, 3, 4, 5), slo=SLO, **kw):
    axes = Axes(["h100-80gb"], [1], list(replicas), [64], [512], ["chunked"])
    return plan_deployments(TRACE, {}, Calibrations([("cal.json", cal)]), axes, parse_slo([slo]),
                            confidence=confidence, jobs=1, probes=kw.pop("probes", 0), **kw)


def test_the_answer_meets_the_slo_by_an_independent_replay_and_the_next_cheaper_fails():
    plan = run_plan(calibration())
    ans = plan.result.answer
    assert ans is not None and ans.status == MEETS
    r = ans.candidate.replicas
    assert r == 2
    assert ttft_p90(r) <= 0.2 < ttft_p90(r - 1)
    assert ans.point["ttft_p90_s"] == pytest.approx(ttft_p90(r), rel=1e-12)
    one = next(ev for ev in plan.result.evaluations if ev.candidate.replicas == 1)
    assert one.status == "fails" and "ttft_p90" in one.reason
    # the band of a calibration with no band points is its point
    assert ans.band.n_points == 0 and ans.band.high["ttft_p90_s"] == ans.point["ttft_p90_s"]
    # more replicas meet it too, but cost more: the table ranks them after it
    assert [ev.candidate.replicas for ev in plan.result.ranked][:2] == [2, 3]


def test_a_slow_band_point_makes_the_band_plan_pick_a_bigger_deployment():
    cal = calibration(band_points=[SLOW, {"eta_compute": 0.9}])
    by_point = run_plan(cal, "point").result
    by_band = run_plan(cal, "band").result
    assert by_point.answer.candidate.replicas == 2
    assert by_band.answer.candidate.replicas == 4
    assert ttft_p90(4, **SLOW) <= 0.2 < ttft_p90(3, **SLOW)
    # the band holds the slow point's replay, and the cheapest by point fails at its worst end
    two = by_band.cheapest_point
    assert two.candidate.replicas == 2 and two.status == POINT_ONLY
    # the plan's band is for future traffic like the trace: the percentile's sampling noise is a part of it
    w = ttft_p90(2, **SLOW) - two.point["ttft_p90_s"]
    assert two.band.parts["ttft_p90_s"]["parameters"][1] == pytest.approx(w, rel=1e-9)
    assert two.band.high["ttft_p90_s"] == pytest.approx(
        two.point["ttft_p90_s"] + math.hypot(w, two.band.parts["ttft_p90_s"]["sampling"][1]), rel=1e-12)
    # the parameter to measure is the one the breaking point moves
    breaking = [pt for pt, row in zip(cal.band_points, two.band_rows) if row["ttft_p90_s"] > 0.2]
    assert breaking == [SLOW]
    assert [name for name, _, _ in deciding_parameters(cal, breaking)] == ["eta_compute"]
    assert not_identified(cal, "eta_compute").startswith("no effect on these data")


def test_cli_band_vs_point_says_what_to_measure(tmp_path):
    trace, cal_path, out = tmp_path / "t.parquet", tmp_path / "cal.json", tmp_path / "plan.csv"
    write_trace(TRACE, REQUEST_TRACE, trace)
    calibration(band_points=[SLOW]).write(cal_path)
    res = CliRunner().invoke(servecal, ["plan", str(trace), "--calibration", str(cal_path), "--slo", SLO,
                                        "--replicas", "1:5", "--jobs", "1", "--probes", "3", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert all(len(line) <= 100 for line in res.output.splitlines())
    text = " ".join(res.output.split())
    assert "answer: 4 x h100-80gb TP1 (4 GPUs) meets ttft_p90 <= 200 ms" in text
    assert "the cheapest by point, 2 x h100-80gb TP1 (2 GPUs), breaks the SLOs" in text
    assert "measure: eta_compute is NOT IDENTIFIED (no effect on these data" in text
    assert "before trusting 2 x h100-80gb TP1" in text
    assert f"which run: calibrate advise {cal_path} --what-if rate=" in text
    assert "Pareto front" in text
    table = pd.read_csv(out)
    assert len(table) == 5 and table["answer"].sum() == 1
    assert table.loc[table["answer"], "replicas"].item() == 4
    assert (table["kv_blocks"] == kv_capacity_blocks(MODEL, GPU, 1, 0.9, 16)).all()


@pytest.mark.parametrize("name", ["p.html", "p.md"])
def test_cli_report_has_the_candidates_table_and_the_front(tmp_path, monkeypatch, name):
    """plan --report: the provenance of the replay report, the table's cells as printed, the front drawn."""
    import re

    monkeypatch.chdir(tmp_path)
    write_trace(TRACE, REQUEST_TRACE, "t.parquet")
    calibration(band_points=[SLOW]).write("cal.json")
    res = CliRunner().invoke(servecal, ["plan", "t.parquet", "--calibration", "cal.json", "--slo", SLO,
                                        "--replicas", "1:5", "--jobs", "1", "--probes", "0", "--report", name],
                             prog_name="servecal")
    assert res.exit_code == 0, res.output
    text = (tmp_path / name).read_text()
    answer = next(line for line in res.output.splitlines() if line.lstrip().startswith("*"))
    cell = re.search(r"\d[\d.]* \[[\d.]+, [\d.]+\]", answer).group(0)  # ttft_p90 of the answer, as printed
    assert cell in text
    assert "servecal plan report" in text and "eta_compute" in text and "NOT IDENTIFIED" in text
    assert "servecal plan t.parquet --calibration cal.json" in text and "answer: 4 x h100-80gb TP1" in text
    if name.endswith(".html"):
        assert len(re.findall(r'<img alt="[^"]+" src="data:image/png;base64,', text)) == 1
    else:
        assert "](p_files/front.png)" in text
        assert (tmp_path / "p_files" / "front.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_report_bad_suffix_fails_before_the_plan(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_trace(TRACE, REQUEST_TRACE, "t.parquet")
    calibration().write("cal.json")
    res = CliRunner().invoke(servecal, ["plan", "t.parquet", "--calibration", "cal.json", "--slo", SLO,
                                        "--report", "p.pdf"])
    assert res.exit_code == 2 and "use .md or .html" in res.output and "plan:" not in res.output


def test_kv_blocks_are_derived_at_each_candidates_tp_not_carried():
    cal = calibration()
    slo = parse_slo([SLO])
    base = base_options(Calibrations([("c", cal)]), slo)
    assert "num_gpu_blocks" not in base  # the calibration's recorded 1000 blocks are not carried
    p = prepare(Candidate("h100-80gb", 2, 1, 64, 512, "chunked"), Calibrations([("c", cal)]), base, {}, 4000)
    assert p.skip is None
    assert p.kv_blocks == (kv_capacity_blocks(MODEL, GPU, 2, 0.9, 16),)
    assert p.cost_model.tp == 2 and p.cfg.engine.num_gpu_blocks is None
    # the replay sizes the same cache
    _, engine = replay_frame(TRACE.head(5), p.cost_model, p.cfg)
    assert engine.replicas[0].kv.num_gpu_blocks == p.kv_blocks[0]
    # another GPU: the calibration carried to its datasheet numbers, its own memory
    a100 = prepare(Candidate("a100-80gb", 2, 1, 64, 512, "chunked"), Calibrations([("c", cal)]), base, {}, 4000)
    assert a100.extrapolated and a100.cost_model.gpu.name == "a100-80gb"
    assert a100.cost_model.params["eta_compute"] == 0.5
    assert a100.kv_blocks == (kv_capacity_blocks(MODEL, get_gpu("a100-80gb"), 2, 0.9, 16),)
    assert cost_model_from_calibration(cal, gpu=get_gpu("a100-80gb")).gpu.peak_flops == get_gpu("a100-80gb").peak_flops


def test_candidates_that_cannot_run_are_skipped_with_the_reason():
    cal = calibration()
    base = base_options(Calibrations([("c", cal)]), parse_slo([SLO]))
    cals = Calibrations([("c", cal)])
    tp3 = prepare(Candidate("h100-80gb", 3, 1, 64, 512, "chunked"), cals, base, {}, 4000)
    assert "does not divide the 32 attention heads" in tp3.skip
    l4 = prepare(Candidate("l4", 1, 1, 64, 512, "chunked"), cals, {**base, "gpu_memory_utilization": 0.5}, {}, 4000)
    assert "do not fit in 1 x l4 at gpu_memory_utilization=0.5" in l4.skip
    long = prepare(Candidate("h100-80gb", 1, 1, 64, 512, "chunked"), cals, base, {}, 10 ** 7)
    assert "cannot hold the longest request" in long.skip
    dis = prepare(Candidate("h100-80gb", 2, 1, 64, 512, "disagg", 1, 2, 1), cals, base, {}, 4000)
    assert dis.skip is None and dis.candidate.num_gpus == 4
    assert dis.kv_blocks == (kv_capacity_blocks(MODEL, GPU, 2, 0.9, 16), kv_capacity_blocks(MODEL, GPU, 1, 0.9, 16))


def test_prices_rank_by_cost_and_max_rate_is_bracketed():
    cal = calibration()
    axes = Axes(["h100-80gb", "a100-80gb"], [1], [1, 2, 3], [64], [512], ["chunked"])
    plan = plan_deployments(TRACE, {}, Calibrations([("c", cal)]), axes, parse_slo([SLO]),
                            prices={"h100-80gb": 4.0, "a100-80gb": 1.5}, jobs=1, probes=4)
    ans = plan.result.answer
    costs = [ev.cost for ev in plan.result.ranked]
    assert costs == sorted(costs)
    assert ans is plan.result.ranked[0] and ans.cost == min(costs)
    # the max rate holds the SLO at the point: replay there independently
    assert ans.max_rate_rps is not None and ans.max_rate_rps >= plan.target_rate_rps
    cfg = ans.prepared.cfg
    scaled = TRACE.assign(arrival_time_s=TRACE["arrival_time_s"] * plan.target_rate_rps / ans.max_rate_rps)
    res, _ = replay_frame(scaled, ans.prepared.cost_model, cfg)
    assert prediction_row(res)["ttft_p90_s"] <= 0.2
    frame = plan_frame(plan.result, parse_slo([SLO]), True)
    assert frame["cost_per_hour"].notna().all()


@pytest.mark.parametrize("slo, needle", [
    ("ttft_p95=2s", "unknown objective"),
    ("ttft_p90=2", "a number with a unit, s or ms"),
    ("ttft_p90=2min", "a number with a unit"),
    ("ttft_p90=-1s", "a number with a unit"),
    ("ttft_p90=0s", "a latency > 0"),
    ("goodput=1.5", "in (0, 1]"),
    ("goodput=0.9", "give a latency objective too"),
    ("e2e_p90=10s,goodput=0.9", "give a ttft_pQ or tpot_pQ objective"),
    ("ttft_p90=2s,ttft_p90=3s", "given more than once"),
    ("ttft_p90", "expected KEY=VALUE"),
])
def test_bad_slo_is_one_usage_line_and_no_output(tmp_path, slo, needle):
    trace, cal_path, out = tmp_path / "t.parquet", tmp_path / "cal.json", tmp_path / "plan.csv"
    write_trace(TRACE.head(20), REQUEST_TRACE, trace)
    calibration().write(cal_path)
    res = CliRunner().invoke(servecal, ["plan", str(trace), "--calibration", str(cal_path), "--slo", slo,
                                        "-o", str(out)])
    assert res.exit_code == 2, res.output
    errors = [line for line in res.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and needle in errors[0], res.output
    assert res.output.rstrip().endswith(errors[0])  # one line: nothing folded after it
    assert not out.exists()


def test_slo_parsing():
    slo = parse_slo(["ttft_p90=2s, tpot_p99=50ms", "goodput=90%", "e2e_p50=1.5e1s"])
    assert slo.latency_s == {"ttft_p90": 2.0, "tpot_p99": 0.05, "e2e_p50": 15.0}
    assert slo.goodput == 0.9 and slo.slo_ttft_s == 2.0 and slo.slo_tpot_s == 0.05
    assert slo.violations({"ttft_p90_s": 2.5, "tpot_p99_s": 0.01, "e2e_p50_s": math.nan}, 0.95) == [
        "ttft_p90 2.5 s > 2 s", "e2e_p50 n/a > 15 s"]
    assert parse_int_list("--replicas", "1:8:3,10") == [1, 4, 7, 10]
    with pytest.raises(ConfigError, match="given more than once"):
        parse_int_list("--tp", "1,1")
    # found by a helper: a huge range was built as a list first (MemoryError)
    with pytest.raises(ConfigError, match="'1:9999999999' has 9999999999 values, more than the 5000"):
        parse_int_list("--replicas", "1:9999999999")


def test_output_is_not_written_when_the_plan_fails(tmp_path):
    trace, cal_path, out = tmp_path / "t.parquet", tmp_path / "cal.json", tmp_path / "plan.csv"
    trace.write_text("not parquet")
    calibration().write(cal_path)
    out.write_text("old")
    res = CliRunner().invoke(servecal, ["plan", str(trace), "--calibration", str(cal_path), "--slo", SLO,
                                        "-o", str(out)])
    assert res.exit_code == 1, res.output
    assert out.read_text() == "old"
    res = CliRunner().invoke(servecal, ["plan", str(trace), "--calibration", str(cal_path), "--slo", SLO,
                                        "-o", str(tmp_path / "plan.txt")])
    assert res.exit_code == 2 and "give a .csv or .parquet file" in " ".join(res.output.split())


def test_no_candidate_meeting_the_slo_exits_3_and_says_so(tmp_path):
    trace, cal_path = tmp_path / "t.parquet", tmp_path / "cal.json"
    write_trace(TRACE, REQUEST_TRACE, trace)
    calibration().write(cal_path)
    res = CliRunner().invoke(servecal, ["plan", str(trace), "--calibration", str(cal_path), "--slo", "ttft_p90=1ms",
                                        "--replicas", "1,2", "--jobs", "1"])
    assert res.exit_code == 3, res.output
    assert "no candidate meets ttft_p90 <= 1 ms" in " ".join(res.output.split())


@pytest.mark.parametrize("confidence, band_points", [
    ("band", [{"eta_compute": 0.4}, {"eta_mem": 0.4}]),  # the TPOT objective fails at the band point not tried first
    ("band", [{"eta_compute": 0.75}, {"eta_mem": 0.95}]),  # band points faster than the point: it fails alone
    ("band", [SLOW, {"eta_mem": 0.6}, {"t_step_s": 4e-4}]),
    ("point", [SLOW, {"eta_mem": 0.6}, {"t_step_s": 4e-4}])])
def test_max_rates_are_those_of_a_bisection_replaying_the_point_and_every_band_point(confidence, band_points):
    """A max-rate probe replays each candidate's likeliest-failing band point first, then the
    points, then the other band points, each batch only for the candidates still passing: the
    rates found equal a bisection (doubling or halving until bracketed, then geometric) that
    replays the point and, with the band, every band point at every probe and needs all to pass."""
    from replay.analysis.bands import band_cost_models
    from replay.plan.runner import Task, run_task
    from replay.plan.search import point_violations

    probes, slo = 5, parse_slo(["ttft_p90=200ms,tpot_p90=12ms"])
    plan = run_plan(calibration(band_points=band_points), confidence, replicas=(1, 2, 3, 4), probes=probes,
                    slo="ttft_p90=200ms,tpot_p90=12ms")
    res = plan.result

    def holds(ev, factor):
        cms = [ev.prepared.cost_model]
        if confidence == "band":
            cms += band_cost_models(ev.prepared.cost_model, ev.prepared.band_points)
        return all(not point_violations(slo, run_task(plan.work, Task(cm, ev.prepared.cfg, plan.rate_scale * factor)),
                                        plan.work.num_requests) for cm in cms)

    searched = [ev for ev in res.evaluations if ev.max_rate_rps is not None]
    assert searched
    for ev in searched:
        holds_at_target = ev.status == MEETS or (confidence == "point" and ev.status == POINT_ONLY)
        lo, hi = (1.0, None) if holds_at_target else (None, 1.0)
        for _ in range(probes):
            f = lo * 2 if hi is None else hi / 2 if lo is None else math.sqrt(lo * hi)
            lo, hi = (f, hi) if holds(ev, f) else (lo, f)
        assert ev.max_rate_rps == (lo * res.target_rate_rps if lo is not None else math.nan) or (
            lo is None and math.isnan(ev.max_rate_rps))


def test_local_processes_give_the_same_plan():
    cal = calibration(band_points=[SLOW])
    one = run_plan(cal, replicas=(1, 2, 3, 4), probes=2).result
    axes = Axes(["h100-80gb"], [1], [1, 2, 3, 4], [64], [512], ["chunked"])
    two = plan_deployments(TRACE, {}, Calibrations([("cal.json", cal)]), axes, parse_slo([SLO]), jobs=2,
                           probes=2).result
    assert two.answer.candidate == one.answer.candidate
    assert [ev.status for ev in two.evaluations] == [ev.status for ev in one.evaluations]
    assert [ev.max_rate_rps for ev in two.evaluations] == [ev.max_rate_rps for ev in one.evaluations]


def test_costlier_candidates_are_not_replayed_once_the_top_is_settled_unless_exhaustive():
    cal = calibration()
    lazy = run_plan(cal, replicas=range(1, 13), top_k=1).result
    assert lazy.answer.candidate.replicas == 2
    status = {ev.candidate.replicas: ev.status for ev in lazy.evaluations}
    assert {status[r] for r in range(9, 13)} == {"not evaluated"}  # the first batch of 8 settled it
    full = run_plan(cal, replicas=range(1, 13), top_k=1, exhaustive=True).result
    assert full.answer.candidate == lazy.answer.candidate
    assert "not evaluated" not in {ev.status for ev in full.evaluations}
    assert len(full.front) >= len(lazy.front)
