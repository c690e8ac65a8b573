"""``replay`` with the calibration's bands on a run unlike the calibrated one (issue 18 items 2-5):
a what-if against its baseline, the KV cache at another TP, bands on sweep and scheduler rows
and their reports, expert parallelism (issue #20), a run said to be measured with a setting
(issue #36 item 3) and a disaggregated replay of a colocated run. The fixtures and helpers are
``test_replay_bands.py``'s."""
import math

import numpy as np
import pandas as pd
import pytest

from replay.analysis.bands import BAND_STATS
from replay.analysis.compare import ms_cell
from replay.config import EngineOptions, ReplayConfig
from replay.cost.cost_model import RooflineCostModel
from replay.cost.kv_capacity import kv_block_bytes_per_rank
from replay.simulate import replay_frame
from replay.text import WIDTH
from schemas.calibration import Calibration, sha256_of
from schemas.cost_params import CostParams
from schemas.specs import get_gpu, get_model
from schemas.tables import REQUEST_TRACE
from traces.synth import synth_requests

import test_replay_bands
from test_replay_bands import COST, POINTS, _row, invoke, widest, write_cal

#: test_replay_bands's fixtures, bound here for its tests (imported by name, a fixture argument would
#: redefine the import: ruff's F811)
spaced, measured = test_replay_bands.spaced, test_replay_bands.measured


# -- item 2: what-if vs baseline ----------------------------------------------------------------------------

def test_an_option_unlike_the_measured_run_makes_a_what_if_with_a_change_column(measured):
    trace, cal = measured
    res = invoke(trace, "--calibration", cal, "--max-num-seqs", 8)
    assert res.exit_code == 0, res.output
    assert "BASELINE (measured) vs WHAT-IF" in res.output
    assert "change_p50" in res.output and "err_p" not in res.output
    assert "--max-num-seqs 8 (the calibration cal.json says 32)" in " ".join(res.output.split())
    assert "inside their 95 % band" not in res.output
    assert widest(res.output) <= WIDTH, res.output
    same = invoke(trace, "--calibration", cal, "--max-num-seqs", 32)  # typed, but as measured
    assert same.exit_code == 0 and "err_p50" in same.output and "WHAT-IF" not in same.output


@pytest.mark.parametrize("args, named", [(["--tp", 2], "--tp 2 (the calibration cal.json says 1)"),
                                         (["--scheduler", "fcfs"], "--scheduler fcfs"),
                                         (["--model", "qwen3-32b"], "--model qwen3-32b")])
def test_tolerance_is_refused_on_a_what_if(measured, args, named):
    trace, cal = measured
    res = invoke(trace, "--calibration", cal, *args, "--tolerance", "ttft_p50=0.1")
    assert res.exit_code == 2, res.output
    assert "what-if" in res.output and named in " ".join(res.output.split())


def test_a_calibration_carried_to_another_run_is_validated_not_a_what_if(measured):
    """The transfer check of docs/fidelity.md (Llama's calibration replaying the Qwen3-32B TP2 run with
    --model and --tp): the calibration was fitted on another trace, so its model and TP are not
    the measured run's; the comparison stays an error and --tolerance judges it."""
    trace, _ = measured
    write_cal("other.json", engine={"max_num_seqs": 32})  # fitted on another trace
    res = invoke(trace, "--calibration", "other.json", "--tp", 2, "--scheduler", "fcfs", "--tolerance",
                 "ttft_p50=10")
    assert res.exit_code == 0, res.output
    assert "WHAT-IF" not in res.output and "err_p50" in res.output


# -- item 3: the KV cache at another TP ---------------------------------------------------------------

def test_kv_blocks_are_re_derived_from_gpu_memory_at_another_tp(spaced, tmp_path):
    trace, _ = spaced
    write_cal(tmp_path / "kv.json", engine={"num_gpu_blocks": 2790})
    m, g = COST.model, COST.gpu
    bb1, bb2 = kv_block_bytes_per_rank(m, 1, 16), kv_block_bytes_per_rank(m, 2, 16)
    other = g.mem_bytes * 0.9 - m.weight_bytes - 2790 * bb1  # what the recorded count implies beside weights
    expected = math.floor((g.mem_bytes * 0.9 - m.weight_bytes / 2 - other) / bb2)
    assert expected > 2 * 2790  # half the weights per GPU, and half the KV heads per block
    res = invoke(trace, "--calibration", "kv.json", "--tp", 2)
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert f"num_gpu_blocks 2790 (recorded at TP 1) -> {expected} from GPU memory at TP 2" in text
    assert f"KV cache {expected} blocks" in text
    same = invoke(trace, "--calibration", "kv.json")
    assert "KV cache 2790 blocks" in same.output and "recorded at TP" not in same.output
    typed = invoke(trace, "--calibration", "kv.json", "--tp", 2, "--num-gpu-blocks", 1000)
    assert "KV cache 1000 blocks" in typed.output and "recorded at TP" not in typed.output


