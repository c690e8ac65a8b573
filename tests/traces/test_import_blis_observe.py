"""``traces import blis-observe``: BLIS TraceV2 pairs (header YAML + CSV), written here by hand.

The expected values are worked out by hand from the format (inference-sim/inference-sim,
sim/workload/tracev2.go): times are integer microseconds; in ``real`` mode the send and
chunk times are the client's epoch clock, TTFT = first chunk - send, E2E = last chunk - send.
"""
from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from traces.cli import main
from traces.errors import TraceFormatError
from traces.importers.blis_observe import import_blis_observe
from traces.io import read_trace

V3_HEADER = """\
trace_version: 3
time_unit: us
created_at: "2026-01-05T10:00:00Z"
mode: real
warm_up_requests: 1
server:
  type: vllm
  model: meta-llama/Llama-3.1-8B-Instruct
  tensor_parallel: 1
  max_num_seqs: 4
  block_size: 16
network:
  measured_rtt_ms: 2.5
goodput_slo_targets:
  critical:
    ttft_ms: 100
    itl_ms: 50
"""
# today's columns, with the optional vllm_priority after slo_class
V3_COLUMNS = ("request_id,client_id,tenant_id,slo_class,vllm_priority,session_id,round_index,prefix_group,"
              "prefix_length,streaming,input_tokens,output_tokens,text_tokens,image_tokens,audio_tokens,video_tokens,"
              "reason_ratio,model,deadline_us,server_input_tokens,arrival_time_us,send_time_us,first_chunk_time_us,"
              "last_chunk_time_us,num_chunks,status,error_message,finish_reason")
T0 = 1700000000000000  # the client's epoch clock, us
V3_ROWS = [
    # 0: streaming, server counted 140 prompt tokens; send T0+100, first +50 ms, last +150 ms
    f"0,c1,,critical,0,,0,sys,32,true,100,11,100,0,0,0,0,,0,140,0,{T0 + 100},{T0 + 50_100},{T0 + 150_100},11,ok,,stop",
    # 1: no server count: prompt = input 200 + prefix 32; scheduled at 250 ms, sent at +250.3 ms
    "1,c1,,standard,2,,0,sys,32,true,200,5,200,0,0,0,0,,0,0,250000,"
    f"{T0 + 250_300},{T0 + 290_300},{T0 + 330_300},5,ok,,length",
    # 2: non-streaming: the first chunk is the whole response, so no TTFT
    "2,c2,,standard,2,,0,,0,false,64,8,64,0,0,0,0,,0,64,500000,"
    f"{T0 + 500_100},{T0 + 900_100},{T0 + 900_100},1,ok,,stop",
    # 3: failed
    f'3,c2,,standard,2,,0,,0,true,64,0,64,0,0,0,0,,0,0,750000,{T0 + 750_200},0,0,0,error,"HTTP 500: boom",',
]

# The first version of the v2 CSV (no prefix_length, model, deadline_us, server_input_tokens,
# finish_reason), from `blis run` (mode generated: send = scheduled arrival, from 0).
V2_HEADER = "trace_version: 2\ntime_unit: microseconds\nmode: generated\nwarm_up_requests: 0\n"
V2_COLUMNS = ("request_id,client_id,tenant_id,slo_class,session_id,round_index,prefix_group,streaming,input_tokens,"
              "output_tokens,text_tokens,image_tokens,audio_tokens,video_tokens,reason_ratio,arrival_time_us,"
              "send_time_us,first_chunk_time_us,last_chunk_time_us,num_chunks,status,error_message")
V2_ROWS = ["0,c1,,,,0,,true,512,6,512,0,0,0,0,0,0,20000,120000,0,ok,",
           "1,c1,,,,0,,true,256,1,256,0,0,0,0,100000,100000,130000,130000,0,ok,",
           "2,c1,,,,0,,true,128,4,128,0,0,0,0,200000,200000,0,0,0,incomplete,"]


