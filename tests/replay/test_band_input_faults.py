"""Bad input around today's features, each one clear error or an honest line: the shape of a
calibration's ``band_points``/``model_error``, the band of a sweep without SLOs, a replay where
no request completes, ``--pp`` typed beyond what a model allows (a usage error, not the
calibration's fault)."""
import json

import pandas as pd
import pytest

from replay.text import WIDTH
from schemas.tables import REQUEST_TRACE
from test_replay_bands import POINTS, invoke, widest, write_cal


@pytest.fixture
def spaced(tmp_path, monkeypatch):
    """Three requests 10 s apart (100 prompt tokens, 2 output tokens) with measured latencies."""
    from traces.io import write_trace

    monkeypatch.chdir(tmp_path)
    df = pd.DataFrame({"request_id": ["a", "b", "c"], "arrival_time_s": [0.0, 10.0, 20.0],
                       "num_prompt_tokens": [100] * 3, "num_output_tokens": [2] * 3,
                       "ttft_s": [0.05] * 3, "e2e_s": [0.06] * 3, "tpot_s": [0.01] * 3})
    write_trace(df, REQUEST_TRACE, "t.parquet")
    write_cal("cal.json")
    return "t.parquet", "cal.json"


def _error(res):
    lines = [line for line in res.output.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, res.output
    assert "Traceback" not in res.output and widest(res.output) <= WIDTH, res.output
    return " ".join(res.output[res.output.index("Error:"):].split())


@pytest.mark.parametrize("field, value, needle", [
    ("band_points", {"eta_mem": 0.5}, "band_points is an object; expected a list of objects of parameter values"),
    ("band_points", "abc", "band_points is a string; expected a list"),
    ("band_points", 5, "band_points is a number; expected a list"),
    ("band_points", [None], "band_points[0] is null; expected an object of parameter values"),
    ("band_points", [{"t_step_s": 1e-4}, [1, 2]], "band_points[1] is a list; expected an object"),
    ("model_error", [["ttft_s", 0.1]], "model_error is a list; expected an object of fractions by metric"),
    ("model_error", "x", "model_error is a string; expected an object"),
])
def test_a_malformed_band_field_is_one_error_naming_the_field_and_what_is_expected(spaced, field, value, needle):
    trace, cal = spaced
    d = json.load(open(cal))
    d[field] = value
    json.dump(d, open(cal, "w"))
    res = invoke(trace, "--calibration", cal)
    assert res.exit_code == 1, res.output
    assert _error(res).startswith(f"Error: {cal}: ") and needle in _error(res), res.output


def test_a_sweep_without_slos_keeps_its_band_and_never_says_the_calibration_has_none(spaced):
    trace, cal = spaced
    res = invoke(trace, "--calibration", cal, "--sweep", "max-num-seqs=1,2", "--jobs", 1)
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "has no band points" not in text, res.output
    assert f"replayed at the {len(POINTS)} points of the calibration's 95 % confidence set" in text, res.output
    row = next(line for line in res.output.splitlines() if line.split()[:1] == ["1"])
    assert "[" in row, res.output  # the p90 cells carry their band


def test_no_request_completed_is_said_so_not_no_measured_latencies(spaced):
    trace, cal = spaced
    res = invoke(trace, "--calibration", cal, "--max-model-len", 2, "--tolerance", "ttft_p50=0.1")
    assert res.exit_code == 3, res.output
    assert "(no request completed in the simulation: nothing to compare)" in res.output
    assert "no measured latencies" not in res.output and "has no measured values" not in res.output
    assert "ttft_p50: metric 'ttft' has no request with both a measured and a predicted value" in res.output


@pytest.mark.parametrize("args, needle", [
    (["--pp", 33], "pp=33 exceeds the 32 layers of llama-3.1-8b"),
    (["--pp", 2, "--data-parallel-size", 2], "--pp with --data-parallel-size is not modelled"),
    (["--pp-prefill", 2], "--pp-prefill: only --scheduler disagg uses these"),
    (["--tp", 3], "tp=3 does not divide the 32 attention heads"),
])
def test_a_typed_option_at_fault_is_a_usage_error_though_settings_came_from_the_calibration(spaced, args, needle):
    trace, _ = spaced
    write_cal("cal.json", engine={"max_num_seqs": 32})  # a setting taken from the calibration
    res = invoke(trace, "--calibration", "cal.json", "--no-band", *args)
    assert res.exit_code == 2, res.output
    assert needle in _error(res) and "engine settings taken" not in res.output, res.output


def test_a_calibration_recording_an_impossible_pp_is_its_file_s_fault(spaced):
    trace, _ = spaced
    write_cal("cal.json", engine={"max_num_seqs": 32})
    d = json.load(open("cal.json"))
    d["pp"] = 64
    json.dump(d, open("cal.json", "w"))
    res = invoke(trace, "--calibration", "cal.json", "--no-band")
    assert res.exit_code == 1 and "pp=64 exceeds the 32 layers" in _error(res), res.output

