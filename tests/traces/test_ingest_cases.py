"""The ingest / schema-validation cases of shared/cases/CASES.md (BR-03, BR-11, BR-13, BR-14,
BR-16, BR-17) through the CLI. Malformed and mutated inputs, and the schema rules the importers
rely on: ``test_ingest_malformed.py``.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from traces.cli import main
from traces.importers.csv_generic import import_csv
from traces.io import read_trace

DATA = Path(__file__).parents[1] / "data"


def cli(*args):
    res = CliRunner().invoke(main, [str(a) for a in args])
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    return res


def ok(res):
    assert res.exit_code == 0, res.output
    return res


# ---------------------------------------------------------------------------
# BR-11: epoch vs relative clocks; send time vs scheduled time
# ---------------------------------------------------------------------------

BR11 = """request_id,arrival_time_us,send_time_us,first_token_time_us,end_time_us,input_tokens,output_tokens
r0,0,1787000000000000,1787000000250000,1787000000450000,500,11
r1,250000,1787000000300000,1787000000500000,1787000000700000,500,11
r2,1000000,1787000001000000,1787000001200000,1787000001400000,500,11
"""
BR11_MAP = ["--time-unit", "us", "--map", "request_id=request_id", "--map", "input_tokens=num_prompt_tokens",
            "--map", "output_tokens=num_output_tokens", "--map", "first_token_time_us=first_token_time",
            "--map", "end_time_us=end_time"]


def test_br11_send_based_injection_and_latencies(tmp_path):
    src = tmp_path / "br11.csv"
    src.write_text(BR11)
    out = tmp_path / "o.parquet"
    ok(cli("import", "csv", src, "-o", out, *BR11_MAP, "--map", "send_time_us=send_time"))
    _, df, meta = read_trace(out)
    np.testing.assert_allclose(df["arrival_time_s"], [0.0, 0.3, 1.0], atol=1e-12)
    np.testing.assert_allclose(df["ttft_s"], [0.25, 0.2, 0.2], atol=1e-12)
    np.testing.assert_allclose(df["e2e_s"], [0.45, 0.4, 0.4], atol=1e-12)
    np.testing.assert_allclose(df["tpot_s"], [0.02, 0.02, 0.02], atol=1e-12)
    assert df["arrival_time_s"].max() < 10  # never 1.787e9 s
    assert meta["clocks"] == "send_time_us=epoch, first_token_time_us=epoch, end_time_us=epoch"


def test_br11_relative_and_epoch_columns_are_never_mixed(tmp_path):
    src = tmp_path / "br11.csv"
    src.write_text(BR11)
    out = tmp_path / "o.parquet"
    res = cli("import", "csv", src, "-o", out, *BR11_MAP, "--map", "arrival_time_us=arrival_time_s")
    assert res.exit_code == 1
    assert str(src) in res.output and "first_token_time_us" in res.output and "arrival_time_us" in res.output
    assert "different clocks" in res.output
    assert not out.exists()


def test_br11_injecting_at_arrival_is_explicit_and_warns(tmp_path):
    src = tmp_path / "br11.csv"
    src.write_text(BR11)
    out = tmp_path / "o.parquet"
    res = ok(cli("import", "csv", src, "-o", out, *BR11_MAP, "--map", "send_time_us=send_time",
                 "--map", "arrival_time_us=arrival_time_s"))
    assert "Warning" in res.stderr and "'r1'" in res.stderr and "0.05 s early" in res.stderr
    _, df, meta = read_trace(out)
    np.testing.assert_allclose(df["arrival_time_s"], [0.0, 0.25, 1.0], atol=1e-12)
    np.testing.assert_allclose(df["ttft_s"], [0.25, 0.2, 0.2], atol=1e-12)  # still from the send time
    assert "arrival_vs_send_warning" in meta


# ---------------------------------------------------------------------------
# BR-13: BurstGPT failed rows and 1-second ties
# ---------------------------------------------------------------------------

BR13 = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
862919,ChatGPT,266,290,556,Conversation log
862919,ChatGPT,166,212,378,Conversation log
862919,ChatGPT,758,0,758,Conversation log
862920,GPT-4,482,226,708,API log
862921,ChatGPT,100,50,151,API log
"""


