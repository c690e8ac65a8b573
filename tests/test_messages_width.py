"""Messages people read, within 100 columns and saying what to do: the other commands of the
README and docs/ (issue #12: the catalog, imports, describe, calibrate fit's warnings), errors and
usage errors found by a new user, and every command's help. The fixture and helpers are
``test_output_width.py``'s."""
import pandas as pd
import pytest
from click.testing import CliRunner

from replay.text import WIDTH, wrap
from schemas.tables import REQUEST_TRACE
from traces.synth import synth_requests

import test_output_width
from test_output_width import invoke, widest

#: test_output_width's fixture, bound here for its tests (imported by name, a fixture argument would
#: redefine the import: ruff's F811)
files = test_output_width.files


# -- the other commands of the README and docs/ (issue #12) ----------------------------------------

def test_calibrate_catalog_is_a_table_within_100_columns_and_name_shows_every_value():
    from calibrate.cli import main as calibrate_main
    from schemas.specs import list_gpus, list_models

    res = CliRunner().invoke(calibrate_main, ["catalog"])
    assert res.exit_code == 0, res.output
    assert widest(res.output) <= WIDTH, res.output
    keys = [line.split()[0] for line in res.output.splitlines() if line.startswith("  ") and line[2] != " "]
    assert set(keys) >= {r["key"] for r in list_gpus() + list_models()}
    assert "TFLOP/s" in res.output and "KV B/token" in res.output and "--name KEY" in res.output
    one = CliRunner().invoke(calibrate_main, ["catalog", "--name", "rtx-pro-6000"])
    assert one.exit_code == 0 and widest(one.output) <= WIDTH, one.output
    assert "peak_flops_source:" in one.output and "RTXPRO6000" in one.output
    bad = CliRunner().invoke(calibrate_main, ["catalog", "--name", "rtx-9999"])
    assert bad.exit_code == 2 and "calibrate catalog" in bad.output


def test_import_summaries_fit_100_columns(real_data_dir, tmp_path, monkeypatch):
    from calibrate.umbrella import main as servecal

    monkeypatch.chdir(tmp_path)
    runs = (("guidellm", "guidellm_results_codellama34b_prefill_sweep.json", "block_hashes:"),
            ("vllm-log", "blis_eval_codellama34b_prefill_sweep_vllm.log", "engine: max_num_seqs=32"),
            ("summary", "guidellm_results_codellama34b_prefill_sweep.json", "5 level(s)"))
    for fmt, name, said in runs:
        importer = ["summary", "guidellm"] if fmt == "summary" else [fmt]
        res = CliRunner().invoke(servecal, ["traces", "import", *importer, str(real_data_dir / name),
                                            "-o", f"{fmt}.parquet"])
        assert res.exit_code == 0, res.output
        assert said in res.output and widest(res.output) <= WIDTH, res.output
        assert all(line.startswith("  ") for line in res.output.splitlines()[2:]), res.output


def test_describe_rho_line_fits_100_columns(files):
    from calibrate.umbrella import main as servecal
    from traces.io import write_trace

    df = synth_requests(200, 50.0, "lognormal:mean=4000,sigma=0.3", "lognormal:mean=400,sigma=0.3", seed=2)
    write_trace(df, REQUEST_TRACE, "busy.parquet")
    res = CliRunner().invoke(servecal, ["traces", "describe", "busy.parquet", "--calibration", files[1]])
    assert res.exit_code == 0, res.output
    assert "rho >= 1" in res.output and widest(res.output) <= WIDTH, res.output


def test_errors_fit_100_columns_and_say_what_to_do(files):
    from calibrate.umbrella import main as servecal

    trace, cal = files
    pd.DataFrame({"a": [1, 2]}).to_csv("log.csv", index=False)
    cases = ((["replay", trace, "--calibration", cal, "--scheduler", "chunkd"], 2, "package.module:ClassName"),
             (["replay", trace, "--calibration", cal, "--tolerance", "latency_p50=0.1"], 2, "mape"),
             (["traces", "validate", "log.csv"], 1, "traces import csv log.csv -o run.parquet"),
             (["replay", "log.csv", "--calibration", cal], 1, "traces import <format>"))
    for args, code, said in cases:
        res = CliRunner().invoke(servecal, args)
        assert res.exit_code == code, res.output
        assert widest(res.output) <= WIDTH, res.output
        assert said in res.output.replace("\n  ", " "), res.output
    assert "not a Parquet file" in res.output and "parquet )" not in res.output


