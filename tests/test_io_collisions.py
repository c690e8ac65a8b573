"""Outputs never overwrite inputs: every file-reading option of every command is an input, the
folder of a Markdown report's figures holds no other input or output, and a bad --vllm-log is
one error. Each refusal comes before any work (nothing is written)."""
import shutil
from pathlib import Path

import click
import pandas as pd
import pytest

from calibrate.umbrella import main as servecal
from helpers import flat, invoke_servecal as invoke, write_calibration, write_content
from replay.cost.cost_model import RooflineCostModel
from schemas.cost_params import CostParams
from schemas.specs import get_gpu, get_model
from schemas.tables import REQUEST_TRACE, to_table, write_table
from traces.cli.support import INPUT_PARAMS, OUTPUT_PARAMS, SPEC_PARAMS

DATA = Path(__file__).parent / "data"


@pytest.fixture
def files(tmp_path, monkeypatch):
    """A request trace, its calibration, a GPU spec, a model config folder, under short names."""
    monkeypatch.chdir(tmp_path)
    df = pd.DataFrame({"request_id": ["a", "b", "c"], "arrival_time_s": [0.0, 0.1, 0.2],
                       "num_prompt_tokens": [100, 200, 300], "num_output_tokens": [5, 6, 7],
                       "ttft_s": [0.05, 0.06, 0.07], "tpot_s": [0.01, 0.01, 0.01], "e2e_s": [0.1, 0.12, 0.14]})
    write_table(to_table(REQUEST_TRACE, df), tmp_path / "t.parquet")
    write_calibration(RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb"),
                                        CostParams(eta_compute=0.5, eta_mem=0.8, t_step_s=1e-4)), tmp_path / "cal.json")
    (tmp_path / "gpu.json").write_text('{"name": "x", "peak_flops": 1e15, "mem_bandwidth_bytes_per_s": 1e12, '
                                       '"mem_bytes": 8e10}')
    (tmp_path / "hf").mkdir()
    shutil.copy(DATA / "hf_config_deepseek_v2_lite.json", tmp_path / "hf" / "config.json")
    (tmp_path / "v.log").write_text("INFO 01-01 00:00:00 [api_server.py:1] vLLM API server version 0.11.0\n")
    shutil.copy(DATA / "vllm_otlp_small.jsonl", tmp_path / "spans.jsonl")
    shutil.copy(DATA / "guidellm_small.json", tmp_path / "g.json")
    return tmp_path


FIT = ["calibrate", "fit", "t.parquet"]
REPLAY = ["replay", "t.parquet", "--calibration", "cal.json"]


@pytest.mark.parametrize("victim,option,cmd", [
    # (the input an output names, the input's option as the message spells it, the command)
    ("gpu.json", "--gpu-spec", FIT + ["--model", "llama-3.1-8b", "--gpu-spec", "gpu.json", "-o", "gpu.json"]),
    ("gpu.json", "--gpu", FIT + ["--model", "llama-3.1-8b", "--gpu", "./gpu.json", "-o", "gpu.json"]),
    ("hf/config.json", "--model-config", FIT + ["--model-config", "hf/config.json", "--gpu", "h100-80gb",
                                                "-o", "hf/config.json"]),
    ("hf/config.json", "--model", FIT + ["--model", "hf/config.json", "--gpu", "h100-80gb", "-o", "hf/config.json"]),
    ("hf/config.json", "--model", FIT + ["--model", "./hf", "--gpu", "h100-80gb", "-o", "hf/config.json"]),
    ("v.log", "--vllm-log", FIT + ["--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--vllm-log", "v.log",
                                   "-o", "v.log"]),
    ("gpu.json", "--gpu-spec", ["calibrate", "validate", "--fit-on", "t.parquet", "--score-on", "t.parquet",
                                "--model", "llama-3.1-8b", "--gpu-spec", "gpu.json", "--table-out", "gpu.json"]),
    ("v.log", "--vllm-log", REPLAY + ["--vllm-log", "v.log", "-o", "v.log"]),
    ("hf/config.json", "--model", REPLAY + ["--model", "hf/config.json", "--steps-out", "hf/config.json"]),
    ("hf/config.json", "--model", ["traces", "describe", "t.parquet", "--calibration", "cal.json",
                                   "--model", "hf/config.json", "--plot", "hf/config.json"]),
    ("g.json", "--guidellm", ["traces", "import", "vllm-otlp", "spans.jsonl", "--guidellm", "g.json",
                              "-o", "g.json"]),
    ("t.parquet", "--align-to", ["traces", "import", "vllm-log", "v.log", "-o", "s.parquet", "--align-to",
                                 "t.parquet", "--timeseries-csv", "t.parquet"]),
    ("v.log", "SRC", ["traces", "import", "vllm-log", "v.log", "-o", "s.parquet", "--timeseries-csv", "v.log"]),
])
def test_an_output_never_overwrites_a_file_read_by_an_option(files, victim, option, cmd):
    before = (files / victim).read_bytes()
    res = invoke(*cmd)
    assert res.exit_code == 2, res.output
    assert f"the same file as the input {option}; choose another output name" in " ".join(res.output.split())
    assert (files / victim).read_bytes() == before
    assert not (files / "s.parquet").exists()


