"""``traces import aiperf``: profile_export.jsonl as a request trace (each value in its own
unit), profile_export_aiperf.json as a level with the run's load, and one clear error per bad
input, no output (issue #32 item 4).

The fixtures in ``tests/data/aiperf`` follow AIPerf's ``docs/tutorials/working-with-profile-exports.md``."""
import json
import shutil
from pathlib import Path

import pytest

from helpers import flat, invoke_servecal
from traces.io import read_trace

DATA = Path(__file__).parents[1] / "data" / "aiperf"
RECORDS = [json.loads(line) for line in (DATA / "profile_export.jsonl").read_text().splitlines()]
SUMMARY = json.loads((DATA / "profile_export_aiperf.json").read_text())


def _run(tmp_path, *args):
    out = tmp_path / "out.parquet"
    return invoke_servecal("traces", "import", "aiperf", *args, "-o", out), out


def test_the_records_are_read_when_present(tmp_path):
    res, out = _run(tmp_path, DATA)
    assert res.exit_code == 0, res.output
    assert "30 requests over 7.7 s (request_trace/1); 1 failed" in res.output
    kind, df, meta = read_trace(out)
    assert kind == "request_trace/1" and meta["num_warmup_left_out"] == "1"
    rec = RECORDS[1]  # the first profiling record (line 1 is a warm-up one)
    row = df[df["request_id"] == rec["metadata"]["x_request_id"]].iloc[0]
    m = rec["metrics"]
    assert row["ttft_s"] == pytest.approx(m["time_to_first_token"]["value"] / 1e3)
    assert row["e2e_s"] == pytest.approx(m["request_latency"]["value"] / 1e3)
    # AIPerf's per-request inter_token_latency is the TPOT
    assert row["tpot_s"] == pytest.approx(m["inter_token_latency"]["value"] / 1e3)
    assert row["num_prompt_tokens"] == m["input_sequence_length"]["value"]
    assert (df["status"] == "failed: 500 InternalServerError").sum() == 1


