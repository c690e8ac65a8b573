"""``traces import distserve``: DistServe's OPT-13B runs on A100 (real), and bad inputs on tiny files.

Expected figures on the real files come from the files themselves (the first request's
numbers copied by hand from line 1; whole columns with a plain ``ast.literal_eval`` pass),
not from the importer.
"""
from __future__ import annotations

import ast
import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from traces.cli import main
from traces.importers.distserve import import_distserve, settings_from_name
from traces.io import read_trace

VLLM_1 = "distserve_opt13b_a100_vllm-100-1.exp"
DS_3 = "distserve_opt13b_a100_distserve-c21d11-300-3.exp"


def run_cli(*args):
    res = CliRunner().invoke(main, [str(a) for a in args])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert "Traceback" not in res.output
    return res


def imported(tmp_path, src, *args, name="out.parquet"):
    out = tmp_path / name
    res = run_cli("import", "distserve", src, *args, "-o", out)
    assert res.exit_code == 0, res.output
    assert run_cli("validate", out).exit_code == 0
    _, df, meta = read_trace(out)
    return df, meta, res.output


# ---------------------------------------------------------------------------
# Real runs
# ---------------------------------------------------------------------------

def test_vllm_run_first_request_by_hand(tmp_path, real_data_dir):
    df, meta, out = imported(tmp_path, real_data_dir / VLLM_1)
    assert len(df) == 100 and "status" not in df
    # line 1, first dict: prompt_len 55, output_len 4, issue_time 12450751.747537581,
    # first_token_time 12450751.8171006, complete_time 12450751.895573435,
    # ttft_ms 69.5630181580782, tpot_ms 26.15761198103428, latency_ms 148.03585410118103;
    # it is also the earliest issue, so it arrives at 0
    first = df.iloc[0]
    assert first["request_id"] == "1" and first["arrival_time_s"] == 0.0
    assert (first["num_prompt_tokens"], first["num_output_tokens"]) == (55, 4)
    assert first["ttft_s"] == pytest.approx(12450751.8171006 - 12450751.747537581, abs=1e-12)
    assert first["ttft_s"] == pytest.approx(0.0695630181580782, abs=1e-12)
    assert first["e2e_s"] == pytest.approx(0.14803585410118103, abs=1e-12)
    # (complete - first token) / (4 - 1) = 0.078472835 s / 3, DistServe's tpot_ms too
    assert first["tpot_s"] == pytest.approx((12450751.895573435 - 12450751.8171006) / 3, abs=1e-12)
    assert first["tpot_s"] == pytest.approx(0.02615761198103428, abs=1e-12)
    # the 2nd arrival is the 3rd dict (the file is in completion order): 829 tokens issued at 12450753.12817694
    assert df["request_id"].iloc[1] == "3" and df["num_prompt_tokens"].iloc[1] == 829
    assert df["arrival_time_s"].iloc[1] == pytest.approx(12450753.12817694 - 12450751.747537581, abs=1e-9)
    assert (meta["engine"], meta["request_rate"], meta["name_num_requests"]) == ("vllm", "1.0", "100")
    assert "engine_settings" not in meta and "vllm, 100 requests at 1 req/s" in out
    assert json.loads(meta["distserve_metrics"])["avg_ttft_ms"] == pytest.approx(df["ttft_s"].mean() * 1e3)


def test_distserve_run_whole_columns(tmp_path, real_data_dir):
    src = real_data_dir / DS_3
    df, meta, out = imported(tmp_path, src)
    raw = ast.literal_eval(src.read_text().split("\n", 1)[0])
    order = np.argsort([r["issue_time"] for r in raw], kind="stable")
    recs = [raw[i] for i in order]
    assert len(df) == 300 and df["request_id"].tolist() == [str(i + 1) for i in order]
    np.testing.assert_array_equal(df["num_prompt_tokens"], [r["prompt_len"] for r in recs])
    np.testing.assert_array_equal(df["num_output_tokens"], [r["output_len"] for r in recs])
    np.testing.assert_allclose(df["arrival_time_s"], [r["issue_time"] - recs[0]["issue_time"] for r in recs],
                               rtol=0, atol=1e-9)
    for col, key in (("ttft_s", "ttft_ms"), ("e2e_s", "latency_ms"), ("tpot_s", "tpot_ms")):
        np.testing.assert_allclose(df[col] * 1e3, [r[key] for r in recs], rtol=1e-9, atol=1e-9)
    assert np.median(df["ttft_s"]) == pytest.approx(0.0825, abs=5e-4)
    assert meta["engine"] == "distserve" and meta["request_rate"] == "3.0"
    assert json.loads(meta["engine_settings"]) == {"scheduler": "disagg", "tp_prefill": 2, "pp_prefill": 1,
                                                   "tp_decode": 1, "pp_decode": 1}
    assert "prefill TP 2 PP 1, decode TP 1 PP 1, 300 requests at 3 req/s" in out


@pytest.mark.parametrize("name,expected", [
    ("vllm-150-1.5.exp", {"engine": "vllm", "request_rate": "1.5", "name_num_requests": "150"}),
    ("x_distserve-c21d11-300-10.5.exp", {"engine": "distserve", "request_rate": "10.5", "name_num_requests": "300",
                                         "engine_settings": '{"scheduler": "disagg", "tp_prefill": 2, "pp_prefill": 1, '
                                                            '"tp_decode": 1, "pp_decode": 1}'}),
    ("run.exp", {}), ("myvllm-100-1.exp", {}), ("vllm-100-1.exp.bak", {}),
])
def test_settings_from_name(name, expected):
    assert settings_from_name(name) == expected


