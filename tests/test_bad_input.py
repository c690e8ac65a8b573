"""Faults found by trying to break the CLI: each gives one message and the right exit code, before any work."""
import json

import pandas as pd
import pytest
from click.testing import CliRunner

from calibrate.umbrella import main as servecal
from helpers import flat, write_calibration
from schemas.specs import get_gpu, get_model
from schemas.tables import REQUEST_TRACE, to_table, write_table
from replay.cost.cost_model import RooflineCostModel
from schemas.cost_params import CostParams


def invoke(*args):
    res = CliRunner().invoke(servecal, [str(a) for a in args])
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output
    return res


@pytest.fixture
def files(tmp_path):
    df = pd.DataFrame({"request_id": ["a", "b", "c"], "arrival_time_s": [0.0, 0.1, 0.2],
                       "num_prompt_tokens": [100, 200, 300], "num_output_tokens": [5, 6, 7],
                       "ttft_s": [0.05, 0.06, 0.07], "tpot_s": [0.01, 0.01, 0.01], "e2e_s": [0.1, 0.12, 0.14]})
    write_table(to_table(REQUEST_TRACE, df), tmp_path / "t.parquet")
    write_calibration(RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb"),
                                        CostParams(eta_compute=0.5, eta_mem=0.8, t_step_s=1e-4)), tmp_path / "cal.json")
    return tmp_path


@pytest.mark.parametrize("field,value", [("eta_compute", -0.5), ("eta_mem", float("nan")), ("eta_mem", "0.9"),
                                         ("t_step_s", -1.0), ("t_step_s", 1e300), ("eta_compute", 1e-320)])
def test_calibration_with_bad_values(files, field, value):
    d = json.loads((files / "cal.json").read_text())
    d["params"][field]["value"] = value
    (files / "bad.json").write_text(json.dumps(d))
    res = invoke("replay", files / "t.parquet", "--calibration", files / "bad.json")
    assert res.exit_code == 1 and "bad.json" in res.output and f"params.{field}.value" in res.output


def test_calibration_with_bad_term_or_tp(files):
    d = json.loads((files / "cal.json").read_text())
    d["terms"], d["tp"] = ["median"], 1
    (files / "bad.json").write_text(json.dumps(d))
    res = invoke("replay", files / "t.parquet", "--calibration", files / "bad.json")
    assert res.exit_code == 1 and "bad.json" in res.output and "unknown cost term(s) median" in res.output
    d["terms"], d["tp"] = ["dense_compute"], 0
    (files / "bad.json").write_text(json.dumps(d))
    res = invoke("replay", files / "t.parquet", "--calibration", files / "bad.json")
    assert res.exit_code == 1 and "tp is 0" in res.output


def test_calibration_1_files_still_read(tmp_path):
    d = {"servecal.schema": "calibration/1", "model": get_model("llama-3.1-8b").to_dict(),
         "gpu": get_gpu("h100-80gb").to_dict(), "tp": 1, "form": "sum",
         "params": {"eta_compute": {"value": 0.5}, "eta_mem": {"value": 0.8}, "t_launch_s": {"value": 1e-4},
                    "t_cpu_s": {"value": 2e-4}}}
    (tmp_path / "old.json").write_text(json.dumps(d))
    from schemas.calibration import Calibration

    cal = Calibration.read(tmp_path / "old.json")
    assert cal.value("t_step_s") == pytest.approx(3e-4) and cal.value("overlap") == 1.0 and cal.form == "sum"


def test_output_equal_to_input_is_refused_and_input_kept(files):
    before = (files / "cal.json").read_bytes()
    res = invoke("replay", files / "t.parquet", "--calibration", files / "cal.json", "-o", files / "cal.json")
    assert res.exit_code == 2 and "the same file as the input" in res.output.replace("\n  ", " ")
    assert (files / "cal.json").read_bytes() == before
    res = invoke("replay", files / "t.parquet", "--calibration", files / "cal.json", "-o", files / "x.parquet",
                 "--steps-out", files / "x.parquet")
    assert res.exit_code == 2 and "--steps-out" in res.output


