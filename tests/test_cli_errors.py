"""Bad input gives one clear message (file, row, rule), exit 1 or 2, no traceback, no output file."""
import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from calibrate.umbrella import main as servecal
from schemas.tables import STEP_TRACE, to_table, write_table
from replay.cost.cost_model import RooflineCostModel
from schemas.cost_params import CostParams

GOOD = {"request_id": "r0", "input_toks": 10, "output_toks": 5, "arrival_time": 1.0e9, "queued_ts": 5.0,
        "scheduled_ts": 5.1, "first_token_ts": 5.2, "last_token_ts": 5.6}


def invoke(*args):
    return CliRunner().invoke(servecal, [str(a) for a in args])


def assert_clean_failure(res, out_path, *needles, codes=(1, 2)):
    assert res.exit_code in codes, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output
    for n in needles:
        assert n in res.output.replace("\n  ", " "), res.output  # a long message is folded
    assert not out_path.exists()
    assert not any(p.name.startswith(f".{out_path.name}") for p in out_path.parent.iterdir())


def test_truncated_jsonl_line(tmp_path):
    src = tmp_path / "run_requests.jsonl"
    src.write_text(json.dumps(GOOD) + "\n" + json.dumps({**GOOD, "request_id": "r1"})[:40] + "\n")
    out = tmp_path / "run.parquet"
    res = invoke("traces", "import", "vllm-request-stats", src, "-o", out)
    assert_clean_failure(res, out, str(src), "line 2", "not valid JSON")


def test_missing_field(tmp_path):
    src = tmp_path / "run_requests.jsonl"
    bad = dict(GOOD)
    del bad["first_token_ts"]
    src.write_text(json.dumps(GOOD) + "\n" + json.dumps(bad) + "\n")
    out = tmp_path / "run.parquet"
    res = invoke("traces", "import", "vllm-request-stats", src, "-o", out)
    assert_clean_failure(res, out, "line 2", "first_token_ts", "missing")


def test_existing_output_is_not_overwritten_on_error(tmp_path):
    src = tmp_path / "run_requests.jsonl"
    src.write_text("{not json\n")
    out = tmp_path / "run.parquet"
    out.write_bytes(b"previous")
    res = invoke("traces", "import", "vllm-request-stats", src, "-o", out)
    assert res.exit_code == 1
    assert out.read_bytes() == b"previous"


def _steps(tmp_path, durations):
    df = pd.DataFrame({"replica_id": 0, "step_start_time_s": [0.0, 1.0, 2.0, 3.0],
                       "step_duration_s": durations, "num_prefill_tokens": [0, 512, 0, 1024],
                       "num_prefill_seqs": [0, 1, 0, 1], "num_decode_seqs": [8, 0, 16, 0],
                       "decode_context_tokens": [800, 0, 1600, 0]})
    p = tmp_path / "steps.parquet"
    write_table(to_table(STEP_TRACE, df), p)
    return p


def test_negative_step_duration(tmp_path):
    steps = _steps(tmp_path, [0.01, -0.02, 0.012, 0.03])
    out = tmp_path / "cal.json"
    res = invoke("calibrate", "fit", steps, "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "-o", out)
    assert_clean_failure(res, out, str(steps), "step_duration_s", "row(s) 1", "> 0", codes=(1,))


def test_missing_column(tmp_path):
    df = pd.DataFrame({"request_id": ["a", "b"], "arrival_time_s": [0.0, 1.0], "num_prompt_tokens": [5, 6]})
    p = tmp_path / "t.parquet"
    table = pa.Table.from_pandas(df, preserve_index=False)
    table = table.replace_schema_metadata({b"servecal.schema": b"request_trace/1"})
    pq.write_table(table, p)
    res = invoke("traces", "validate", p)
    assert_clean_failure(res, tmp_path / "none", str(p), "num_output_tokens", "missing required column", codes=(1,))


def test_every_problem_reported_at_once(tmp_path):
    df = pd.DataFrame({"request_id": ["a", "a", "c"], "arrival_time_s": [0.0, 2.0, 1.0],
                       "num_prompt_tokens": [5, 6, 7], "num_output_tokens": [1, 0, 3],
                       "ttft_s": [0.5, 0.1, float("nan")], "e2e_s": [0.4, 0.2, 0.3]})
    p = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False)
                   .replace_schema_metadata({b"servecal.schema": b"request_trace/1"}), p)
    res = invoke("traces", "validate", p)
    for rule in ("duplicate", "not sorted", "below 1", "ttft_s > e2e_s"):
        assert rule in res.output
    assert res.exit_code == 1


def test_timestamp_column_with_time_zone_is_refused(tmp_path):
    t = pa.table({"request_id": ["a"], "arrival_time_s": pa.array([0], pa.timestamp("us", tz="UTC")),
                  "num_prompt_tokens": [3], "num_output_tokens": [2]})
    p = tmp_path / "t.parquet"
    pq.write_table(t.replace_schema_metadata({b"servecal.schema": b"request_trace/1"}), p)
    res = invoke("traces", "validate", p)
    assert res.exit_code == 1 and "timestamp" in res.output and "arrival_time_s" in res.output


