"""Each kind of malformed input found by fuzzing (issue 11) gives exit 1 or 2 and one message naming
the file (and the row and column where there is one), never a traceback; valid oddities import."""
import json
import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from calibrate.umbrella import main as servecal
from schemas.tables import REQUEST_TRACE, STEP_TRACE, to_table, write_table
from traces.io import read_trace

DATA = __import__("pathlib").Path(__file__).parents[1] / "data"


def invoke(*args):
    res = CliRunner().invoke(servecal, [str(a) for a in args])
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output
    return res


def failed(res, *needles, code=1):
    assert res.exit_code == code, res.output
    assert sum(line.startswith("Error:") for line in res.output.splitlines()) == 1, res.output
    for n in needles:
        assert str(n) in res.output.replace("\n  ", " "), (n, res.output)  # a long message is folded


# ---------------------------------------------------------------------------
# CSV headers with spaces: the Arrow reader sees the names the header check sees
# ---------------------------------------------------------------------------

CSVS = {
    "azure": ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,4808,10\n"
              "2023-11-16 18:17:04.0319600,3180,8\n", []),
    "vidur": ("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,374,44\n4.3,396,109\n", []),
    "burstgpt": ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                 "5,ChatGPT,472,18,490,Conversation log\n45,ChatGPT,1087,3,1090,Conversation log\n", []),
    "csv": ("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,374,44\n4.3,396,109\n",
            ["--map", "arrived_at=arrival_time_s", "--map", "num_prefill_tokens=num_prompt_tokens",
             "--map", "num_decode_tokens=num_output_tokens"]),
}


def _spaced(text: str) -> str:
    head, rest = text.split("\n", 1)
    return ",".join(f" {c}  " if i % 2 else f"{c} " for i, c in enumerate(head.split(","))) + "\n" + rest


@pytest.mark.parametrize("fmt", sorted(CSVS))
def test_csv_header_names_with_spaces_import_the_same(tmp_path, fmt):
    text, extra = CSVS[fmt]
    (tmp_path / "plain.csv").write_text(text)
    (tmp_path / "spaced.csv").write_text(_spaced(text))
    for name in ("plain", "spaced"):
        res = invoke("traces", "import", fmt, tmp_path / f"{name}.csv", "-o", tmp_path / f"{name}.parquet", *extra)
        assert res.exit_code == 0, res.output
    a = read_trace(tmp_path / "plain.parquet")[1]
    b = read_trace(tmp_path / "spaced.parquet")[1]
    pd.testing.assert_frame_equal(a, b)


@pytest.mark.parametrize("fmt", sorted(CSVS))
def test_csv_column_twice_once_spaces_are_ignored(tmp_path, fmt):
    text, extra = CSVS[fmt]
    head, rest = text.split("\n", 1)
    first = head.split(",")[0]
    bad = f"{head},{first} \n" + "\n".join(l + ",1" for l in rest.strip().split("\n")) + "\n"
    (tmp_path / "dup.csv").write_text(bad)
    res = invoke("traces", "import", fmt, tmp_path / "dup.csv", "-o", tmp_path / "o.parquet", *extra)
    failed(res, tmp_path / "dup.csv", f"column '{first}'", "2 times")
    assert not (tmp_path / "o.parquet").exists()


# ---------------------------------------------------------------------------
# Numbers out of range, and JSON nested too deeply
# ---------------------------------------------------------------------------

REQ = {"request_id": "r0", "input_toks": 10, "output_toks": 5, "arrival_time": 1.0e9, "queued_ts": 5.0,
       "scheduled_ts": 5.1, "first_token_ts": 5.2, "last_token_ts": 5.6}


@pytest.mark.parametrize("field,raw", [("input_toks", "1e300"), ("input_toks", str(2 ** 64)),
                                       ("output_toks", "9" * 400), ("queued_ts", "9" * 400), ("input_toks", "9" * 5000),
                                       ("first_token_ts", "1e300")])
def test_vllm_request_stats_numbers_out_of_range(tmp_path, field, raw):
    line = json.dumps({**REQ, field: 0}).replace(f'"{field}": 0', f'"{field}": {raw}')
    src = tmp_path / "r.jsonl"
    src.write_text(json.dumps(REQ | {"request_id": "a"}) + "\n" + line + "\n")
    res = invoke("traces", "import", "vllm-request-stats", src, "-o", tmp_path / "o.parquet")
    failed(res, src)
    assert "line 2" in res.output or "row 2" in res.output or "row(s) 1" in res.output, res.output
    assert not (tmp_path / "o.parquet").exists()