def write_pair(tmp_path, header=V3_HEADER, columns=V3_COLUMNS, rows=V3_ROWS, name="trace"):
    (tmp_path / f"{name}.yaml").write_text(header)
    (tmp_path / f"{name}.csv").write_text("\n".join([columns, *rows]) + "\n")
    return tmp_path / f"{name}.yaml"


def run_cli(*args):
    res = CliRunner().invoke(main, [str(a) for a in args])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert "Traceback" not in res.output
    return res


def fails(tmp_path, *args, **pair):
    """Import through the CLI; expect exit 1 with one message naming a file; return the message."""
    src = write_pair(tmp_path, **pair)
    res = run_cli("import", "blis-observe", src, *args, "-o", tmp_path / "out.parquet")
    assert res.exit_code == 1, res.output
    assert not (tmp_path / "out.parquet").exists()
    assert res.output.count("Error:") == 1 and str(tmp_path) in res.output
    return res.output


def test_v3_by_hand(tmp_path):
    out = tmp_path / "out.parquet"
    res = run_cli("import", "blis-observe", write_pair(tmp_path), "-o", out)
    assert res.exit_code == 0, res.output
    assert "4 requests" in res.output and "1 failed" in res.output
    assert "engine (trace header): tensor_parallel_size=1, max_num_seqs=4, block_size=16" in res.output
    assert run_cli("validate", out).exit_code == 0
    _, df, meta = read_trace(out)
    assert df["request_id"].tolist() == ["0", "1", "2", "3"]
    # arrival = send time minus the first send (T0 + 100 us)
    assert df["arrival_time_s"].tolist() == pytest.approx([0.0, 0.2502, 0.5, 0.7501], abs=1e-12)
    assert df["num_prompt_tokens"].tolist() == [140, 232, 64, 64]
    assert df["num_output_tokens"].tolist() == [11, 5, 8, 0]
    r0, r1, r2, r3 = (df.iloc[i] for i in range(4))
    assert (r0.ttft_s, r0.e2e_s, r0.tpot_s) == pytest.approx((0.05, 0.15, 0.01), abs=1e-12)   # (150-50)/(11-1) ms
    assert (r1.ttft_s, r1.e2e_s, r1.tpot_s) == pytest.approx((0.04, 0.08, 0.01), abs=1e-12)   # (80-40)/(5-1) ms
    assert math.isnan(r2.ttft_s) and math.isnan(r2.tpot_s) and r2.e2e_s == pytest.approx(0.4, abs=1e-12)
    assert math.isnan(r3.ttft_s) and math.isnan(r3.e2e_s) and r3.status == "failed: error: HTTP 500: boom"
    assert df["status"].tolist()[:3] == ["ok"] * 3
    # v3 goodput targets of the class 'critical' (ms) -> per-request SLOs (s)
    assert r0.slo_ttft_s == 0.1 and r0.slo_tpot_s == 0.05 and math.isnan(r1.slo_ttft_s)
    assert df["priority"].tolist() == [0, 2, 2, 2] and meta["priority_source"] == "vllm_priority"
    # rows 0 and 1 share prefix group 'sys' of 32 tokens: their first 2 blocks of 16
    h0, h1 = df["block_hashes"][0], df["block_hashes"][1]
    assert len(h0) == 140 // 16 and len(h1) == 232 // 16
    assert list(h0[:2]) == list(h1[:2]) and h0[2] != h1[2] and df["block_hashes"][2] is None
    assert meta["hash_block_tokens"] == "16"
    assert json.loads(meta["engine_settings"]) == {"tensor_parallel_size": 1, "max_num_seqs": 4, "block_size": 16}
    assert meta["model"] == "meta-llama/Llama-3.1-8B-Instruct" and meta["server_type"] == "vllm"
    assert meta["network_rtt_s"] == "0.0025" and meta["blis_trace_version"] == "3" and meta["blis_mode"] == "real"
    assert float(meta["time_origin_unix_s"]) == pytest.approx((T0 + 100) / 1e6, abs=1e-6)
    assert meta["warm_up_requests"] == "1" and meta["num_warm_up_rows"] == "1"
    assert meta["source"] == str(tmp_path / "trace.csv") and meta["trace_header"] == str(tmp_path / "trace.yaml")
    assert meta["source_format"] == "blis-observe" and "arrival_vs_send_warning" not in meta