# -- item 4: sweep and compare-schedulers rows carry bands ----------------------------------------------

def test_sweep_rows_carry_bands_in_the_file_and_the_p90_cells(spaced, tmp_path):
    trace, cal = spaced
    res = invoke(trace, "--calibration", cal, "--sweep", "max-num-seqs=1,2", "--sweep-out", "s.csv", "--jobs", 1,
                 "--slo-ttft-s", 1)
    assert res.exit_code == 0, res.output
    assert widest(res.output) <= WIDTH, res.output
    table = pd.read_csv("s.csv")
    for s in BAND_STATS:
        assert {f"{s}_low", f"{s}_high"} <= set(table.columns), s
        ok = table[s].notna()
        assert (table.loc[ok, f"{s}_low"] <= table.loc[ok, s] + 1e-12).all()
        assert (table.loc[ok, s] <= table.loc[ok, f"{s}_high"] + 1e-12).all()
    assert (table["band_points"] == 2).all()
    ttft = [COST.with_params(COST.params.replace(**pt)).prefill_time_s(100) for pt in POINTS]
    # by ratio, the faster point (0.05 ms less per step) is the farther: the band is [it, point^2 / it]
    point = COST.prefill_time_s(100)
    assert point / ttft[0] > ttft[1] / point
    assert table["ttft_p90_s_low"].to_numpy() == pytest.approx([ttft[0]] * 2)
    assert table["ttft_p90_s_high"].to_numpy() == pytest.approx([point ** 2 / ttft[0]] * 2)
    row = _row(res.output, "1")
    assert f"[{ms_cell(ttft[0])}, {ms_cell(point ** 2 / ttft[0])}]" in row, res.output


def test_compare_schedulers_rows_carry_bands_and_gpu_counts(spaced):
    trace, cal = spaced
    res = invoke(trace, "--calibration", cal, "--compare-schedulers", "chunked,disagg", "--replicas", 2,
                 "--decode-replicas", 2)
    assert res.exit_code == 0, res.output
    assert widest(res.output) <= WIDTH, res.output
    head = next(line for line in res.output.splitlines() if line.split()[:2] == ["scheduler", "gpus"])
    assert "ttft_p90" in head
    assert _row(res.output, "chunked").split()[1] == "2"      # 2 replicas x TP 1
    assert _row(res.output, "disagg").split()[1] == "3"       # 1 prefill + 2 decode instances
    assert "[" in _row(res.output, "chunked")
    off = invoke(trace, "--calibration", cal, "--compare-schedulers", "chunked", "--no-band")
    assert off.exit_code == 0 and "no band (--no-band)" in off.output and "[" not in _row(off.output, "chunked")


# -- issue 18 item 5: --report with --sweep and --compare-schedulers -----------------------------------

def _report_checks(path, cell, figure):
    """The report at ``path`` has the provenance, the band cell ``cell`` and one figure ``figure``."""
    import re
    from pathlib import Path

    text = Path(path).read_text()
    assert cell in text, (cell, text[:3000])
    assert "eta_compute" in text and "identified" in text and "95 % band" in text
    assert "replay t.parquet --calibration cal.json" in text  # the command line
    if str(path).endswith(".html"):
        assert len(re.findall(r'<img alt="[^"]+" src="data:image/png;base64,', text)) == 1
        assert "<dt>command</dt>" in text
    else:
        stem = Path(path).stem
        assert f"]({stem}_files/{figure})" in text
        assert Path(f"{stem}_files/{figure}").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return text