@pytest.mark.parametrize("fmt,file,key", [("vllm-bench", "vllm_bench_small.json", "input_lens"),
                                          ("vllm-bench", "vllm_bench_small.json", "ttfts"),
                                          ("genai-perf", "genai_perf_profile_export.json", None)])
@pytest.mark.parametrize("value", ["1e300", str(2 ** 64), "9" * 400])
def test_json_importers_numbers_out_of_range(tmp_path, fmt, file, key, value):
    text = (DATA / file).read_text()
    if key is None:  # the first nanosecond timestamp
        text = text.replace("1715299200000000001", value, 1)
    else:
        obj = json.loads(text)
        obj[key][0] = 12345.0
        text = json.dumps(obj).replace("12345.0", value, 1)
    src = tmp_path / file
    src.write_text(text)
    res = invoke("traces", "import", fmt, src, "-o", tmp_path / "o.parquet")
    failed(res, src)


def test_mooncake_and_llmperf_out_of_range(tmp_path, ):
    src = tmp_path / "m.jsonl"
    src.write_text('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n'
                   '{"timestamp": 1e300, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n')
    failed(invoke("traces", "import", "mooncake", src, "-o", tmp_path / "o.parquet"), src, "row 2", "timestamp")
    src.write_text('{"timestamp": 0, "input_length": 1e300, "output_length": 5}\n')
    failed(invoke("traces", "import", "mooncake", src, "-o", tmp_path / "o.parquet"), src, "input_length")


@pytest.mark.parametrize("fmt,file", [("vllm-request-stats", "r.jsonl"), ("vllm-bench", "v.json"),
                                      ("mooncake", "m.jsonl"), ("genai-perf", "g.json")])
def test_deeply_nested_json(tmp_path, fmt, file):
    src = tmp_path / file
    src.write_text("[" * 200_000 + "]" * 200_000 + "\n")
    res = invoke("traces", "import", fmt, src, "-o", tmp_path / "o.parquet")
    failed(res, src, "nested too deeply")


@pytest.mark.parametrize("fmt,text", [
    ("vidur", "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,374,44\n1e300,396,109\n"),
    ("vidur", "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,374,44\n1.0,1e300,109\n"),
    ("vidur", f"arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,374,44\n1.0,{2 ** 64},109\n"),
    ("burstgpt", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,472,18,490,x\n"
                 "1e300,ChatGPT,472,18,490,x\n"),
    ("azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,4808,10\n"
              f"2023-11-16 18:17:04.0319600,{'9' * 400},8\n"),
])
def test_csv_numbers_out_of_range(tmp_path, fmt, text):
    src = tmp_path / "x.csv"
    src.write_text(text)
    res = invoke("traces", "import", fmt, src, "-o", tmp_path / "o.parquet")
    failed(res, src)
    assert "row" in res.output


def test_profile_value_out_of_range_names_the_profile(tmp_path, real_data_dir):
    p = "lss_profile_rtx4090_llama31_8b_"
    files = []
    for k in ("meta.yaml", "tp1_dense.csv", "tp1_attention.csv", "tp1_per_sequence.csv"):
        dst = tmp_path / f"x_{k}"
        text = (real_data_dir / f"{p}{k}").read_text()
        if k == "tp1_dense.csv":
            text = text.replace("act_fn,2,", f"act_fn,{'9' * 30},", 1)
        dst.write_text(text)
        files.append(dst)
    res = invoke("traces", "import", "llmservingsim-profile", *files, "-o", tmp_path / "s.parquet")
    failed(res, "x_tp1_dense.csv", "out of range")


# ---------------------------------------------------------------------------
# Parquet that validate, fit and replay read: metadata and rules
# ---------------------------------------------------------------------------

def _requests(**cols):
    base = {"request_id": ["a", "b"], "arrival_time_s": [0.0, 1.0], "num_prompt_tokens": [10, 20],
            "num_output_tokens": [3, 2], "ttft_s": [0.1, 0.2], "e2e_s": [0.3, 0.4]}
    base.update(cols)
    return pd.DataFrame(base)


@pytest.mark.parametrize("meta", [{b"servecal.schema": b"\xff\xferequest_trace/1"},
                                  {b"servecal.schema": b"request_trace/1", b"servecal.source": b"\xc3\x28"},
                                  {b"servecal.schema": b"request_trace/1", b"pandas": b"\xff{"},
                                  {b"servecal.schema": b"request_trace/1", b"pandas": b'{"columns": 3}'}])