def test_a_bad_second_output_does_not_cost_the_first(files):
    (files / "k.parquet").write_bytes(b"KEEP")
    res = invoke("replay", files / "t.parquet", "--calibration", files / "cal.json", "-o", files / "k.parquet",
                 "--report", files / "nope" / "r.md")
    assert res.exit_code == 2 and "does not exist" in flat(res.output)
    assert (files / "k.parquet").read_bytes() == b"KEEP"
    assert not (files / "nope").exists()


def test_output_folder_is_never_created_silently(files):
    res = invoke("traces", "synth", "--requests", 5, "--rate", 1, "-o", files / "no" / "where" / "s.parquet")
    assert res.exit_code == 2 and "does not exist" in flat(res.output) and not (files / "no").exists()


def test_unwritable_output_is_one_message(files):
    res = invoke("calibrate", "fit", files / "t.parquet", "--model", "llama-3.1-8b", "--gpu", "h100-80gb",
                 "--jobs", "1", "-o", "/proc/c.json")
    # as root the folder looks writable, so the failure shows only at the write: still one message
    assert res.exit_code in (1, 2) and "/proc/c.json: cannot write" in res.output


def test_negative_seed_and_bad_lengths(files):
    assert invoke("traces", "synth", "--requests", 5, "--rate", 1, "--seed", -1,
                  "-o", files / "s.parquet").exit_code == 2
    res = invoke("traces", "synth", "--requests", 5, "--rate", 1, "--prompt-tokens", "fixed:99999999999999999999",
                 "-o", files / "s.parquet")
    assert res.exit_code == 2 and "--prompt-tokens" in res.output or "length distribution" in res.output
    assert not (files / "s.parquet").exists()


def test_binary_vllm_request_stats(files):
    (files / "b.jsonl").write_bytes(bytes(range(256)) * 4)
    res = invoke("traces", "import", "vllm-request-stats", files / "b.jsonl", "-o", files / "o.parquet")
    assert res.exit_code == 1 and "not UTF-8" in res.output and "b.jsonl" in res.output


def test_absolute_timestamps_are_refused(files):
    df = pd.DataFrame({"request_id": ["a", "b"], "arrival_time_s": [1.7e15, 1.7e15 + 1],
                       "num_prompt_tokens": [10, 10], "num_output_tokens": [2, 2]})
    write_table(to_table(REQUEST_TRACE, df), files / "abs.parquet", )
    res = invoke("traces", "validate", files / "abs.parquet")
    assert res.exit_code == 1 and "absolute timestamp" in res.output and "arrival_time_s" in res.output


def test_plot_format_checked_before_work(files):
    res = invoke("traces", "describe", files / "t.parquet", "--plot", files / "x.xyz")
    assert res.exit_code == 2 and "--plot" in res.output


def test_tolerance_typo_is_a_usage_error(files):
    res = invoke("replay", files / "t.parquet", "--calibration", files / "cal.json", "--tolerance", "TTFT_P50=0.1")
    assert res.exit_code == 2 and "--tolerance" in res.output and "replaying" not in res.output


@pytest.mark.parametrize("value", ["ttft_p50=-0.1", "ttft_p50=nan", "ttft_p50", "ttft_p50=x"])
def test_negative_or_missing_tolerance_is_a_usage_error_without_assert(value):
    """Checked by a condition, not an assert (python -O strips asserts)."""
    import click

    from replay.cli.options import parse_tolerances

    with pytest.raises(click.BadParameter, match="expected metric_stat=fraction"):
        parse_tolerances(value)


def test_tp_must_divide_attention_heads(files):
    res = invoke("replay", files / "t.parquet", "--calibration", files / "cal.json", "--tp", 3)
    assert res.exit_code == 2 and "does not divide the 32 attention heads" in res.output


