"""Fits from aggregate results (issue #21 item 7): the statistics matched are numpy's, the
synthesized workload follows the recorded lengths and load, a fit on the aggregates of a known
cluster's runs holds the truth in its intervals, and the fit says what an aggregate cannot tell."""
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibrate.aggregate_runs import aggregate_runs, level_targets, not_identified
from traces.aggregate_workload import level_trace
from calibrate.demo import NoisyCostModel
from calibrate.request_fit import fit_requests
from calibrate.run_errors import Run
from replay.analysis.metrics import statistics
from helpers import invoke_servecal
from replay.config import EngineOptions, ReplayConfig
from replay.cost.cost_model import RooflineCostModel
from replay.simulate import replay_frame
from schemas.cost_params import CostParams
from schemas.specs import get_gpu, get_model
from traces.synth import synth_requests

TRUTH = CostParams(eta_compute=0.55, n_half_tokens=64.0, eta_mem=0.80, t_step_s=4e-4, t_seq_s=2e-5)
LATENCIES = ("ttft_s", "tpot_s", "e2e_s")


def _model(params: CostParams | None = None):
    return RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb"), params or CostParams())


def test_statistics_are_numpys_percentiles_and_mean():
    v = np.random.default_rng(0).lognormal(0, 1, 101)
    pcts = np.array([10.0, np.nan, 50.0, 90.0])
    assert statistics(v, pcts) == pytest.approx([np.percentile(v, 10), v.mean(), np.median(v), np.percentile(v, 90)],
                                                rel=1e-15)
    rows = np.vstack([v, v[::-1] * 2])
    assert statistics(rows, pcts, axis=1) == pytest.approx(np.vstack([statistics(v, pcts), 2 * statistics(v, pcts)]))


def _level(kind="concurrency", value=4.0, n=1000, lengths=()):
    base = {"level": 0, "level_kind": kind, "level_value": value, "num_requests": n}
    rows = [{**base, "metric": "ttft_s", "statistic": "quantile", "quantile_pct": q, "value_s": 0.1 * q,
             "value_tokens": np.nan} for q in (5.0, 10.0, 50.0, 90.0, 99.0)]
    rows.append({**base, "metric": "e2e_s", "statistic": "mean", "quantile_pct": np.nan, "value_s": 3.0,
                 "value_tokens": np.nan})
    rows += [{**base, "metric": m, "statistic": s, "quantile_pct": q, "value_s": np.nan, "value_tokens": v}
             for m, s, q, v in lengths]
    return pd.DataFrame(rows)


def test_synthesized_lengths_follow_the_reported_percentiles():
    lengths = [("num_prompt_tokens", "quantile", q, v) for q, v in ((25.0, 200), (50.0, 400), (75.0, 800))] + \
              [("num_prompt_tokens", "min", np.nan, 100), ("num_prompt_tokens", "max", np.nan, 1600),
               ("num_output_tokens", "mean", np.nan, 150), ("num_output_tokens", "std", np.nan, 30)]
    trace = level_trace(_level(lengths=lengths), "x", seed=0)
    p = trace["num_prompt_tokens"].to_numpy()
    assert len(trace) == 1000 and p.min() >= 100 and p.max() <= 1600
    # the inverse CDF through (0,100) (25,200) (50,400) (75,800) (100,1600) at one point per 1/1000 of it
    assert np.percentile(p, [25, 50, 75]) == pytest.approx([200, 400, 800], abs=2)
    assert np.percentile(p, 87.5) == pytest.approx(1200, abs=3)  # halfway between p75 and the max
    o = trace["num_output_tokens"].to_numpy()
    assert abs(o.mean() - 150) < 3 * 30 / np.sqrt(1000) + 0.5 and o.std() == pytest.approx(30, rel=0.1)