def test_the_unit_of_each_value_is_honoured(tmp_path):
    """The same record written in ns and in s reads the same as in ms."""
    recs = json.loads(json.dumps(RECORDS))
    for r in recs:
        for name, m in (r["metrics"] or {}).items():
            if m["unit"] == "ms" and not isinstance(m["value"], list):
                m["value"], m["unit"] = (m["value"] * 1e6, "ns") if name == "request_latency" else \
                    (m["value"] / 1e3, "sec")
    (tmp_path / "profile_export.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    res, out = _run(tmp_path, tmp_path / "profile_export.jsonl")
    assert res.exit_code == 0, res.output
    _, df, _ = read_trace(out)
    _, ref, _ = read_trace(_run(tmp_path / "..", DATA)[1])
    assert df["e2e_s"].tolist() == pytest.approx(ref["e2e_s"].tolist(), nan_ok=True)
    assert df["ttft_s"].tolist() == pytest.approx(ref["ttft_s"].tolist(), nan_ok=True)


def test_the_aggregate_is_a_level_with_the_runs_load(tmp_path):
    res, out = _run(tmp_path, DATA, "--aggregates")
    assert res.exit_code == 0, res.output
    assert "1 level(s) (concurrency 4)" in flat(res.output)
    kind, df, meta = read_trace(out)
    assert kind == "aggregate_targets/1" and meta["source_format"] == "aiperf-summary"
    assert set(df["num_requests"]) == {29}

    def value(metric, statistic, q=None, col="value_s"):
        rows = df[(df["metric"] == metric) & (df["statistic"] == statistic)]
        rows = rows[rows["quantile_pct"] == q] if q is not None else rows
        assert len(rows) == 1
        return float(rows[col].iloc[0])

    assert value("ttft_s", "quantile", 99) == pytest.approx(SUMMARY["time_to_first_token"]["p99"] / 1e3)
    assert value("tpot_s", "mean") == pytest.approx(SUMMARY["inter_token_latency"]["avg"] / 1e3)
    assert value("e2e_s", "std") == pytest.approx(SUMMARY["request_latency"]["std"] / 1e3)
    assert value("num_output_tokens", "max", col="value_tokens") == SUMMARY["output_sequence_length"]["max"]


def test_a_rate_run_is_an_open_loop(tmp_path):
    s = json.loads(json.dumps(SUMMARY))
    s["input_config"]["loadgen"] = {"request_rate": 2.5, "request_rate_mode": "constant", "request_count": 30}
    (tmp_path / "profile_export_aiperf.json").write_text(json.dumps(s))
    res, _ = _run(tmp_path, tmp_path)
    assert res.exit_code == 0 and "constant rate 2.5" in flat(res.output)


def _bad(tmp_path, name: str, content: str):
    (tmp_path / name).write_text(content)
    res, out = _run(tmp_path, tmp_path / name)
    assert res.exit_code == 1 and not out.exists(), res.output
    assert "Traceback" not in res.output and str(tmp_path / name) in flat(res.output)
    return flat(res.output)


@pytest.mark.parametrize("case, expected", [
    ("wrong-unit", "row 2, column 'metrics.request_latency.unit': unit 'tokens' is not a time unit; "
                   "expected ns, us, ms, s or sec"),
    ("missing", "row 2, column 'metrics.request_latency': missing field"),
    ("not-json", "row 2 (line 2): not valid JSON"),
    ("only-warmup", "has no profiling records"),
    ("string", "row 2, column 'metrics.input_sequence_length.value': value 'x' is not a number"),
])
def test_each_kind_of_bad_record(tmp_path, case, expected):
    recs = json.loads(json.dumps(RECORDS[:4]))
    lines = [json.dumps(r) for r in recs]
    if case == "wrong-unit":
        recs[1]["metrics"]["request_latency"]["unit"] = "tokens"
    elif case == "missing":
        del recs[1]["metrics"]["request_latency"]
    elif case == "string":
        recs[1]["metrics"]["input_sequence_length"]["value"] = "x"
    if case == "only-warmup":
        lines = lines[:1]
    elif case == "not-json":
        lines[1] = lines[1][:40]
    else:
        lines = [json.dumps(r) for r in recs]
    assert expected in _bad(tmp_path, "profile_export.jsonl", "\n".join(lines) + "\n")


@pytest.mark.parametrize("case, expected", [
    ("wrong-unit", "column 'time_to_first_token.unit': unit 'tokens/sec' is not a time unit"),
    ("length-unit", "column 'input_sequence_length.unit': unit 'ms' is not tokens"),
    ("missing-metric", "column 'output_sequence_length': missing field"),
    ("no-load", "column 'input_config.loadgen': missing field"),
    ("rate-and-cap", "column 'input_config.loadgen.concurrency': request_rate 2 with concurrency 4"),
    ("not-json", "not valid JSON"),
])
def test_each_kind_of_bad_aggregate(tmp_path, case, expected):
    s = json.loads(json.dumps(SUMMARY))
    if case == "wrong-unit":
        s["time_to_first_token"]["unit"] = "tokens/sec"
    elif case == "length-unit":
        s["input_sequence_length"]["unit"] = "ms"
    elif case == "missing-metric":
        del s["output_sequence_length"]
    elif case == "no-load":
        del s["input_config"]
    elif case == "rate-and-cap":
        s["input_config"]["loadgen"].update(request_rate=2, request_rate_mode="poisson")
    text = json.dumps(s)[:-10] if case == "not-json" else json.dumps(s)
    assert expected in _bad(tmp_path, "profile_export_aiperf.json", text)


def test_records_and_aggregates_together_are_a_usage_error(tmp_path):
    shutil.copy(DATA / "profile_export_aiperf.json", tmp_path)
    res, out = _run(tmp_path, DATA / "profile_export.jsonl", tmp_path / "profile_export_aiperf.json")
    assert res.exit_code == 2 and "not both" in flat(res.output) and not out.exists()
