"""``traces import guidellm``: the real CodeLlama-34B sweep report, a tiny fixture, and bad inputs.

Expected figures on the real file are counted with a plain ``json`` pass over it, not
with the importer.
"""
from __future__ import annotations

import ast
import json
import math
import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from traces.cli import main
from traces.importers.block_hashes import implied_prefix_cache_hits, shared_leading_blocks, text_block_hashes
from traces.importers.guidellm import import_guidellm
from traces.io import read_trace

DATA = Path(__file__).parents[1] / "data"
REAL = "guidellm_results_codellama34b_prefill_sweep.json"


def run_cli(*args):
    res = CliRunner().invoke(main, [str(a) for a in args])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert "Traceback" not in res.output
    return res


def imported(tmp_path, *args, name="out.parquet"):
    out = tmp_path / name
    res = run_cli("import", "guidellm", *args, "-o", out)
    assert res.exit_code == 0, res.output
    assert run_cli("validate", out).exit_code == 0
    _, df, meta = read_trace(out)
    return df, meta, res.output


@pytest.fixture(scope="module")
def real(real_data_dir):
    path = real_data_dir / REAL
    return path, json.loads(path.read_text())


def test_real_sweep_all_benchmarks(tmp_path, real):
    path, doc = real
    df, meta, out = imported(tmp_path, path)
    assert len(df) == 200 and "status" not in df
    assert df.groupby("benchmark").size().to_dict() == {b: 40 for b in range(5)}
    # one origin for the whole file: the first benchmark's first request_start
    starts = [r["info"]["timings"]["request_start"] for b in doc["benchmarks"] for r in b["requests"]["successful"]]
    t0 = min(starts)
    assert float(meta["time_origin_unix_s"]) == t0
    assert df["arrival_time_s"].iloc[-1] == pytest.approx(max(starts) - t0, abs=1e-6)
    # benchmarks stay in their real order in time
    assert (np.diff(df["benchmark"].to_numpy()) >= 0).all()
    assert meta["guidellm_version"] == "0.6.0.dev5" and meta["benchmark"] == "all"
    strategies = json.loads(meta["benchmarks"])
    assert [s["type"] for s in strategies] == ["synchronous", "throughput", "constant", "constant", "constant"]
    assert strategies[2]["rate"] == pytest.approx(0.758996823129983)
    assert strategies[0]["max_concurrency"] == 1 and all(s["num_successful"] == 40 for s in strategies)
    # server usage counts
    assert df["num_prompt_tokens"].sum() == sum(r["prompt_tokens"] for b in doc["benchmarks"]
                                                for r in b["requests"]["successful"])
    assert "200 requests" in out


def test_real_latencies_are_recomputed_from_timings(tmp_path, real):
    path, doc = real
    df, meta, _ = imported(tmp_path, path, "--benchmark", 0)
    assert len(df) == 40 and "benchmark" not in df
    assert meta["strategy_type"] == "synchronous" and meta["strategy_max_concurrency"] == "1"
    r = doc["benchmarks"][0]["requests"]["successful"][0]
    t = r["info"]["timings"]
    row = df.set_index("request_id").loc[r["response_id"] + "-0"]
    assert row["ttft_s"] == pytest.approx(t["first_token_iteration"] - t["request_start"], abs=1e-9)
    assert row["e2e_s"] == pytest.approx(t["last_token_iteration"] - t["request_start"], abs=1e-9)
    tpot = (t["last_token_iteration"] - t["first_token_iteration"]) / (r["output_tokens"] - 1)
    assert row["tpot_s"] == pytest.approx(tpot, abs=1e-12)
    # GuideLLM's time_per_output_token_ms (latency / N, TTFT included) is far from the TPOT
    assert r["time_per_output_token_ms"] / 1e3 > 1.5 * tpot
    # E2E = TTFT + (N - 1) TPOT on every multi-token row; TPOT NaN for one token
    multi = df["num_output_tokens"] > 1
    assert np.allclose(df.loc[multi, "e2e_s"], df.loc[multi, "ttft_s"]
                       + (df.loc[multi, "num_output_tokens"] - 1) * df.loc[multi, "tpot_s"])
    assert df.loc[~multi, "tpot_s"].isna().all() and (~multi).sum() == 1
    assert 0 < float(meta["request_end_minus_last_token_max_s"]) < 0.01


