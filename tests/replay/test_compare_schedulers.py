"""``replay --compare-schedulers``: one trace, several policies, one table (replay.analysis.compare.scheduler_table)."""
import re

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from replay.analysis.band_tables import format_scheduler_table
from replay.analysis.compare import SCHEDULER_TABLE_METRICS, scheduler_table
from replay.cost.cost_model import cost_model_from_calibration
from replay.analysis.metrics import goodput_rps
from replay.config import EngineOptions, ReplayConfig, SchedulingOptions
from replay.simulate import replay_frame
from replay.cost.cost_model import RooflineCostModel
from schemas.cost_params import CostParams

ALL = ["fcfs", "chunked", "static", "sjf", "edf", "disagg"]


def test_scheduler_table_percentiles_and_goodput():
    # two completed requests and a rejected one; TPOT of the one-token request is NaN (BR-03)
    res = pd.DataFrame({"arrival_time_s": [0.0, 1.0, 2.0], "num_output_tokens": [3, 1, 2],
                        "pred_status": ["ok", "ok", "rejected: exceeds max_model_len"],
                        "pred_queue_wait_s": [0.0, 0.2, np.nan], "pred_ttft_s": [0.1, 0.3, np.nan],
                        "pred_tpot_s": [0.05, np.nan, np.nan], "pred_e2e_s": [0.2, 0.3, np.nan]})
    table = scheduler_table({"a": res, "b": res.iloc[:1]}, slo_ttft_s=0.2)
    a = table.set_index("scheduler").loc["a"]
    assert a["n_ok"] == 2
    assert a["ttft_p50_s"] == pytest.approx(0.2) and a["ttft_p90_s"] == pytest.approx(0.28)
    assert a["tpot_p50_s"] == a["tpot_p99_s"] == pytest.approx(0.05)  # only the 3-token request
    assert a["queue_wait_p50_s"] == pytest.approx(0.1) and a["e2e_p99_s"] == pytest.approx(0.299)
    # goodput: 1 request meets ttft <= 0.2 s over the span from the first arrival to the last completion (1.3 s)
    assert a["goodput_rps"] == pytest.approx(1 / 1.3) == goodput_rps(res, 0.2, None)
    text = format_scheduler_table(table, wide=True).splitlines()
    assert text[0].split() == (["scheduler", "n_ok"] + [f"{m}_p{q}_ms" for m in SCHEDULER_TABLE_METRICS
                                                        for q in (50, 90, 99)] + ["goodput_rps"])
    assert text[1].split()[:4] == ["a", "2", "200.0", "280.0"] and text[2].split()[0] == "b"
    # by default: p50 and p90 of TTFT, TPOT and E2E, and the goodput
    text = format_scheduler_table(table).splitlines()
    assert text[0].split() == ["scheduler", "n_ok", "ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90", "e2e_p50",
                               "e2e_p90", "goodput"]
    assert text[1].split() == ["a", "2", "200.0", "280.0", "50.0", "50.0", "250.0", "290.0", "0.769"]


def test_scheduler_table_fits_100_columns_with_long_names():
    res = pd.DataFrame({"arrival_time_s": [0.0, 1.0], "num_output_tokens": [3, 2], "pred_status": ["ok", "ok"],
                        "pred_queue_wait_s": [0.0, 2000.0], "pred_ttft_s": [0.1, 3000.0],
                        "pred_tpot_s": [0.05, 0.07], "pred_e2e_s": [0.2, 9000.5]})
    names = ["chunked", "my_policies:ShortestOutputFirst", "some.very.long.package.module:AnotherSchedulerClass"]
    text = format_scheduler_table(scheduler_table({n: res for n in names}))
    assert max(map(len, text.splitlines())) <= 100, text
    assert "ttft_p50" in text and "goodput" in text


@pytest.fixture
def trace_and_calibration(tmp_path):
    from helpers import write_calibration
    from schemas.specs import get_gpu, get_model
    from schemas.tables import REQUEST_TRACE
    from traces.io import write_trace

    n = 10
    df = pd.DataFrame({"request_id": [f"r{i}" for i in range(n)], "arrival_time_s": [0.02 * i for i in range(n)],
                       "num_prompt_tokens": [300 + 97 * i for i in range(n)],
                       "num_output_tokens": [1 + 7 * i for i in range(n)]})
    trace, cal = tmp_path / "t.parquet", tmp_path / "cal.json"
    write_trace(df, REQUEST_TRACE, trace)
    write_calibration(RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb"),
                                        CostParams(eta_compute=0.5, eta_mem=0.8, t_step_s=1e-4)), cal)
    return trace, cal, df


def invoke(trace, cal, *args):
    from replay.cli import main

    return CliRunner().invoke(main, [str(trace), "--calibration", str(cal), "--wide", *map(str, args)])


