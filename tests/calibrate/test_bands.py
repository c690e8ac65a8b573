"""Prediction bands (issue #18 item 1): the band's arithmetic by hand, the points a
calibration carries, and a narrow band where the data pin every term. Coverage over seeds of
what-ifs is in tests/calibrate/test_request_fit_intervals.py (it reuses those fits)."""
import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import chi2

from calibrate.confidence import covariance_points
from replay.analysis.band_parts import Z95, distance, load_features, percentile_noise
from replay.analysis.bands import BAND_STATS, BandBasis, BandJob, band_of_rows, predict_with_band, prediction_row
from replay.config import EngineOptions, ReplayConfig
from replay.cost.cost_model import RooflineCostModel
from replay.simulate import replay_frame
from schemas.calibration import Calibration, FittedParam, fit_grade
from schemas.cost_params import CostParams
from schemas.errors import SchemaError
from schemas.specs import get_gpu, get_model
from traces.synth import synth_requests


def _row(x):
    return {s: x for s in BAND_STATS}


def test_band_is_the_farthest_point_by_ratio_on_both_sides():
    band = band_of_rows(_row(10.0), [_row(9.0), _row(12.0), _row(11.0)], [_row(10.5), _row(9.8)])
    # the farthest of the points and seeds is 12, 1.2x the point: the band is [10 / 1.2, 12]
    assert band.low["ttft_p90_s"] == pytest.approx(10 / 1.2) and band.high["ttft_p90_s"] == pytest.approx(12.0)
    assert band.n_points == 3 and band.n_seeds == 2
    assert band.half_width("ttft_p90_s") == pytest.approx((12 - 10 / 1.2) / 2 / 10)
    assert band.holds("e2e_p50_s", 8.34) and not band.holds("e2e_p50_s", 12.01)
    assert band.cell("tpot_p50_s", scale=1.0) == "10.0 [8.3, 12.0]"
    # a seed farther than every point sets it
    assert band_of_rows(_row(10.0), [_row(11.0)], [_row(7.5)]).high["ttft_p50_s"] == pytest.approx(10 / 0.75)


def test_a_band_is_not_one_sided_when_the_optimum_sits_at_a_bound():
    """Every point of the set predicts slower (the optimum at t_step_s = 0): the band still reaches
    as far below the point as above it (issue #36)."""
    band = band_of_rows(_row(10.0), [_row(10.4), _row(10.9)])
    assert band.low["ttft_p50_s"] == pytest.approx(10 / 1.09) and band.high["ttft_p50_s"] == pytest.approx(10.9)


def test_no_band_of_a_time_or_rate_reaches_below_zero():
    # by ratio, the parameters' part alone never reaches 0: 3x above is 3x below
    assert band_of_rows(_row(1.0), [_row(3.0)]).low["ttft_p50_s"] == pytest.approx(1 / 3)
    carried = BandBasis(carried=("the model (a -> b)",), transfer_error={m: 2.0 for m in ("ttft_s", "tpot_s", "e2e_s")})
    band = band_of_rows(_row(1.0), [_row(3.0)], basis=carried)
    assert all(band.low[s] == 0.0 for s in BAND_STATS) and band.high["ttft_p50_s"] > 3.0


def test_a_statistic_missing_at_some_points_takes_the_range_of_the_others():
    nan = _row(float("nan"))
    band = band_of_rows(_row(2.0), [nan, _row(3.0)])
    assert (band.low["e2e_p99_s"], band.high["e2e_p99_s"]) == (pytest.approx(2 / 1.5), 3.0)


def test_no_points_no_band():
    band = band_of_rows(_row(0.25), [])
    assert band.low == band.point == band.high and band.cell("ttft_p50_s") == "250.0" and not band.has_band


def test_covariance_points_are_the_ellipsoid_axes_by_hand():
    # two uncorrelated parameters: the points are x0 +- sqrt(chi2_2(0.95)) sd along each axis
    params = {"eta_mem": FittedParam(0.8, 0.01), "t_step_s": FittedParam(4e-4, 2e-5),
              "eta_compute": FittedParam(0.5, None, False, "NOT IDENTIFIED", True)}
    pts = covariance_points(params, {})
    r = math.sqrt(chi2.ppf(0.95, 2))  # 2.4477
    got = sorted((round(p["eta_mem"], 6), round(p["t_step_s"], 9)) for p in pts)
    want = sorted([(round(0.8 + r * 0.01, 6), 4e-4), (round(0.8 - r * 0.01, 6), 4e-4),
                   (0.8, round(4e-4 + r * 2e-5, 9)), (0.8, round(4e-4 - r * 2e-5, 9))])
    assert got == want and all(set(p) == {"eta_mem", "t_step_s"} for p in pts)