def test_lengths_between_bucket_bounds_have_the_reported_mean_and_keep_its_percentiles():
    """The same points with a mean of 500. Read as a summary's percentiles, linearly between
    them: the sample's mean is 0.25 * (150 + 300 + 600 + 1200) = 562.5. Read as histogram
    bucket bounds (metadata length_points, traces import prometheus): the maximum-entropy
    density with the mean, 500, each quarter of the requests still between its two points."""
    points = [("num_prompt_tokens", "quantile", q, v) for q, v in ((25.0, 200), (50.0, 400), (75.0, 800))] + \
             [("num_prompt_tokens", "min", np.nan, 100), ("num_prompt_tokens", "max", np.nan, 1600),
              ("num_prompt_tokens", "mean", np.nan, 500), ("num_output_tokens", "mean", np.nan, 150)]
    uniform = level_trace(_level(lengths=points), "x", seed=0)["num_prompt_tokens"].to_numpy()
    p = level_trace(_level(lengths=points), "x", 0, bucket_bounds=True)["num_prompt_tokens"].to_numpy()
    assert uniform.mean() == pytest.approx(562.5, abs=1) and p.mean() == pytest.approx(500, abs=0.5)
    assert np.mean(p <= 200) == pytest.approx(0.25, abs=0.002) and np.mean(p <= 400) == pytest.approx(0.5, abs=0.002)
    assert np.mean(p <= 800) == pytest.approx(0.75, abs=0.002) and p.min() >= 100 and p.max() <= 1600


def test_a_length_in_one_bucket_is_spread_over_it_with_its_mean():
    """Every output in vLLM's 500-1000 bucket, mean 653: between the bounds with that mean
    (scipy's truncexpon of the same mean, on [500, 1000], has the same median); a summary's min,
    max and mean alone keep every request at the mean."""
    from scipy import stats

    from traces.binned import segment_tilt

    lengths = [("num_prompt_tokens", "mean", np.nan, 100), ("num_output_tokens", "min", np.nan, 500),
               ("num_output_tokens", "max", np.nan, 1000), ("num_output_tokens", "mean", np.nan, 653)]
    o = level_trace(_level(lengths=lengths), "x", 0, bucket_bounds=True)["num_output_tokens"].to_numpy()
    scale = -1 / segment_tilt(np.array([500.0, 1000.0]), np.array([1.0]), 653.0)
    d = stats.truncexpon(b=500 / scale, loc=500, scale=scale)
    assert d.mean() == pytest.approx(653) and o.mean() == pytest.approx(653, abs=0.5)
    assert np.median(o) == pytest.approx(d.median(), abs=1) and o.min() >= 500 and o.max() <= 1000
    assert set(level_trace(_level(lengths=lengths), "x", 0)["num_output_tokens"]) == {653}


def test_lengths_known_by_their_mean_alone_are_that_mean_and_the_fit_says_so():
    lengths = [("num_prompt_tokens", "mean", np.nan, 512.4), ("num_output_tokens", "mean", np.nan, 64)]
    frame = _level("constant_rate", 2.5, 40, lengths)
    [run] = aggregate_runs("agg.parquet", frame, {}, ReplayConfig(), None)
    assert set(run.trace["num_prompt_tokens"]) == {512} and set(run.trace["num_output_tokens"]) == {64}
    assert run.trace["arrival_time_s"].to_numpy() == pytest.approx(np.arange(40) / 2.5, abs=0)
    assert run.config.closed_loop.concurrency is None
    said = " ".join(not_identified([run]))
    assert "same lengths" in said and "one load level" in said and "prefix-cache hits are unknown" in said


def test_arrivals_counted_over_intervals_are_uniform_within_each_and_the_first_n():
    """Counted arrivals (metadata arrival_counts): 4 in 15-30 s, none in 30-45 s, 6 in 45-60 s.
    From the first counted interval's start: 4 in [0, 15], 6 in [30, 45]; with 12 finished, 2
    more at 0 (held when the level began); with 7, the first 7 of the 10."""
    from traces.aggregate_workload import arrival_counts

    lengths = [("num_prompt_tokens", "mean", np.nan, 100), ("num_output_tokens", "mean", np.nan, 10)]
    meta = {"arrival_counts": json.dumps({"0": [[0, 15, 0], [15, 30, 4], [30, 45, 0], [45, 60, 6]]})}
    counts = arrival_counts(meta, "agg.parquet", 0)
    for n, at_0, early, late in ((10, 0, 4, 6), (12, 2, 4, 6), (7, 0, 4, 3)):
        t = level_trace(_level("poisson_rate", 1 / 6, n, lengths), "x", 0, 0, counts)["arrival_time_s"].to_numpy()
        assert np.all(np.diff(t) >= 0) and len(t) == n
        assert np.sum(t == 0) == at_0 and np.sum((t > 0) & (t <= 15)) == early
        assert np.sum((t >= 30) & (t <= 45)) == late and not np.any((t > 15) & (t < 30))
    # the mean of 6 uniforms on [30, 45] over many seeds: 37.5 (the order statistics' mean is the interval's middle)
    late_mean = np.mean([level_trace(_level("poisson_rate", 1 / 6, 10, lengths), "x", s, 0, counts)[
        "arrival_time_s"].to_numpy()[4:].mean() for s in range(400)])
    assert late_mean == pytest.approx(37.5, abs=0.3)  # 4.33 s / sqrt(2400) = 0.09 s standard error
    # a closed loop keeps its clients' sends at 0; a level without counts keeps its Poisson gaps
    assert set(level_trace(_level("concurrency", 4, 10, lengths), "x", 0, 0, counts)["arrival_time_s"]) == {0.0}
    assert arrival_counts({}, "agg.parquet", 0) is None and arrival_counts(meta, "agg.parquet", 1) is None