def test_v2_first_columns_generated(tmp_path):
    df, meta = import_blis_observe(write_pair(tmp_path, V2_HEADER, V2_COLUMNS, V2_ROWS))
    assert df["arrival_time_s"].tolist() == [0.0, 0.1, 0.2]
    assert df["num_prompt_tokens"].tolist() == [512, 256, 128]
    assert meta["prompt_tokens_source"] == "input_tokens"
    assert (df.ttft_s[0], df.e2e_s[0], df.tpot_s[0]) == pytest.approx((0.02, 0.12, 0.02), abs=1e-12)
    assert (df.ttft_s[1], df.e2e_s[1]) == pytest.approx((0.03, 0.03), abs=1e-12) and math.isnan(df.tpot_s[1])
    assert df.status[2] == "failed: incomplete" and math.isnan(df.e2e_s[2])
    assert "engine_settings" not in meta and "time_origin_unix_s" not in meta and "block_hashes" not in df
    assert meta["blis_trace_version"] == "2" and meta["blis_mode"] == "generated"


def test_pairing(tmp_path):
    write_pair(tmp_path, name="h")
    (tmp_path / "requests.csv").write_bytes((tmp_path / "h.csv").read_bytes())
    (tmp_path / "h.csv").unlink()
    res = run_cli("import", "blis-observe", tmp_path / "h.yaml", "-o", tmp_path / "o.parquet")
    assert res.exit_code == 1 and "h.yaml: has no data file beside it (h.csv not found); expected --data" in res.output
    res = run_cli("import", "blis-observe", tmp_path / "h.yaml", "--data", tmp_path / "requests.csv",
                  "-o", tmp_path / "o.parquet")
    assert res.exit_code == 0, res.output
    # the CSV given as FILE finds its header beside it
    write_pair(tmp_path, name="t")
    df, meta = import_blis_observe(tmp_path / "t.csv")
    assert len(df) == 4 and meta["trace_header"] == str(tmp_path / "t.yaml")


@pytest.mark.parametrize("change, where, expected", [
    (("trace_version: 3", "trace_version: 4"), "line 1, column 'trace_version'", "expected 2 or 3"),
    (("time_unit: us", "time_unit: ms"), "line 2, column 'time_unit'", "expected us or microseconds"),
    (("mode: real", "mode: live"), "line 4, column 'mode'", "expected real or generated or replayed"),
    (("mode: real\n", ""), "column 'mode': missing key", "expected a TraceV2 header"),
    (("max_num_seqs: 4", "max_num_seqs: many"), "line 10, column 'server.max_num_seqs'", "is not a whole number"),
    (("server:\n", "server: [1]\nx:\n"), "column 'server'", "expected a mapping"),
    (("trace_version: 3", "trace_version: 2"), "line 14, column 'goodput_slo_targets'", "expected trace_version: 3"),
    (("ttft_ms: 100", "ttft_ms: -1"), "column 'goodput_slo_targets.critical.ttft_ms'", "is not a number >= 0"),
    (("mode: real", "mode: [real"), "trace.yaml, line", "not valid YAML"),
])
def test_header_mismatches(tmp_path, change, where, expected):
    msg = fails(tmp_path, header=V3_HEADER.replace(*change, 1))
    assert "trace.yaml" in msg and where in msg and expected in msg, msg


def test_header_not_yaml_mapping(tmp_path):
    write_pair(tmp_path)
    res = run_cli("import", "blis-observe", tmp_path / "trace.yaml", "--data", tmp_path / "trace.csv",
                  "-o", tmp_path / "o.parquet")
    assert res.exit_code == 0
    res = run_cli("import", "blis-observe", tmp_path / "trace.csv", "--data", tmp_path / "trace.csv",
                  "-o", tmp_path / "o2.parquet")  # the CSV given as the header
    assert res.exit_code == 1 and "trace.csv: is a CSV file, given with --data; expected the header YAML" in res.output
    (tmp_path / "h.yaml").write_text("request_id,input_tokens\n1,2\n")  # a CSV named .yaml
    res = run_cli("import", "blis-observe", tmp_path / "h.yaml", "--data", tmp_path / "trace.csv",
                  "-o", tmp_path / "o3.parquet")
    assert res.exit_code == 1 and "h.yaml: is not a YAML mapping; expected the --trace-header YAML" in res.output