def test_real_one_benchmark_is_rebased_to_its_own_start(tmp_path, real):
    path, doc = real
    df, meta, _ = imported(tmp_path, path, "--benchmark", 2)
    starts = [r["info"]["timings"]["request_start"] for r in doc["benchmarks"][2]["requests"]["successful"]]
    assert df["arrival_time_s"].iloc[0] == 0 and float(meta["time_origin_unix_s"]) == min(starts)
    assert df["arrival_time_s"].iloc[-1] == pytest.approx(max(starts) - min(starts), abs=1e-6)
    assert meta["strategy_type"] == "constant" and float(meta["strategy_rate"]) == pytest.approx(0.759, abs=1e-3)


def test_real_block_hashes(tmp_path, real):
    """One chars/token ratio for the file; about 64 shared 16-token blocks (the 1,024-token prefix)."""
    path, doc = real
    df, meta, out = imported(tmp_path, path)
    reqs = [r for b in doc["benchmarks"] for r in b["requests"]["successful"]]
    prompts = [ast.literal_eval(r["request_args"])["body"]["prompt"] for r in reqs]
    ratio = sum(map(len, prompts)) / sum(r["prompt_tokens"] for r in reqs)
    assert float(meta["chars_per_token"]) == pytest.approx(ratio, rel=1e-6)
    assert meta["hash_block_tokens"] == "16"
    assert (df["block_hashes"].map(len) == df["num_prompt_tokens"] // 16).all()
    shared = json.loads(meta["shared_prefix_blocks"])
    # measured: 64, 65, 64, 63, 65 (each benchmark has its own 1,024-token prefix: the tokens share 64)
    assert shared == {"0": 64, "1": 65, "2": 64, "3": 63, "4": 65}
    assert "0: 64, 1: 65, 2: 64, 3: 63, 4: 65" in out
    # block k of two prompts is equal exactly when their texts agree up to its boundary
    a, b = prompts[0], prompts[1]
    common = len(os.path.commonprefix([a, b]))
    ha, hb = text_block_hashes(a, 16 * 80, ratio), text_block_hashes(b, 16 * 80, ratio)
    for k in range(70):
        end = round((k + 1) * 16 * ratio)
        assert (ha[k] == hb[k]) == (end <= common)
    # no prefix shared across benchmarks (GuideLLM drew a new prefix per benchmark)
    firsts = df.groupby("benchmark")["block_hashes"].first()
    assert len({int(h[0]) for h in firsts}) == 5
    rate = float(meta["implied_prefix_cache_hit_rate"])
    assert rate == pytest.approx(0.3284, abs=1e-4)


def test_block_hashes_are_the_same_alone_or_with_all(tmp_path, real):
    path, _ = real
    all_df, _ = import_guidellm(path)
    one, _ = import_guidellm(path, benchmark=3)
    ref = all_df.set_index("request_id")["block_hashes"]
    for rid, h in zip(one["request_id"], one["block_hashes"]):
        assert list(ref[rid]) == list(h)


def test_no_block_hashes(tmp_path, real):
    path, _ = real
    df, meta, _ = imported(tmp_path, path, "--no-block-hashes", "--benchmark", 1)
    assert "block_hashes" not in df and "hash_block_tokens" not in meta


def test_hit_helpers():
    h = [np.array([1, 2, 3]), np.array([1, 2, 4]), np.array([1, 5]), None, np.array([1, 2, 3])]
    # the last one matches all 3 blocks but 48 tokens cap the hit at (48 - 1) // 16 = 2 blocks
    assert implied_prefix_cache_hits(h, [64, 64, 40, 10, 48]).tolist() == [0, 32, 16, 0, 32]
    assert shared_leading_blocks(h) == 1 and shared_leading_blocks([None]) == 0


def test_fixture_failed_and_dropped_requests(tmp_path):
    df, meta, out = imported(tmp_path, DATA / "guidellm_small.json")
    assert df["request_id"].tolist() == ["cmpl-a-0", "cmpl-b-0", "cmpl-c-0", "cmpl-e-0", "cmpl-f-0", "cmpl-g-0",
                                         "cmpl-h-0"]
    st = df["status"].astype(str).tolist()
    assert st[3] == "failed: errored: httpx.ReadTimeout: timed out" and st[6] == "failed: incomplete"
    assert meta["num_failed"] == "2" and meta["num_dropped_unstarted"] == "1"
    assert "2 failed" in out and "1 errored/incomplete requests that never started left out" in out
    # failed rows: no latencies, prompt count from input_metrics
    assert math.isnan(df["ttft_s"].iloc[3]) and df["num_prompt_tokens"].iloc[3] == 52
    # file order was g before f in benchmark 1: sorted by arrival
    assert df["arrival_time_s"].tolist() == [0.0, 1.0, 2.0, 3.0, 5.25, 5.75, 6.5]
    assert df["tpot_s"].iloc[0] == pytest.approx(0.025) and math.isnan(df["tpot_s"].iloc[1])
    assert df["benchmark"].tolist() == [0, 0, 0, 0, 1, 1, 1]
    # exactly 5 chars/token: the 160-character prefix is 2 blocks
    assert meta["chars_per_token"] == "5.000000" and json.loads(meta["shared_prefix_blocks"]) == {"0": 2, "1": 2}
    meta_raw = pq.read_schema(tmp_path / "out.parquet").metadata
    assert meta_raw[b"servecal.schema"] == b"request_trace/1"


# ---------------------------------------------------------------------------
# Bad inputs: one message naming file, request and field; exit 1; no output
# ---------------------------------------------------------------------------

def _bad(tmp_path, mutate, *extra):
    doc = json.loads((DATA / "guidellm_small.json").read_text())
    mutate(doc)
    src = tmp_path / "bad.json"
    src.write_text(json.dumps(doc))
    out = tmp_path / "out.parquet"
    res = run_cli("import", "guidellm", src, "-o", out, *extra)
    return res, out


def test_missing_timing_names_request_and_field(tmp_path):
    def m(doc):
        del doc["benchmarks"][1]["requests"]["successful"][1]["info"]["timings"]["first_token_iteration"]
    res, out = _bad(tmp_path, m)
    assert res.exit_code == 1 and not out.exists()
    assert ("bad.json, row 6, column 'benchmarks[1].requests.successful[1].info.timings.first_token_iteration': "
            "missing field") in res.output


def test_non_numeric_token_count(tmp_path):
    def m(doc):
        doc["benchmarks"][0]["requests"]["successful"][2]["output_tokens"] = "9"
    res, out = _bad(tmp_path, m, "--no-block-hashes")
    assert res.exit_code == 1 and not out.exists()
    assert "row 3, column 'benchmarks[0].requests.successful[2].output_tokens': value '9' is not a number" in res.output


def test_timings_out_of_order_follow_invalid_policy(tmp_path):
    def m(doc):
        t = doc["benchmarks"][0]["requests"]["successful"][1]["info"]["timings"]
        t["first_token_iteration"] = t["request_start"] - 1
    res, out = _bad(tmp_path, m)
    assert res.exit_code == 1 and not out.exists()
    assert "row 2: timings out of order" in res.output and "--invalid flag" in res.output
    res, out = _bad(tmp_path, m, "--invalid", "flag")
    assert res.exit_code == 0, res.output
    _, df, _ = read_trace(out)
    assert df["status"].astype(str).iloc[1] == "invalid: timings out of order"


def test_unreadable_request_args_asks_for_no_block_hashes(tmp_path):
    def m(doc):
        doc["benchmarks"][0]["requests"]["successful"][0]["request_args"] = "{'body': {'prompt': "
    res, out = _bad(tmp_path, m)
    assert res.exit_code == 1 and not out.exists()
    assert "row 1, column 'benchmarks[0].requests.successful[0].request_args'" in res.output
    assert "--no-block-hashes" in res.output
    res, out = _bad(tmp_path, m, "--no-block-hashes")
    assert res.exit_code == 0 and out.exists()


@pytest.mark.parametrize("text,needle", [
    ("[1, 2]", "column 'benchmarks': has no 'benchmarks' list"),
    ('{"benchmarks": []}', "has no benchmarks"),
    ('{"benchmarks": [{"requests": {"successful": [', "line 1: not valid JSON"),
    ("", "empty file"),
])
def test_not_a_report(tmp_path, text, needle):
    src = tmp_path / "x.json"
    src.write_text(text)
    res = run_cli("import", "guidellm", src, "-o", tmp_path / "o.parquet")
    assert res.exit_code == 1 and needle in res.output.replace("\n  ", " ") and not (tmp_path / "o.parquet").exists()


def test_benchmark_out_of_range_and_existing_output_kept(tmp_path):
    out = tmp_path / "keep.parquet"
    out.write_bytes(b"KEEP")
    res = run_cli("import", "guidellm", DATA / "guidellm_small.json", "--benchmark", 2, "-o", out)
    assert res.exit_code == 1 and "benchmark 2 is out of range; expected --benchmark 0..1" in res.output
    assert out.read_bytes() == b"KEEP"