def test_unknown_interconnect_in_a_gpu_spec(files, tmp_path):
    (tmp_path / "g.json").write_text(json.dumps({"name": "g", "peak_flops": 1e15, "mem_bandwidth_bytes_per_s": 2e12,
                                                 "mem_bytes": 80e9, "tp_link": "carrier-pigeon"}))
    steps = files / "t.parquet"
    res = invoke("calibrate", "fit", steps, "--model", "llama-3.1-8b", "--gpu-spec", tmp_path / "g.json",
                 "--max-num-seqs", 4, "-o", tmp_path / "c.json")
    assert res.exit_code == 2 and "carrier-pigeon" in res.output


def test_request_fit_config_errors_and_nothing_simulable(files):
    res = invoke("calibrate", "fit", files / "t.parquet", "--model", "llama-3.1-8b", "--gpu", "h100-80gb",
                 "--scheduler", "foo", "-o", files / "c.json")
    assert res.exit_code == 2 and "--scheduler foo" in res.output
    res = invoke("calibrate", "fit", files / "t.parquet", "--model", "llama-3.1-8b", "--gpu", "h100-80gb",
                 "--max-model-len", 50, "--jobs", 1, "-o", files / "c.json")
    assert res.exit_code == 1 and "no request can be simulated" in res.output
    assert not (files / "c.json").exists()


def test_calibration_with_a_broken_model_spec_names_the_file(files):
    d = json.loads((files / "cal.json").read_text())
    del d["model"]["num_layers"]
    (files / "bad.json").write_text(json.dumps(d))
    res = invoke("replay", files / "t.parquet", "--calibration", files / "bad.json")
    assert res.exit_code == 1 and "bad.json" in res.output and "num_layers" in res.output
    d = json.loads((files / "cal.json").read_text())
    (files / "bad.json").write_text(json.dumps(d).replace('"tp": 1', '"tp": ' + "9" * 5000))
    res = invoke("replay", files / "t.parquet", "--calibration", files / "bad.json")
    assert res.exit_code == 1 and "bad.json" in res.output and "Traceback" not in res.output


# --- faults found by a tester trying to break the fits (each a kind, fixed for every command) ---

@pytest.mark.parametrize("cmd", [
    ["calibrate", "fit", "{t}#0", "-o", "{t}"],
    ["calibrate", "fit", "{t}@0:1", "-o", "{t}"],
    ["calibrate", "validate", "--fit-on", "{t}", "--score-on", "{t}", "--table-out", "{t}"],
    ["calibrate", "validate", "--fit-on", "{t}#0", "--score-on", "{t}", "-o", "{t}"],
])
def test_a_fit_never_writes_over_its_input(files, cmd):
    """FILE#K and FILE@START:END read FILE: an output of that name is refused before any work."""
    t = files / "t.parquet"
    before = t.read_bytes()
    res = invoke(*[a.format(t=t) for a in cmd], "--model", "llama-3.1-8b", "--gpu", "h100-80gb")
    assert res.exit_code == 2 and "the same file as the input" in res.output.replace("\n  ", " ")
    assert t.read_bytes() == before


def test_blis_output_is_not_the_csv_beside_the_header(tmp_path):
    from pathlib import Path

    for suffix in ("yaml", "csv"):
        (tmp_path / f"a.{suffix}").write_bytes((Path(__file__).parent / "data" / f"blis_observe_trace.{suffix}")
                                               .read_bytes())
    before = (tmp_path / "a.csv").read_bytes()
    res = invoke("traces", "import", "blis-observe", tmp_path / "a.yaml", "-o", tmp_path / "a.csv")
    assert res.exit_code == 2 and "the same file as the input" in res.output.replace("\n  ", " ")
    assert (tmp_path / "a.csv").read_bytes() == before


def test_a_benchmark_number_in_other_digits_is_one_error(files):
    res = invoke("calibrate", "fit", f"{files / 't.parquet'}#²", "--model", "llama-3.1-8b", "--gpu", "h100-80gb",
                 "-o", files / "c.json")
    assert res.exit_code == 2 and "with K a benchmark number" in res.output