def test_missing_column(tmp_path):
    cols = V3_COLUMNS.replace(",first_chunk_time_us", "")
    rows = [",".join(c for j, c in enumerate(r.split(",")) if j != 22) for r in V3_ROWS[:3]]
    msg = fails(tmp_path, columns=cols, rows=rows)
    assert "trace.csv, line 1: has no column 'first_chunk_time_us'" in msg and "the header has: request_id" in msg


@pytest.mark.parametrize("col, value, where, rule", [
    (11, "abc", "row 2 (line 3), column 'output_tokens'", "value 'abc' is not a whole number"),
    (10, "-5", "row 2 (line 3), column 'input_tokens'", "value is negative or too large"),
    # a prompt of 2**53 tokens would build 2**49 block hashes: refused as the data contract's
    # MAX_TOKENS before any work (found by the long fuzz: a hang)
    (10, "9007199254740993", "row 2 (line 3), column 'input_tokens'", "value is negative or too large"),
    (9, "yes", "row 2 (line 3), column 'streaming'", "value is not a boolean; expected true or false"),
    (0, "0", "row 2 (line 3), column 'request_id'", "duplicate request_id"),
    (21, str(T0 + 400_000), "row 2 (line 3), column 'first_chunk_time_us'", "chunk times out of order"),
])
def test_bad_row(tmp_path, col, value, where, rule):
    rows = list(V3_ROWS)
    cells = rows[1].split(",")
    cells[col] = value
    rows[1] = ",".join(cells)
    msg = fails(tmp_path, rows=rows)
    assert f"trace.csv, {where}: {rule}" in msg, msg


def test_invalid_row_flag_and_drop(tmp_path):
    rows = list(V3_ROWS)
    rows[1] = rows[1].replace(f"{T0 + 290_300},", f"{T0 + 200_000},")  # first chunk before the send
    df, meta = import_blis_observe(write_pair(tmp_path, rows=rows), invalid="flag")
    assert df.status[1] == "invalid: chunk times out of order" and math.isnan(df.ttft_s[1])
    assert meta["num_invalid"] == "1"
    df, meta = import_blis_observe(tmp_path / "trace.yaml", invalid="drop")
    assert df["request_id"].tolist() == ["0", "2", "3"] and meta["num_invalid_dropped"] == "1"


def test_late_send_is_reported(tmp_path):
    rows = list(V3_ROWS)
    rows[2] = rows[2].replace(",500000,", ",200000,")  # scheduled 300 ms before it was sent
    res = run_cli("import", "blis-observe", write_pair(tmp_path, rows=rows), "-o", tmp_path / "o.parquet")
    assert res.exit_code == 0 and "Warning: 1 request(s) were sent more than 0.1 s after" in res.output
    assert "request 2 by 0.300 s" in res.output


def test_bad_option_exit_2(tmp_path):
    res = run_cli("import", "blis-observe", write_pair(tmp_path), "--invalid", "maybe", "-o", tmp_path / "o.parquet")
    assert res.exit_code == 2


def with_recorded_settings(trace, settings: dict, dest):
    """A copy of ``trace`` at ``dest`` whose metadata records the engine ``settings``."""
    import pyarrow.parquet as pq

    table = pq.read_table(trace)
    meta = dict(table.schema.metadata)
    meta[b"servecal.engine_settings"] = json.dumps(settings).encode()
    pq.write_table(table.replace_schema_metadata(meta), dest)
    return dest