@pytest.mark.parametrize("option,value", [("--model", "llama-9b"), ("--gpu", "b300")])
def test_unknown_model_or_gpu(tmp_path, option, value):
    steps = _steps(tmp_path, [0.01, 0.02, 0.012, 0.03])
    out = tmp_path / "cal.json"
    args = {"--model": "llama-3.1-8b", "--gpu": "h100-80gb", option: value}
    res = invoke("calibrate", "fit", steps, "--model", args["--model"], "--gpu", args["--gpu"], "-o", out)
    assert_clean_failure(res, out, value, codes=(2,))


def test_replay_with_bad_calibration_file(tmp_path):
    df = pd.DataFrame({"request_id": ["a"], "arrival_time_s": [0.0], "num_prompt_tokens": [5],
                       "num_output_tokens": [2]})
    from schemas.tables import REQUEST_TRACE

    trace = tmp_path / "t.parquet"
    write_table(to_table(REQUEST_TRACE, df), trace)
    cal = tmp_path / "cal.json"
    cal.write_text('{"servecal.schema": "something/9"}')
    out = tmp_path / "pred.parquet"
    res = invoke("replay", trace, "--calibration", cal, "-o", out)
    assert_clean_failure(res, out, str(cal), "calibration/3", codes=(1,))


def test_unknown_scheduler_fails_before_anything_is_printed(tmp_path):
    from helpers import write_calibration
    from schemas.specs import get_gpu, get_model
    from schemas.tables import REQUEST_TRACE

    df = pd.DataFrame({"request_id": ["a"], "arrival_time_s": [0.0], "num_prompt_tokens": [5],
                       "num_output_tokens": [2]})
    trace, cal, out = tmp_path / "t.parquet", tmp_path / "cal.json", tmp_path / "pred.parquet"
    write_table(to_table(REQUEST_TRACE, df), trace)
    write_calibration(RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb"),
                                        CostParams(eta_compute=0.5, eta_mem=0.8, t_step_s=1e-4)), cal)
    res = invoke("replay", trace, "--calibration", cal, "--scheduler", "nope", "-o", out)
    assert_clean_failure(res, out, "--scheduler nope: unknown", codes=(2,))
    assert "replaying" not in res.output


def test_version_and_help_everywhere():
    for args in (["--version"], ["traces", "--version"], ["replay", "--help"], ["calibrate", "fit", "--help"],
                 ["traces", "import", "vllm-request-stats", "--help"], ["demo", "--help"]):
        res = invoke(*args)
        assert res.exit_code == 0, (args, res.output)
        if "--help" in args:
            assert "Example" in res.output


def test_model_config_and_gpu_spec_files(tmp_path):
    steps = _steps(tmp_path, [0.01, 0.02, 0.012, 0.03])
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
           "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
           "vocab_size": 128256, "max_position_embeddings": 131072, "tie_word_embeddings": False,
           "torch_dtype": "bfloat16"}
    (tmp_path / "my-llama").mkdir()
    (tmp_path / "my-llama" / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "gpu.json").write_text(json.dumps({"name": "my-gpu", "peak_flops": 4e14,
                                                   "mem_bandwidth_bytes_per_s": 2e12, "mem_bytes": 48e9}))
    out = tmp_path / "cal.json"
    res = invoke("calibrate", "fit", steps, "--model-config", tmp_path / "my-llama" / "config.json",
                 "--gpu-spec", tmp_path / "gpu.json", "--variants", "max", "--fix", "n_half_tokens=0",
                 "--fix", "t_seq_s=0", "-o", out)
    assert res.exit_code == 0, res.output
    cal = json.loads(out.read_text())
    assert cal["gpu"]["name"] == "my-gpu" and cal["model"]["num_layers"] == 32
    assert cal["model"]["num_params"] == pytest.approx(8.03e9, rel=0.01)
    res = invoke("calibrate", "fit", steps, "--model", "llama-3.1-8b",
                 "--model-config", tmp_path / "my-llama" / "config.json", "--gpu", "h100-80gb",
                 "-o", tmp_path / "x.json")
    assert res.exit_code == 2 and "exactly one of --model and --model-config" in res.output


def test_missing_calibration_says_how_to_make_one_and_unknown_model_is_exit_2_everywhere(tmp_path):
    from helpers import write_calibration
    from schemas.specs import get_gpu, get_model

    steps = _steps(tmp_path, [0.01, 0.02, 0.012, 0.03])
    res = invoke("replay", steps)
    assert res.exit_code == 2 and "calibrate fit TRACE --model M --gpu G -o cal.json" in res.output
    assert all(len(line) <= 100 for line in res.output.splitlines())
    write_calibration(RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb"), CostParams()),
                      tmp_path / "cal.json")
    for args in (["calibrate", "fit", steps, "--model", "llama-3.2-3b", "--gpu", "h100-80gb",
                  "-o", tmp_path / "c.json"],
                 ["replay", steps, "--calibration", tmp_path / "cal.json", "--model", "llama-3.2-3b"]):
        res = invoke(*args)
        assert res.exit_code == 2 and "unknown model 'llama-3.2-3b'" in res.output, res.output