def test_covariance_points_follow_a_correlation_and_stay_in_range():
    # correlation -1: the ellipsoid is a segment along (1, -1) (in units of each sd)
    params = {"eta_mem": FittedParam(0.99, 0.01), "t_step_s": FittedParam(4e-4, 1e-4)}
    pts = covariance_points(params, {"eta_mem,t_step_s": -1.0})
    assert max(p["eta_mem"] for p in pts) <= 1.0  # eta_mem's declared upper bound
    moved = [p for p in pts if abs(p["t_step_s"] - 4e-4) > 1e-9]
    assert moved and all((p["eta_mem"] - 0.99) * (p["t_step_s"] - 4e-4) < 0 for p in moved)


def test_calibration_keeps_its_band_points_and_rejects_a_bad_one(tmp_path):
    cal = Calibration(get_model("llama-3.1-8b"), get_gpu("h100-80gb"), 1, {"eta_mem": FittedParam(0.8, 0.01)},
                      band_points=[{"eta_mem": 0.78}, {"eta_mem": 0.82}])
    cal.write(tmp_path / "c.json")
    assert Calibration.read(tmp_path / "c.json").band_points == [{"eta_mem": 0.78}, {"eta_mem": 0.82}]
    bad = tmp_path / "bad.json"
    bad.write_text((tmp_path / "c.json").read_text().replace("0.82", "1.7"))
    with pytest.raises(SchemaError) as err:
        Calibration.read(bad)
    assert "band_points[1].eta_mem is 1.7; expected 0.01 to 1" in " ".join(str(err.value).split())


def test_a_calibration_with_a_bad_holdout_is_refused(tmp_path):
    cal = Calibration(get_model("llama-3.1-8b"), get_gpu("h100-80gb"), 1, {"eta_mem": FittedParam(0.8, 0.01)},
                      holdout={"method": "leave one run out", "errors": [
                          {"part": "a", "metric": "ttft_s", "pct": 50.0, "rel_err": 0.1, "distance": 0.0}],
                          "fitted_range": {"rate_rps": [1.0, 2.0]}})
    cal.write(tmp_path / "c.json")
    assert Calibration.read(tmp_path / "c.json").holdout == cal.holdout
    for old, new, want in (('"ttft_s"', '"itl_s"', 'holdout.errors[0].metric is "itl_s"; expected ttft_s'),
                           ('"distance": 0.0', '"distance": -1', "holdout.errors[0].distance is -1; expected"),
                           # found by a helper: finite but huge values overflowed the band (a traceback)
                           ('"distance": 0.0', '"distance": 1e6', "holdout.errors[0].distance is 1000000.0"),
                           ('"rel_err": 0.1', '"rel_err": 1e300', "holdout.errors[0].rel_err is 1e+300"),
                           ('"errors": [', '"errors": "oops", "x": [', 'holdout.errors is "oops"; expected a list'),
                           ("1.0,", "3.0,", "holdout.fitted_range.rate_rps is [3.0, 2.0]"),
                           ("1.0,", "1e-320,", "holdout.fitted_range.rate_rps is [1e-320, 2.0]")):
        bad = tmp_path / "bad.json"
        bad.write_text((tmp_path / "c.json").read_text().replace(old, new))
        with pytest.raises(SchemaError) as err:
            Calibration.read(bad)
        assert want in " ".join(str(err.value).split())


def _llama(params=None):
    return RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb"), params or CostParams())


