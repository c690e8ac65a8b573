"""``traces import summary inferencemax``: InferenceMAX's benchmark points read to the values in
the file, lengths uniform over the range ratio's interval, one clear error for a selection that is
empty, mixes deployments or holds disaggregated points (issue #35 item 3)."""
import json

import numpy as np
import pytest

from helpers import flat, invoke_servecal
from traces.io import read_trace

RUN = "inferencemax/inferencemax_run_20286929996_agg_bmk.json"
DISAGG = "inferencemax/inferencemax_run_20321908209_agg_bmk.json"


def _point(**over):
    p = {"hw": "h200", "conc": 8, "image": "img:1", "model": "org/m", "framework": "sglang", "precision": "fp8",
         "spec_decoding": "none", "disagg": False, "isl": 1000, "osl": 100, "is_multinode": False, "tp": 8, "ep": 1,
         "dp_attention": "false"}
    for name, scale in (("ttft", 0.1), ("tpot", 0.01), ("itl", 0.2), ("e2el", 2.0)):
        p.update({f"mean_{name}": scale, f"median_{name}": 0.9 * scale, f"std_{name}": 0.1 * scale,
                  f"p99_{name}": 3 * scale})
    return {**p, **over}


def _import(tmp_path, points, *options):
    src = tmp_path / "agg_bmk.json"
    src.write_text(json.dumps(points))
    out = tmp_path / "agg.parquet"
    return invoke_servecal("traces", "import", "summary", "inferencemax", src, "-o", out, *options), out


def test_points_are_levels_with_the_files_values_and_uniform_lengths(tmp_path):
    res, out = _import(tmp_path, [_point(conc=16), _point(conc=4), _point(isl=100, osl=1000)])
    assert res.exit_code == 0, res.output
    kind, df, meta = read_trace(out)
    assert kind == "aggregate_targets/1" and meta["source_format"] == "inferencemax-summary"
    levels = df.drop_duplicates("level")  # in order of isl, osl, conc
    assert list(levels["level_value"]) == [8.0, 4.0, 16.0] and list(levels["num_requests"]) == [80, 40, 160]
    lv = df[df["level"] == 2]

    def value(metric, statistic, q=None, col="value_s"):
        rows = lv[(lv["metric"] == metric) & (lv["statistic"] == statistic)]
        rows = rows if q is None else rows[rows["quantile_pct"] == q]
        return float(rows[col].iloc[0])

    assert value("ttft_s", "mean") == 0.1 and value("ttft_s", "quantile", 50.0) == 0.9 * 0.1
    assert value("e2e_s", "quantile", 99.0) == 3 * 2.0 and value("tpot_s", "std") == pytest.approx(0.001)
    # lengths uniform in [int(0.8 L), L] (bench_serving's random dataset, R = 0.8)
    assert value("num_prompt_tokens", "min", col="value_tokens") == 800
    assert value("num_prompt_tokens", "max", col="value_tokens") == 1000
    assert value("num_output_tokens", "quantile", 50.0, col="value_tokens") == 90
    assert "itl" not in " ".join(set(df["metric"]))  # chunk gaps, not per-token latencies
    assert meta["gpu"] == "h200" and meta["tp"] == "8" and meta["random_range_ratio"] == "0.8"
    res, out = _import(tmp_path, [_point()], "--range-ratio", "0.5", "--prompts-per-client", "3")
    _, df, _ = read_trace(out)
    assert set(df["num_requests"]) == {24}
    assert df.loc[(df["metric"] == "num_output_tokens") & (df["statistic"] == "min"), "value_tokens"].item() == 50


def test_selections_that_cannot_be_one_trace_are_refused_naming_what_the_file_holds(tmp_path):
    points = [_point(), _point(hw="b200"), _point(hw="b200", tp=4)]
    res, out = _import(tmp_path, points, "--hw", "h100")
    text = flat(res.output)
    assert res.exit_code != 0 and "agg_bmk.json" in text and "--hw" in text and "no point matches" in text
    assert "hw b200, model org/m, framework sglang, precision fp8, tp 4" in text and not out.exists()
    res, _ = _import(tmp_path, points, "--hw", "b200,h200")
    assert res.exit_code != 0 and "several deployments" in flat(res.output)
    res, out = _import(tmp_path, points, "--hw", "b200", "--tp", "4")
    assert res.exit_code == 0 and "1 level(s) (1000/100 tokens x8)" in flat(res.output)
    res, _ = _import(tmp_path, [_point(disagg=True)])
    assert res.exit_code != 0 and "disaggregated" in flat(res.output) and "column 'disagg'" in flat(res.output)
    res, _ = _import(tmp_path, [_point(mean_ttft="fast")])
    assert res.exit_code != 0 and "row 1" in flat(res.output) and "mean_ttft" in flat(res.output)
    res = invoke_servecal("traces", "import", "summary", "vllm-bench", tmp_path / "agg_bmk.json", "--hw", "h200",
                          "-o", tmp_path / "x.parquet")
    assert res.exit_code != 0 and "--hw: only for FORMAT inferencemax" in flat(res.output)


def test_real_points_match_the_range_ratio_convention(real_data_dir, tmp_path):
    """The module docstring's evidence: (E2E - TTFT) / TPOT + 1 is 0.9 x osl, the mean of
    uniform [0.8 osl, osl], in every aggregated point of the DeepSeek-R1 run."""
    points = json.loads((real_data_dir / RUN).read_text())
    ratio = [((p["mean_e2el"] - p["mean_ttft"]) / p["mean_tpot"] + 1) / p["osl"] for p in points]
    assert np.min(ratio) > 0.88 and np.max(ratio) < 0.92
    res = invoke_servecal("traces", "import", "summary", "inferencemax", real_data_dir / RUN, "--hw", "h200",
                          "--isl", "1024", "--osl", "1024", "-o", tmp_path / "a.parquet")
    assert res.exit_code == 0, res.output
    assert "5 level(s) (1024/1024 tokens x4, 1024/1024 tokens x8" in flat(res.output)
    res = invoke_servecal("traces", "import", "summary", "inferencemax", real_data_dir / DISAGG,
                          "-o", tmp_path / "d.parquet")
    assert res.exit_code != 0 and "90 selected point(s) are disaggregated" in flat(res.output)
