"""``traces import vllm-otlp``: vLLM's OTLP request spans, real and a tiny fixture, joined with GuideLLM."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from traces.cli import main
from traces.io import read_trace

DATA = Path(__file__).parents[1] / "data"
REAL = "vllm_otlp_spans_codellama34b_prefill_sweep.jsonl"
GUIDELLM = "guidellm_results_codellama34b_prefill_sweep.json"


def run_cli(*args):
    res = CliRunner().invoke(main, [str(a) for a in args])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert "Traceback" not in res.output
    return res


def imported(tmp_path, *args, name="out.parquet"):
    out = tmp_path / name
    res = run_cli("import", "vllm-otlp", *args, "-o", out)
    assert res.exit_code == 0, res.output
    assert run_cli("validate", out).exit_code == 0
    _, df, meta = read_trace(out)
    return df, meta, res.output


def _real_spans(path):
    """Every span's attributes, by a plain json pass."""
    out = []
    for line in path.read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for sp in ss["spans"]:
                    a = {x["key"]: next(iter(x["value"].values())) for x in sp["attributes"]}
                    out.append((sp["name"], int(sp["startTimeUnixNano"]), a))
    return out


def test_real_spans(tmp_path, real_data_dir):
    df, meta, out = imported(tmp_path, real_data_dir / REAL)
    spans = _real_spans(real_data_dir / REAL)
    assert len(df) == 200 == len(spans) and meta["num_spans"] == "200" and meta["num_other_spans"] == "0"
    t0 = min(s[1] for s in spans)
    assert meta["time_origin_unix_ns"] == str(t0)
    by_id = {s[2]["gen_ai.request.id"]: s for s in spans}
    row = df.iloc[17]
    _, start, a = by_id[row["request_id"]]
    assert row["arrival_time_s"] == pytest.approx((start - t0) / 1e9, abs=1e-9)
    assert row["ttft_s"] == a["gen_ai.latency.time_to_first_token"]
    assert row["e2e_s"] == a["gen_ai.latency.e2e"]
    assert row["queue_wait_s"] == a["gen_ai.latency.time_in_queue"]
    assert row["prefill_time_s"] == a["gen_ai.latency.time_in_model_prefill"]
    assert row["decode_time_s"] == a["gen_ai.latency.time_in_model_decode"]
    assert row["inference_time_s"] == a["gen_ai.latency.time_in_model_inference"]
    assert row["num_prompt_tokens"] == int(a["gen_ai.usage.prompt_tokens"])  # intValue as a string
    n = int(a["gen_ai.usage.completion_tokens"])
    assert row["tpot_s"] == pytest.approx((a["gen_ai.latency.e2e"] - a["gen_ai.latency.time_to_first_token"]) / (n - 1))
    assert df["tpot_s"].isna().sum() == sum(int(s[2]["gen_ai.usage.completion_tokens"]) == 1 for s in spans) == 5
    assert df["num_prompt_tokens"].sum() == sum(int(s[2]["gen_ai.usage.prompt_tokens"]) for s in spans)
    assert meta["service_name"] == "vllm-exp1"


def test_real_join_with_guidellm(tmp_path, real_data_dir):
    """The two imports share request ids; the server's and the client's views agree."""
    df, meta, out = imported(tmp_path, real_data_dir / REAL, "--guidellm", real_data_dir / GUIDELLM)
    assert "200 of 200 spans matched" in out and meta["guidellm_num_unmatched_spans"] == "0"
    assert df.groupby("benchmark").size().to_dict() == {b: 40 for b in range(5)}
    assert meta["hash_block_tokens"] == "16" and df["block_hashes"].notna().all()
    gl = CliRunner().invoke(main, ["import", "guidellm", str(real_data_dir / GUIDELLM),
                                   "-o", str(tmp_path / "g.parquet")])
    assert gl.exit_code == 0
    _, g, gmeta = read_trace(tmp_path / "g.parquet")
    j = df.merge(g, on="request_id", suffixes=("", "_gl"))
    assert len(j) == 200
    assert (j["num_prompt_tokens"] == j["num_prompt_tokens_gl"]).all()
    assert (j["num_output_tokens"] == j["num_output_tokens_gl"]).all()
    # the engine sees a request 10-60 ms after the client sends it, and its TTFT is shorter by about that
    origin_gap = int(meta["time_origin_unix_ns"]) / 1e9 - float(gmeta["time_origin_unix_s"])
    lag = j["arrival_time_s"] + origin_gap - j["arrival_time_s_gl"]
    assert lag.between(0, 0.1).all()
    assert ((j["ttft_s_gl"] - j["ttft_s"]) - lag).abs().max() < 0.02
    # the benchmark each span is in matches its arrival window
    assert (j["benchmark"] == j["benchmark_gl"]).all()


def test_fixture(tmp_path):
    df, meta, out = imported(tmp_path, DATA / "vllm_otlp_small.jsonl")
    assert df["request_id"].tolist() == ["cmpl-a-0", "cmpl-b-0", "cmpl-c-0", "cmpl-x-0"]
    assert df["arrival_time_s"].tolist() == [0.0, 1.0, 2.000000001, 2.5]   # exact in int64 ns
    assert df["num_prompt_tokens"].tolist() == [52, 60, 44, 40]           # intValue as string and as number
    assert meta["num_other_spans"] == "1" and meta["other_span_names"] == "POST /v1/completions"
    assert "1 other spans ignored (POST /v1/completions)" in out
    assert df["tpot_s"].iloc[0] == pytest.approx((0.625 - 0.5) / 4) and math.isnan(df["tpot_s"].iloc[1])