def test_parquet_metadata_not_utf8_or_unusable(tmp_path, meta):
    t = pa.Table.from_pandas(_requests(), preserve_index=False).replace_schema_metadata(meta)
    p = tmp_path / "t.parquet"
    pq.write_table(t, p)
    bad = any(k.startswith(b"servecal.") and not _utf8(v) for k, v in meta.items())
    from schemas.calibration import Calibration, FittedParam
    from schemas.specs import get_gpu, get_model

    params = {k: FittedParam(v) for k, v in (("eta_compute", 0.5), ("eta_mem", 0.8), ("t_step_s", 1e-4))}
    Calibration(get_model("llama-3.1-8b"), get_gpu("h100-80gb"), 1, params).write(tmp_path / "cal.json")
    for args in (["traces", "validate", p], ["replay", p, "--calibration", tmp_path / "cal.json"],
                 ["calibrate", "fit", p, "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--jobs", "1",
                  "-o", tmp_path / "c.json"]):
        res = invoke(*args)
        if bad:
            failed(res, p, "not UTF-8")
        elif args[0] == "traces":
            assert res.exit_code == 0, res.output  # the pandas key only guides to_pandas: dropped


def _utf8(b):
    try:
        b.decode()
        return True
    except UnicodeDecodeError:
        return False


@pytest.mark.parametrize("times,rule", [
    ([[0.1, float("nan"), 0.3], [0.2, 0.4]], "NaN or infinite"),
    ([[0.1, 0.2, float("inf")], [0.2, 0.4]], "NaN or infinite"),
    ([[0.1, 0.3, 0.2], [0.2, 0.4]], "decreasing"),
    ([[0.1, 0.2, 0.3], [0.2, 0.5]], "last token time > e2e_s"),
    ([[-0.1, 0.2, 0.3], [0.2, 0.4]], "negative"),
])
def test_validate_token_times(tmp_path, times, rule):
    df = _requests(token_times_s=times)
    p = tmp_path / "t.parquet"
    write_table(to_table(REQUEST_TRACE, df), p)
    failed(invoke("traces", "validate", p), p, "token_times_s", rule, "row(s) 1" if "e2e" in rule else "row(s) 0")


def test_validate_token_times_ok_and_null(tmp_path):
    p = tmp_path / "t.parquet"
    write_table(to_table(REQUEST_TRACE, _requests(token_times_s=[[0.1, 0.2, 0.3], None])), p)
    assert invoke("traces", "validate", p).exit_code == 0


def test_validate_cached_beyond_prompt_and_negative_replica(tmp_path):
    p = tmp_path / "t.parquet"
    write_table(to_table(REQUEST_TRACE, _requests(num_cached_tokens=[5, 21], replica_id=[0, -1])), p)
    res = invoke("traces", "validate", p)
    failed(res, p, "num_cached_tokens > num_prompt_tokens", "replica_id", "is negative")


@pytest.mark.parametrize("col,value,rule", [("step_duration_s", float("inf"), "infinite"),
                                            ("step_duration_s", 1e300, "1e+09 s or more"),
                                            ("replica_id", -1, "negative"),
                                            ("num_prefill_tokens", 10 ** 15, "above 1e+09")])
def test_validate_step_rules(tmp_path, col, value, rule):
    df = pd.DataFrame({"replica_id": [0, 0], "step_start_time_s": [0.0, 1.0], "step_duration_s": [0.01, 0.02],
                       "num_prefill_tokens": [0, 512], "num_prefill_seqs": [0, 1], "num_decode_seqs": [8, 0],
                       "decode_context_tokens": [800, 0]})
    df.loc[1, col] = value
    p = tmp_path / "s.parquet"
    write_table(to_table(STEP_TRACE, df), p)
    failed(invoke("traces", "validate", p), p, col, rule, "row(s) 1")


@pytest.mark.parametrize("col", ["ttft_s", "e2e_s", "tpot_s", "queue_wait_s"])
def test_validate_absurd_latency(tmp_path, col):
    df = _requests(queue_wait_s=[0.05, 0.1], tpot_s=[0.1, 0.2])
    df[col] = df[col].astype(float)
    df.loc[0, col] = 1e300 if col != "queue_wait_s" else 1e12
    if col == "queue_wait_s":
        df.loc[0, ["ttft_s", "e2e_s"]] = 1e12
    p = tmp_path / "t.parquet"
    write_table(to_table(REQUEST_TRACE, df), p)
    failed(invoke("traces", "validate", p), p, col, "or more")