def test_band_replays_each_point_and_speculative_decoding_adds_seeds():
    trace = synth_requests(40, 5.0, "fixed:200", "fixed:20", seed=1)
    slow = {"eta_mem": 0.4}
    cfg = ReplayConfig(engine=EngineOptions(max_num_seqs=16, max_num_batched_tokens=512))
    band = predict_with_band(BandJob(trace, {}, _llama(), cfg, [slow]))
    at_slow, _ = replay_frame(trace, _llama(CostParams(eta_mem=0.4)), cfg)
    p, slow_p = band.point["tpot_p50_s"], prediction_row(at_slow)["tpot_p50_s"]
    w = slow_p - p
    assert w > 0 and band.parts["tpot_p50_s"]["parameters"] == pytest.approx((p - p * p / slow_p, w))
    # the point replay's own percentile noise is the other part (fixed lengths: small)
    below, above = band.parts["tpot_p50_s"]["sampling"]
    assert band.high["tpot_p50_s"] == pytest.approx(band.point["tpot_p50_s"] + math.hypot(w, above))
    assert band.low["tpot_p50_s"] == pytest.approx(p - math.hypot(p - p * p / slow_p, below))
    spec = cfg.with_options(speculative_tokens=3, spec_acceptance_rate=0.6)
    job = BandJob(trace, {}, _llama(), spec, [slow])
    assert [k for k, _, _ in job.replays()] == ["point", "set"] + ["seed"] * 4
    assert predict_with_band(job).n_seeds == 4


def test_a_step_fit_that_pins_every_term_gives_a_narrow_band():
    """The demo's step log identifies every term: the parameters' part of the band of a replay at
    another load is within +-5 % (issue #18: narrow where the data pin the terms)."""
    from calibrate.demo import TRUTH, NoisyCostModel
    from calibrate.step_fit import fit_steps, set_ci95
    from replay.config import RecordOptions
    from replay.core.result_columns import steps_frame

    cfg = ReplayConfig(EngineOptions(max_num_seqs=128, max_num_batched_tokens=2048), record=RecordOptions(steps=True))
    trace = synth_requests(800, 8.0, "lognormal:mean=1024,sigma=0.8", "lognormal:mean=256,sigma=0.7", seed=0)
    _, engine = replay_frame(trace, NoisyCostModel(_llama(TRUTH), 0.03, np.random.default_rng(0)), cfg)
    fit = fit_steps(steps_frame(engine), _llama())[0][0]
    set_ci95(fit, "stderr")
    assert all(p.identifiable for n, p in fit.params.items() if p.vary and n != "overlap")
    what_if = synth_requests(800, 12.0, "lognormal:mean=1024,sigma=0.8", "lognormal:mean=256,sigma=0.7", seed=5)
    plain = ReplayConfig(EngineOptions(max_num_seqs=128, max_num_batched_tokens=2048))
    band = predict_with_band(BandJob(what_if, {}, _llama(fit.cost_params()), plain, fit.stats["band_points"]))
    for s in ("ttft_p50_s", "tpot_p50_s", "tpot_p90_s", "e2e_p50_s", "e2e_p90_s"):
        # the parameters' part within +-5 %; with the percentile's own noise over 800 requests, +-10 %
        assert 0 < band.parts[s]["parameters"][1] / band.point[s] < 0.05, (s, band.parts[s])
        assert 0 < band.half_width(s) < 0.10, (s, band.half_width(s))


def test_in_sample_model_error_is_added_in_quadrature_by_hand():
    band = band_of_rows(_row(10.0), [_row(9.0), _row(12.0)], basis=BandBasis(model_error={"ttft_s": 0.05}))
    w = Z95 * 0.05 * 10.0  # 0.98
    below = 10.0 - 10.0 / 1.2  # the parameters' part: 12 is 1.2x the point, so 10 / 1.2 below
    assert band.low["ttft_p90_s"] == pytest.approx(10.0 - math.hypot(below, w))
    assert band.high["ttft_p50_s"] == pytest.approx(10.0 + math.hypot(2.0, w))
    assert band.low["tpot_p90_s"] == pytest.approx(10 / 1.2) and band.high["tpot_p90_s"] == 12.0  # no TPOT error
    # the queue wait takes TTFT's model error in seconds (here the same 10.0)
    assert band.high["queue_wait_p50_s"] == pytest.approx(10.0 + math.hypot(2.0, w))
    assert band_of_rows(_row(1.0), [], basis=BandBasis(model_error={"e2e_s": 0.1})).has_band