def test_every_file_option_of_every_command_is_checked():
    """Every parameter that names a file (click.Path, the file arguments, --model/--gpu) is one
    user_errors knows, by name: a new option cannot escape the check."""
    def commands(cmd, name):
        if isinstance(cmd, click.Group):
            for sub, c in cmd.commands.items():
                yield from commands(c, f"{name} {sub}")
        else:
            yield name, cmd

    # servecal demo's --out-dir: a folder it makes for its outputs; the demo reads no file
    known = set(INPUT_PARAMS) | set(OUTPUT_PARAMS) | set(SPEC_PARAMS) | {"out_dir"}
    unknown = [(name, p.name) for name, cmd in commands(servecal, "servecal") for p in cmd.params
               if isinstance(p.type, click.Path) and p.name not in known]
    assert unknown == []
    # and nothing else is called 'model' or 'gpu' unless it names a model or GPU spec
    for name, cmd in commands(servecal, "servecal"):
        for p in cmd.params:
            if p.name in SPEC_PARAMS:
                assert "Catalog key" in p.help or "catalog key" in p.help or "calibrated GPU" in p.help, (name, p.help)


def test_a_filter_named_like_a_file_is_no_input(files):
    """burstgpt's --model keeps one Model column value: not a file, so an output of that name is fine."""
    shutil.copy(DATA / "burstgpt_small.csv", files / "b.csv")
    (files / "ChatGPT").write_text("an unrelated file\n")
    res = invoke("traces", "import", "burstgpt", "b.csv", "--model", "ChatGPT", "-o", "ChatGPT")
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("content,message", [
    ("not a log\n", "--vllm-log v.log: has no vLLM log line; expected the stdout of 'vllm serve'"),
    (b"\xff\xfe\x00", "--vllm-log v.log, line 1: is not UTF-8 text; expected a vLLM server log"),
    (None, "--vllm-log v.log: no such file"),
])
@pytest.mark.parametrize("cmd", [REPLAY + ["-o", "r.parquet"],
                                 FIT + ["--model", "llama-3.1-8b", "--gpu", "h100-80gb", "-o", "r.parquet"]])
def test_a_bad_vllm_log_is_one_data_error(files, content, message, cmd):
    write_content(files / "v.log", content)
    res = invoke(*cmd, "--vllm-log", "v.log")
    assert res.exit_code == 1 and f"Error: {message}" in flat(res.output)
    assert not (files / "r.parquet").exists()


# --- the folder of a Markdown report's figures ----------------------------------------------------

def test_an_output_inside_the_report_folder_is_refused(files):
    (files / "rp_files").mkdir()
    (files / "rp_files" / "cdf.png").write_bytes(b"KEEP")
    res = invoke(*REPLAY, "--report", "rp.md", "-o", "rp_files/cdf.png")
    assert res.exit_code == 2 and "replaying" not in res.output
    assert ("-o/--output rp_files/cdf.png: inside the folder rp_files, which --report rp.md fills with its figures "
            "(replacing files of their names); choose another output name") in flat(res.output)
    assert (files / "rp_files" / "cdf.png").read_bytes() == b"KEEP" and not (files / "rp.md").exists()
    # any name inside the folder, the folder reached through a link, and every output option
    (files / "link").symlink_to(files / "rp_files")
    for option in ("--steps-out", "--chrome-trace"):
        res = invoke(*REPLAY, "--report", "rp.md", option, "link/x.json")
        assert res.exit_code == 2 and f"{option} link/x.json: inside the folder rp_files" in flat(res.output)
    assert sorted(p.name for p in (files / "rp_files").iterdir()) == ["cdf.png"]