def test_vllm_bench_itls_beyond_latency_is_an_invalid_row(tmp_path):
    obj = json.loads((DATA / "vllm_bench_small.json").read_text())
    obj["itls"][0] = [0.5, 0.5, 0.5]  # ttft 0.05 + 1.5 s of gaps, latency 0.083 s
    src = tmp_path / "v.json"
    src.write_text(json.dumps(obj))
    res = invoke("traces", "import", "vllm-bench", src, "-o", tmp_path / "o.parquet")
    failed(res, src, "row 1", "beyond the latency")
    res = invoke("traces", "import", "vllm-bench", src, "-o", tmp_path / "o.parquet", "--invalid", "flag")
    assert res.exit_code == 0, res.output
    _, df, _ = read_trace(tmp_path / "o.parquet")
    row = df[df["request_id"] == "1"].iloc[0]
    assert row["status"].startswith("invalid: ttft + sum(itls)") and math.isnan(row["e2e_s"])
    assert invoke("traces", "validate", tmp_path / "o.parquet").exit_code == 0


def test_every_fixture_import_still_validates(tmp_path):
    res = invoke("traces", "import", "vllm-bench", DATA / "vllm_bench_small.json", "-o", tmp_path / "o.parquet")
    assert res.exit_code == 0, res.output
    _, df, _ = read_trace(tmp_path / "o.parquet")
    tt = [t for t in df["token_times_s"] if t is not None]
    assert tt and all(np.all(np.diff(t) >= 0) for t in tt)


@pytest.mark.parametrize("key", ["request_rate", "burstiness"])
@pytest.mark.parametrize("value", ["9" * 400, "1e400", "NaN", "-1"])
def test_bench_rate_and_burstiness_out_of_range(tmp_path, key, value):
    obj = json.loads((DATA / "vllm_bench_small.json").read_text())
    obj[key] = 12345.5
    src = tmp_path / "v.json"
    src.write_text(json.dumps(obj).replace("12345.5", value))
    res = invoke("traces", "import", "vllm-bench", src, "-o", tmp_path / "o.parquet", "--arrivals", "synth")
    failed(res, src, key)


def test_genai_perf_response_text_with_a_huge_number_is_text(tmp_path):
    text = (DATA / "genai_perf_profile_export.json").read_text()
    obj = json.loads(text)
    resp = obj["experiments"][0]["requests"][0]["response_outputs"][0]
    resp["response"] = "data: {\"x\": " + "9" * 5000 + "}\n\n"
    src = tmp_path / "g.json"
    src.write_text(json.dumps(obj))
    res = invoke("traces", "import", "genai-perf", src, "-o", tmp_path / "o.parquet", "--prompt-tokens", "128")
    assert res.exit_code in (0, 1), res.output
    if res.exit_code == 1:
        failed(res, src)


def test_a_model_whose_kv_cache_holds_no_block_is_one_message(tmp_path):
    from schemas.calibration import Calibration, FittedParam
    from schemas.specs import get_gpu, get_model

    params = {k: FittedParam(v) for k, v in (("eta_compute", 0.5), ("eta_mem", 0.8), ("t_step_s", 1e-4))}
    Calibration(get_model("llama-3.1-8b"), get_gpu("h100-80gb"), 1, params).write(tmp_path / "cal.json")
    d = json.loads((tmp_path / "cal.json").read_text())
    d["model"]["num_layers"] = 10 ** 12
    (tmp_path / "big.json").write_text(json.dumps(d))
    p = tmp_path / "t.parquet"
    write_table(to_table(REQUEST_TRACE, _requests()), p)
    res = invoke("replay", p, "--calibration", tmp_path / "big.json", "-o", tmp_path / "o.parquet")
    assert res.exit_code in (1, 2) and "Traceback" not in res.output, res.output
    assert sum(line.startswith("Error:") for line in res.output.splitlines()) == 1, res.output
    assert not (tmp_path / "o.parquet").exists()


def test_a_step_that_would_last_forever_is_one_message(tmp_path):
    from schemas.calibration import Calibration, FittedParam
    from schemas.specs import get_gpu, get_model

    params = {k: FittedParam(v) for k, v in (("eta_compute", 0.5), ("eta_mem", 0.8), ("t_step_s", 1e-4))}
    Calibration(get_model("llama-3.1-8b"), get_gpu("h100-80gb"), 1, params).write(tmp_path / "cal.json")
    d = json.loads((tmp_path / "cal.json").read_text())
    d["params"]["t_step_s"]["value"] = 1e308  # refused by its declared range, one message
    (tmp_path / "slow.json").write_text(json.dumps(d))
    p = tmp_path / "t.parquet"
    write_table(to_table(REQUEST_TRACE, _requests()), p)
    for extra in ([], ["--exact-steps"]):
        res = invoke("replay", p, "--calibration", tmp_path / "slow.json", "-o", tmp_path / "o.parquet", *extra)
        assert res.exit_code in (1, 2) and "Traceback" not in res.output, res.output
        assert sum(line.startswith("Error:") for line in res.output.splitlines()) == 1, res.output
        assert not (tmp_path / "o.parquet").exists()