@pytest.mark.parametrize("name", ["s.html", "s.md"])
def test_sweep_report_has_the_table_with_bands_and_the_figure(spaced, name):
    from replay.analysis.band_tables import band_cell, row_band

    trace, cal = spaced
    res = invoke(trace, "--calibration", cal, "--sweep", "max-num-seqs=1,2", "--sweep-out", "s.csv", "--jobs", 1,
                 "--report", name)
    assert res.exit_code == 0, res.output
    assert f"wrote {name}" in res.output
    table = pd.read_csv("s.csv")
    cell = band_cell(row_band(table.iloc[1].to_dict()), "ttft_p90_s")
    assert cell in _row(res.output, "2")  # the printed table's cell...
    text = _report_checks(name, cell, "sweep.png")  # ...is the report's
    assert "servecal sweep report" in text and "e2e_p99_ms" in text  # every statistic, not the printed few


@pytest.mark.parametrize("name", ["c.html", "c.md"])
def test_compare_schedulers_report_has_the_table_with_bands_and_the_figure(spaced, name):
    trace, cal = spaced
    res = invoke(trace, "--calibration", cal, "--compare-schedulers", "fcfs,chunked", "--report", name)
    assert res.exit_code == 0, res.output
    row = _row(res.output, "chunked")
    cell = row[row.index("[") - 1 - len(row[:row.index("[") - 1].split()[-1]):row.index("]") + 1]
    text = _report_checks(name, cell, "schedulers.png")
    assert "servecal scheduler comparison report" in text
    assert text.count("fcfs") >= 1 and text.count("chunked") >= 2  # the command line and its row


def test_sweep_and_compare_schedulers_refuse_measured_timeseries(spaced):
    trace, cal = spaced
    open("ts.csv", "w").write("t,running,waiting\n1.0,1,0\n")
    res = invoke(trace, "--calibration", cal, "--sweep", "max-num-seqs=1,2", "--report", "r.md",
                 "--measured-timeseries", "ts.csv")
    assert res.exit_code == 2 and "cannot be combined with --measured-timeseries" in res.output


def test_no_band_skips_even_the_seed_replays_of_speculative_decoding(spaced):
    trace, cal = spaced
    spec = ("--speculative-tokens", 3, "--spec-acceptance-rate", 0.7)
    on = invoke(trace, "--calibration", cal, *spec)
    assert on.exit_code == 0, on.output
    assert "4 other seeds" in " ".join(on.output.split())
    off = invoke(trace, "--calibration", cal, *spec, "--no-band")
    assert off.exit_code == 0 and "[" not in _row(off.output, "tpot")


# -- issue #20: --enable-expert-parallel -------------------------------------------------------------

def test_enable_expert_parallel_is_an_option_of_replay_and_a_what_if(tmp_path):
    """Issue #20: vLLM's --enable-expert-parallel, which ``calibrate fit`` has, is also replay's;
    typed unlike the calibration it changes the MoE step (the all-to-all appears, each GPU reads
    half the experts) and makes the replay a what-if."""
    moe = RooflineCostModel(get_model("qwen3-30b-a3b"), get_gpu("rtx-pro-6000"), CostParams(), dp=2)
    trace = synth_requests(30, 4.0, "fixed:300", "fixed:40", seed=3)
    from traces.io import write_trace

    write_trace(trace, REQUEST_TRACE, tmp_path / "t.parquet", {})
    Calibration(moe.model, moe.gpu, 1, {}, terms=list(moe.terms), dp=2,  # fitted on this trace
                source={"path": "t.parquet", "sha256": sha256_of(tmp_path / "t.parquet")}).write(tmp_path / "moe.json")
    plain = invoke(tmp_path / "t.parquet", "--calibration", tmp_path / "moe.json", "-o", tmp_path / "a.parquet")
    ep = invoke(tmp_path / "t.parquet", "--calibration", tmp_path / "moe.json", "--enable-expert-parallel",
                "-o", tmp_path / "b.parquet", "--tolerance", "ttft_p50=0.1")
    assert plain.exit_code == 0, plain.output
    assert ep.exit_code == 2 and "--enable-expert-parallel True (the calibration" in ep.output.replace("\n", " ")
    ep = invoke(tmp_path / "t.parquet", "--calibration", tmp_path / "moe.json", "--enable-expert-parallel",
                "-o", tmp_path / "b.parquet")
    assert ep.exit_code == 0, ep.output
    a, b = pd.read_parquet(tmp_path / "a.parquet"), pd.read_parquet(tmp_path / "b.parquet")
    with_ep = RooflineCostModel(moe.model, moe.gpu, CostParams(), dp=2, expert_parallel=True)
    want, _ = replay_frame(trace, with_ep, ReplayConfig(EngineOptions()))
    assert np.allclose(b["pred_e2e_s"], want["pred_e2e_s"]) and not np.allclose(a["pred_e2e_s"], b["pred_e2e_s"])


