"""``traces import vllm-log``: engine settings and the stats series of a vLLM server log.

Includes the check of the GuideLLM-derived ``block_hashes`` against the prefix cache hit
rate vLLM itself logged for the same run.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from calibrate.umbrella import main as servecal
from schemas.calibration import Calibration, FittedParam
from schemas.specs import get_gpu, get_model
from traces.cli import main
from traces.importers.block_hashes import implied_prefix_cache_hits
from traces.importers.vllm_log import engine_settings_from_vllm_log, read_vllm_log
from traces.io import read_trace

LOG = "blis_eval_codellama34b_prefill_sweep_vllm.log"
OTLP = "vllm_otlp_spans_codellama34b_prefill_sweep.jsonl"
GUIDELLM = "guidellm_results_codellama34b_prefill_sweep.json"


def run(*args, cli=main):
    res = CliRunner().invoke(cli, [str(a) for a in args])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert "Traceback" not in res.output
    return res


def test_real_engine_settings(real_data_dir):
    s = engine_settings_from_vllm_log(real_data_dir / LOG)
    assert s["vllm_version"] == "0.11.0"
    assert (s["max_num_seqs"], s["max_num_batched_tokens"], s["max_model_len"]) == (32, 64, 8192)
    assert (s["tensor_parallel_size"], s["pipeline_parallel_size"], s["data_parallel_size"]) == (1, 1, 1)
    assert s["enable_prefix_caching"] is True and s["enable_chunked_prefill"] is True
    assert (s["num_gpu_blocks"], s["gpu_kv_cache_size_tokens"], s["block_size"]) == (2790, 44640, 16)
    assert s["gpu_memory_utilization"] == 0.9 and s["dtype"] == "bfloat16" and s["enforce_eager"] is False
    assert s["served_model_name"] == "codellama/CodeLlama-34b-Instruct-hf"
    assert s["model_weights_gib"] == pytest.approx(62.8571)
    log = read_vllm_log(real_data_dir / LOG)
    assert log.sources["max_num_seqs"] == "non-default args"
    assert log.sources["gpu_memory_utilization"].startswith("default (vLLM 0.11.0 V1)")
    assert log.sources["block_size"] == "GPU KV cache size / num_gpu_blocks = 44640 / 2790"
    assert log.non_default_args["max_num_batched_tokens"] == 64


def test_real_series(tmp_path, real_data_dir):
    out = tmp_path / "stats.parquet"
    res = run("import", "vllm-log", real_data_dir / LOG, "-o", out)
    assert res.exit_code == 0, res.output
    assert "26 stats lines over 250 s (vllm_stats/1), vLLM 0.11.0" in res.output
    assert "max_num_seqs=32, max_num_batched_tokens=64" in res.output and "num_gpu_blocks=2790" in res.output
    assert "valid vllm_stats/1, 26 rows" in run("validate", out).output
    kind, df, meta = read_trace(out)
    lines = [ln for ln in (real_data_dir / LOG).read_text().splitlines() if "Avg prompt throughput" in ln]
    assert len(df) == len(lines) == 26
    assert df["t_s"].iloc[0] == 0 and df["t_s"].iloc[-1] == pytest.approx(250.008)
    assert np.allclose(np.diff(df["t_s"]), 10, atol=0.01) and meta["stats_interval_s"] == "10.000"
    first = df.iloc[0]
    assert (first["prompt_throughput_tokens_per_s"], first["generation_throughput_tokens_per_s"]) == (598.2, 6.4)
    assert (first["running"], first["waiting"], first["engine"]) == (1, 0, 0)
    assert first["kv_cache_usage_frac"] == pytest.approx(0.067)
    assert first["prefix_cache_hit_rate_frac"] == pytest.approx(0.171)
    assert df["waiting"].max() == 36 and df["prefix_cache_hit_rate_frac"].iloc[-1] == pytest.approx(0.327)
    settings = engine_settings_from_vllm_log(real_data_dir / LOG)
    assert json.loads(meta["engine_settings"]) == json.loads(json.dumps(settings))
    assert meta["first_stats_line_time"] == "2026-01-20T06:11:13.161000"
    desc = run("describe", out)
    assert desc.exit_code == 0 and "kind: vllm_stats/1" in desc.output and "waiting: p50=0.0" in desc.output


@pytest.fixture(scope="module")
def aligned(tmp_path_factory, real_data_dir):
    d = tmp_path_factory.mktemp("aligned")
    assert run("import", "vllm-otlp", real_data_dir / OTLP, "--guidellm", real_data_dir / GUIDELLM,
               "-o", d / "spans.parquet").exit_code == 0
    assert run("import", "guidellm", real_data_dir / GUIDELLM, "-o", d / "gl.parquet").exit_code == 0
    res = run("import", "vllm-log", real_data_dir / LOG, "--align-to", d / "spans.parquet",
              "--timeseries-csv", d / "ts.csv", "-o", d / "stats.parquet")
    assert res.exit_code == 0, res.output
    return d, res.output


def test_real_alignment_to_the_trace_clock(aligned):
    d, out = aligned
    _, df, meta = read_trace(d / "stats.parquet")
    # the log is in UTC-8 (PST); its first stats line comes 3.8 s after the first span's arrival
    assert meta["log_utc_offset_hours"] == "-8" and meta["log_utc_offset_source"].startswith("inferred")
    assert "log clock UTC-8 h (inferred), first stats line at t = 3.8 s" in out
    assert df["t_s"].iloc[0] == pytest.approx(3.819, abs=0.01)
    # the same with the offset given
    res = run("import", "vllm-log", Path(meta["source"]), "--align-to", d / "spans.parquet", "--log-utc-offset", -8,
              "-o", d / "stats2.parquet")
    assert res.exit_code == 0 and "UTC-8 h (given)" in res.output


def test_real_block_hashes_match_the_logged_prefix_cache_hit_rate(aligned):
    """vLLM logs hits / queried prompt tokens over the requests looked up so far (< 1000 here).

    Each span's lookup happens when it is first scheduled: arrival + queue wait. The hit rate
    the text-derived hashes imply at every stats line is within 0.3 percentage points of the
    logged one (32.8 % vs 32.7 % at the end); 64 shared blocks per request (the exact token
    prefix) would give 32.7 %.
    """
    d, _ = aligned
    _, spans, _ = read_trace(d / "spans.parquet")
    _, stats, _ = read_trace(d / "stats.parquet")
    spans["lookup_s"] = spans["arrival_time_s"] + spans["queue_wait_s"]
    spans = spans.sort_values("lookup_s", kind="stable").reset_index(drop=True)
    hits = implied_prefix_cache_hits(spans["block_hashes"].tolist(), spans["num_prompt_tokens"].to_numpy())
    cum_hits, cum_tokens = np.cumsum(hits), np.cumsum(spans["num_prompt_tokens"].to_numpy())
    k = np.searchsorted(spans["lookup_s"].to_numpy(), stats["t_s"].to_numpy(), side="right")
    implied = cum_hits[k - 1] / cum_tokens[k - 1]
    logged = stats["prefix_cache_hit_rate_frac"].to_numpy()
    assert k[0] == 2 and k[-1] == 200
    assert implied[0] == pytest.approx(0.1712, abs=1e-4) and logged[0] == 0.171
    assert np.abs(implied - logged).max() < 0.003
    assert implied[-1] == pytest.approx(0.3284, abs=1e-4) and logged[-1] == 0.327


def test_real_timeseries_csv_is_read_by_replay_report(aligned, tmp_path):
    d, _ = aligned
    ts = pd.read_csv(d / "ts.csv")
    assert list(ts.columns) == ["t", "prompt_throughput", "gen_throughput", "running", "waiting", "kv_cache_pct",
                                "prefix_cache_hit_pct"]
    assert len(ts) == 26 and ts["kv_cache_pct"].iloc[0] == pytest.approx(6.7)
    params = {k: FittedParam(v) for k, v in (("eta_compute", 0.5), ("eta_mem", 0.8), ("t_step_s", 1e-4))}
    Calibration(get_model("llama-3.1-8b"), get_gpu("h100-80gb"), 1, params).write(tmp_path / "cal.json")
    res = run("replay", d / "gl.parquet", "--calibration", tmp_path / "cal.json", "--max-num-seqs", 32,
              "--max-num-batched-tokens", 64, "--enable-prefix-caching", "--report", tmp_path / "r.md",
              "--measured-timeseries", d / "ts.csv", cli=servecal)
    assert res.exit_code == 0, res.output
    assert "Running and waiting requests over time" in (tmp_path / "r.md").read_text()


# ---------------------------------------------------------------------------
# Other log formats and bad inputs
# ---------------------------------------------------------------------------

V1_DEFAULT_FORMAT = """\
(APIServer pid=7) INFO 12-31 23:59:50 [api_server.py:1] vLLM API server version 0.10.2
(APIServer pid=7) INFO 12-31 23:59:50 [utils.py:1] non-default args: {'model': 'm', 'data_parallel_size': 2}
(EngineCore_0 pid=9) INFO 12-31 23:59:51 [kv_cache_utils.py:1] GPU KV cache size: 1,024 tokens
(APIServer pid=7) INFO 12-31 23:59:58 [loggers.py:1] Engine 000: Avg prompt throughput: 10.0 tokens/s, \
Avg generation throughput: 2.0 tokens/s, Running: 3 reqs, Waiting: 1 reqs, GPU KV cache usage: 50.0%, \
Prefix cache hit rate: 0.0%
(APIServer pid=7) INFO 12-31 23:59:58 [loggers.py:1] Engine 001: Avg prompt throughput: 5.0 tokens/s, \
Avg generation throughput: 1.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 10.0%, \
Prefix cache hit rate: 0.0%, MM cache hit rate: 0.0%
(APIServer pid=7) INFO 01-01 00:00:08 [loggers.py:1] Engine 000: Avg prompt throughput: 0.0 tokens/s, \
Avg generation throughput: 4.0 tokens/s, Running: 2 reqs, Waiting: 0 reqs, GPU KV cache usage: 40.0%, \
Prefix cache hit rate: 25.0%
"""

V0_FORMAT = """\
INFO 05-01 10:00:00 api_server.py:1] vLLM API server version 0.6.3
INFO 05-01 10:00:05 metrics.py:1] Avg prompt throughput: 100.5 tokens/s, Avg generation throughput: 20.0 tokens/s, \
Running: 4 reqs, Swapped: 0 reqs, Pending: 2 reqs, GPU KV cache usage: 12.5%, CPU KV cache usage: 0.0%.
"""


def test_vllm_default_format_with_two_engines(tmp_path):
    src = tmp_path / "v.log"
    src.write_text(V1_DEFAULT_FORMAT)
    out = tmp_path / "s.parquet"
    res = run("import", "vllm-log", src, "-o", out, "--timeseries-csv", tmp_path / "ts.csv")
    assert res.exit_code == 0, res.output
    _, df, meta = read_trace(out)
    assert df["engine"].tolist() == [0, 1, 0]
    assert df["t_s"].tolist() == [0.0, 0.0, 10.0]              # across New Year, no year in the log
    assert df["kv_cache_usage_frac"].tolist() == [0.5, 0.1, 0.4]
    assert meta["num_engines"] == "2" and "no year" in meta["log_clock"]
    s = json.loads(meta["engine_settings"])
    assert s["data_parallel_size"] == 2 and s["vllm_version"] == "0.10.2" and s["max_num_seqs"] is None
    assert s["block_size"] == 16 and "default" in json.loads(meta["engine_settings_sources"])["block_size"]
    ts = pd.read_csv(tmp_path / "ts.csv")
    assert ts["running"].tolist() == [4, 2] and ts["waiting"].tolist() == [1, 0]   # engines summed per tick


def test_vllm_v0_line(tmp_path):
    src = tmp_path / "v0.log"
    src.write_text(V0_FORMAT)
    _, df, _ = (run("import", "vllm-log", src, "-o", tmp_path / "s.parquet"), *read_trace(tmp_path / "s.parquet")[1:])
    assert (df["running"].iloc[0], df["waiting"].iloc[0]) == (4, 2)
    assert df["prefix_cache_hit_rate_frac"].isna().all()


def _bad_log(tmp_path, real_data_dir, edit, *extra):
    lines = (real_data_dir / LOG).read_text().splitlines()
    lines = edit(lines)
    src = tmp_path / "bad.log"
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.parquet"
    return run("import", "vllm-log", src, "-o", out, *extra), out


def test_truncated_stats_line(tmp_path, real_data_dir):
    def edit(lines):
        return lines[:80] + [lines[80][:lines[80].index("Waiting") + 5]]
    res, out = _bad_log(tmp_path, real_data_dir, edit)
    assert res.exit_code == 1 and not out.exists()
    assert "bad.log, line 81, column 'Waiting': stats line has no 'Waiting' field (truncated?)" in res.output


def test_bad_number_and_bad_fraction(tmp_path, real_data_dir):
    res, out = _bad_log(tmp_path, real_data_dir, lambda ls: [ln.replace("Running: 2 reqs", "Running: 2.5 reqs")
                                                            for ln in ls])
    assert res.exit_code == 1 and "column 'Running': value '2.5' is not a whole number of requests" in res.output
    res, out = _bad_log(tmp_path, real_data_dir, lambda ls: [ln.replace("usage: 6.7%", "usage: 106.7%") for ln in ls])
    assert res.exit_code == 1 and "line 63, column 'GPU KV cache usage': GPU KV cache usage 106.7% is above 100%" \
        in res.output and not out.exists()


def test_bad_non_default_args(tmp_path, real_data_dir):
    res, out = _bad_log(tmp_path, real_data_dir, lambda ls: [ln[:-30] if "non-default args" in ln else ln for ln in ls])
    assert res.exit_code == 1 and not out.exists()
    assert "bad.log, line 3, column 'non-default args': non-default args is not a Python dict literal" in res.output


def test_log_without_stats_or_not_a_log(tmp_path, real_data_dir):
    res, out = _bad_log(tmp_path, real_data_dir, lambda ls: [ln for ln in ls if "Avg prompt" not in ln])
    assert res.exit_code == 1 and "has no stats lines" in res.output and "--disable-log-stats" in res.output
    # settings are still readable from such a log
    assert engine_settings_from_vllm_log(tmp_path / "bad.log")["num_gpu_blocks"] == 2790
    src = tmp_path / "x.log"
    src.write_text("hello\nworld\n")
    res = run("import", "vllm-log", src, "-o", tmp_path / "o.parquet")
    assert res.exit_code == 1 and "has no vLLM log line" in res.output
    src.write_bytes(b"INFO vllm \xff\xfe\n")
    res = run("import", "vllm-log", src, "-o", tmp_path / "o.parquet")
    assert res.exit_code == 1 and "x.log, line 1: is not UTF-8 text" in res.output
    res = run("import", "vllm-log", tmp_path / "missing.log", "-o", tmp_path / "o.parquet")
    assert res.exit_code == 1 and "missing.log: no such file" in res.output


def test_option_errors(tmp_path, real_data_dir):
    res = run("import", "vllm-log", real_data_dir / LOG, "-o", tmp_path / "o.parquet", "--log-utc-offset", 1)
    assert res.exit_code == 2 and "give --align-to too" in res.output
    res = run("import", "vllm-log", real_data_dir / LOG, "-o", tmp_path / "o.parquet", "--timeseries-csv",
              tmp_path / "o.parquet")
    assert res.exit_code == 2 and "--timeseries-csv" in res.output and not (tmp_path / "o.parquet").exists()
    synth = tmp_path / "s.parquet"
    assert run("synth", "--requests", 3, "--rate", 1, "-o", synth).exit_code == 0
    res = run("import", "vllm-log", real_data_dir / LOG, "-o", tmp_path / "o.parquet", "--align-to", synth)
    assert res.exit_code == 2 and "no time_origin_unix_s metadata" in res.output.replace("\n  ", " ")