@pytest.mark.parametrize("window", ["@5:3", "@a:b", "@", "@1_0:20", "@-1:2", "@inf:"])
def test_a_bad_window_is_a_usage_error(files, window):
    """A run spec is an argument: a bad window is bad usage (exit 2; it was 1), and what float()
    takes beyond plain decimals and inf (1_0 = 10, a sign) is not a window."""
    res = invoke("calibrate", "fit", f"{files / 't.parquet'}{window}", "--model", "llama-3.1-8b", "--gpu",
                 "h100-80gb", "-o", files / "c.json")
    assert res.exit_code == 2 and "expected a time window @START:END" in flat(res.output)


def test_a_file_whose_name_holds_at_or_hash_is_read_as_named(files):
    import shutil

    for name in ("r#1.parquet", "a@b.parquet"):
        shutil.copyfile(files / "t.parquet", files / name)
        res = invoke("calibrate", "fit", files / name, "--model", "llama-3.1-8b", "--gpu", "h100-80gb",
                     "--variants", "max", "--jobs", "1", "-o", files / "c.json")
        assert res.exit_code == 0, res.output


def test_nothing_left_to_fit_is_one_error(files):
    res = invoke("calibrate", "fit", files / "t.parquet", "--model", "llama-3.1-8b", "--gpu", "h100-80gb",
                 "--variants", "max", "--free", "overlap", "-o", files / "c.json")
    assert res.exit_code == 1 and "no parameter left to fit" in res.output


def test_a_tiny_log_fits_without_a_confidence_set(files):
    """Three requests do not vary under resampling the way a covariance needs: the fit says
    its intervals come from the delta method instead of failing (was: LinAlgError)."""
    res = invoke("calibrate", "fit", files / "t.parquet", "--model", "llama-3.1-8b", "--gpu", "h100-80gb",
                 "--variants", "max", "--jobs", "1", "-o", files / "c.json")
    assert res.exit_code == 0, res.output


def test_validate_scores_a_run_the_fit_saw_in_sample(files):
    """--score-on naming a --fit-on run is said and scored "in", never "out" of sample."""
    t = files / "t.parquet"
    res = invoke("calibrate", "validate", "--fit-on", t, "--score-on", t, "--model", "llama-3.1-8b",
                 "--gpu", "h100-80gb", "--variants", "max", "--jobs", "1", "--table-out", files / "e.csv")
    assert res.exit_code == 0, res.output
    assert "run(s) whose requests the fit sees" in res.stderr.replace("\n  ", " ")
    assert set(pd.read_csv(files / "e.csv")["sample"]) == {"in"}


@pytest.mark.parametrize("fit_on,score_on", [("t.parquet@0:10", "./t.parquet@0:10"), ("t.parquet", "t.parquet@0.05:1"),
                                             ("t.parquet@0:0.15", "t.parquet@0.05:1"), ("t.parquet", "copy.parquet"),
                                             ("t.parquet", "slice.parquet")])
def test_validate_knows_a_run_the_fit_saw_under_another_name(files, fit_on, score_on, monkeypatch):
    """The same measured requests named another way (a path spelled differently, a window inside
    the fit's run, overlapping windows, a byte-identical copy, a slice written by `traces slice`)
    are in sample too (they were scored "out")."""
    import shutil

    shutil.copyfile(files / "t.parquet", files / "copy.parquet")
    assert invoke("traces", "slice", files / "t.parquet", "--start", "0.05",
                  "-o", files / "slice.parquet").exit_code == 0
    monkeypatch.chdir(files)
    res = invoke("calibrate", "validate", "--fit-on", fit_on, "--score-on", score_on, "--model", "llama-3.1-8b",
                 "--gpu", "h100-80gb", "--variants", "max", "--jobs", "1", "--table-out", "e.csv")
    assert res.exit_code == 0, res.output
    assert set(pd.read_csv(files / "e.csv")["sample"]) == {"in"}