def test_br13_total_mismatch_is_a_schema_error(tmp_path):
    src = tmp_path / "b.csv"
    src.write_text(BR13)
    res = cli("import", "burstgpt", src, "-o", tmp_path / "o.parquet")
    assert res.exit_code == 1
    assert f"{src}, row 5 (line 6), column 'Total tokens'" in res.output
    assert not (tmp_path / "o.parquet").exists()


def test_br13_failed_rows_ties_and_counts(tmp_path):
    src = tmp_path / "b.csv"
    src.write_text(BR13)
    out = tmp_path / "o.parquet"
    res = ok(cli("import", "burstgpt", src, "-o", out, "--invalid", "drop"))
    assert "1 failed, 1 invalid, 1 dropped" in res.output
    _, df, meta = read_trace(out)
    assert meta["num_failed"] == "1" and meta["num_invalid"] == "1" and meta["num_invalid_dropped"] == "1"
    assert df["status"].tolist() == ["ok", "ok", "failed: zero response tokens", "ok"]
    kept = df[df["status"] == "ok"]
    assert kept["arrival_time_s"].tolist() == [0.0, 0.0, 1.0]  # zero gaps allowed, file order, no dedup
    assert kept["num_prompt_tokens"].tolist() == [266, 166, 482]
    assert meta["time_resolution_s"] == "1"
    assert float(meta["mean_rate_rps"]) == 3.0  # 3 ok requests / (1 - 0) s
    assert meta["mean_rate_formula"] == "n_ok / (t_last - t_first) over ok rows"
    flagged = tmp_path / "f.parquet"
    ok(cli("import", "burstgpt", src, "-o", flagged, "--invalid", "flag"))
    _, f, _ = read_trace(flagged)
    assert f["status"].iloc[-1] == "invalid: Total tokens != Request tokens + Response tokens"
    assert len(f) == 5


def test_br13_model_filter(tmp_path):
    src = tmp_path / "b.csv"
    src.write_text(BR13)
    out = tmp_path / "o.parquet"
    ok(cli("import", "burstgpt", src, "-o", out, "--model", "GPT-4"))
    _, df, meta = read_trace(out)
    assert len(df) == 1 and df["num_prompt_tokens"].tolist() == [482] and df["arrival_time_s"].tolist() == [0.0]
    res = cli("import", "burstgpt", src, "-o", out, "--model", "Claude")
    assert res.exit_code == 1 and "no rows of model 'Claude'" in res.output


# ---------------------------------------------------------------------------
# BR-14: Mooncake hash_ids count, ms timestamps, 512-token blocks
# ---------------------------------------------------------------------------

BR14 = """{"timestamp": 0,    "input_length": 1200, "output_length": 10, "hash_ids": [0, 1, 2]}
{"timestamp": 500,  "input_length": 1100, "output_length": 10, "hash_ids": [0, 1, 3]}
{"timestamp": 500,  "input_length": 20,   "output_length": 8,  "hash_ids": [0, 1]}
{"timestamp": 1000, "input_length": 1024, "output_length": 4,  "hash_ids": [0, 1]}
"""


def test_br14_wrong_hash_count_is_rejected_by_default(tmp_path):
    src = tmp_path / "m.jsonl"
    src.write_text(BR14)
    res = cli("import", "mooncake", src, "-o", tmp_path / "o.parquet")
    assert res.exit_code == 1
    assert f"{src}, row 3 (line 3), column 'hash_ids'" in res.output
    assert "ceil(20/512) = 1" in res.output


def test_br14_flagged_and_dropped(tmp_path):
    src = tmp_path / "m.jsonl"
    src.write_text(BR14)
    out = tmp_path / "o.parquet"
    ok(cli("import", "mooncake", src, "-o", out, "--invalid", "flag"))
    _, df, meta = read_trace(out)
    assert df["arrival_time_s"].tolist() == [0.0, 0.5, 0.5, 1.0]  # ms, not s
    assert df["status"].tolist() == ["ok", "ok", "invalid: hash_ids count", "ok"]
    assert meta["num_invalid_hash_ids_count"] == "1"
    assert [list(h) for h in df["block_hashes"]] == [[0, 1, 2], [0, 1, 3], [0, 1], [0, 1]]
    assert meta["hash_block_tokens"] == "512"
    ok(cli("import", "mooncake", src, "-o", out, "--invalid", "drop"))
    _, df, _ = read_trace(out)
    assert df["arrival_time_s"].tolist() == [0.0, 0.5, 1.0] and df["request_id"].tolist() == ["1", "2", "4"]