def test_fixture_join(tmp_path):
    df, meta, out = imported(tmp_path, DATA / "vllm_otlp_small.jsonl", "--guidellm", DATA / "guidellm_small.json")
    assert "3 of 4 spans matched" in out and "1 have no benchmark" in out
    assert df["benchmark"].tolist()[:3] == [0, 0, 0] and df["benchmark"].isna().tolist() == [False] * 3 + [True]
    assert df["block_hashes"].iloc[3] is None and len(df["block_hashes"].iloc[0]) == 3


def test_join_with_an_unrelated_report_fails(tmp_path, real_data_dir):
    res = run_cli("import", "vllm-otlp", DATA / "vllm_otlp_small.jsonl", "--guidellm", real_data_dir / GUIDELLM,
                  "-o", tmp_path / "o.parquet")
    assert res.exit_code == 1 and "matches a span's gen_ai.request.id" in res.output
    assert not (tmp_path / "o.parquet").exists()


# ---------------------------------------------------------------------------
# Bad inputs
# ---------------------------------------------------------------------------

def _lines():
    return [json.loads(x) for x in (DATA / "vllm_otlp_small.jsonl").read_text().splitlines()]


def _attr(line, k, key):
    sp = line["resourceSpans"][0]["scopeSpans"][0]["spans"][k]
    return next(a for a in sp["attributes"] if a["key"] == key)


def _bad(tmp_path, lines, *extra):
    src = tmp_path / "bad.jsonl"
    src.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    out = tmp_path / "out.parquet"
    return run_cli("import", "vllm-otlp", src, "-o", out, *extra), out


def test_truncated_line(tmp_path):
    lines = _lines()
    res, out = _bad(tmp_path, [lines[0], json.dumps(lines[1])[:200]])
    assert res.exit_code == 1 and not out.exists()
    assert "bad.jsonl, row 2 (line 2): not valid JSON" in res.output


def test_bad_int_value_names_span_line_and_attribute(tmp_path):
    lines = _lines()
    _attr(lines[1], 0, "gen_ai.usage.completion_tokens")["value"] = {"intValue": "nine"}
    res, out = _bad(tmp_path, lines)
    assert res.exit_code == 1 and not out.exists()
    assert "bad.jsonl, row 3 (line 2), column 'gen_ai.usage.completion_tokens': intValue 'nine' is not an integer" \
        in res.output


def test_missing_attribute(tmp_path):
    lines = _lines()
    sp = lines[0]["resourceSpans"][0]["scopeSpans"][0]["spans"][2]
    sp["attributes"] = [a for a in sp["attributes"] if a["key"] != "gen_ai.latency.e2e"]
    res, out = _bad(tmp_path, lines)
    assert res.exit_code == 1 and "row 2 (line 1), column 'gen_ai.latency.e2e': missing attribute" in res.output


def test_negative_latency_and_duplicate_id(tmp_path):
    lines = _lines()
    _attr(lines[0], 0, "gen_ai.latency.time_to_first_token")["value"] = {"doubleValue": -0.5}
    res, _ = _bad(tmp_path, lines)
    assert res.exit_code == 1
    assert "column 'gen_ai.latency.time_to_first_token': value -0.5 is not a finite" in res.output
    lines = _lines()
    _attr(lines[1], 1, "gen_ai.request.id")["value"] = {"stringValue": "cmpl-a-0"}
    res, _ = _bad(tmp_path, lines)
    assert res.exit_code == 1 and "row 4 (line 2), column 'gen_ai.request.id': duplicate request id 'cmpl-a-0'" \
        in res.output


def test_ttft_above_e2e_follows_invalid_policy(tmp_path):
    lines = _lines()
    _attr(lines[0], 0, "gen_ai.latency.e2e")["value"] = {"doubleValue": 0.1}
    res, out = _bad(tmp_path, lines)
    assert res.exit_code == 1 and not out.exists()
    assert "row 1, column 'gen_ai.latency.time_to_first_token': time_to_first_token > e2e" in res.output
    res, out = _bad(tmp_path, lines, "--invalid", "drop")
    assert res.exit_code == 0 and "1 dropped" in res.output
    _, df, _ = read_trace(out)
    assert len(df) == 3


def test_no_request_spans(tmp_path):
    lines = _lines()
    for line in lines:
        for sp in line["resourceSpans"][0]["scopeSpans"][0]["spans"]:
            sp["name"] = "other"
    res, out = _bad(tmp_path, lines)
    assert res.exit_code == 1 and "has no 'llm_request' spans (only {'other': 5})" in res.output


def test_not_otlp(tmp_path):
    res, out = _bad(tmp_path, [{"spans": []}])
    assert res.exit_code == 1 and "line 1, column 'resourceSpans': no 'resourceSpans' list" in res.output
    assert not np.any([out.exists()])