def test_validate_scores_a_disjoint_window_out_of_sample(files, monkeypatch):
    monkeypatch.chdir(files)
    res = invoke("calibrate", "validate", "--fit-on", "t.parquet@0:0.15", "--score-on", "t.parquet@0.15:", "--model",
                 "llama-3.1-8b", "--gpu", "h100-80gb", "--variants", "max", "--jobs", "1", "--table-out", "e.csv")
    assert res.exit_code == 0, res.output
    assert list(pd.read_csv(files / "e.csv").drop_duplicates("run")["sample"]) == ["in", "out"]


def test_validate_refuses_a_table_out_suffix_before_the_fit(files):
    """A --table-out of no known format is refused by its own name before the fit and before -o
    is written (it was named --sweep-out, after both)."""
    res = invoke("calibrate", "validate", "--fit-on", files / "t.parquet", "--score-on", files / "t.parquet",
                 "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--table-out", files / "tab.txt",
                 "-o", files / "v.json")
    assert res.exit_code == 2 and "--table-out" in res.output and "fitting" not in res.output
    assert not (files / "v.json").exists()


@pytest.mark.parametrize("args,phrase", [
    (["--fix", "eta_mem=0.5", "--fix", "eta_mem=0.6"], "eta_mem is given twice"),
    (["--fix", "eta_mem=0.5", "--free", "eta_mem,t_step_s"], "eta_mem: both held (--fix) and freed (--free)"),
    ([a for n in ("eta_compute=0.5", "n_half_tokens=0", "eta_mem=0.8", "t_step_s=0", "t_seq_s=0",
                  "t_allreduce_hop_s=0", "t_alltoall_s=0", "t_frontend_s=0") for a in ("--fix", n)],
     "no parameter left to fit"),
])
def test_contradictory_fix_and_free_are_usage_errors_before_the_fit(files, args, phrase):
    res = invoke("calibrate", "fit", files / "t.parquet", "--model", "llama-3.1-8b", "--gpu", "h100-80gb", *args,
                 "-o", files / "c.json")
    assert res.exit_code == 2 and phrase in flat(res.output) and "fitting" not in res.output


def test_free_overlap_alone_fits_the_blend(files):
    """--free overlap with the default variants fits the blend (max and sum hold overlap: it
    aborted with 'no parameter left to fit')."""
    res = invoke("calibrate", "fit", files / "t.parquet", "--model", "llama-3.1-8b", "--gpu", "h100-80gb",
                 "--free", "overlap", "--jobs", "1", "-o", files / "c.json")
    assert res.exit_code == 0, res.output
    assert json.loads((files / "c.json").read_text())["params"]["overlap"]["vary"]


def test_validate_on_a_run_whose_settings_admit_no_request_is_an_error(files):
    """A --score-on run none of whose requests the engine admits was dropped from the table with
    exit 0; it is one error naming the run and why."""
    # request a (105 tokens) fits in max_model_len 150; b and c, the ones scored, do not
    res = invoke("calibrate", "validate", "--fit-on", files / "t.parquet@0:0.05", "--score-on",
                 files / "t.parquet@0.05:", "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--variants", "max",
                 "--jobs", "1", "--max-model-len", "150")
    message = flat(res.output)
    assert res.exit_code == 1, res.output
    assert "no request can be simulated" in message and "exceeds max_model_len" in message


def test_a_bad_spec_file_is_a_data_error_an_unknown_key_a_usage_error(files):
    """A GPU spec or model config file whose content is not a spec is bad data (exit 1, naming
    the file; it was 2); a catalog key that does not exist stays bad usage (2)."""
    (files / "gpu.json").write_text('{"name": "x"}')
    (files / "config.json").write_text('{"model_type": "llama"}')
    res = invoke("calibrate", "fit", files / "t.parquet", "--model", "llama-3.1-8b", "--gpu-spec",
                 files / "gpu.json", "-o", files / "c.json")
    assert res.exit_code == 1 and f"{files / 'gpu.json'}: missing field(s)" in res.output
    res = invoke("calibrate", "fit", files / "t.parquet", "--model-config", files / "config.json", "--gpu",
                 "h100-80gb", "-o", files / "c.json")
    assert res.exit_code == 1 and str(files / "config.json") in "".join(res.output.split()), res.output
    res = invoke("calibrate", "fit", files / "t.parquet", "--model", "no-such-model", "--gpu", "h100-80gb",
                 "-o", files / "c.json")
    assert res.exit_code == 2 and "unknown model" in res.output