# ---------------------------------------------------------------------------
# BR-16: Parquet timestamp units, tz, nullable ints
# ---------------------------------------------------------------------------

BASE_NS = 1715299200_000_000_000  # 2024-05-10T00:00:00
INSTANTS_NS = [BASE_NS, BASE_NS + 250_000_000, BASE_NS + 1_500_000_001]
BR16_MAP = {"arrival_time_s": "t", "num_prompt_tokens": "p", "num_output_tokens": "o"}


@pytest.mark.parametrize("unit,tz,expected,resolution", [
    ("ns", None, [0, 0.25, 1.500000001], "1e-09"),
    ("us", None, [0, 0.25, 1.5], "0.01"),
    ("ms", None, [0, 0.25, 1.5], "0.01"),
    ("us", "UTC", [0, 0.25, 1.5], "0.01"),
    ("s", None, [0, 0, 1], "1"),  # the writer truncates; it reads back as timestamp[ms]: report 1 s
])
def test_br16_unit_read_from_the_arrow_type(tmp_path, unit, tz, expected, resolution):
    col = pa.array(INSTANTS_NS, pa.timestamp("ns")).cast(pa.timestamp(unit, tz), safe=False)
    f = tmp_path / "t.parquet"
    pq.write_table(pa.table({"t": col, "p": [1, 2, 3], "o": [1, 1, 1]}), f)
    out = tmp_path / "o.parquet"
    ok(cli("import", "csv", f, "-o", out, "--map", "t=arrival_time_s", "--map", "p=num_prompt_tokens",
           "--map", "o=num_output_tokens"))
    _, df, meta = read_trace(out)
    assert df["arrival_time_s"].tolist() == expected
    assert meta["time_resolution_s"] == resolution


def test_br16_nullable_int64_is_rejected_not_rounded(tmp_path):
    f = tmp_path / "n.parquet"
    pq.write_table(pa.table({"arrival_ns": pa.array(INSTANTS_NS + [None], pa.int64()),
                             "p": [44, 1, 16, 3], "o": [1, 1, 1, 1]}), f)
    res = cli("import", "csv", f, "-o", tmp_path / "o.parquet", "--time-unit", "ns", "--map",
              "arrival_ns=arrival_time_s", "--map", "p=num_prompt_tokens", "--map", "o=num_output_tokens")
    assert res.exit_code == 1 and f"{f}, row 4, column 'arrival_ns': missing value" in res.output
    # without the NULL row, 1715299201500000001 ns keeps its last nanosecond
    df, _ = import_csv(f, {"arrival_time_s": "arrival_ns", "num_prompt_tokens": "p", "num_output_tokens": "o"},
                       time_unit="ns", filters={"p": "44"})
    assert df["arrival_time_s"].tolist() == [0.0]
    pq.write_table(pa.table({"arrival_ns": pa.array(INSTANTS_NS, pa.int64()), "p": [1, 2, 3], "o": [1, 1, 1]}), f)
    df, _ = import_csv(f, {"arrival_time_s": "arrival_ns", "num_prompt_tokens": "p", "num_output_tokens": "o"},
                       time_unit="ns")
    assert df["arrival_time_s"].tolist() == [0.0, 0.25, 1.500000001]
    pq.write_table(pa.table({"arrival_ns": pa.array(INSTANTS_NS, pa.int64()),
                             "p": pa.array([44, None, 16], pa.int64()), "o": [1, 1, 1]}), f)
    res = cli("import", "csv", f, "-o", tmp_path / "o.parquet", "--time-unit", "ns", "--map",
              "arrival_ns=arrival_time_s", "--map", "p=num_prompt_tokens", "--map", "o=num_output_tokens")
    assert res.exit_code == 1 and "row 2, column 'p': missing value" in res.output


def test_br16_dictionary_encoded_filter(tmp_path):
    f = tmp_path / "d.parquet"
    pq.write_table(pa.table({"t": pa.array(INSTANTS_NS, pa.timestamp("ns")), "p": [44, 2, 16], "o": [1, 1, 1],
                             "model": pa.array(["a", "b", "a"]).dictionary_encode()}), f)
    assert pq.read_table(f).to_pandas()["model"].dtype == "category"
    out = tmp_path / "o.parquet"
    ok(cli("import", "csv", f, "-o", out, "--map", "t=arrival_time_s", "--map", "p=num_prompt_tokens",
           "--map", "o=num_output_tokens", "--filter", "model=a"))
    _, df, _ = read_trace(out)
    assert df["num_prompt_tokens"].tolist() == [44, 16] and df["arrival_time_s"].tolist() == [0.0, 1.500000001]


