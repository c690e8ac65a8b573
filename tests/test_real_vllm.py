"""End to end on the real vLLM run (issue #2): import, calibrate fit, replay, compare.

Llama-3.1-8B on an RTX PRO 6000 Blackwell Server Edition, vLLM 0.19.0, max_num_seqs=128,
max_num_batched_tokens=2048; the calibration comes from the same GPU's kernel profile
(LLMServingSim), never from the request log it is checked against.
"""
import json

import pandas as pd
import pytest
from click.testing import CliRunner

from calibrate.umbrella import main as servecal


def _ok(result):
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def run_dir(real_data_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("real")
    cli = CliRunner()
    _ok(cli.invoke(servecal, ["traces", "import", "vllm-request-stats",
                              str(real_data_dir / "lss_vllm_rtxpro6000_llama31_8b_requests.jsonl"),
                              "-o", str(d / "llama.parquet")]))
    profile = sorted(str(p) for p in real_data_dir.glob("lss_profile_rtxpro6000_llama31_8b_*"))
    _ok(cli.invoke(servecal, ["traces", "import", "llmservingsim-profile", *profile, "-o", str(d / "steps.parquet")]))
    _ok(cli.invoke(servecal, ["calibrate", "fit", str(d / "steps.parquet"), "--model", "meta-llama/Llama-3.1-8B",
                              "--gpu", "NVIDIA RTX PRO 6000 Blackwell Server Edition", "-o", str(d / "cal.json")]))
    return d


def test_import_measured_columns(run_dir):
    df = pd.read_parquet(run_dir / "llama.parquet")
    assert len(df) == 300
    assert df["arrival_time_s"].iloc[0] == 0.0
    assert df["arrival_time_s"].iloc[-1] == pytest.approx(29.2, abs=0.1)
    # bench-0: queued 479748.340626232, scheduled ...34067238, first ...510151426, last ...4764.054028055
    r = df.set_index("request_id").loc["bench-0"]
    assert r["ttft_s"] == pytest.approx(479748.510151426 - 479748.340626232, abs=1e-9)
    assert r["e2e_s"] == pytest.approx(479764.054028055 - 479748.340626232, abs=1e-9)
    assert r["tpot_s"] == pytest.approx((479764.054028055 - 479748.510151426) / 530, abs=1e-9)
    assert r["num_prompt_tokens"] == 2358 and r["num_output_tokens"] == 531


def test_calibration_file(run_dir):
    cal = json.loads((run_dir / "cal.json").read_text())
    assert cal["servecal.schema"] == "calibration/3"
    assert cal["gpu"]["name"] == "rtx-pro-6000" and cal["model"]["name"] == "llama-3.1-8b"
    assert len(cal["source"]["sha256"]) == 64
    for k in ("eta_compute", "eta_mem"):
        assert 0.3 < cal["params"][k]["value"] <= 1.0
        assert cal["params"][k]["stderr"] > 0


def test_replay_within_15_percent_of_measured(run_dir):
    res = CliRunner().invoke(servecal, ["replay", str(run_dir / "llama.parquet"), "--calibration",
                                        str(run_dir / "cal.json"), "--max-num-seqs", "128",
                                        "--max-num-batched-tokens", "2048", "-o", str(run_dir / "pred.parquet"),
                                        "--tolerance", "ttft_p50=0.15,ttft_p90=0.15,tpot_p50=0.15,tpot_p90=0.15,"
                                                       "e2e_p50=0.15,e2e_p90=0.15"])
    assert res.exit_code == 0, res.output
    pred = pd.read_parquet(run_dir / "pred.parquet")
    assert (pred["pred_status"] == "ok").all()
    from replay.analysis.compare import compare

    table = compare(pred).set_index("metric")
    for m in ("ttft", "tpot", "e2e"):
        for q in ("p50", "p90"):
            assert abs(table.loc[m, f"rel_err_{q}"]) < 0.15, (m, q, table.loc[m, f"rel_err_{q}"])



def test_the_readme_replay_prints_the_readme_table(run_dir, monkeypatch):
    """The README's "Validate against real logs" replay, as written (this module's import and fit of the
    same files), gives the p50/p90 (ms) and errors its table quotes."""
    import re
    import shlex
    from pathlib import Path

    from replay.analysis.compare import compare

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("## Validate against real logs\n", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1).replace("\\\n", " ")
    command = next(line for line in block.splitlines() if line.startswith("replay llama.parquet --calibration "))
    monkeypatch.chdir(run_dir)
    _ok(CliRunner().invoke(servecal, shlex.split(command)))
    rows = dict(re.findall(r"^\| (queue wait|TTFT|TPOT|E2E) \|(.*)\|$", section, re.M))
    table = compare(pd.read_parquet(run_dir / "pred.parquet")).set_index("metric")
    for name, metric in (("queue wait", "queue_wait"), ("TTFT", "ttft"), ("TPOT", "tpot"), ("E2E", "e2e")):
        r = table.loc[metric]
        cells = []
        for q in ("p50", "p90"):
            for v in (r[f"meas_{q}"], r[f"pred_{q}"]):
                cells.append(f"{v * 1e3:.1f}" if v < 0.1 else f"{v * 1e3:.0f}")
            cells.append(f"{r[f'rel_err_{q}'] * 100:+.1f} %")
        assert [c.strip() for c in rows[name].split("|")] == cells, (name, rows[name], cells)


def test_exact_steps_option_gives_the_same_replay(run_dir):
    """``--exact-steps`` (every step through the event heap) and the fast path agree exactly."""
    out = {}
    for flag in ([], ["--exact-steps"]):
        path = run_dir / f"pred{len(flag)}.parquet"
        res = CliRunner().invoke(servecal, ["replay", str(run_dir / "llama.parquet"), "--calibration",
                                            str(run_dir / "cal.json"), "--max-num-seqs", "128",
                                            "--max-num-batched-tokens", "2048", "-o", str(path), *flag])
        assert res.exit_code == 0, res.output
        out[bool(flag)] = pd.read_parquet(path)
    pd.testing.assert_frame_equal(out[False], out[True])


def test_qwen_with_the_llama_calibration_runs(real_data_dir, run_dir):
    cli = CliRunner()
    _ok(cli.invoke(servecal, ["traces", "import", "vllm-request-stats",
                              str(real_data_dir / "lss_vllm_rtxpro6000_qwen3_32b_requests.jsonl"),
                              "-o", str(run_dir / "qwen.parquet")]))
    out = _ok(cli.invoke(servecal, ["replay", str(run_dir / "qwen.parquet"), "--calibration", str(run_dir / "cal.json"),
                                    "--model", "qwen3-32b", "--tp", "2", "--max-num-seqs", "128",
                                    "--max-num-batched-tokens", "2048"]))
    assert "model qwen3-32b, 2 x rtx-pro-6000 (TP=2)" in out
    assert "ttft" in out and "tpot" in out