def test_an_input_inside_the_report_folder_is_refused(files):
    (files / "cf_files").mkdir()
    ts = files / "cf_files" / "timeseries.png"
    ts.write_text("t,running,waiting\n0.0,1,0\n")
    shutil.copy(files / "t.parquet", files / "cf_files" / "t.parquet")
    res = invoke(*REPLAY, "--measured-timeseries", ts.relative_to(files), "--report", "cf.md", "-o", "o.parquet")
    assert res.exit_code == 2
    assert ("--measured-timeseries cf_files/timeseries.png: inside the folder cf_files, which --report cf.md fills "
            "with its figures (replacing files of their names); move it or choose another --report name"
            ) in flat(res.output)
    assert ts.read_text() == "t,running,waiting\n0.0,1,0\n" and not (files / "o.parquet").exists()
    res = invoke("replay", "cf_files/t.parquet", "--calibration", "cal.json", "--report", "cf.md")
    assert res.exit_code == 2 and "TRACE cf_files/t.parquet: inside the folder cf_files" in flat(res.output)


def test_a_file_in_the_way_of_the_report_folder_is_refused_before_any_output(files):
    (files / "ff_files").write_text("a file, not a folder\n")
    res = invoke(*REPLAY, "--report", "ff.md", "-o", "ff.parquet", "--steps-out", "s.parquet")
    assert res.exit_code == 2 and "replaying" not in res.output
    assert ("--report ff.md: writes its figures into the folder ff_files, but that is a file; move it or choose "
            "another --report name") in flat(res.output)
    assert not (files / "ff.parquet").exists() and not (files / "s.parquet").exists()
    assert (files / "ff_files").read_text() == "a file, not a folder\n"


def test_an_html_report_has_no_folder_to_keep_clear(files):
    (files / "rp_files").mkdir()
    res = invoke(*REPLAY, "--report", "rp.html", "-o", "rp_files/cdf.parquet")
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in (files / "rp_files").iterdir()) == ["cdf.parquet"]
    (files / "ff_files").write_text("x")
    assert invoke(*REPLAY, "--report", "ff.html").exit_code == 0


# --- the reports of replay --sweep, --compare-schedulers and plan ----------------------------------

@pytest.mark.parametrize("cmd", [
    REPLAY + ["--sweep", "max-num-seqs=1,2", "--jobs", "1", "--sweep-out", "rp_files/s.csv"],
    REPLAY + ["--compare-schedulers", "fcfs,chunked", "--measured-timeseries", "rp_files/s.csv"],
    ["plan", "t.parquet", "--calibration", "cal.json", "--slo", "ttft_p90=2s", "--jobs", "1", "-o", "rp_files/s.csv"],
])
def test_the_table_reports_keep_their_figure_folder_clear(files, cmd):
    (files / "rp_files").mkdir()
    (files / "rp_files" / "s.csv").write_text("KEEP\n")
    res = invoke(*cmd, "--report", "rp.md")
    assert res.exit_code == 2, res.output
    assert "rp_files/s.csv: inside the folder rp_files, which --report rp.md fills with its figures" in flat(res.output)
    assert (files / "rp_files" / "s.csv").read_text() == "KEEP\n" and not (files / "rp.md").exists()


def test_plan_report_is_an_output_never_an_input(files):
    before = (files / "cal.json").read_bytes()
    (files / "c.md").write_bytes(before)
    res = invoke("plan", "t.parquet", "--calibration", "c.md", "--slo", "ttft_p90=2s", "--report", "c.md")
    assert res.exit_code == 2 and "the same file as the input --calibration" in flat(res.output)
    assert (files / "c.md").read_bytes() == before