def test_import_then_replay(tmp_path):
    """End to end: the header's engine settings become replay's defaults."""
    from replay.cli import main as replay_main
    from schemas.calibration import Calibration, FittedParam
    from schemas.specs import get_gpu, get_model

    out = tmp_path / "observed.parquet"
    assert run_cli("import", "blis-observe", write_pair(tmp_path), "-o", out).exit_code == 0
    params = {k: FittedParam(v) for k, v in (("eta_compute", 0.5), ("eta_mem", 0.8), ("t_step_s", 1e-4))}
    Calibration(get_model("llama-3.1-8b"), get_gpu("h100-80gb"), 1, params).write(tmp_path / "cal.json")
    pred = tmp_path / "pred.parquet"
    res = CliRunner().invoke(replay_main, [str(out), "--calibration", str(tmp_path / "cal.json"), "-o", str(pred)])
    assert res.exit_code == 0, res.output
    flat = "".join(res.output.split())  # the message is wrapped at 100 columns
    assert f"enginesettingsfromthetrace{out}:max_num_seqs=4,block_size=16,tp=1" in flat
    assert "max_num_seqs=4" in res.output
    kind, df, _ = read_trace(pred)
    assert kind == "replay_result/1" and len(df) == 4
    assert (df["pred_status"] == "ok").sum() == 3  # the failed request is not replayed
    # given on the command line, the option wins and the difference is noted
    res = CliRunner().invoke(replay_main, [str(out), "--calibration", str(tmp_path / "cal.json"),
                                           "--max-num-seqs", "8", "-o", str(pred)])
    assert res.exit_code == 0 and "--max-num-seqs8(thetrace" in "".join(res.output.split())


def test_fixture_pair_imports(tmp_path):
    """The fuzz seeds (tests/data/blis_observe_trace.*) import cleanly."""
    from pathlib import Path

    df, meta = import_blis_observe(Path(__file__).parents[1] / "data" / "blis_observe_trace.yaml")
    assert len(df) == 6 and meta["num_failed"] == "1"


def test_error_class():
    with pytest.raises(TraceFormatError):
        import_blis_observe("/nonexistent/trace.yaml", data="/nonexistent/trace.csv")


def test_calibrate_runs_take_the_recorded_settings_too(tmp_path):
    """`calibrate fit`/`validate` read the same recorded settings as `replay` (one reader,
    traces.io.recorded_engine_settings); an option given keeps its value; a bad recorded value is
    one error naming the file."""
    from calibrate.errors import FitError
    from calibrate.runs import load_runs
    from replay.config import EngineOptions, ReplayConfig

    out = tmp_path / "observed.parquet"
    assert run_cli("import", "blis-observe", write_pair(tmp_path), "-o", out).exit_code == 0
    (run,) = load_runs([str(out)], ReplayConfig(), read_trace)
    assert run.config.engine.max_num_seqs == 4 and run.config.engine.block_size == 16
    # given on the command line (or from the server's log), the option wins, even at its default value
    for value in (8, 256):
        (run,) = load_runs([str(out)], ReplayConfig(engine=EngineOptions(max_num_seqs=value)), read_trace,
                           keep={"max_num_seqs"})
        assert run.config.engine.max_num_seqs == value
    with_recorded_settings(out, {"max_num_seqs": 0}, tmp_path / "bad.parquet")
    with pytest.raises(FitError, match=r"bad\.parquet.*max_num_seqs=0 is not a valid setting"):
        load_runs([str(tmp_path / "bad.parquet")], ReplayConfig(), read_trace)


