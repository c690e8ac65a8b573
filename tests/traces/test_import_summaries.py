"""``traces import summary``: aggregate results read to the values in the files, levels with
the load each benchmark ran at, and one clear error per bad file (issue #21 item 7)."""
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from helpers import flat, invoke_servecal
from traces.errors import TraceFormatError
from traces.importers.summaries import import_summaries
from traces.io import read_trace

DATA = Path(__file__).parents[1] / "data"
LLMPERF = "llmperf_leaderboard_anyscale_llama2_70b_summary.json"
SWEEP = "guidellm_results_codellama34b_prefill_sweep.json"


def _value(df, level, metric, statistic, q=None, col="value_s"):
    rows = df[(df["level"] == level) & (df["metric"] == metric) & (df["statistic"] == statistic)]
    if q is not None:
        rows = rows[rows["quantile_pct"] == q]
    assert len(rows) == 1, (level, metric, statistic, q, rows)
    return float(rows[col].iloc[0])


def _imported(fmt, *paths, tmp_path):
    out = tmp_path / "agg.parquet"
    res = invoke_servecal("traces", "import", "summary", fmt, *paths, "-o", out)
    assert res.exit_code == 0, res.output
    kind, df, meta = read_trace(out)
    assert kind == "aggregate_targets/1"
    return df, meta, res.output


def test_llmperf_summary_values_are_the_files(real_data_dir, tmp_path):
    df, meta, out = _imported("llmperf", real_data_dir / LLMPERF, tmp_path=tmp_path)
    src = json.loads((real_data_dir / LLMPERF).read_text())
    assert "1 level(s) (concurrency 5)" in flat(out)
    assert set(df["level_kind"]) == {"concurrency"} and set(df["level_value"]) == {5.0}
    assert set(df["num_requests"]) == {150}
    assert _value(df, 0, "ttft_s", "quantile", 50) == src["results_ttft_s_quantiles_p50"]
    assert _value(df, 0, "e2e_s", "quantile", 90) == src["results_end_to_end_latency_s_quantiles_p90"]
    assert _value(df, 0, "e2e_s", "mean") == src["results_end_to_end_latency_s_mean"]
    assert _value(df, 0, "ttft_s", "std") == src["results_ttft_s_stddev"]
    # the leaderboard writes min/max of the lengths as strings: read as numbers
    assert _value(df, 0, "num_output_tokens", "min", col="value_tokens") == 22
    assert _value(df, 0, "num_output_tokens", "mean", col="value_tokens") == src["results_number_output_tokens_mean"]
    # LLMPerf's ITL changed definition between versions (llmperf#99): not read
    assert set(df["metric"]) == {"ttft_s", "e2e_s", "num_prompt_tokens", "num_output_tokens"}
    assert meta["source_format"] == "llmperf-summary"


def test_llmperf_summary_agrees_with_its_own_per_request_file(real_data_dir):
    """The same run's per-request file: the summary's p50s are numpy's linear percentiles of it."""
    df, _ = import_summaries([real_data_dir / LLMPERF], "llmperf")
    ind = json.loads((real_data_dir / LLMPERF.replace("summary", "individual")).read_text())
    for metric, field in (("ttft_s", "ttft_s"), ("e2e_s", "end_to_end_latency_s")):
        v = np.array([r[field] for r in ind])
        for q in (25, 50, 75, 90):
            assert _value(df, 0, metric, "quantile", q) == pytest.approx(np.percentile(v, q), rel=1e-12)


def test_guidellm_levels_and_values_are_the_reports(real_data_dir, tmp_path):
    df, _, out = _imported("guidellm", real_data_dir / SWEEP, tmp_path=tmp_path)
    src = json.loads((real_data_dir / SWEEP).read_text())["benchmarks"]
    levels = df.drop_duplicates("level").set_index("level")
    assert list(levels["level_kind"]) == ["concurrency", "concurrency", "constant_rate", "constant_rate",
                                          "constant_rate"]
    assert list(levels["level_value"][:2]) == [1.0, 40.0]  # synchronous; throughput: all 40 at once
    assert levels["level_value"][2] == src[2]["config"]["strategy"]["rate"]
    assert list(levels["num_requests"]) == [40] * 5
    m = src[2]["metrics"]
    assert _value(df, 2, "ttft_s", "quantile", 50) == pytest.approx(
        m["time_to_first_token_ms"]["successful"]["percentiles"]["p50"] / 1e3, rel=1e-15)
    assert _value(df, 2, "e2e_s", "mean") == m["request_latency"]["successful"]["mean"]
    assert _value(df, 2, "num_prompt_tokens", "quantile", 0.1, "value_tokens") == \
        m["prompt_token_count"]["successful"]["percentiles"]["p001"]
    assert "5 level(s)" in flat(out)


def test_guidellm_aggregates_are_order_statistics_of_the_same_requests(real_data_dir):
    """GuideLLM's TTFT and E2E percentiles are values of the requests it reports beside them;
    its ITL statistics count token gaps, not requests (so they are not read as TPOT)."""
    df, _ = import_summaries([real_data_dir / SWEEP], "guidellm")
    src = json.loads((real_data_dir / SWEEP).read_text())["benchmarks"]
    for b, bench in enumerate(src):
        ok = bench["requests"]["successful"]
        for metric, field, factor in (("ttft_s", "time_to_first_token_ms", 1e-3), ("e2e_s", "request_latency", 1)):
            v = np.array([r[field] * factor for r in ok])
            for q in (10, 50, 90):
                assert np.isclose(v, _value(df, b, metric, "quantile", q), rtol=1e-15, atol=0).any(), (b, metric, q)
        assert bench["metrics"]["inter_token_latency_ms"]["successful"]["count"] > 20 * len(ok)
    assert "tpot_s" not in set(df["metric"])