# ---------------------------------------------------------------------------
# Tiny files: one-token outputs, the --invalid policy, bad input
# ---------------------------------------------------------------------------

def rec(issue=100.0, first=100.25, done=101.25, prompt=10, output=5, **over):
    """One DistServe ReqResult dict, its *_ms derived as DistServe derives them."""
    d = {"prompt_len": prompt, "output_len": output, "issue_time": issue, "first_token_time": first,
         "complete_time": done, "ttft_ms": (first - issue) * 1000,
         "tpot_ms": ((done - first) / (output - 1) if output > 1 else 0) * 1000, "latency_ms": (done - issue) * 1000}
    d.update(over)
    return d


def write(tmp_path, recs, tail="", name="vllm-2-1.exp"):
    src = tmp_path / name
    src.write_text((recs if isinstance(recs, str) else str(recs)) + "\n" + tail)
    return src


def test_one_token_output_has_no_tpot_and_order_follows_issue(tmp_path):
    src = write(tmp_path, [rec(issue=100.5, first=100.75, done=100.75, output=1), rec()])
    df, meta = import_distserve(src)
    assert df["request_id"].tolist() == ["2", "1"] and df["arrival_time_s"].tolist() == [0.0, 0.5]
    assert df["tpot_s"].iloc[0] == pytest.approx(0.25) and math.isnan(df["tpot_s"].iloc[1])
    assert df["ttft_s"].tolist() == [0.25, 0.25] and df["e2e_s"].tolist() == [1.25, 0.25]
    assert meta["engine"] == "vllm" and "distserve_metrics" not in meta


@pytest.mark.parametrize("bad,rule,column", [
    (rec(output=0, tpot_ms=0), "0 output tokens", "output_len"),
    (rec(first=99.0), "timestamps out of order", "first_token_time"),
    (rec(ttft_ms=250.01), "ttft_ms disagrees with the timestamps", "ttft_ms"),
    (rec(tpot_ms=1.0), "tpot_ms disagrees with the timestamps", "tpot_ms"),
])
def test_invalid_rows_follow_the_policy(tmp_path, bad, rule, column):
    src = write(tmp_path, [rec(), bad])
    res = run_cli("import", "distserve", src, "-o", tmp_path / "o.parquet")
    text = res.output.replace("\n  ", " ")
    assert res.exit_code == 1 and f"vllm-2-1.exp, row 2, column '{column}': {rule}" in text, text
    assert "--invalid flag" in text and not (tmp_path / "o.parquet").exists()
    df, meta, _ = imported(tmp_path, src, "--invalid", "flag")
    assert df["status"].astype(str).tolist() == ["ok", f"invalid: {rule}"] and math.isnan(df["ttft_s"].iloc[1])
    df, meta, _ = imported(tmp_path, src, "--invalid", "drop", name="d.parquet")
    assert len(df) == 1 and meta["num_invalid_dropped"] == "1"


@pytest.mark.parametrize("text,tail,needle", [
    ("", "", "empty file"),
    ("[{'prompt_len': 10, 'output_len': 5, 'issue_time'", "", "line 1: not a Python literal ("),
    ("__import__('os').system('touch PWNED')", "",
     "line 1: not a Python literal (names, calls or operators, not only values)"),
    ("{'prompt_len': 10}", "", "line 1: is a Python dict; expected a list of per-request dicts"),
    ("[]", "", "has no requests"),
    ("[1]", "", "row 1: request is a Python int; expected a dict"),
    (str([rec(), {k: v for k, v in rec().items() if k != "complete_time"}]), "",
     "row 2, column 'complete_time': missing field"),
    (str([rec(issue=-1.0)]), "", "row 1, column 'issue_time': value -1.0 is below 0"),
    (str([rec(prompt=10.5)]), "", "row 1, column 'prompt_len': value 10.5 is not a whole number"),
    (str([rec(output=True)]), "", "row 1, column 'output_len': value True is not a number"),
    (str([rec(latency_ms="1250")]), "", "row 1, column 'latency_ms': value '1250' is not a number"),
    (str([rec()]), "{\n\tnum_requests: 2\n}", "the metrics block says num_requests 2 but line 1 holds 1 requests"),
    (str([rec()]), "{\n\tnum_requests: 1\nhello\n}", "line 4: not a 'name: number' line"),
])
def test_bad_input_is_one_error_naming_file_row_and_field(tmp_path, monkeypatch, text, tail, needle):
    monkeypatch.chdir(tmp_path)
    src = write(tmp_path, text, tail, name="bad.exp") if text else tmp_path / "bad.exp"
    if not text:
        src.write_text("")
    res = run_cli("import", "distserve", src, "-o", tmp_path / "o.parquet")
    out = res.output.replace("\n  ", " ")
    assert res.exit_code == 1 and f"{src}" in out and needle in out, out
    assert not (tmp_path / "o.parquet").exists() and not (tmp_path / "PWNED").exists()


def test_a_file_name_without_settings_is_noted(tmp_path):
    df, meta, out = imported(tmp_path, write(tmp_path, [rec()], name="run.exp"))
    assert len(df) == 1 and "engine" not in meta
    assert "engine, rate and parallelism not recorded" in out.replace("\n  ", " ")
