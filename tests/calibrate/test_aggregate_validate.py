"""Aggregates replayed as they were measured and scored by validation (issue #35 item 4): a
closed loop's clients never move in lock step, and ``calibrate validate --score-on AGG`` sets
each level's reported statistics beside its replay's."""
import json

import numpy as np
import pandas as pd
import pytest

from calibrate.aggregate_runs import aggregate_runs, not_identified
from helpers import flat, invoke_servecal
from replay.config import ReplayConfig
from replay.cost.cost_model import RooflineCostModel
from replay.simulate import replay_frame
from schemas.specs import get_gpu, get_model
from traces.importers.summaries import Level, levels_frame

RUN = "inferencemax/inferencemax_run_20286929996_agg_bmk.json"


def _send_times(uniform: bool) -> np.ndarray:
    level = Level("concurrency", 64.0, 640)
    for metric in ("num_prompt_tokens", "num_output_tokens"):
        if uniform:  # InferenceMAX's 1k/1k: [int(0.8 L), L]
            level.add_uniform(metric, 819, 1024)
        else:
            level.add(metric, "mean", None, 1024.0)
    level.add("e2e_s", "mean", None, 8.0)
    frame, meta = levels_frame([level], "test", ["agg.json"])
    [run] = aggregate_runs("agg.parquet", frame, meta, ReplayConfig(), None)
    assert run.trace["num_output_tokens"].nunique() > 1 if uniform else "same lengths" in " ".join(
        not_identified([run]))
    cost = RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb"))
    result, _ = replay_frame(run.trace, cost, run.config, run.metadata)
    return result["pred_arrival_time_s"].to_numpy(float)


@pytest.mark.parametrize("uniform", [True, False])
def test_a_closed_loop_of_64_clients_sends_at_distinct_times(uniform):
    """Lengths from the range ratio: completions spread, so do the next sends (two requests may
    end in one step: nearly all distinct). Lengths known by their means alone, identical: the
    clients start spread over the mean E2E, else they would send in waves of 64 forever."""
    t = _send_times(uniform)
    later = np.unique(np.round(t[64:], 9))
    assert later.size >= 0.9 * (t.size - 64)
    assert np.unique(t[:64]).size == (1 if uniform else 64)  # a benchmark's clients start at once


def _points(tmp_path):
    points = []
    for conc in (2, 4):
        p = {"hw": "h100", "conc": conc, "image": "i", "model": "meta-llama/Llama-3.1-8B", "framework": "vllm",
             "precision": "bf16", "spec_decoding": "none", "disagg": False, "isl": 200, "osl": 40, "tp": 1, "ep": 1,
             "dp_attention": "false"}
        for name, v in (("ttft", 0.03 * conc), ("tpot", 0.008), ("itl", 0.008), ("e2el", 0.03 * conc + 0.3)):
            p.update({f"mean_{name}": v, f"median_{name}": v, f"std_{name}": 0.1 * v, f"p99_{name}": 1.5 * v})
        points.append(p)
    src = tmp_path / "agg_bmk.json"
    src.write_text(json.dumps(points))
    out = tmp_path / "agg.parquet"
    res = invoke_servecal("traces", "import", "summary", "inferencemax", src, "--prompts-per-client", "5", "-o", out)
    assert res.exit_code == 0, res.output
    return out


def test_validate_scores_each_level_of_an_aggregate(tmp_path):
    agg = _points(tmp_path)
    table = tmp_path / "errors.csv"
    res = invoke_servecal("calibrate", "validate", "--fit-on", f"{agg}#0", "--score-on", f"{agg}#1",
                          "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--free", "eta_mem,t_step_s",
                          "--variants", "sum", "--jobs", "1", "--table-out", table)
    assert res.exit_code == 0, res.output
    text = flat(res.output)
    assert f"{agg}#1 (out of sample; 20 requests replayed)" in text and f"{agg}#0 (in sample;" in text
    assert "out of sample, mean TTFT: median |error|" in text
    rows = pd.read_csv(table)
    out = rows[rows["sample"] == "out"]
    assert set(out["statistic"]) == {"mean", "p50", "p99"} and set(out["metric"]) == {"ttft", "tpot", "e2e"}
    ttft = out[(out["metric"] == "ttft") & (out["statistic"] == "mean")].iloc[0]
    assert ttft["meas_s"] == pytest.approx(0.12) and ttft["rel_err"] == pytest.approx(
        ttft["pred_s"] / ttft["meas_s"] - 1)


def test_validate_refuses_a_scored_run_without_measured_latencies_before_fitting(tmp_path):
    agg, synth = _points(tmp_path), tmp_path / "synth.parquet"
    assert invoke_servecal("traces", "synth", "--requests", "20", "--rate", "2", "-o", synth).exit_code == 0
    res = invoke_servecal("calibrate", "validate", "--fit-on", f"{agg}#0", "--score-on", synth,
                          "--model", "llama-3.1-8b", "--gpu", "h100-80gb")
    # was: exit 0, the run left out of every table without a word
    assert res.exit_code == 1 and "fitting" not in res.output, res.output
    assert "synth.parquet: no measured ttft_s, tpot_s or e2e_s; --score-on needs measured latencies" in flat(res.output)


@pytest.mark.parametrize("twice", [("#0", "#0"), ("#0", "")])
def test_a_run_named_twice_is_refused_not_weighted_double(tmp_path, twice):
    agg = _points(tmp_path)
    out = tmp_path / "cal.json"
    res = invoke_servecal("calibrate", "fit", *(f"{agg}{k}" for k in twice), "--model", "llama-3.1-8b",
                          "--gpu", "h100-80gb", "-o", out)
    assert res.exit_code == 1 and "named more than once" in flat(res.output) and not out.exists(), res.output


def test_validate_on_the_deepseek_r1_h200_grid(real_data_dir, tmp_path):
    """InferenceMAX's DeepSeek-R1 (fp8, SGLang, TP 8) on H200: fitted on the highest 1k/1k
    concurrency, scored on 8k/1k at 64 clients; a roofline predicts it within a factor of 2."""
    agg = {}
    for name, isl, osl in (("1k1k", 1024, 1024), ("8k1k", 8192, 1024)):
        agg[name] = tmp_path / f"{name}.parquet"
        res = invoke_servecal("traces", "import", "summary", "inferencemax", real_data_dir / RUN, "--hw", "h200",
                              "--isl", isl, "--osl", osl, "-o", agg[name])
        assert res.exit_code == 0, res.output
    table = tmp_path / "errors.csv"
    res = invoke_servecal("calibrate", "validate", "--fit-on", f"{agg['1k1k']}#4", "--score-on", f"{agg['8k1k']}#3",
                          "--model", "deepseek-r1", "--gpu", "h200", "--tp", "8", "--free", "eta_mem,t_step_s",
                          "--variants", "sum", "--jobs", "1", "--table-out", table)
    assert res.exit_code == 0, res.output
    out = pd.read_csv(table).query("sample == 'out' and statistic == 'mean'").set_index("metric")
    [point] = [p for p in json.loads((real_data_dir / RUN).read_text())
               if (p["hw"], p["isl"], p["osl"], p["conc"]) == ("h200", 8192, 1024, 64)]
    assert out.loc["ttft", "meas_s"] == point["mean_ttft"] and out.loc["e2e", "meas_s"] == point["mean_e2el"]
    assert np.all(np.abs(out["rel_err"]) < 1.0)