def test_validate_prints_the_runs_it_moved_in_sample(files, monkeypatch):
    """An overlapping --score-on run is scored "in" and shown (its row was dropped); window
    bounds are named exactly (10.1200926, not 10.1201, which decided overlaps wrongly)."""
    monkeypatch.chdir(files)
    res = invoke("calibrate", "validate", "--fit-on", "t.parquet@0:0.1000001", "--score-on", "t.parquet@0.05:1",
                 "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--variants", "max", "--jobs", "1",
                 "--table-out", "e.csv")
    assert res.exit_code == 0, res.output
    table = pd.read_csv(files / "e.csv").drop_duplicates("run")
    assert table["run"].tolist() == ["t.parquet@0:0.1000001", "t.parquet@0.05:1"]
    assert table["sample"].tolist() == ["in", "in"]


def test_validate_knows_the_runs_a_fix_from_calibration_was_fitted_on(files, monkeypatch):
    """The values --fix-from holds were fitted on CAL's runs: scoring those is in sample."""
    monkeypatch.chdir(files)
    hw = ["--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--variants", "max", "--jobs", "1"]
    assert invoke("calibrate", "fit", "t.parquet@0:0.05", *hw, "-o", "first.json").exit_code == 0
    res = invoke("calibrate", "validate", "--fit-on", "t.parquet@0.05:1", "--score-on", "t.parquet@0:0.05", *hw,
                 "--fix-from", "first.json", "--free", "t_step_s", "--table-out", "e.csv")
    assert res.exit_code == 0, res.output
    assert "fitted on requests of" in flat(res.output)
    assert set(pd.read_csv(files / "e.csv")["sample"]) == {"in"}


def test_a_step_trace_fitted_at_another_tp_than_it_records_is_warned(tmp_path):
    """Like a request log, a step trace (a kernel profile) whose metadata says TP 1 is fitted at
    --tp 2 only with a warning saying so (it was silent)."""
    from traces.io import write_trace

    rows = [(0, 0.01 * i, 0.01, 100 * (i % 3), 1 if i % 3 else 0, 8, 8 * 500, 0) for i in range(30)]
    steps = pd.DataFrame(rows, columns=["replica_id", "step_start_time_s", "step_duration_s", "num_prefill_tokens",
                                        "num_prefill_seqs", "num_decode_seqs", "decode_context_tokens",
                                        "prefill_context_tokens"])
    write_trace(steps, "step_trace/1", tmp_path / "steps.parquet", {"tp": "1"})
    res = invoke("calibrate", "fit", tmp_path / "steps.parquet", "--model", "llama-3.1-8b", "--gpu", "h100-80gb",
                 "--tp", "2", "--variants", "max", "-o", tmp_path / "c.json")
    assert "the trace says tp 1; fitting it as --tp 2" in flat(res.output), res.output


def test_validate_scores_another_log_with_the_same_request_ids_out_of_sample(files, monkeypatch):
    """Two logs of different runs both number their requests from 0 (LLMServingSim's bench-0..):
    the ids alone do not make them the same requests."""
    other = pd.read_parquet(files / "t.parquet").assign(ttft_s=[0.08, 0.09, 0.1])
    write_table(to_table(REQUEST_TRACE, other), files / "other.parquet")
    monkeypatch.chdir(files)
    res = invoke("calibrate", "validate", "--fit-on", "t.parquet", "--score-on", "other.parquet", "--model",
                 "llama-3.1-8b", "--gpu", "h100-80gb", "--variants", "max", "--jobs", "1", "--table-out", "e.csv")
    assert res.exit_code == 0, res.output
    assert list(pd.read_csv(files / "e.csv").drop_duplicates("run")["sample"]) == ["in", "out"]
