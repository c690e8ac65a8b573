"""``traces import FORMAT``: every format on a real file where one exists, else on a tiny fixture.

Real files are read from ``../shared/data/real`` (the ``real_data_dir`` fixture); the
expected figures were counted independently of the importers (a plain ``csv``/``json``
pass over the files) and agree with PROVENANCE.md.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import click
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from schemas.tables import table_metadata
from traces.cli import main
from traces.errors import TraceFormatError
from traces.importers.azure import import_azure
from traces.importers.genai_perf import import_genai_perf
from traces.importers.llmperf import closed_loop_arrivals, import_llmperf
from traces.importers.sglang_bench import import_sglang_bench
from traces.importers.vidur import export_vidur, import_vidur
from traces.importers.vllm_bench import import_vllm_bench
from traces.io import read_trace

DATA = Path(__file__).parents[1] / "data"


def run_cli(*args):
    res = CliRunner().invoke(main, [str(a) for a in args])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res


def imported(tmp_path, *args, name="out.parquet"):
    """Run ``traces import ...`` to a Parquet file; check exit 0 and ``traces validate``; read it back."""
    out = tmp_path / name
    res = run_cli("import", *args, "-o", out)
    assert res.exit_code == 0, res.output
    val = run_cli("validate", out)
    assert val.exit_code == 0 and "valid request_trace/1" in val.output, val.output
    _, df, meta = read_trace(out)
    return df, meta


# ---------------------------------------------------------------------------
# Azure LLM inference trace 2023 (real) and Vidur's copy of it (real)
# ---------------------------------------------------------------------------

AZURE = {
    # rows, last arrival (s), 2nd arrival (s), sum ContextTokens, sum GeneratedTokens, first TIMESTAMP
    "code": (8819, 3435.948056, 0.052, 18059974, 245896, "2023-11-16 18:17:03.979960"),
    "conv": (19366, 3501.721937, 4.314579, 22361870, 4088665, "2023-11-16 18:15:46.680590"),
}


@pytest.mark.parametrize("kind", ["code", "conv"])
def test_azure_real(tmp_path, real_data_dir, kind):
    rows, last, second, sum_in, sum_out, origin = AZURE[kind]
    df, meta = imported(tmp_path, "azure", real_data_dir / f"azure_llm_2023_{kind}.csv")
    assert len(df) == rows == int(meta["num_rows"])
    assert df["arrival_time_s"].iloc[0] == 0.0
    assert df["arrival_time_s"].iloc[1] == pytest.approx(second, abs=1e-9)
    assert df["arrival_time_s"].iloc[-1] == pytest.approx(last, abs=1e-9)
    assert int(df["num_prompt_tokens"].sum()) == sum_in
    assert int(df["num_output_tokens"].sum()) == sum_out
    assert meta["time_origin"].startswith(origin)
    assert meta["source_format"] == "azure-llm"
    # file order kept (the trace is monotonic): ids are the data rows 1..n
    assert df["request_id"].tolist()[:3] == ["1", "2", "3"]
    assert (np.diff(df["arrival_time_s"].to_numpy()) >= 0).all()


def test_azure_timestamps_are_exact_to_100ns(tmp_path):
    src = tmp_path / "a.csv"
    src.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                   "2024-05-10 00:00:00.0000000,10,2\n"
                   "2024-05-10 00:00:00.0000001,11,3\n"
                   "2024-05-10 00:59:59.9999999,12,4\n")  # no trailing newline issue either way
    df, meta = import_azure(src)
    assert df["arrival_time_s"].tolist() == [0.0, 1e-7, 3599.9999999]
    assert meta["time_resolution_s"] == "1e-07"


@pytest.mark.parametrize("kind", ["code", "conv"])
def test_vidur_real_agrees_with_azure_on_every_row(tmp_path, real_data_dir, kind):
    rows, last, _, sum_in, sum_out, _ = AZURE[kind]
    az, _ = imported(tmp_path, "azure", real_data_dir / f"azure_llm_2023_{kind}.csv", name="az.parquet")
    vi, meta = imported(tmp_path, "vidur", real_data_dir / f"vidur_splitwise_{kind}.csv", name="vi.parquet")
    assert len(vi) == rows
    assert vi["arrival_time_s"].iloc[-1] == pytest.approx(last, abs=1e-9)
    np.testing.assert_array_equal(az["num_prompt_tokens"], vi["num_prompt_tokens"])
    np.testing.assert_array_equal(az["num_output_tokens"], vi["num_output_tokens"])
    assert np.abs(az["arrival_time_s"].to_numpy() - vi["arrival_time_s"].to_numpy()).max() < 1e-6
    assert (az["request_id"] == vi["request_id"]).all()


def test_vidur_export_round_trip(tmp_path, real_data_dir):
    src = real_data_dir / "vidur_splitwise_code.csv"
    df, _ = imported(tmp_path, "vidur", src, name="v.parquet")
    out = tmp_path / "back.csv"
    res = run_cli("export", "vidur", tmp_path / "v.parquet", "-o", out)
    assert res.exit_code == 0, res.output
    assert out.read_text().splitlines()[0] == "arrived_at,num_prefill_tokens,num_decode_tokens"
    back, _ = import_vidur(out)
    np.testing.assert_array_equal(back["arrival_time_s"], df["arrival_time_s"])  # shortest round-trip floats
    np.testing.assert_array_equal(back["num_prompt_tokens"], df["num_prompt_tokens"])
    orig = pd.read_csv(src)
    np.testing.assert_array_equal(pd.read_csv(out)["arrived_at"], orig["arrived_at"])


def test_vidur_export_leaves_out_failed_rows(tmp_path):
    frame = pd.DataFrame({"request_id": ["a", "b"], "arrival_time_s": [0.0, 0.5], "num_prompt_tokens": [5, 6],
                          "num_output_tokens": [3, 0], "status": ["ok", "failed: timeout"]})
    counts = export_vidur(frame, tmp_path / "x.csv")
    assert counts == {"written": 1, "skipped": 1}
    assert (tmp_path / "x.csv").read_text().splitlines() == ["arrived_at,num_prefill_tokens,num_decode_tokens",
                                                             "0,5,3"]


# ---------------------------------------------------------------------------
# Mooncake (real)
# ---------------------------------------------------------------------------

MOONCAKE = {
    # rows, last arrival (s), sum input, sum output, distinct arrival instants
    "conversation": (12031, 3536.999, 144793823, 4122048, 1180),
    "synthetic": (3993, 1022.025, 61194628, 595432, None),
}


@pytest.mark.parametrize("kind", ["conversation", "synthetic"])
def test_mooncake_real(tmp_path, real_data_dir, kind):
    rows, last, sum_in, sum_out, distinct = MOONCAKE[kind]
    df, meta = imported(tmp_path, "mooncake", real_data_dir / f"mooncake_{kind}_trace.jsonl")
    assert len(df) == rows
    assert df["arrival_time_s"].iloc[0] == 0.0
    assert df["arrival_time_s"].iloc[-1] == pytest.approx(last, abs=1e-9)
    assert int(df["num_prompt_tokens"].sum()) == sum_in
    assert int(df["num_output_tokens"].sum()) == sum_out
    if distinct:
        assert df["arrival_time_s"].nunique() == distinct  # the ~3 s grid of the conversation trace
    n_blocks = df["block_hashes"].map(len).to_numpy()
    np.testing.assert_array_equal(n_blocks, np.ceil(df["num_prompt_tokens"].to_numpy() / 512))
    assert meta["hash_block_tokens"] == "512" and meta["num_invalid"] == "0"
    assert meta["time_resolution_s"] == "0.001"


# ---------------------------------------------------------------------------
# LLMPerf (real)
# ---------------------------------------------------------------------------

def test_llmperf_real(tmp_path, real_data_dir):
    src = real_data_dir / "llmperf_leaderboard_anyscale_llama2_70b_individual.json"
    summary = json.loads((real_data_dir / "llmperf_leaderboard_anyscale_llama2_70b_summary.json").read_text())
    conc = summary["num_concurrent_requests"]
    df, meta = imported(tmp_path, "llmperf", src, "--concurrency", conc)
    assert len(df) == 150
    assert int(df["num_prompt_tokens"].sum()) == 150 * 550
    assert int(df["num_output_tokens"].sum()) == 22042
    # measured latencies are kept as measured: LLMPerf's own summary of the same file agrees
    assert df["ttft_s"].mean() == pytest.approx(summary["results_ttft_s_mean"], rel=1e-12)
    assert df["e2e_s"].mean() == pytest.approx(summary["results_end_to_end_latency_s_mean"], rel=1e-12)
    assert np.percentile(df["ttft_s"], 50) == pytest.approx(summary["results_ttft_s_quantiles_p50"], rel=1e-12)
    n = df["num_output_tokens"].to_numpy()
    np.testing.assert_allclose(df["tpot_s"], (df["e2e_s"] - df["ttft_s"]) / (n - 1))
    # closed loop of 5 clients: the first 5 at 0, the 6th when the shortest of them ends
    raw = json.loads(src.read_text())
    assert (df["arrival_time_s"].iloc[:5] == 0).all()
    assert df["arrival_time_s"].iloc[5] == pytest.approx(min(r["end_to_end_latency_s"] for r in raw[:5]))
    assert df["arrival_time_s"].iloc[-1] == pytest.approx(69.04142251699994)
    assert meta["concurrency"] == "5" and "estimate" in meta["arrival_source"]


def test_closed_loop_arrivals():
    np.testing.assert_allclose(closed_loop_arrivals(np.array([3.0, 1.0, 1.0, 2.0]), 2), [0, 0, 1, 2])


def test_llmperf_failed_request_is_kept_without_latencies(tmp_path):
    recs = [{"error_code": None, "error_msg": "", "ttft_s": 0.2, "end_to_end_latency_s": 1.2,
             "number_input_tokens": 10, "number_output_tokens": 11},
            {"error_code": 429, "error_msg": "Too Many Requests", "ttft_s": 0, "end_to_end_latency_s": 0.1,
             "number_input_tokens": 10, "number_output_tokens": 0}]
    src = tmp_path / "l.json"
    src.write_text(json.dumps(recs))
    df, meta = import_llmperf(src, concurrency=1)
    assert df["status"].tolist() == ["ok", "failed: 429 Too Many Requests"]
    assert math.isnan(df["ttft_s"].iloc[1]) and df["tpot_s"].iloc[0] == pytest.approx(0.1)
    assert df["arrival_time_s"].tolist() == [0.0, 1.2]
    assert meta["num_failed"] == "1"


# ---------------------------------------------------------------------------
# vLLM benchmark result (fixture)
# ---------------------------------------------------------------------------

def test_vllm_bench_fixture(tmp_path):
    df, meta = imported(tmp_path, "vllm-bench", DATA / "vllm_bench_small.json")
    assert len(df) == 5
    # sorted by start_times, ties (requests 3 and 5 at 1000.400) in file order
    assert df["request_id"].tolist() == ["1", "2", "3", "5", "4"]
    np.testing.assert_allclose(df["arrival_time_s"], [0.0, 0.25, 0.4, 0.4, 1.1], atol=1e-12)
    r = df.set_index("request_id")
    assert r.loc["2", "status"].startswith("failed: ClientConnectorError")
    assert np.isnan(r.loc["2", "ttft_s"]) and r.loc["2", "num_output_tokens"] == 0
    assert r.loc["1", "ttft_s"] == 0.05 and r.loc["1", "e2e_s"] == 0.083
    np.testing.assert_allclose(r.loc["1", "token_times_s"], [0.05, 0.06, 0.072, 0.083])
    assert r.loc["1", "tpot_s"] == pytest.approx(0.033 / 3)
    assert np.isnan(r.loc["3", "tpot_s"])  # one output token: TPOT undefined, not 0
    # request 4: 10 tokens in 3 chunks (BR-03): TPOT over N - 1 tokens, per-token times unknown
    assert r.loc["4", "tpot_s"] == pytest.approx(0.4 / 9)
    assert r.loc["4", "token_times_s"] is None
    assert meta["arrival_source"].startswith("recorded") and meta["e2e_source"] == "latencies"
    assert meta["num_failed"] == "1" and meta["token_times_missing_multi_token_chunks"] == "1"
    assert meta["request_rate"] == "4.0" and meta["model_id"] == "meta-llama/Llama-3.1-8B-Instruct"


def _old_vllm_result(tmp_path, rate):
    obj = json.loads((DATA / "vllm_bench_small.json").read_text())
    for k in ("start_times", "latencies", "queue_times"):
        del obj[k]
    obj["request_rate"] = rate
    src = tmp_path / "old.json"
    src.write_text(json.dumps(obj))
    return src


def test_vllm_bench_without_start_times(tmp_path):
    src = _old_vllm_result(tmp_path, 4.0)
    res = run_cli("import", "vllm-bench", src, "-o", tmp_path / "x.parquet")
    assert res.exit_code == 1 and str(src) in res.output and "--arrivals synth" in res.output
    assert not (tmp_path / "x.parquet").exists()
    a, meta_a = import_vllm_bench(src, arrivals="synth", seed=3)
    b, _ = import_vllm_bench(src, arrivals="synth", seed=3)
    np.testing.assert_array_equal(a["arrival_time_s"], b["arrival_time_s"])
    assert a["arrival_time_s"].iloc[0] == 0 and meta_a["arrival_source"].startswith("synthesized")
    # e2e = TTFT + sum(ITL) when latencies were not saved
    assert a.set_index("request_id").loc["1", "e2e_s"] == pytest.approx(0.083)
    z, meta_z = import_vllm_bench(_old_vllm_result(tmp_path, "inf"))
    assert (z["arrival_time_s"] == 0).all() and meta_z["arrival_source"].startswith("zero")


# ---------------------------------------------------------------------------
# SGLang bench_serving (fixture)
# ---------------------------------------------------------------------------

def test_sglang_bench_fixture(tmp_path):
    src = DATA / "sglang_bench_small.jsonl"
    res = run_cli("import", "sglang-bench", src, "-o", tmp_path / "x.parquet")
    assert res.exit_code == 1 and "start_times" in res.output and str(src) in res.output
    df, meta = imported(tmp_path, "sglang-bench", src, "--arrivals", "synth", "--seed", "1")
    assert meta["run"] == "2"  # the only run saved with --output-details
    assert len(df) == 4 and meta["num_failed"] == "1"
    r = df.set_index("request_id")
    assert r.loc["3", "status"] == "failed: Bad Request"
    np.testing.assert_allclose(r.loc["2", "token_times_s"], [0.12, 0.15, 0.18, 0.21, 0.24])
    assert r.loc["2", "tpot_s"] == pytest.approx(0.03)
    assert int(df["num_prompt_tokens"].sum()) == 1100
    with pytest.raises(TraceFormatError, match="per-request"):
        import_sglang_bench(src, run=1)


# ---------------------------------------------------------------------------
# GenAI-Perf profile export (fixture)
# ---------------------------------------------------------------------------

def test_genai_perf_fixture(tmp_path):
    df, meta = imported(tmp_path, "genai-perf", DATA / "genai_perf_profile_export.json")
    assert df["request_id"].tolist() == ["1", "3", "2"]  # sorted by request timestamp
    assert df["arrival_time_s"].tolist() == [0.0, 0.1, 0.25]  # int64 ns subtracted before float
    r = df.set_index("request_id")
    # role chunk (no content) is not a token; the 1 ns survives the epoch-ns arithmetic
    assert r.loc["1", "token_times_s"].tolist() == [0.1, 0.120000001, 0.14]
    assert r.loc["1", "ttft_s"] == 0.1 and r.loc["1", "e2e_s"] == 0.14
    assert r.loc["1", "num_prompt_tokens"] == 128 and r.loc["1", "num_output_tokens"] == 3
    # usage says 4 tokens in 2 content chunks: TPOT over 3, no per-token times
    assert r.loc["2", "tpot_s"] == pytest.approx((0.2 - 0.09) / 3)
    assert r.loc["2", "token_times_s"] is None
    assert r.loc["3", "status"] == "failed: context length exceeded"
    assert meta["experiment_mode"] == "request_rate" and meta["experiment_value"] == "4.0"


def test_genai_perf_without_usage_needs_prompt_tokens(tmp_path):
    doc = {"experiments": [{"experiment": {"mode": "concurrency", "value": 1}, "requests": [
        {"timestamp": 10, "response_timestamps": [30, 40, 70], "response_outputs": [{"text_output": "a"},
                                                                                 {"text_output": "b"},
                                                                                 {"text_output": ""}]}]}]}
    src = tmp_path / "p.json"
    src.write_text(json.dumps(doc))
    with pytest.raises(TraceFormatError, match="--prompt-tokens"):
        import_genai_perf(src)
    df, meta = import_genai_perf(src, prompt_tokens=64)
    assert df["num_output_tokens"].tolist() == [2]
    assert df["token_times_s"].iloc[0].tolist() == [2e-8, 3e-8]
    assert "--prompt-tokens for 1" in meta["prompt_tokens_source"]


# ---------------------------------------------------------------------------
# BurstGPT (fixture; the real files are Git LFS only)
# ---------------------------------------------------------------------------

def test_burstgpt_fixture(tmp_path):
    df, meta = imported(tmp_path, "burstgpt", DATA / "burstgpt_small.csv")
    assert df["arrival_time_s"].tolist() == [0, 40, 113, 113, 120, 125]
    assert df["request_id"].tolist() == ["1", "2", "3", "4", "5", "6"]
    assert df["status"].tolist()[1] == "failed: zero response tokens"
    assert meta["time_resolution_s"] == "1" and meta["models"] == "ChatGPT=4, GPT-4=2"
    g4, meta4 = imported(tmp_path, "burstgpt", DATA / "burstgpt_small.csv", "--model", "GPT-4", name="g4.parquet")
    assert g4["arrival_time_s"].tolist() == [0.0, 7.0] and g4["request_id"].tolist() == ["3", "5"]
    assert meta4["model_filter"] == "GPT-4"


# ---------------------------------------------------------------------------
# Every output works with validate and describe (and --plot)
# ---------------------------------------------------------------------------

def test_describe_plot_is_written_atomically(tmp_path):
    src = DATA / "burstgpt_small.csv"
    imported(tmp_path, "burstgpt", src)
    png = tmp_path / "sub" / "p.png"
    res = run_cli("describe", tmp_path / "out.parquet", "--plot", png)
    assert res.exit_code == 2 and "does not exist" in res.output  # no folder is created silently
    png.parent.mkdir()
    res = run_cli("describe", tmp_path / "out.parquet", "--plot", png)
    assert res.exit_code == 0, res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in png.parent.iterdir()] == ["p.png"]  # no temp file left
    res = run_cli("describe", tmp_path / "missing.parquet", "--plot", tmp_path / "q.png")
    assert res.exit_code == 1 and not (tmp_path / "q.png").exists()


def test_describe_summarises_aggregates_by_level_and_plots_request_traces_only(tmp_path):
    # the tests' scrapes: two 30 s windows (test_import_prometheus.py has their numbers)
    agg = tmp_path / "prod.parquet"
    assert run_cli("import", "prometheus", DATA / "vllm_metrics_scrapes.txt", "--window-s", "30",
                   "-o", agg).exit_code == 0
    res = run_cli("describe", agg)
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert "kind: aggregate_targets/1" in lines and "levels: 2" in lines
    assert "level_1: poisson rate 1.7, 44 requests" in lines
    # the exact mean; the percentiles inside their buckets with it (histogram_quantile reads 483.3 and 915.0 ms)
    assert "level_1_ttft_s: mean=511.7 ms, p50=479.5 ms, p90=878.9 ms" in lines
    res = run_cli("describe", agg, "--plot", tmp_path / "p.png")
    assert res.exit_code == 2 and "--plot draws request traces" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "p.png").exists()


def _commands(group, prefix=()):
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, (*prefix, name))
        yield (*prefix, name), cmd


@pytest.mark.parametrize("path", [p for p, _ in _commands(main)], ids=lambda p: " ".join(p))
def test_every_command_has_help_with_an_example(path):
    res = run_cli(*path, "--help")
    assert res.exit_code == 0
    assert "Example:" in res.output, f"traces {' '.join(path)} --help has no Example"


def test_metadata_is_stored_in_the_parquet_file(tmp_path):
    imported(tmp_path, "vllm-bench", DATA / "vllm_bench_small.json")
    meta = table_metadata(pq.read_table(tmp_path / "out.parquet"))
    assert meta["source_format"] == "vllm-bench" and meta["num_failed"] == "1"