def test_a_damaged_parquet_file_is_cut_at_a_word():
    from schemas.tables import parquet_reason

    class Long(Exception):
        pass

    msg = parquet_reason(__file__, Long("word " * 100))
    assert msg.startswith("not a Parquet file")  # a .py file: import it first
    import pathlib
    damaged = pathlib.Path(__file__).parent / "data" / "__damaged_for_test.parquet"
    try:
        damaged.write_bytes(b"PAR1" + b"x" * 10 + b"PAR1")
        msg = parquet_reason(damaged, Long("abcdefghij " * 30))
    finally:
        damaged.unlink()
    assert msg.startswith("not a readable Parquet file (") and msg.endswith("abcdefghij ...)"), msg


@pytest.mark.parametrize("cmd", ["calibrate", "replay"])
def test_a_model_name_not_in_the_catalog_is_refused_with_the_closest(files, cmd):
    from calibrate.umbrella import main as servecal

    trace, cal = files
    args = (["calibrate", "fit", trace, "--gpu", "h100-80gb", "-o", "c.json"] if cmd == "calibrate"
            else ["replay", trace, "--calibration", cal])
    res = CliRunner().invoke(servecal, args + ["--model", "llama3-8b"])
    assert res.exit_code == 2, res.output
    assert "unknown model 'llama3-8b'. Did you mean 'llama-3-8b'" in res.output.replace("\n  ", " ")
    assert widest(res.output) <= WIDTH, res.output
    assert "llama-3-8b on" not in res.output  # nothing was replayed with another model


def test_calibrate_fit_says_each_warning_once_on_stderr(files):
    from calibrate.cli import main as calibrate_main

    from traces.io import read_trace, write_trace

    trace, _ = files
    # the first 40 requests (up to 25 at once) give the warnings of all 300, in a sixth of the time
    kind, df, meta = read_trace(trace)
    write_trace(df.head(40), kind, "t40.parquet", meta)
    res = CliRunner().invoke(calibrate_main, ["fit", "t40.parquet", "--model", "llama-3.1-8b", "--gpu", "h100-80gb",
                                              "--max-num-seqs", "8", "--variants", "max", "--jobs", "1",
                                              "-o", "c.json"])
    assert res.exit_code == 0, res.output
    assert widest(res.output) <= WIDTH, res.output
    warnings = [line for line in res.stderr.splitlines() if line.startswith("warning: ")]
    assert warnings and "requests running at once, above --max-num-seqs 8" in res.stderr
    for w in warnings:
        head = w.split(",")[0]
        assert res.output.count(head) == 1, (head, res.output)
    for line in res.stdout.splitlines():
        assert not line.lstrip().startswith("the data allow"), res.stdout  # said in the warning


def test_a_passing_tolerance_says_so(files):
    trace, cal = files
    res = invoke(trace, "--calibration", cal, "--max-num-seqs", 32, "--tolerance", "ttft_p50=100,e2e_p90=100")
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[-1] == "tolerance: all 2 checks pass"


# -- usage errors, help and messages found by a new user -------------------------------------------

def test_wrap_fills_lines_rather_than_breaking_early_after_a_comma():
    from schemas.errors import SpecError
    from schemas.specs import get_model
    from schemas.text import SLACK

    warning = ("warning: n_half_tokens: NOT IDENTIFIED, its confidence set could not be traced (every step "
               "from the optimum left it)")
    assert wrap(warning).splitlines()[0].startswith("warning: n_half_tokens: NOT IDENTIFIED, its confidence set")
    with pytest.raises(SpecError) as err:
        get_model("llama")  # the known models follow a long "Did you mean" and end in a sentence
    for line in (warning, "Error: " + str(err.value)):
        text = wrap(line)
        lines = text.splitlines()
        assert widest(text) <= WIDTH and len(lines) > 1, text
        assert all(len(out) >= WIDTH - SLACK for out in lines[:-1]), text  # no line left short
        assert text.split() == line.split()