def test_a_recorded_setting_that_cannot_run_is_a_data_error_naming_the_trace(tmp_path):
    """A trace recording TP 3 for a 32-head model: replay and calibrate exit 1 naming the trace
    and the setting taken from it (it was a usage error, exit 2); typed, it stays a usage error."""
    from calibrate.cli import main as calibrate_main
    from replay.cli import main as replay_main
    from schemas.calibration import Calibration, FittedParam
    from schemas.specs import get_gpu, get_model

    out = tmp_path / "observed.parquet"
    assert run_cli("import", "blis-observe", write_pair(tmp_path), "-o", out).exit_code == 0
    bad = with_recorded_settings(out, {"tensor_parallel_size": 3}, tmp_path / "tp3.parquet")
    cal = tmp_path / "cal.json"
    Calibration(get_model("llama-3.1-8b"), get_gpu("h100-80gb"), 1, {"eta_mem": FittedParam(0.8)}).write(cal)
    runs = {"replay": (replay_main, [str(bad), "--calibration", str(cal)]),
            "calibrate": (calibrate_main, ["fit", str(bad), "--model", "llama-3.1-8b", "--gpu", "h100-80gb",
                                           "-o", str(tmp_path / "fit.json")])}
    for name, (cli, args) in runs.items():
        res = CliRunner().invoke(cli, args)
        flat = "".join(res.output.split())
        assert res.exit_code == 1, (name, res.output)
        assert "Usage:" not in res.output and "doesnotdividethe32attentionheads" in flat
        assert f"takenfromthetrace{bad}:tp=3" in flat
        typed = CliRunner().invoke(cli, [*args, "--tp", "3"])
        assert typed.exit_code == 2 and "Usage:" in typed.output, (name, typed.output)
    assert not (tmp_path / "fit.json").exists()


def test_missing_header_says_so(tmp_path):
    """A header that does not exist is named as missing (as every importer says it), not as
    a header without its CSV."""
    res = run_cli("import", "blis-observe", tmp_path / "trace.yaml", "-o", tmp_path / "o.parquet")
    assert res.exit_code == 1 and "trace.yaml: cannot open (No such file or directory)" in res.output


def test_a_recorded_block_size_no_kv_cache_holds_is_a_data_error(tmp_path):
    """A KV block larger than the cache, recorded in the trace: replay and calibrate exit 1
    naming the trace (it was a usage error that named no file)."""
    from calibrate.cli import main as calibrate_main
    from replay.cli import main as replay_main
    from schemas.calibration import Calibration, FittedParam
    from schemas.specs import get_gpu, get_model

    out = tmp_path / "observed.parquet"
    assert run_cli("import", "blis-observe", write_pair(tmp_path), "-o", out).exit_code == 0
    bad = with_recorded_settings(out, {"block_size": 2 ** 30}, tmp_path / "huge_blocks.parquet")
    cal = tmp_path / "cal.json"
    Calibration(get_model("llama-3.1-8b"), get_gpu("h100-80gb"), 1, {"eta_mem": FittedParam(0.8)}).write(cal)
    for cli, args in ((replay_main, [str(bad), "--calibration", str(cal)]),
                      (calibrate_main, ["fit", str(bad), "--model", "llama-3.1-8b", "--gpu", "h100-80gb",
                                        "-o", str(tmp_path / "fit.json")])):
        res = CliRunner().invoke(cli, args)
        flat = "".join(res.output.split())
        assert res.exit_code == 1 and "Usage:" not in res.output, res.output
        assert str(bad) in flat and "holdsnoblockof1073741824tokens" in flat


def test_logs_of_another_tp_degree_are_not_fitted_or_scored_together(tmp_path):
    """The first log sets the TP degree modelled; a later one recording another is one error
    naming it (it was fitted, or scored, at the first one's TP)."""
    from calibrate.cli import main as calibrate_main

    out = tmp_path / "observed.parquet"
    assert run_cli("import", "blis-observe", write_pair(tmp_path), "-o", out).exit_code == 0
    tp2 = with_recorded_settings(out, {"tensor_parallel_size": 2}, tmp_path / "tp2.parquet")
    hw = ["--model", "llama-3.1-8b", "--gpu", "h100-80gb"]
    for args in (["fit", str(out), str(tp2), *hw, "-o", str(tmp_path / "c.json")],
                 ["validate", "--fit-on", str(out), "--score-on", str(tp2), *hw]):
        res = CliRunner().invoke(calibrate_main, args)
        flat = "".join(res.output.split())
        assert res.exit_code == 1 and f"{tp2}:recordstensor_parallel_size=2,butthefitmodelstp=1" in flat, res.output
