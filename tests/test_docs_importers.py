"""The recipes of docs/importers.md ("Getting your production log in") run as written, on the real files."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

from click.testing import CliRunner

from calibrate.umbrella import main as servecal

PAGE = Path(__file__).parents[1] / "docs" / "importers.md"


def _commands() -> list[str]:
    text = PAGE.read_text()
    assert text.startswith("# Getting your production log in\n")
    section = text.split("\n## ", 1)[0]  # the page, up to a second-level heading if one is ever added
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    return [c.strip() for b in blocks for c in b.replace("\\\n", " ").splitlines() if c.strip()]


def test_the_recipes_are_the_ones_these_tests_run():
    commands = _commands()
    assert len(commands) == 21 and all(c.startswith("traces import ") for c in commands[:4])
    assert commands[4].startswith("calibrate fit ") and commands[5].startswith("replay ")
    assert commands[6].startswith("traces import blis-observe trace.yaml")
    assert all(c.startswith("traces import distserve ") for c in commands[7:9])
    assert commands[9].startswith("calibrate fit vllm_1rps.parquet") and commands[10].startswith("replay ")
    assert commands[11].startswith("traces import prometheus ") and commands[12].startswith("calibrate fit prod")
    assert commands[13].startswith("calibrate validate --fit-on prod") and commands[14].startswith("replay prod")
    assert commands[15].startswith("servecal plan prod")
    assert all(c.startswith("traces import inference-perf reports/") for c in commands[16:18])
    assert commands[18].startswith("calibrate fit ip_stages.parquet")
    assert commands[20].startswith("calibrate fit aiperf")


def _run(commands: list[str], real_data_dir: Path) -> list[str]:
    out = []
    for cmd in commands:
        args = shlex.split(cmd.replace("$D", str(real_data_dir)))
        args = args[1:] if args[0] == "servecal" else args  # the umbrella itself; its groups by name
        res = CliRunner().invoke(servecal, args)
        assert res.exit_code == 0, (cmd, res.output)
        out.append(res.output)
    return out


# Independent chains of the section (each reads only its own outputs), run as four tests.
def test_the_vllm_recipes_run_as_written(real_data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = _run(_commands()[:6], real_data_dir)
    assert "num_gpu_blocks=2790" in out[3] and "UTC-8 h (inferred)" in out[3]
    # the calibration took the log's settings, and the replay the calibration's: no engine option typed
    assert "max_num_batched_tokens=64" in out[4] and "max_num_batched_tokens=64" in out[5]
    for name in ("sweep.parquet", "rate076.parquet", "spans.parquet", "vllm_stats.parquet", "vllm_ts.csv"):
        assert (tmp_path / name).exists()


def test_the_blis_recipe_runs_as_written(real_data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # no BLIS trace among the real files: the recipe runs on the hand-written pair of the tests
    for suffix in ("yaml", "csv"):
        (tmp_path / f"trace.{suffix}").write_bytes((Path(__file__).parent / "data" / f"blis_observe_trace.{suffix}")
                                                   .read_bytes())
    out = _run(_commands()[6:7], real_data_dir)
    assert "max_num_seqs=64" in out[0]
    assert (tmp_path / "observed.parquet").exists()


def test_the_distserve_recipes_run_as_written(real_data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = _run(_commands()[7:11], real_data_dir)
    assert "vllm, 100 requests at 1 req/s" in out[0]
    assert "distserve, prefill TP 2 PP 1, decode TP 1 PP 1, 300 requests at 3 req/s" in out[1]
    # DistServe's pools replayed from the vLLM run's calibration, with its SLO attainment's objectives
    flat = " ".join(out[3].split())
    assert "prefill TP=2, decode TP=1" in flat and "goodput (ttft <= 0.2 s, tpot <= 0.1 s)" in flat
    for name in ("vllm_1rps.parquet", "distserve_3rps.parquet"):
        assert (tmp_path / name).exists()


def test_the_prometheus_recipe_runs_as_written(real_data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "scrapes.txt").write_bytes((Path(__file__).parent / "data" / "vllm_metrics_scrapes.txt").read_bytes())
    out = _run(_commands()[11:16], real_data_dir)
    assert "prod.parquet: 2 level(s) (0-30 s, 30-60 s), 72 statistics (aggregate_targets/1)" in out[0]
    assert (tmp_path / "cal_prod.json").exists()
    # one window scored from the other, level by level; the plan on the busiest window (#1, 1.7 req/s); the
    # 30-60 s window replays its 7 requests held at 30 s and its 44 + 14 - 7 = 51 arrivals (14 held at 60 s)
    assert "prod.parquet#1 (out of sample; 58 requests replayed)" in out[2]
    assert "18 of 18 reported percentiles inside their 95 % band" in " ".join(out[3].split())
    assert "the plan replays the busiest, #1 at 1.7 req/s: 58 requests" in " ".join(out[4].split())


def test_the_inference_perf_and_aiperf_recipes_run_as_written(real_data_dir, tmp_path, monkeypatch):
    import shutil

    monkeypatch.chdir(tmp_path)
    # no such run among the real files: the recipes run on the tests' folders, laid out as the tools write them
    shutil.copytree(Path(__file__).parent / "data" / "inference_perf", tmp_path / "reports")
    shutil.copytree(Path(__file__).parent / "data" / "aiperf", tmp_path / "artifacts")
    out = [" ".join(o.split()) for o in _run(_commands()[16:], real_data_dir)]
    assert "ip.parquet: 48 requests over 26.3 s (request_trace/1); 1 failed" in out[0]
    assert "ip_stages.parquet: 2 level(s) (poisson rate 2, poisson rate 4), 140 statistics (aggregate_targets/1)" \
        in out[1]
    assert "aiperf.parquet: 30 requests over 7.7 s (request_trace/1); 1 failed" in out[3]
    assert (tmp_path / "cal_ip.json").exists() and (tmp_path / "cal_aiperf.json").exists()