@pytest.mark.parametrize("args, said", [
    (["calibrate", "fit", "t.parquet", "--model", "llama-3.1-8b", "--gpu", "rtx-pro-6000", "--fix", "foo=1",
      "-o", "c.json"], "Invalid value for --fix: 'foo=1': unknown cost parameter 'foo'; known: eta_compute,"),
    (["calibrate", "fit", "t.parquet", "--model", "llama-3.1-8b", "--gpu", "rtx-pro-6000", "--terms", "foo",
      "-o", "c.json"], "Invalid value for --terms: 'foo': expected names from step_overhead,"),
    (["replay", "t.parquet", "--calibration", "cal.json", "--tolerance", "ttft_p50=abc"],
     "Invalid value for --tolerance: 'ttft_p50=abc': expected metric_stat=fraction, e.g. ttft_p50=0.1"),
    # click's own parsing of an option, before the command runs
    (["replay", "t.parquet", "--calibration", "cal.json", "--link", "foo"],
     "Invalid value for '--link': 'foo' is not one of 'pcie4', 'pcie5',"),
    (["replay", "t.parquet", "--calibration", "cal.json", "--router", "foo"],
     "Invalid value for '--router': 'foo' is not one of 'round_robin', 'least_loaded', 'prefix_affinity'."),
    (["calibrate", "fit", "t.parquet", "--fit-on-nothing"], "No such option '--fit-on-nothing'"),
])
def test_usage_errors_fit_100_columns_everywhere(files, args, said):
    """Every root command (servecal, replay, calibrate, traces) folds its usage errors, whether
    click's parsing or the command raised them; the message and click's usage lines stay."""
    import importlib

    roots = {"servecal": ("calibrate.umbrella", "main"), "replay": ("replay.cli", "main"),
             "calibrate": ("calibrate.cli", "main")}
    for root in ("servecal", args[0]):
        cmd = getattr(importlib.import_module(roots[root][0]), roots[root][1])
        res = CliRunner().invoke(cmd, args if root == "servecal" else args[1:])
        assert res.exit_code == 2, res.output
        assert widest(res.output) <= WIDTH, res.output
        assert res.output.startswith("Usage: ") and "Try '" in res.output, res.output
        assert said in res.output.replace("\n  ", " "), res.output


def test_a_group_without_a_command_still_prints_its_help():
    from traces.cli import main as traces_main

    res = CliRunner().invoke(traces_main, [])
    assert "Commands:" in res.output and "Error" not in res.output, res.output


def test_every_help_fits_100_columns():
    import click

    from calibrate.umbrella import main as servecal

    def walk(cmd, path):
        yield path
        if isinstance(cmd, click.Group):
            ctx = click.Context(cmd)
            for name in cmd.list_commands(ctx):
                yield from walk(cmd.get_command(ctx, name), path + [name])

    paths = list(walk(servecal, []))
    assert ["traces", "synth"] in paths and ["traces", "import", "llmperf"] in paths
    for path in paths:
        res = CliRunner().invoke(servecal, path + ["--help"])
        assert res.exit_code == 0 and widest(res.output) <= WIDTH, (path, res.output)


def test_the_speculative_decoding_and_prefix_cache_lines_fit_100_columns(files):
    trace, cal = files
    res = invoke(trace, "--calibration", cal, "--speculative-tokens", 3, "--spec-acceptance-rate", 0.7,
                 "--enable-prefix-caching", "--max-num-seqs", 32)
    assert res.exit_code == 0, res.output
    assert widest(res.output) <= WIDTH, res.output
    text = res.output.replace("\n  ", " ")
    assert "draft tokens accepted" in text and "verify steps" in text and "so nothing can hit" in text


