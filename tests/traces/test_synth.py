"""``traces synth``, ``traces slice`` and ``traces scale``."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from traces.cli import main
from traces.io import read_trace, write_trace
from traces.transform import scale_trace, slice_trace


def cli(*args):
    res = CliRunner().invoke(main, [str(a) for a in args])
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    return res


SYNTH = ["synth", "--requests", "2000", "--rate", "5", "--arrival", "gamma", "--cv", "2",
         "--prompt-tokens", "lognormal:mean=1024,sigma=0.6", "--output-tokens", "uniform:16,256"]


def test_same_seed_same_bytes(tmp_path):
    a, b, c = tmp_path / "a.parquet", tmp_path / "b.parquet", tmp_path / "c.parquet"
    assert cli(*SYNTH, "--seed", "7", "-o", a).exit_code == 0
    assert cli(*SYNTH, "--seed", "7", "-o", b).exit_code == 0
    assert cli(*SYNTH, "--seed", "8", "-o", c).exit_code == 0
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()


def test_synth_statistics_and_metadata(tmp_path):
    out = tmp_path / "s.parquet"
    assert cli(*SYNTH, "--seed", "1", "-o", out).exit_code == 0
    assert cli("validate", out).exit_code == 0
    _, df, meta = read_trace(out)
    gaps = np.diff(df["arrival_time_s"].to_numpy())
    assert len(df) == 2000 and df["arrival_time_s"].iloc[0] == 0
    assert 1 / gaps.mean() == pytest.approx(5, rel=0.15)
    assert gaps.std() / gaps.mean() == pytest.approx(2, rel=0.2)
    assert df["num_output_tokens"].between(16, 256).all()
    assert meta["synth_seed"] == "1" and meta["synth_arrival"] == "gamma" and meta["source_format"] == "synth"


@pytest.mark.parametrize("args", [["--rate", "0"], ["--rate", "-1"], ["--cv", "0"],
                                  ["--prompt-tokens", "normal:5"], ["--output-tokens", "fixed:0"]])
def test_synth_bad_options_are_usage_errors(tmp_path, args):
    base = {"--requests": "10", "--rate": "1"}
    argv = ["synth"]
    for k, v in base.items():
        if k not in args:
            argv += [k, v]
    res = cli(*argv, *args, "-o", tmp_path / "x.parquet")
    assert res.exit_code == 2 and not (tmp_path / "x.parquet").exists()


def _trace(tmp_path, name="t.parquet"):
    df = pd.DataFrame({"request_id": [f"r{i}" for i in range(6)],
                       "arrival_time_s": [0.0, 1.0, 2.5, 3.0, 4.0, 9.0],
                       "num_prompt_tokens": [10, 11, 12, 13, 14, 15], "num_output_tokens": [2, 3, 4, 5, 6, 7],
                       "ttft_s": [0.1] * 6, "e2e_s": [0.5] * 6})
    p = tmp_path / name
    write_trace(df, "request_trace/1", p, {"source_format": "test"})
    return p, df


def test_slice_rebases_to_the_window_start(tmp_path):
    src, df = _trace(tmp_path)
    out = tmp_path / "s.parquet"
    res = cli("slice", src, "--start", "2", "--end", "4", "-o", out)
    assert res.exit_code == 0 and "2 of 6 requests" in res.output
    _, s, meta = read_trace(out)
    assert s["request_id"].tolist() == ["r2", "r3"]  # [2, 4): 4.0 excluded
    assert s["arrival_time_s"].tolist() == [0.5, 1.0]
    assert s["ttft_s"].tolist() == [0.1, 0.1]  # latencies are per request: kept
    assert meta["slice_start_s"] == "2.0" and meta["source_format"] == "test" and meta["num_rows"] == "2"
    res = cli("slice", src, "--start", "5", "--end", "8", "-o", tmp_path / "e.parquet")
    assert res.exit_code == 2 and "no request arrives" in res.output
    assert cli("slice", src, "--start", "3", "--end", "1", "-o", tmp_path / "e.parquet").exit_code == 2
    assert not (tmp_path / "e.parquet").exists()


def test_scale_divides_arrivals_and_drops_measured_latencies(tmp_path):
    src, df = _trace(tmp_path)
    out = tmp_path / "x.parquet"
    assert cli("scale", src, "--rate-scale", "2", "-o", out).exit_code == 0
    _, s, meta = read_trace(out)
    np.testing.assert_array_equal(s["arrival_time_s"], df["arrival_time_s"] / 2)
    assert "ttft_s" not in s and "e2e_s" not in s
    assert meta["rate_scale"] == "2.0" and meta["measured_columns_dropped"] == "ttft_s, e2e_s"
    for bad in ("0", "-1", "nan", "inf"):
        assert cli("scale", src, "--rate-scale", bad, "-o", tmp_path / "y.parquet").exit_code == 2
    assert cli("scale", tmp_path / "missing.parquet", "--rate-scale", "2", "-o", out).exit_code == 1


def test_transform_functions_directly():
    df = pd.DataFrame({"request_id": ["a", "b"], "arrival_time_s": [0.0, 10.0], "num_prompt_tokens": [1, 2],
                       "num_output_tokens": [1, 1]})
    s, _ = slice_trace(df, 0, float("inf"))
    assert s["arrival_time_s"].tolist() == [0.0, 10.0]
    x, _ = scale_trace(df, 0.5)
    assert x["arrival_time_s"].tolist() == [0.0, 20.0]