# -- issue #36 item 3: a run measured with a setting; a disaggregated replay of a colocated run ----------

def test_a_run_said_to_be_measured_with_a_setting_is_a_validation_not_a_what_if(tmp_path, monkeypatch):
    """Issue #36 item 3: a calibration fitted at max_num_seqs 256 replaying a run measured at 128: typed
    alone, --max-num-seqs 128 makes a what-if; with --measured-with max_num_seqs=128 it is the run's own
    setting, so its measured latencies are scored against the band."""
    from traces.io import write_trace

    monkeypatch.chdir(tmp_path)
    trace = synth_requests(60, 4.0, "fixed:300", "fixed:40", seed=2)
    res, _ = replay_frame(trace, COST, ReplayConfig(EngineOptions(max_num_seqs=128)))
    write_trace(trace.assign(ttft_s=res["pred_ttft_s"], tpot_s=res["pred_tpot_s"], e2e_s=res["pred_e2e_s"]),
                REQUEST_TRACE, "run.parquet")
    write_cal("cal.json", engine={"max_num_seqs": 256})
    typed = invoke("run.parquet", "--calibration", "cal.json", "--max-num-seqs", 128)
    said = invoke("run.parquet", "--calibration", "cal.json", "--measured-with", "max_num_seqs=128")
    assert typed.exit_code == 0 and said.exit_code == 0, said.output
    assert "what-if" in typed.output and "inside their 95 % band" not in typed.output
    assert "inside their 95 % band: 6 of 6" in said.output and "what-if" not in said.output
    assert "max_num_seqs=128" in said.output


@pytest.mark.parametrize("pairs, want", [
    (["max_num_seqs"], "expected SETTING=VALUE"),
    (["colour=blue"], "expected SETTING=VALUE with a setting of"),
    (["max_num_seqs=lots"], "expected a whole number, not 'lots'"),
    (["max_num_seqs=1.5"], "expected a whole number, not '1.5'"),
    (["max_num_seqs=0"], "--measured-with 'max_num_seqs=0': expected"),
    # found by a helper: accepted and silently ignored, or taken as True, or the last one silently won
    (["tp=2"], "expected SETTING=VALUE with a setting of"),
    (["enable_prefix_caching=maybe"], "expected true or false"),
    (["max_num_seqs=4", "max_num_seqs=8"], "gives max_num_seqs twice, 4 and 8"),
    (["scheduler=bogus"], "--measured-with 'scheduler=bogus':"),
])
def test_a_bad_measured_with_is_one_clear_usage_error(spaced, pairs, want):
    args = [a for p in pairs for a in ("--measured-with", p)]
    res = invoke("t.parquet", "--calibration", "cal.json", *args)
    assert res.exit_code == 2 and want in " ".join(res.output.split()) and "Traceback" not in res.output, res.output


def test_a_disaggregated_replay_of_a_colocated_run_is_a_what_if_whatever_the_calibration_was_fitted_on(
        tmp_path, monkeypatch):
    """Found by a helper following the README: with a calibration fitted elsewhere (a kernel profile), a
    --scheduler disagg replay of a colocated run was scored as a validation and --tolerance judged it."""
    from traces.io import write_trace

    monkeypatch.chdir(tmp_path)
    trace = synth_requests(40, 2.0, "fixed:300", "fixed:20", seed=4)
    res, _ = replay_frame(trace, COST, ReplayConfig(EngineOptions()))
    write_trace(trace.assign(ttft_s=res["pred_ttft_s"], tpot_s=res["pred_tpot_s"], e2e_s=res["pred_e2e_s"]),
                REQUEST_TRACE, "run.parquet")
    write_cal("cal.json")  # fitted on another file, no engine settings recorded
    args = ["run.parquet", "--calibration", "cal.json", "--scheduler", "disagg", "--decode-replicas", 2]
    what_if = invoke(*args)
    assert what_if.exit_code == 0 and "BASELINE (measured) vs WHAT-IF" in what_if.output, what_if.output
    assert "--scheduler disagg (the measured run records no disaggregated pools)" in " ".join(what_if.output.split())
    gated = invoke(*args, "--tolerance", "ttft_p50=0.1")
    assert gated.exit_code == 2 and "what-if" in gated.output