def test_vllm_bench_summary_fields(tmp_path):
    df, _, _ = _imported("vllm-bench", DATA / "vllm_bench_summary.json", tmp_path=tmp_path)
    assert df.drop_duplicates("level")[["level_kind", "level_value"]].values.tolist() == [["poisson_rate", 4.0]]
    assert _value(df, 0, "ttft_s", "quantile", 50) == pytest.approx(0.0552)
    assert _value(df, 0, "ttft_s", "quantile", 99) == pytest.approx(0.1403)
    assert _value(df, 0, "e2e_s", "mean") == pytest.approx(1.865)
    assert _value(df, 0, "num_prompt_tokens", "mean", col="value_tokens") == 1024.0  # 204800 / 200
    assert "itl" not in " ".join(df["metric"])


def test_sglang_lines_are_levels(tmp_path):
    df, _, out = _imported("sglang-bench", DATA / "sglang_bench_small.jsonl", tmp_path=tmp_path)
    levels = df.drop_duplicates("level")
    assert levels[["level_kind", "level_value", "num_requests"]].values.tolist() == \
        [["poisson_rate", 2.0, 3], ["poisson_rate", 4.0, 3]]
    assert _value(df, 1, "ttft_s", "mean") == pytest.approx(0.110)
    assert _value(df, 1, "num_prompt_tokens", "mean", col="value_tokens") == 300.0


def test_several_vllm_files_are_levels_in_order(tmp_path):
    obj = json.loads((DATA / "vllm_bench_summary.json").read_text())
    b = tmp_path / "b.json"
    b.write_text(json.dumps({**obj, "request_rate": "inf", "max_concurrency": 8}))
    df, _ = import_summaries([DATA / "vllm_bench_summary.json", b], "vllm-bench")
    assert df.drop_duplicates("level")[["level_kind", "level_value"]].values.tolist() == \
        [["poisson_rate", 4.0], ["concurrency", 8.0]]


def _bad(tmp_path, fmt, obj, name="bad.json"):
    p = tmp_path / name
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    out = tmp_path / "out.parquet"
    res = invoke_servecal("traces", "import", "summary", fmt, p, "-o", out)
    assert res.exit_code == 1, res.output
    assert not out.exists()
    msg = flat(res.output)
    assert msg.count("Error:") == 1 and str(p) in msg.replace("\n", "")
    return msg


@pytest.mark.parametrize("fmt,change,says", [
    ("vllm-bench", {"max_concurrency": 4}, "max_concurrency"),
    ("vllm-bench", {"burstiness": 0.5}, "burstiness"),
    ("vllm-bench", {"completed": "many"}, "completed"),
    ("vllm-bench", {"mean_ttft_ms": -3}, "mean_ttft_ms"),
    ("vllm-bench", {"total_input_tokens": None}, "total_input_tokens"),
])
def test_bad_vllm_summaries_name_the_field(tmp_path, fmt, change, says):
    obj = {**json.loads((DATA / "vllm_bench_summary.json").read_text()), **change}
    msg = _bad(tmp_path, fmt, obj)
    assert says in msg


def test_bad_files_name_the_field(tmp_path):
    assert "num_concurrent_requests" in _bad(tmp_path, "llmperf", {"results_ttft_s_mean": 1})
    assert "results_ttft_s_quantiles_p50" in _bad(tmp_path, "llmperf", {
        "num_concurrent_requests": 2, "results_num_completed_requests": 3, "results_ttft_s_quantiles_p50": "x"})
    assert "has no latency statistic" in _bad(tmp_path, "llmperf", {
        "num_concurrent_requests": 2, "results_num_completed_requests": 3})
    assert "benchmarks" in _bad(tmp_path, "guidellm", {"benchmarks": []})
    msg = _bad(tmp_path, "sglang-bench", '{"completed": 3}\n', "s.jsonl")
    assert "total_input_tokens" in msg and "row 1" in msg
    # a GuideLLM report without the aggregate metrics (an older version): says which object is missing
    assert "benchmarks[0].metrics" in _bad(tmp_path, "guidellm", (DATA / "guidellm_small.json").read_text())


def test_a_guidellm_strategy_the_replay_cannot_run_is_named(real_data_dir, tmp_path):
    report = json.loads((real_data_dir / SWEEP).read_text())
    report["benchmarks"][3]["config"]["strategy"]["type_"] = "sweep"
    p = tmp_path / "g.json"
    p.write_text(json.dumps(report))
    with pytest.raises(TraceFormatError, match=r"benchmarks\[3\].config.strategy.type_'?: strategy 'sweep'"):
        import_summaries([p], "guidellm")


def test_validation_refuses_a_table_breaking_the_contract(tmp_path):
    from schemas.errors import ValidationError
    from schemas.tables import to_table, write_table
    from schemas.validate import validate

    df, _ = import_summaries([DATA / "vllm_bench_summary.json"], "vllm-bench")
    bad = df.copy()
    bad.loc[0, "quantile_pct"] = 120.0
    bad.loc[1, "metric"] = "ttft_ms"
    bad.loc[2, "value_tokens"] = 5.0
    with pytest.raises(ValidationError) as err:
        validate(to_table("aggregate_targets/1", bad), "x.parquet")
    text = flat(str(err.value))
    assert "column 'quantile_pct'" in text and "is not a known name" in text and "column 'value_tokens'" in text
    dup = pd.concat([df, df.iloc[:1]], ignore_index=True)
    with pytest.raises(ValidationError, match="repeats a statistic"):
        validate(to_table("aggregate_targets/1", dup), "x.parquet")
    write_table(to_table("aggregate_targets/1", df), tmp_path / "ok.parquet")
    assert read_trace(tmp_path / "ok.parquet")[0] == "aggregate_targets/1"