def _holdout(rel_errs, metric="ttft_s", distance=0.0, fitted_range=None):
    return {"errors": [{"part": f"p{i}", "metric": metric, "pct": 50.0, "rel_err": e, "distance": distance}
                       for i, e in enumerate(rel_errs)],
            "fitted_range": fitted_range or {}}


def test_held_out_errors_give_the_conformal_quantile_by_hand():
    """39 held-out errors 0.01, ..., 0.39: the ceil(40 x 0.95) = 38th smallest, 0.38, of the point."""
    errs = [(-1) ** i * 0.01 * (i + 1) for i in range(39)]
    band = band_of_rows(_row(10.0), [], basis=BandBasis(holdout=_holdout(errs)))
    assert band.high["ttft_p90_s"] == pytest.approx(13.8) and band.low["ttft_p90_s"] == pytest.approx(6.2)
    assert band.parts["ttft_p90_s"]["model"] == pytest.approx((3.8, 3.8))
    assert band.high["tpot_p50_s"] == 10.0  # no TPOT errors held out, no in-sample misfit
    assert not band.notes  # 39 errors: the 95 % is reached


def test_few_held_out_errors_use_the_largest_and_say_so():
    band = band_of_rows(_row(10.0), [], basis=BandBasis(holdout=_holdout([0.02, -0.05, 0.01])))
    assert band.high["e2e_p50_s"] == 10.0 and band.high["ttft_p50_s"] == pytest.approx(10.5)
    assert any("fewer than 19 held-out errors (ttft_s)" in n for n in band.notes)


def test_a_held_out_error_at_a_distance_counts_for_less_and_a_what_if_far_away_is_wider():
    """An error of 0.2 seen at distance 1 (twice the load) is a score of 0.2 / 2^1 = 0.1; a what-if at 4x the
    largest fitted rate (distance 2) gets 0.1 x 2^2 = 0.4 of its point, one inside the range 0.1."""
    basis = BandBasis(holdout=_holdout([0.2] * 20, distance=1.0, fitted_range={"running": [1.0, 2.0]}))
    inside = band_of_rows(_row(10.0), [], basis=basis, details={"load": {"running": 1.5}})
    far = band_of_rows(_row(10.0), [], basis=basis, details={"load": {"running": 8.0}})
    assert inside.high["ttft_p50_s"] == pytest.approx(11.0) and inside.distance == 0 and not inside.notes
    assert far.high["ttft_p50_s"] == pytest.approx(14.0) and far.distance == pytest.approx(2.0)
    assert "model error widened x4.0" in far.notes[0]
    assert "the mean requests running (Little's law on E2E less queue wait) 8 requests is 4.0x the largest " \
        "fitted (2 requests)" in far.notes[0]


def test_the_distance_by_hand():
    rng = {"prompt_tokens": [100.0, 200.0], "running": [3.0, 6.0], "rate_rps": [1.0, 2.0], "in_system": [3.0, 9.0]}
    assert distance({"prompt_tokens": 150.0, "running": 4.0}, rng) == (0.0, None)
    d, words = distance({"prompt_tokens": 25.0, "running": 24.0}, rng)
    assert d == pytest.approx(2.0) and "4.0x below the smallest fitted" in words  # log2(100/25) = log2(24/6)
    assert distance({"running": 3.0}, {})[0] == 0.0  # nothing known: no distance
    # neither the arrival rate (a burst has any rate) nor a queue asks more of the cost model
    assert distance({"rate_rps": 20.0, "in_system": 90.0, "running": 4.0}, rng)[0] == 0.0


def test_load_features_by_little_s_law_by_hand():
    """Two requests 10 s apart, each 2 s in the system of which 0.5 s queued: 4 s in the system and 3 s
    running over the 12 s from the first arrival to the last completion; three arrivals in 10 s, 0.2 req/s
    (a rejected one counts in the rate only)."""
    result = pd.DataFrame({"arrival_time_s": [0.0, 5.0, 10.0], "num_prompt_tokens": [100, 300, 200],
                           "pred_status": ["ok", "rejected: too long", "ok"], "pred_e2e_s": [2.0, np.nan, 2.0],
                           "pred_queue_wait_s": [0.5, np.nan, 0.5]})
    f = load_features(result)
    assert f == {"rate_rps": pytest.approx(0.2), "in_system": pytest.approx(4 / 12), "running": pytest.approx(3 / 12),
                 "prompt_tokens": pytest.approx(200.0)}
    # a burst (every request at once) still has a load: three requests running for the 2 s they took
    burst = result.assign(arrival_time_s=0.0, pred_status="ok", pred_e2e_s=2.0, pred_queue_wait_s=0.0)
    assert load_features(burst)["running"] == pytest.approx(3.0) and np.isnan(load_features(burst)["rate_rps"])