@pytest.mark.parametrize("text", ["{", "[1]", '{"0": [[15, 0, 3]]}', '{"0": [[0, 15, -1]]}',
                                  '{"0": [[15, 30, 1], [0, 15, 1]]}', '{"0": [[0, 15]]}'])
def test_bad_arrival_counts_are_one_error_naming_the_file_and_key(tmp_path, text):
    from traces.io import write_trace

    lengths = [("num_prompt_tokens", "mean", np.nan, 100), ("num_output_tokens", "mean", np.nan, 10)]
    path = tmp_path / "agg.parquet"
    write_trace(_level("poisson_rate", 1.0, 10, lengths), "aggregate_targets/1", path, {"arrival_counts": text})
    res = invoke_servecal("calibrate", "fit", path, "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "-o",
                          tmp_path / "cal.json")
    said = " ".join(res.output.split())
    assert res.exit_code != 0 and "Traceback" not in res.output
    assert f"{path}: metadata arrival_counts, level 0" in said and "[[start_s, end_s, requests], ...]" in said


def test_a_bad_length_points_is_one_error_naming_the_file_and_key(tmp_path):
    from traces.io import write_trace

    lengths = [("num_prompt_tokens", "mean", np.nan, 100), ("num_output_tokens", "mean", np.nan, 10)]
    path = tmp_path / "agg.parquet"
    write_trace(_level("poisson_rate", 1.0, 10, lengths), "aggregate_targets/1", path, {"length_points": "buckets"})
    res = invoke_servecal("calibrate", "fit", path, "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "-o",
                          tmp_path / "cal.json")
    assert res.exit_code != 0 and "Traceback" not in res.output
    assert f"{path}: metadata length_points 'buckets': expected 'bucket bounds' or none" in " ".join(res.output.split())


def test_an_aggregate_of_one_statistic_is_one_clear_error(tmp_path):
    """One mean: one residual, its sampling covariance 1 x 1 (was a bare IndexError), and the fit
    says it needs more statistics than parameters."""
    from traces.io import write_trace

    lengths = [("num_prompt_tokens", "mean", np.nan, 500), ("num_output_tokens", "mean", np.nan, 100)]
    frame = _level("poisson_rate", 1.0, 30, lengths)
    frame = frame[(frame["metric"] != "ttft_s")]  # the e2e mean alone
    path = tmp_path / "one.parquet"
    write_trace(frame, "aggregate_targets/1", path, {})
    res = invoke_servecal("calibrate", "fit", path, "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--jobs", "1",
                          "-o", tmp_path / "cal.json")
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert "1 quantile residuals; need more than" in res.output