def test_a_file_that_is_not_a_calibration_json_says_what_it_is(files):
    from calibrate.umbrella import main as servecal

    trace, _ = files
    with open("binary.json", "wb") as f:
        f.write(b"\x1f\x8b\x08\x00\x9c\xff" * 10)
    for cal, what in ((trace, "(it is a Parquet file)"), ("binary.json", "(not UTF-8 text)")):
        res = CliRunner().invoke(servecal, ["replay", trace, "--calibration", cal])
        assert res.exit_code == 1 and widest(res.output) <= WIDTH, res.output
        assert f"{cal}: not a calibration JSON {what}" in res.output, res.output
        assert "codec" not in res.output and "position" not in res.output, res.output
    for args in (["calibrate", "fit", trace, "--model-config", trace, "--gpu", "h100-80gb", "-o", "c.json"],
                 ["calibrate", "fit", trace, "--model", "llama-3.1-8b", "--gpu-spec", "binary.json", "-o", "c.json"],
                 ["replay", trace, "--calibration", files[1], "--report", "r.html",
                  "--measured-timeseries", trace]):
        res = CliRunner().invoke(servecal, args)
        assert res.exit_code in (1, 2) and widest(res.output) <= WIDTH, res.output
        assert "Parquet file" in res.output or "not UTF-8 text" in res.output, res.output
        assert "codec" not in res.output, res.output


def test_import_errors_of_a_file_in_another_format_fit_100_columns(files):
    import json

    from calibrate.umbrella import main as servecal

    with open("pretty.jsonl", "w") as f:
        f.write(json.dumps({"request_id": "a", "input_toks": 3}, indent=2))
    with open("lines.jsonl", "w") as f:
        f.write('{"benchmarks": []}\n{"benchmarks": []}\n')
    with open("list.json", "w") as f:
        f.write("[1, 2]")
    cases = ((["vllm-request-stats", "pretty.jsonl"], "pretty.jsonl, line 1: not valid JSON (Expecting property "
              "name enclosed in double quotes); expected one complete JSON object per line"),
             (["guidellm", "lines.jsonl"], "lines.jsonl, line 2: not valid JSON (Extra data); expected one "
              "complete JSON document"),
             (["guidellm", "list.json"], "list.json, column 'benchmarks': has no 'benchmarks' list; expected a "
              "GuideLLM benchmark report (guidellm benchmark --output-path x.json)"))
    for args, said in cases:
        res = CliRunner().invoke(servecal, ["traces", "import", *args, "-o", "o.parquet"])
        assert res.exit_code == 1 and widest(res.output) <= WIDTH, res.output
        assert said in res.output.replace("\n  ", " "), res.output


@pytest.mark.parametrize("name, key", [("RTXPRO6000", "rtx-pro-6000"), ("NVIDIA H100 80GB HBM3", "h100-80gb"),
                                       ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
                                       ("Qwen3-8B", "qwen3-8b")])
def test_calibrate_catalog_name_takes_aliases_and_hugging_face_ids(name, key):
    from calibrate.cli import main as calibrate_main

    res = CliRunner().invoke(calibrate_main, ["catalog", "--name", name])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[0] == f"key: {key}" and widest(res.output) <= WIDTH, res.output


def test_bench_help_states_the_calibration_defaults():
    import re
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "bench" / "replay_speed.py"
    out = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, check=True).stdout
    defaults = {opt: int(v) for opt, v in re.findall(r"(--calibration-\w+) \w+\s+.*?\(default: (\d+)\)",
                                                     out, flags=re.S)}
    assert set(defaults) == {"--calibration-rows", "--calibration-logs", "--calibration-requests"}, out
    text = " ".join(out.split())
    assert f"{defaults['--calibration-rows']:,} rows (--calibration-rows)" in text, out
    assert f"{defaults['--calibration-logs']} logs jointly (--calibration-logs)" in text, out
    assert f"{defaults['--calibration-requests']:,} requests (--calibration-requests)" in text, out
    assert widest(out) <= WIDTH, out