def test_percentile_noise_is_the_order_statistic_interval_by_hand():
    """100 values 1..100, the median: ranks 50 -+ 1.96 x 5 = 40.2 .. 59.8, so the 40th and 60th values
    (40 and 60) around numpy's 50.5; it matches the binomial's 95 % interval for the rank."""
    from scipy.stats import binom

    below, above = percentile_noise(np.arange(1, 101), 50)
    assert (below, above) == (pytest.approx(10.5), pytest.approx(9.5))
    lo, hi = binom.interval(0.95, 100, 0.5)  # (40, 60)
    assert (lo, hi) == (40, 60)
    assert percentile_noise([5.0], 90) == (0.0, 0.0)


def test_a_carried_calibration_adds_the_transfer_error_and_a_poor_one_says_its_band_means_nothing():
    carried = band_of_rows(_row(10.0), [], basis=BandBasis(carried=("the model (a -> b)",),
                                                           transfer_error={"tpot_s": 0.3}))
    assert carried.high["tpot_p90_s"] == pytest.approx(13.0) and carried.high["ttft_p50_s"] == 10.0
    assert any("carried across the model (a -> b)" in n for n in carried.notes)
    poor = band_of_rows(_row(10.0), [_row(11.0)], basis=BandBasis(grade="poor"))
    assert not poor.meaningful and any("graded poor" in n and "not meaningful" in n for n in poor.notes)


def test_a_far_what_if_has_a_finite_band_that_says_it_reaches_zero():
    """Found by a helper: a distance of thousands of doublings overflowed; the growth stops at 2^20 and a
    band clipped at 0 says it bounds nothing from below."""
    basis = BandBasis(holdout=_holdout([0.2] * 20, fitted_range={"running": [1e-9, 1e-9]}))
    band = band_of_rows(_row(10.0), [], basis=basis, details={"load": {"running": 1e9}})
    assert all(np.isfinite(band.high[s]) for s in BAND_STATS) and band.low["ttft_p50_s"] == 0.0
    assert band.high["ttft_p50_s"] == pytest.approx(10.0 + 0.2 * 2 ** 20 * 10.0)
    assert any("reach 0" in n and "say little" in n for n in band.notes)


def test_a_band_is_carried_across_the_engine_per_scheduler():
    """Found by a helper: a scheduler comparison took the transfer part from --scheduler for every row."""
    colocated = BandBasis(scheduler="chunked")
    assert colocated.with_scheduler("disagg").carried_all == ("the engine (a colocated fit to disaggregated pools)",)
    assert colocated.with_scheduler("fcfs").carried_all == ()
    fitted_disagg = BandBasis(fitted_disagg=True, carried=("TP (1 -> 2)",))
    assert fitted_disagg.with_scheduler("disagg").carried_all == ("TP (1 -> 2)",)
    assert len(fitted_disagg.with_scheduler("chunked").carried_all) == 2


def test_itl_takes_tpot_s_parameters_part_by_ratio_when_the_band_replays_record_no_token_times():
    point = {**_row(10.0), **{f"itl_p{q}_s": 5.0 for q in (50, 90, 99)}}
    at = [{**_row(12.0), **{f"itl_p{q}_s": float("nan") for q in (50, 90, 99)}}]  # TPOT 1.2x at the point
    band = band_of_rows(point, at, basis=BandBasis(holdout=_holdout([0.1] * 20, metric="tpot_s")))
    # TPOT's parameters part (10 / 1.2 .. 12) on ITL's 5 ms: (5 - 5 / 1.2, 1.0); the model part is TPOT's 10 %
    assert band.parts["itl_p50_s"]["parameters"] == pytest.approx((5 - 5 / 1.2, 1.0))
    assert band.high["itl_p50_s"] == pytest.approx(5.0 + math.hypot(1.0, 0.5))
    assert "itl_p50_s" in BAND_STATS and np.isnan(prediction_row(_tiny_result())["itl_p50_s"])


