"""``traces import inference-perf``: the per-request file as a request trace, the stage files as
levels with each stage's load, and one clear error per bad input, no output (issue #32 item 4).

The fixture folder ``tests/data/inference_perf`` is laid out as inference-perf's report folder
(``docs/reports.md``; ``reportgen/base.py``): config.yaml, stage_N and per-request files."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from helpers import flat, invoke_servecal
from traces.io import read_trace

DATA = Path(__file__).parents[1] / "data" / "inference_perf"
PER_REQUEST = json.loads((DATA / "per_request_lifecycle_metrics.json").read_text())
STAGE0 = json.loads((DATA / "stage_0_lifecycle_metrics.json").read_text())


def _run(tmp_path, *args):
    out = tmp_path / "out.parquet"
    return invoke_servecal("traces", "import", "inference-perf", *args, "-o", out), out


def _value(df, level, metric, statistic, q=None, col="value_s"):
    rows = df[(df["level"] == level) & (df["metric"] == metric) & (df["statistic"] == statistic)]
    if q is not None:
        rows = rows[rows["quantile_pct"] == q]
    assert len(rows) == 1, (level, metric, statistic, q)
    return float(rows[col].iloc[0])


def test_the_per_request_file_is_read_when_present(tmp_path):
    res, out = _run(tmp_path, DATA)
    assert res.exit_code == 0, res.output
    assert "48 requests over 26.3 s (request_trace/1); 1 failed" in res.output
    kind, df, meta = read_trace(out)
    assert kind == "request_trace/1" and meta["source_format"] == "inference-perf"
    first = PER_REQUEST[0]
    row = df[df["request_id"] == "1"].iloc[0]
    times = first["info"]["response_metrics"]["output_token_times"]
    assert row["num_prompt_tokens"] == first["info"]["request_metrics"]["text"]["input_tokens"]
    assert row["num_output_tokens"] == first["info"]["response_metrics"]["server_usage"]["completion_tokens"]
    assert row["ttft_s"] == pytest.approx(times[0] - first["start_time"])
    assert row["e2e_s"] == pytest.approx(first["end_time"] - first["start_time"])
    assert row["tpot_s"] == pytest.approx((row["e2e_s"] - row["ttft_s"]) / (row["num_output_tokens"] - 1))
    assert (df["status"] == "failed: HTTP Error 503").sum() == 1
    assert df["arrival_time_s"].iloc[0] == 0


def test_the_stage_files_are_levels_with_their_load(tmp_path):
    res, out = _run(tmp_path, DATA, "--aggregates")
    assert res.exit_code == 0, res.output
    assert "2 level(s) (poisson rate 2, poisson rate 4)" in flat(res.output)
    kind, df, meta = read_trace(out)
    assert kind == "aggregate_targets/1" and meta["load_type"] == "poisson"
    lat = STAGE0["successes"]["latency"]
    assert _value(df, 0, "ttft_s", "quantile", 50) == lat["time_to_first_token"]["median"]
    assert _value(df, 0, "tpot_s", "quantile", 99.9) == lat["time_per_output_token"]["p99.9"]
    assert _value(df, 0, "e2e_s", "mean") == lat["request_latency"]["mean"]
    assert _value(df, 0, "num_prompt_tokens", "quantile", 90, "value_tokens") == \
        STAGE0["successes"]["prompt_tokens"]["p90"]
    assert set(df["metric"]) == {"ttft_s", "tpot_s", "e2e_s", "num_prompt_tokens", "num_output_tokens"}
    assert list(df.drop_duplicates("level")["num_requests"]) == [24, 23]


def test_the_aggregates_agree_with_the_per_request_file(tmp_path):
    """Stage 0's percentiles are numpy's of its requests (the first 24 entries)."""
    reqs = PER_REQUEST[:24]
    e2e = np.array([r["end_time"] - r["start_time"] for r in reqs])
    assert np.percentile(e2e, 90) == pytest.approx(STAGE0["successes"]["latency"]["request_latency"]["p90"],
                                                   rel=1e-5)


def test_a_concurrent_stage_without_config_is_a_closed_loop(tmp_path):
    stage = json.loads(json.dumps(STAGE0))
    stage["load_summary"]["concurrency"] = 8
    (tmp_path / "stage_0_lifecycle_metrics.json").write_text(json.dumps(stage))
    res, out = _run(tmp_path, tmp_path / "stage_0_lifecycle_metrics.json")
    assert res.exit_code == 0, res.output
    assert "1 level(s) (concurrency 8)" in flat(res.output)


def test_an_open_loop_without_config_needs_the_load_type(tmp_path):
    shutil.copy(DATA / "stage_0_lifecycle_metrics.json", tmp_path)
    res, out = _run(tmp_path, tmp_path)
    assert res.exit_code == 1 and not out.exists()
    assert "no config.yaml beside it says the arrivals" in flat(res.output) and "--load-type" in flat(res.output)
    res, out = _run(tmp_path, tmp_path, "--load-type", "constant")
    assert res.exit_code == 0 and "constant rate 2" in flat(res.output)


def _bad(tmp_path, name: str, content: str):
    d = tmp_path / "r"
    d.mkdir()
    shutil.copy(DATA / "config.yaml", d)
    (d / name).write_text(content)
    res, out = _run(tmp_path, d)
    assert res.exit_code == 1 and not out.exists(), res.output
    assert "Traceback" not in res.output and str(d / name) in flat(res.output)
    return flat(res.output)


def test_bad_inputs_get_one_clear_error_and_no_output(tmp_path):
    stage = json.loads(json.dumps(STAGE0))
    del stage["successes"]["latency"]
    msg = _bad(tmp_path, "stage_0_lifecycle_metrics.json", json.dumps(stage))
    assert "column 'successes.latency': missing field" in msg


@pytest.mark.parametrize("case, expected", [
    ("not-json", "not valid JSON"),
    ("string-value", "column 'successes.latency.time_to_first_token.median': value 'fast' is not a number"),
    ("no-successes", "column 'successes.count': has no successful request"),
    ("not-an-object", "is a JSON list"),
])
def test_each_kind_of_bad_stage_file(tmp_path, case, expected):
    stage = json.loads(json.dumps(STAGE0))
    if case == "not-json":
        text = json.dumps(stage)[:-20]
    elif case == "string-value":
        stage["successes"]["latency"]["time_to_first_token"]["median"] = "fast"
        text = json.dumps(stage)
    elif case == "no-successes":
        stage["successes"]["count"] = 0
        text = json.dumps(stage)
    else:
        text = "[]"
    assert expected in _bad(tmp_path, "stage_0_lifecycle_metrics.json", text)


@pytest.mark.parametrize("case, expected", [
    ("empty", "has no requests"),
    ("missing", "row 2, column 'start_time': missing field"),
    ("negative", "row 1, column 'end_time': value -1.0 is below 0"),
])
def test_each_kind_of_bad_per_request_file(tmp_path, case, expected):
    reqs = json.loads(json.dumps(PER_REQUEST[:3]))
    if case == "empty":
        reqs = []
    elif case == "missing":
        del reqs[1]["start_time"]
    else:
        reqs[0]["end_time"] = -1.0
    assert expected in _bad(tmp_path, "per_request_lifecycle_metrics.json", json.dumps(reqs))


def test_an_empty_folder_and_a_summary_of_several_stages_are_refused(tmp_path):
    (tmp_path / "e").mkdir()
    res, out = _run(tmp_path, tmp_path / "e")
    assert res.exit_code == 1 and "holds no result file" in flat(res.output) and not out.exists()
    d = tmp_path / "s"
    d.mkdir()
    shutil.copy(DATA / "config.yaml", d)
    (d / "summary_lifecycle_metrics.json").write_text(json.dumps(STAGE0))
    res, out = _run(tmp_path, d)
    assert res.exit_code == 1 and "summarises 2 load stages" in flat(res.output) and not out.exists()