def flat(output: str) -> str:
    """The output with its lines joined (long lines are folded at 100 columns)."""
    return " ".join(output.split())


def table_rows(output):
    lines = output.splitlines()
    i = next(k for k, line in enumerate(lines) if line.split()[:1] == ["scheduler"])
    head = lines[i].split()
    rows = {}
    for line in lines[i + 1:]:
        # a row's point values; its band, "[low, high]", where it has one (the disaggregated row of a
        # colocated calibration carries the transfer error even without band points)
        cells = re.sub(r"\s*\[[^\]]*\]", "", line).split()
        if len(cells) != len(head) or line.startswith("("):  # the note below the table may have as many words
            break
        rows[cells[0]] = dict(zip(head, cells))
    return rows


def test_compare_schedulers_cli_one_row_per_policy(trace_and_calibration):
    from schemas.calibration import Calibration

    trace, cal, df = trace_and_calibration
    res = invoke(trace, cal, "--compare-schedulers", ",".join(ALL), "--num-gpu-blocks", 3000,
                 "--max-num-batched-tokens", 1024, "--slo-ttft-s", 0.2, "--slo-tpot-s", 0.02)
    assert res.exit_code == 0, res.output
    rows = table_rows(res.output)
    assert list(rows) == ALL
    assert all(r["n_ok"] == str(len(df)) for r in rows.values())
    assert "disagg: 1 prefill x 1 x h100-80gb + 1 decode x 1 x h100-80gb" in res.output
    assert "meeting ttft <= 0.2 s and tpot <= 0.02 s" in flat(res.output)
    # each row is the replay of that scheduler with the same options
    cost = cost_model_from_calibration(Calibration.read(cal))
    for name in ("chunked", "disagg"):
        pred, _ = replay_frame(df, cost, ReplayConfig(EngineOptions(num_gpu_blocks=3000, max_num_batched_tokens=1024),
                                                      SchedulingOptions(name, slo_ttft_s=0.2, slo_tpot_s=0.02)))
        ok = pred["pred_status"] == "ok"
        assert rows[name]["ttft_p50_ms"] == f"{np.percentile(pred.loc[ok, 'pred_ttft_s'], 50) * 1e3:.1f}"
        assert rows[name]["e2e_p99_ms"] == f"{np.percentile(pred.loc[ok, 'pred_e2e_s'], 99) * 1e3:.1f}"
        assert rows[name]["goodput_rps"] == f"{goodput_rps(pred, 0.2, 0.02):.3f}"
    # static batching makes later requests wait for the whole batch: its queue wait is the worst
    p99_wait = {k: float(r["queue_wait_p99_ms"]) for k, r in rows.items()}
    assert p99_wait["static"] == max(p99_wait.values())


def test_compare_schedulers_with_defaults_and_disagg_options(trace_and_calibration):
    trace, cal, df = trace_and_calibration
    res = invoke(trace, cal, "--compare-schedulers", "chunked,disagg", "--replicas", 2, "--decode-replicas", 2,
                 "--tp-prefill", 2, "--link", "400gbe")
    assert res.exit_code == 0, res.output
    assert list(table_rows(res.output)) == ["chunked", "disagg"]
    assert "2 replicas of 1 x h100-80gb (TP=1), 2 GPUs" in flat(res.output)
    assert ("1 prefill x 2 x h100-80gb + 2 decode x 1 x h100-80gb (4 GPUs; prefill TP=2, decode TP=1)"
            in flat(res.output))
    assert "no --slo-ttft-s/--slo-tpot-s given" in flat(res.output)


@pytest.mark.parametrize("args, needle", [
    (("--compare-schedulers", "chunked,nope"), "--compare-schedulers: --scheduler nope: unknown"),
    (("--compare-schedulers", "chunked,chunked"), "chunked given more than once"),
    (("--compare-schedulers", " , "), "give a comma-separated list"),
    (("--compare-schedulers", "chunked,disagg", "--tolerance", "ttft_p50=0.1"), "cannot be combined with --tolerance"),
])
def test_compare_schedulers_bad_options_exit_2(trace_and_calibration, tmp_path, args, needle):
    trace, cal, _ = trace_and_calibration
    res = invoke(trace, cal, *args)
    assert res.exit_code == 2, res.output
    assert needle in res.output and "Traceback" not in res.output


def test_compare_schedulers_refuses_output_files(trace_and_calibration, tmp_path):
    trace, cal, _ = trace_and_calibration
    out = tmp_path / "pred.parquet"
    res = invoke(trace, cal, "--compare-schedulers", "fcfs,chunked", "-o", out)
    assert res.exit_code == 2 and "cannot be combined with -o" in res.output
    assert not out.exists()