def test_a_stated_shared_prefix_is_hit_in_the_prefix_cache():
    """--shared-prefix-tokens 1024 at import: every prompt opens with the level's 64 blocks, the
    rest unique; the replay then finds 1024 cached tokens for every request after the first."""
    lengths = [("num_prompt_tokens", "mean", np.nan, 2000), ("num_prompt_tokens", "std", np.nan, 300),
               ("num_output_tokens", "mean", np.nan, 8)]
    [run] = aggregate_runs("agg.parquet", _level("constant_rate", 0.5, 20, lengths),
                           {"shared_prefix_tokens": "1024"}, ReplayConfig.from_options(enable_prefix_caching=True), 0)
    hashes = run.trace["block_hashes"].tolist()
    assert all(h[:64] == list(range(64)) for h in hashes)
    rest = [x for h in hashes for x in h[64:]]
    assert len(rest) == len(set(rest)) == sum(p // 16 - 64 for p in run.trace["num_prompt_tokens"])
    res, _ = replay_frame(run.trace, _model(TRUTH), run.config, run.metadata)
    assert res["pred_num_cached_tokens"].tolist() == [0] + [1024] * 19
    assert "share their first 1024 tokens" in " ".join(not_identified([run]))
    with pytest.raises(Exception, match="shared_prefix_tokens 'x'"):
        aggregate_runs("agg.parquet", _level(lengths=lengths), {"shared_prefix_tokens": "x"}, ReplayConfig(), 0)


def test_targets_are_the_reported_percentiles_in_range_and_the_means():
    t = level_targets(_level())
    np.testing.assert_array_equal(t["ttft_s"][0], [10.0, 50.0, 90.0])  # p5 and p99 are tails: not matched
    assert t["ttft_s"][1] == pytest.approx([1.0, 5.0, 9.0])
    assert np.isnan(t["e2e_s"][0]).all() and t["e2e_s"][1] == pytest.approx([3.0])
    [run] = aggregate_runs("agg.parquet", _level(lengths=[("num_prompt_tokens", "mean", np.nan, 100),
                                                          ("num_output_tokens", "mean", np.nan, 10)]),
                           {}, ReplayConfig(), 0)
    assert run.config.closed_loop.concurrency == 4 and run.name == "agg.parquet#0"


def _aggregate_of(level: int, kind: str, value: float, measured: pd.DataFrame) -> pd.DataFrame:
    """The aggregate a benchmark would report of ``measured`` (a per-request log): p10..p90 and
    the mean of each latency, min/max and p5..p95 of each length."""
    base = {"level": level, "level_kind": kind, "level_value": value, "num_requests": len(measured)}
    rows = []
    for m in LATENCIES:
        v = measured[m].dropna().to_numpy(float)
        rows += [{**base, "metric": m, "statistic": "quantile", "quantile_pct": float(q),
                  "value_s": float(np.percentile(v, q))} for q in range(10, 100, 10)]
        rows.append({**base, "metric": m, "statistic": "mean", "value_s": float(v.mean())})
    for m in ("num_prompt_tokens", "num_output_tokens"):
        v = measured[m].to_numpy(float)
        rows += [{**base, "metric": m, "statistic": "quantile", "quantile_pct": float(q),
                  "value_tokens": float(np.percentile(v, q))} for q in range(5, 100, 5)]
        rows += [{**base, "metric": m, "statistic": s, "value_tokens": float(f(v))} for s, f in (("min", np.min),
                                                                                                 ("max", np.max))]
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def cluster_fit():
    """A known cluster (the demo's truth, 3 % step noise) measured at 2 and 24 clients; only the
    aggregates of its logs are given to the fit."""
    cfg = ReplayConfig(engine=EngineOptions(max_num_seqs=64, max_num_batched_tokens=2048))
    frames = []
    for k, clients in enumerate((2, 24)):
        trace = synth_requests(300, 1.0, "lognormal:mean=800,sigma=0.8", "lognormal:mean=200,sigma=0.7", seed=k)
        measured, _ = replay_frame(trace, NoisyCostModel(_model(TRUTH), 0.03, np.random.default_rng(k)),
                                   cfg.with_options(concurrency=clients))
        measured = trace.assign(**{m: measured[f"pred_{m}"] for m in LATENCIES})
        frames.append(_aggregate_of(k, "concurrency", float(clients), measured))
    frame = pd.concat(frames, ignore_index=True)
    runs = aggregate_runs("cluster.parquet", frame, {}, cfg, None)
    fixed = {"n_half_tokens": 64.0, "t_step_s": 4e-4, "t_seq_s": 2e-5}
    return runs, fit_requests(runs, _model(), ("max",), metrics=LATENCIES, free=("eta_compute", "eta_mem"),
                              fixed=fixed, jobs=1)[0]


def test_a_fit_on_aggregates_holds_the_known_cluster_in_its_intervals(cluster_fit):
    runs, fit = cluster_fit
    assert [r.config.closed_loop.concurrency for r in runs] == [2, 24]
    for n in ("eta_compute", "eta_mem"):
        p = fit.params[n]
        assert p.vary and p.ci95[0] <= TRUTH[n] <= p.ci95[1], (n, p.value, p.ci95)
    # the residuals are per level, per matched statistic (p10..p90 and the mean)
    assert set(fit.stats["residual_by_run"]["cluster.parquet#1"]["ttft_s"]) == \
        {f"p{q}" for q in range(10, 100, 10)} | {"mean"}


def test_a_fit_on_aggregates_is_not_told_the_wrong_cluster(cluster_fit):
    """The power check: the same aggregates with every latency 30 % slower do not hold the truth."""
    runs, _ = cluster_fit
    slow = [Run(r.name, r.trace, r.config, r.metadata, None, None,
                {m: (q, 1.3 * v) for m, (q, v) in r.targets.items()}) for r in runs]
    fit = fit_requests(slow, _model(), ("max",), metrics=LATENCIES, free=("eta_compute", "eta_mem"),
                       fixed={"n_half_tokens": 64.0, "t_step_s": 4e-4, "t_seq_s": 2e-5}, jobs=1)[0]
    assert not all(fit.params[n].ci95[0] <= TRUTH[n] <= fit.params[n].ci95[1] for n in ("eta_compute", "eta_mem"))


def test_a_calibration_from_the_llmperf_summary_says_so_and_scores_on_the_runs_requests(real_data_dir, tmp_path):
    """calibrate validate: fitted on the summary, scored on the same run's per-request file."""
    agg, log, cal = tmp_path / "agg.parquet", tmp_path / "log.parquet", tmp_path / "cal.json"
    invoke_servecal("traces", "import", "summary", "llmperf",
                    real_data_dir / "llmperf_leaderboard_anyscale_llama2_70b_summary.json", "-o", agg)
    invoke_servecal("traces", "import", "llmperf",
                    real_data_dir / "llmperf_leaderboard_anyscale_llama2_70b_individual.json",
                    "--concurrency", "5", "-o", log)
    res = invoke_servecal("calibrate", "validate", "--fit-on", agg, "--score-on", log, "--concurrency", "5",
                          "--model", "llama-2-70b", "--gpu", "h100-80gb", "--tp", "4", "--variants", "max",
                          "--jobs", "1", "-o", cal)
    assert res.exit_code == 0, res.output
    saved = json.loads(cal.read_text())
    fit = saved["fit"]
    assert "aggregate statistics" in fit["method"] and saved["source"]["kind"] == "aggregate_targets/1"
    said = " ".join(fit["warnings"])
    for words in ("fitted from aggregates", "one load level", "hosted API", "prefix-cache hits are unknown"):
        assert words in said, words
    assert set(fit["residual_by_run"][f"{agg}#0"]) == {"ttft_s", "e2e_s"}
    assert set(fit["residual_by_run"][f"{agg}#0"]["ttft_s"]) == {"p25", "p50", "p75", "p90", "mean"}
    rows = [line.split() for line in res.output.splitlines() if line.startswith(str(log)[-34:])]
    assert len(rows) == 1 and rows[0][1] == "out"  # the requests the fit never saw, only their summary


def test_run_specs_an_aggregate_cannot_honour_are_refused(tmp_path):
    from calibrate.errors import FitError
    from calibrate.runs import load_runs
    from traces.io import read_trace

    agg = tmp_path / "agg.parquet"
    data = Path(__file__).parents[1] / "data" / "vllm_bench_summary.json"
    assert invoke_servecal("traces", "import", "summary", "vllm-bench", data, "-o", agg).exit_code == 0
    [run] = load_runs([str(agg)], ReplayConfig(), read_trace)
    assert run.name == f"{agg}#0" and run.config.closed_loop.concurrency is None and len(run.trace) == 200
    with pytest.raises(FitError, match=r"#3: no level 3 \(the file has 0\)"):
        load_runs([f"{agg}#3"], ReplayConfig(), read_trace)
    with pytest.raises(FitError, match="an aggregate has no arrival times to window"):
        load_runs([f"{agg}@0:10"], ReplayConfig(), read_trace)
    # an aggregate is scored level by level (issue #35 item 4); the level the fit saw, in sample
    res = invoke_servecal("calibrate", "validate", "--fit-on", agg, "--score-on", agg, "--model", "llama-3.1-8b",
                          "--gpu", "h100-80gb", "--free", "eta_mem", "--variants", "sum", "--jobs", "1")
    text = " ".join(res.output.split())
    assert res.exit_code == 0 and f"--score-on names run(s) whose requests the fit sees: {agg}#0" in text
    assert f"{agg}#0 (in sample; 200 requests replayed)" in text and "out of sample, mean" not in text