def _tiny_result():
    trace = synth_requests(5, 5.0, "fixed:50", "fixed:4", seed=1)
    return replay_frame(trace, _llama(), ReplayConfig(EngineOptions(max_num_seqs=4)))[0]


def test_the_fit_grade_words():
    assert fit_grade({"residual_by_run": {"r": {"ttft_s": {"p50": 0.01, "p90": -0.03}}}})[0] == "good"
    assert fit_grade({"residual_by_run": {"r": {"ttft_s": {"p50": 0.2, "p90": -0.3}}}})[0] == "poor"
    assert fit_grade({"rel_residual_pct": {"p50": 0.08, "p90": 0.2}})[0] == "fair"
    assert fit_grade({}) == ("", "no residuals recorded")
    # found by the long fuzz: a calibration file whose fit block has another shape crashed replay
    for bad in ({"rel_residual_pct": {"p50": None, "p90": 0.1}}, {"rel_residual_pct": 3},
                {"residual_by_run": {"r": {"ttft_s": {"p50": None, "p90": "x"}}}}, {"residual_by_run": [1, 2]}):
        assert fit_grade(bad) == ("", "no residuals recorded"), bad


def test_model_error_is_zero_for_the_true_model_and_the_misfit_of_a_wrong_one():
    """A request log replayed by the cost model that made it: no discrepancy. The same log
    against a model whose memory efficiency is 0.6 instead of 0.8 (every decode step ~30 %
    slower): a TPOT discrepancy of that order, which no sampling noise explains."""
    from calibrate.discrepancy import model_error
    from calibrate.request_fit import QUANTILES
    from calibrate.run_errors import Run

    cfg = ReplayConfig(engine=EngineOptions(max_num_seqs=32, max_num_batched_tokens=1024))
    truth = _llama(CostParams(eta_mem=0.8, t_step_s=1e-4))
    trace = synth_requests(300, 6.0, "lognormal:mean=600,sigma=0.6", "lognormal:mean=150,sigma=0.6", seed=2)
    measured, _ = replay_frame(trace, truth, cfg)
    trace = trace.assign(ttft_s=measured["pred_ttft_s"], tpot_s=measured["pred_tpot_s"], e2e_s=measured["pred_e2e_s"])
    runs = [Run("synthetic", trace, cfg, {})]
    assert model_error(runs, truth, QUANTILES) == {"ttft_s": 0.0, "tpot_s": 0.0, "e2e_s": 0.0}
    wrong = model_error(runs, _llama(CostParams(eta_mem=0.6, t_step_s=1e-4)), QUANTILES)
    assert 0.15 < wrong["tpot_s"] < 0.35, wrong


def test_spread_points_keeps_the_farthest_and_then_the_most_apart():
    from calibrate.confidence import MAX_BAND_POINTS, spread_points

    center = {"eta_mem": 0.5, "t_step_s": 1e-4}
    pts = [{"eta_mem": 0.5 + d} for d in (0.01, 0.02, 0.03, 0.3, -0.2)]
    # farthest from the center: +0.3; then the farthest from it: -0.2; then from both: +0.03
    assert spread_points(pts, center, 3) == [pts[2], pts[3], pts[4]]
    assert spread_points(pts, center) == pts and MAX_BAND_POINTS == 9


def test_a_calibration_whose_source_is_not_an_object_is_refused(tmp_path):
    """Found by the long fuzz: a calibration with ``"source": 3`` reached replay's in-sample
    check and ended in a traceback; it is the file's fault, named."""
    cal = Calibration(get_model("llama-3.1-8b"), get_gpu("h100-80gb"), 1, {"eta_mem": FittedParam(0.8, 0.01)})
    cal.write(tmp_path / "c.json")
    bad = tmp_path / "bad.json"
    bad.write_text((tmp_path / "c.json").read_text().replace('"source": {}', '"source": 3'))
    with pytest.raises(SchemaError) as err:
        Calibration.read(bad)
    assert "source is 3; expected an object" in " ".join(str(err.value).split())