def test_datetime_strings_with_offsets_in_csv(tmp_path):
    src = tmp_path / "d.csv"
    src.write_text("t,p,o\n2024-05-10T02:00:00.250+02:00,1,1\n2024-05-10T00:00:00Z,2,2\n")
    df, meta = import_csv(src, {"arrival_time_s": "t", "num_prompt_tokens": "p", "num_output_tokens": "o"})
    assert df["arrival_time_s"].tolist() == [0.0, 0.25] and df["num_prompt_tokens"].tolist() == [2, 1]


# ---------------------------------------------------------------------------
# BR-17: failed requests inside vLLM benchmark JSON; BR-03: chunks vs tokens
# ---------------------------------------------------------------------------

BR17 = {"request_rate": "inf", "input_lens": [500, 600, 700, 800], "output_lens": [50, 0, 40, 10],
        "ttfts": [0.120, 0.0, 0.200, 0.160], "itls": [[0.02], [], [0.03], [0.01]],
        "errors": ["", "ReadTimeout", "", ""]}


def test_br17_failed_requests_filtered_on_error_not_position(tmp_path):
    src = tmp_path / "r.json"
    src.write_text(json.dumps(BR17))
    out = tmp_path / "o.parquet"
    res = ok(cli("import", "vllm-bench", src, "-o", out))
    assert "1 failed" in res.output
    _, df, meta = read_trace(out)
    assert meta["num_failed"] == "1"
    okr = df[df["status"] == "ok"]
    assert len(okr) == 3
    assert okr["ttft_s"].mean() == pytest.approx(0.160) and okr["ttft_s"].median() == pytest.approx(0.160)
    failed = df[df["status"] != "ok"]
    assert failed["status"].tolist() == ["failed: ReadTimeout"] and failed["ttft_s"].isna().all()
    # the failure never enters a mean as TTFT 0 (wrong answers: mean 0.120, median 0.140)
    assert df["ttft_s"].mean() == pytest.approx(0.160)


def test_br17_success_with_zero_ttft_is_invalid(tmp_path):
    bad = dict(BR17, errors=["", "", "", ""], output_lens=[50, 7, 40, 10])
    src = tmp_path / "r.json"
    src.write_text(json.dumps(bad))
    res = cli("import", "vllm-bench", src, "-o", tmp_path / "o.parquet")
    assert res.exit_code == 1 and f"{src}, row 2, column 'ttfts'" in res.output
    ok(cli("import", "vllm-bench", src, "-o", tmp_path / "o.parquet", "--invalid", "flag"))
    _, df, _ = read_trace(tmp_path / "o.parquet")
    assert df["status"].tolist()[1] == "invalid: success with ttft 0"


def test_br03_tpot_divides_by_tokens_not_chunks(tmp_path):
    # C: one token; D: 10 tokens in chunks of [1, 4, 5] at 0.5, 0.7, 0.9 s
    res_json = {"request_rate": "inf", "input_lens": [100, 100], "output_lens": [1, 10], "ttfts": [0.4, 0.5],
                "itls": [[], [0.2, 0.2]], "errors": ["", ""]}
    src = tmp_path / "r.json"
    src.write_text(json.dumps(res_json))
    out = tmp_path / "o.parquet"
    ok(cli("import", "vllm-bench", src, "-o", out))
    _, df, _ = read_trace(out)
    c, d = df.iloc[0], df.iloc[1]
    assert c["ttft_s"] == c["e2e_s"] == 0.4 and np.isnan(c["tpot_s"])  # undefined, not 0 or inf
    assert list(c["token_times_s"]) == [0.4]
    assert d["e2e_s"] == pytest.approx(0.9) and d["tpot_s"] == pytest.approx(0.4 / 9)  # not 0.040 or 0.200
    assert d["token_times_s"] is None  # 3 chunks for 10 tokens: per-token times unknown
    assert np.nanmean(df["tpot_s"]) == pytest.approx(0.04444, abs=1e-5)  # C excluded, not counted as 0
