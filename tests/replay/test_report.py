"""The replay report (replay.report): key table first, valid PNGs, atomic files, the CLI options."""
import re

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from replay.analysis.compare import compare, table_cells
from replay.errors import ConfigError
from replay.report import (NUM_TIME_WINDOWS, errors_over_time, simulated_counts, write_report)
from test_compare import make_cli_inputs

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def synthetic_result(n=60, seed=0):
    """A replay result with every metric (token times included), one measured failure, one rejection."""
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(0.5, n))
    out_tokens = rng.integers(1, 8, n)
    qw = rng.exponential(0.05, n)
    ttft = qw + rng.uniform(0.02, 0.2, n)
    times = [list(t0 + 0.02 * np.arange(k)) for t0, k in zip(ttft, out_tokens)]
    e2e = np.array([t[-1] for t in times])
    res = pd.DataFrame({"request_id": [f"r{i}" for i in range(n)], "arrival_time_s": arrival,
                        "num_prompt_tokens": rng.integers(10, 500, n), "num_output_tokens": out_tokens,
                        "queue_wait_s": qw, "ttft_s": ttft, "e2e_s": e2e,
                        "tpot_s": np.where(out_tokens > 1, (e2e - ttft) / np.maximum(out_tokens - 1, 1), np.nan),
                        "token_times_s": times, "status": ["ok"] * n})
    for col in ("queue_wait_s", "ttft_s", "e2e_s", "tpot_s"):
        res[f"pred_{col}"] = res[col] * rng.uniform(0.8, 1.2, n)
    res["pred_token_times_s"] = [list(np.array(t) * 1.1) for t in times]
    res["pred_status"] = "ok"
    res.loc[3, "status"] = "ReadTimeout"
    res.loc[5, "pred_status"] = "rejected: exceeds max_model_len"
    return res


def steps(n=40):
    return pd.DataFrame({"replica_id": 0, "step_start_time_s": np.arange(n) * 0.05, "step_duration_s": 0.04,
                         "num_prefill_tokens": np.arange(n) % 3 * 100, "num_prefill_seqs": np.arange(n) % 3,
                         "num_decode_seqs": 4, "decode_context_tokens": 400})


def assert_png(path):
    import matplotlib.image

    assert path.read_bytes()[:8] == PNG_MAGIC, path
    img = matplotlib.image.imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100


def test_markdown_report_opens_with_the_context_then_the_compare_table(tmp_path):
    res = synthetic_result()
    written = write_report(res, tmp_path / "run.md", simulated_steps=steps(),
                           context=[("trace", "t.parquet"), ("model", "llama-3.1-8b")])
    text = (tmp_path / "run.md").read_text()
    lines = text.splitlines()
    assert lines[0] == "# servecal replay report"
    assert "| **trace** | t.parquet |" in lines and "| **model** | llama-3.1-8b |" in lines
    assert "No --tolerance given" in text
    head, rows = table_cells(compare(res))
    # the first table after the header is the key table, cell for cell the formatting of replay.analysis.compare.compare
    i = lines.index("## Measured vs predicted")
    assert lines[i + 2] == "| " + " | ".join(head) + " |"
    assert lines[i + 4:i + 4 + len(rows)] == ["| " + " | ".join(r) + " |" for r in rows]
    assert [r[0] for r in rows] == ["queue_wait", "ttft", "tpot", "e2e", "itl"]
    # the figures go to a folder named after the report
    assert [str(p.relative_to(tmp_path)) for p in written] == ["run.md", "run_files/scatter.png", "run_files/cdf.png",
                                                               "run_files/steps.png"]
    for p in written[1:]:
        assert f"](run_files/{p.name})" in text
        assert_png(p)
    assert "## Errors over time" in text
    assert sorted(q.name for q in tmp_path.iterdir()) == ["run.md", "run_files"]  # no temporaries left
    assert sorted(q.name for q in (tmp_path / "run_files").iterdir()) == ["cdf.png", "scatter.png", "steps.png"]


def test_html_report_is_one_file_with_its_figures_embedded(tmp_path):
    import base64

    ts = pd.DataFrame({"t": np.arange(1.0, 30.0), "running": 1, "waiting": 0})
    (tmp_path / "run.md").write_text("an earlier markdown report\n")
    written = write_report(synthetic_result(), tmp_path / "run.html", measured_timeseries=ts,
                           context=[("trace", "t.parquet"), ("calibration", "cal.json")])
    text = (tmp_path / "run.html").read_text()
    assert text.startswith("<!DOCTYPE html>")
    assert written == [tmp_path / "run.html"]
    assert sorted(q.name for q in tmp_path.iterdir()) == ["run.html", "run.md"]  # nothing beside it
    assert "<dt>trace</dt><dd>t.parquet</dd>" in text and "<dt>calibration</dt><dd>cal.json</dd>" in text
    assert text.index("<dt>trace</dt>") < text.index("<table>") < text.index("<img")
    assert "<th>meas_p99_ms</th>" in text and "<td>ttft</td>" in text
    assert text.count('<div class="scroll"><table>') == text.count("<table>")  # every table scrolls, none is cut
    assert "overflow-x:auto" in text
    images = re.findall(r'<img alt="[^"]+" src="data:image/png;base64,([A-Za-z0-9+/=]+)">', text)
    assert len(images) == 3 and text.count("<img") == 3  # scatter, CDF, time series: all embedded
    for data in images:
        assert base64.b64decode(data)[:8] == PNG_MAGIC
    assert "src=\"run_" not in text and ".png\"" not in text


def test_report_verdict_against_tolerances(tmp_path):
    from replay.report import report_context, tolerance_verdict

    res = synthetic_result()
    table = compare(res)
    kind, line, rows = tolerance_verdict(table, {"ttft_p50": 0.5, "e2e_p50": 0.5})
    assert kind == "pass" and line.startswith("PASS") and [r[3] for r in rows] == ["pass", "pass"]
    kind, line, rows = tolerance_verdict(table, {"ttft_p50": 0.5, "tpot_p90": 0.0})
    assert kind == "fail" and "1 of 2" in line and "tpot_p90" in line and rows[1][3] == "FAIL"
    write_report(res, tmp_path / "r.html", tolerances={"ttft_p50": 0.5, "tpot_p90": 0.0})
    text = (tmp_path / "r.html").read_text()
    assert '<p class="verdict fail">FAIL: 1 of 2 tolerances broken (tpot_p90).</p>' in text
    assert "<h2>Tolerances</h2>" in text
    ctx = dict(report_context(trace="t.parquet"))
    assert ctx["trace"] == "t.parquet" and ctx["servecal"]


def test_unknown_suffix_writes_nothing(tmp_path):
    with pytest.raises(ConfigError, match=r"\.txt.*use \.md or \.html"):
        write_report(synthetic_result(), tmp_path / "run.txt")
    assert list(tmp_path.iterdir()) == []


def test_no_partial_files_when_a_figure_fails(tmp_path, monkeypatch):
    import schemas.tables
    from schemas.errors import OutputError

    (tmp_path / "run.md").write_text("previous report\n")
    real, calls = schemas.tables.os.replace, []

    def failing_replace(src, dst):
        calls.append(dst)
        if str(dst).endswith("cdf.png"):  # the scatter PNG is on disk (as a temporary) when the second fails
            raise OSError(28, "disk full")
        return real(src, dst)

    monkeypatch.setattr(schemas.tables.os, "replace", failing_replace)
    with pytest.raises(OutputError, match="cdf.png: cannot write \\(disk full\\)"):
        write_report(synthetic_result(), tmp_path / "run.md")
    assert [p.name for p in tmp_path.iterdir()] == ["run.md"]  # no PNG, no temporary, no folder
    assert (tmp_path / "run.md").read_text() == "previous report\n"


def test_no_files_when_a_figure_cannot_be_drawn(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    (tmp_path / "run.md").write_text("previous report\n")

    def failing_savefig(self, fname, **kw):
        raise RuntimeError("cannot draw")

    monkeypatch.setattr(Figure, "savefig", failing_savefig)
    with pytest.raises(RuntimeError):
        write_report(synthetic_result(), tmp_path / "run.md")
    assert [p.name for p in tmp_path.iterdir()] == ["run.md"]
    assert (tmp_path / "run.md").read_text() == "previous report\n"


def test_simulated_counts_hand_worked():
    # a: arrives 0, scheduled 0.5, done 2; b: arrives 1, scheduled 1, done 3; c: rejected (never counted)
    res = pd.DataFrame({"arrival_time_s": [0.0, 1.0, 1.5], "pred_queue_wait_s": [0.5, 0.0, np.nan],
                        "pred_e2e_s": [2.0, 2.0, np.nan],
                        "pred_status": ["ok", "ok", "rejected: exceeds KV cache capacity"]})
    running, waiting = simulated_counts(res, [0.0, 0.25, 0.5, 1.0, 2.0, 2.99, 3.0, 9.0])
    assert waiting.tolist() == [1, 1, 0, 0, 0, 0, 0, 0]
    assert running.tolist() == [0, 0, 1, 2, 1, 1, 0, 0]


def test_errors_over_time_reuses_compare_per_window():
    res = synthetic_result()
    win = errors_over_time(res)
    assert len(win) == NUM_TIME_WINDOWS
    assert win["n"].sum() == compare(res).set_index("metric").loc["ttft", "n"]  # every compared request, once
    first = res[res["arrival_time_s"] < win["end_s"][0]]
    expected = compare(first, percentiles=(50,)).set_index("metric").loc["ttft"]
    assert win.loc[0, ["meas_p50", "pred_p50", "rel_err_p50"]].tolist() == \
        pytest.approx([expected["meas_p50"], expected["pred_p50"], expected["rel_err_p50"]])


# -- the CLI ---------------------------------------------------------------------------------------

def test_cli_report_and_timeseries(tmp_path):
    from replay.cli import main

    trace, cal, opts = make_cli_inputs(tmp_path, error=0.05)
    ts = tmp_path / "timeseries.csv"
    ts.write_text("t,prompt_throughput,gen_throughput,running,waiting,kv_cache_pct\n"
                  + "".join(f"{t}.0,0,0,1,0,0.0\n" for t in range(1, 4)))
    report = tmp_path / "out" / "rep.md"
    report.parent.mkdir()
    res = CliRunner().invoke(main, [str(trace), "--calibration", str(cal), *opts, "--report", str(report),
                                    "--measured-timeseries", str(ts), "--tolerance", "e2e_p50=0.01"])
    assert res.exit_code == 3, res.output  # the report is written before the tolerance verdict
    text = report.read_text()
    assert any(line.startswith("| metric | n |") for line in text.splitlines())
    assert f"| **trace** | {trace} |" in text and f"| **calibration** | {cal} |" in text
    assert "| **model** |" in text and "| **engine** | max_num_seqs=" in text and "| **servecal** |" in text
    assert "**FAIL: 1 of 1 tolerances broken (e2e_p50).**" in text
    for name in ("scatter.png", "cdf.png", "timeseries.png", "steps.png"):
        assert_png(report.parent / "rep_files" / name)


def test_cli_report_usage_errors(tmp_path):
    from replay.cli import main

    trace, cal, opts = make_cli_inputs(tmp_path)
    base = [str(trace), "--calibration", str(cal), *opts]
    res = CliRunner().invoke(main, base + ["--report", str(tmp_path / "rep.pdf")])
    assert res.exit_code == 2 and "use .md or .html" in res.output and "replaying" not in res.output
    res = CliRunner().invoke(main, base + ["--measured-timeseries", str(trace)])
    assert res.exit_code == 2 and "give --report too" in res.output
    bad = tmp_path / "ts.csv"
    bad.write_text("t,running\n1.0,2\n")
    res = CliRunner().invoke(main, base + ["--report", str(tmp_path / "rep.md"), "--measured-timeseries", str(bad)])
    assert res.exit_code == 1 and "missing column(s) waiting" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "rep.md").exists()


@pytest.mark.parametrize("content,message,code", [
    ("t,running,waiting\n", "ts.csv: has no rows; expected one row per tick (t, running, waiting)", 1),
    ("t,running,waiting\n1700000001,3,0\n1700000002,4,0\n",
     "ts.csv: column 't': every tick (1700000001 to 1700000002 s) lies outside the trace's span [0, ", 1),
    ("t,running,waiting\n0.5,1,0\n1.5,0,0\n2.5,0,0\n1000,0,0\n",
     "warning: ts.csv: 1 of 4 ticks (t 1000 to 1000 s) lie after the trace's span [0, ", 0),
])
def test_cli_timeseries_faults_come_before_any_output(tmp_path, monkeypatch, content, message, code):
    """A bad or misplaced series is found when it is read (before the replay), not at report time
    after -o, --steps-out and --chrome-trace were written; a partly misplaced one is a warning."""
    from replay.cli import main

    trace, cal, opts = make_cli_inputs(tmp_path)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ts.csv").write_text(content)
    res = CliRunner().invoke(main, [str(trace), "--calibration", str(cal), *opts, "--measured-timeseries", "ts.csv",
                                    "--report", "r.md", "-o", "o.parquet", "--steps-out", "s.parquet",
                                    "--chrome-trace", "c.json"])
    assert res.exit_code == code, res.output
    assert message in " ".join(res.output.split()) and "Traceback" not in res.output
    written = sorted(p.name for p in tmp_path.iterdir() if p.name not in ("ts.csv", trace.name, cal.name))
    assert written == ([] if code else ["c.json", "o.parquet", "r.md", "r_files", "s.parquet"])
    if code:
        assert "replaying" not in res.output


def test_simulated_counts_are_on_the_engine_clock_with_a_front_end():
    # the request of the hand-worked case above with 0.25 s before the engine and 0.5 s of
    # streaming after its last token: arrives at the engine at 0.25, scheduled 0.75, the
    # engine's last token at 2.25 (the client's at 2.75)
    res = pd.DataFrame({"arrival_time_s": [0.0], "pred_queue_wait_s": [0.5], "pred_e2e_s": [2.75],
                        "pred_frontend_s": [0.25], "pred_stream_s": [0.5], "pred_status": ["ok"]})
    running, waiting = simulated_counts(res, [0.0, 0.25, 0.5, 0.75, 2.0, 2.25, 2.5])
    assert waiting.tolist() == [0, 1, 1, 0, 0, 0, 0]
    assert running.tolist() == [0, 0, 0, 1, 1, 0, 0]


def test_simulated_running_never_exceeds_max_num_seqs_with_a_front_end():
    # before, the requests in their front-end time were counted running: 129 of 128 on a real run
    from replay.config import EngineOptions, ReplayConfig
    from replay.cost.cost_model import RooflineCostModel
    from replay.simulate import replay_frame
    from schemas.cost_params import CostParams
    from schemas.specs import get_gpu, get_model
    from traces.synth import synth_requests

    cm = RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb"),
                           CostParams(t_frontend_s=0.05, t_stream_per_token_s=1e-3))
    trace = synth_requests(400, 40.0, "fixed:500", "fixed:200", seed=1)
    res, _ = replay_frame(trace, cm, ReplayConfig(engine=EngineOptions(max_num_seqs=8)))
    assert {"pred_frontend_s", "pred_stream_s"} <= set(res.columns)
    t = np.linspace(0.0, float((res["arrival_time_s"] + res["pred_e2e_s"]).max()), 20_000)
    running, _ = simulated_counts(res, t)
    assert running.max() == 8


def test_per_benchmark_table_by_hand(tmp_path):
    """A GuideLLM sweep's trace (a benchmark column): each benchmark compared on its own rows.
    A: measured TTFT 100, 300 ms -> p50 200, p90 280; predicted 100, 500 -> p50 300 (+50.0%), p90 460.
    B: measured 1000, 1000 ms, predicted 1100, 1100 -> +10.0%."""
    meas = np.array([0.1, 0.3, 1.0, 1.0])
    pred = np.array([0.1, 0.5, 1.1, 1.1])
    res = pd.DataFrame({"request_id": list("abcd"), "arrival_time_s": [0.0, 1.0, 2.0, 3.0],
                        "num_prompt_tokens": 10, "num_output_tokens": 3, "benchmark": ["A", "A", "B", "B"],
                        "ttft_s": meas, "pred_ttft_s": pred, "tpot_s": meas / 10, "pred_tpot_s": pred / 10,
                        "e2e_s": meas * 2, "pred_e2e_s": pred * 2, "pred_status": "ok"})
    for name in ("b.md", "b.html"):
        write_report(res, tmp_path / name)
    lines = (tmp_path / "b.md").read_text().splitlines()
    i = lines.index("## Per benchmark")
    head = lines[i + 4].strip("| ").split(" | ")
    assert head[:5] == ["benchmark", "n", "ttft_meas_p50", "ttft_pred_p50", "ttft_err_p50"]
    a = dict(zip(head, lines[i + 6].strip("| ").split(" | ")))
    b = dict(zip(head, lines[i + 7].strip("| ").split(" | ")))
    assert (a["benchmark"], a["n"]) == ("A", "2") and (b["benchmark"], b["n"]) == ("B", "2")
    assert (a["ttft_meas_p50"], a["ttft_pred_p50"], a["ttft_err_p50"]) == ("200.0", "300.0", "+50.0%")
    assert (a["ttft_meas_p90"], a["ttft_pred_p90"]) == ("280.0", "460.0")
    assert (b["ttft_meas_p50"], b["ttft_pred_p50"], b["ttft_err_p50"]) == ("1000", "1100", "+10.0%")
    assert (a["tpot_meas_p50"], a["tpot_pred_p50"]) == ("20.0", "30.0")
    assert (b["e2e_meas_p90"], b["e2e_pred_p90"], b["e2e_err_p90"]) == ("2000", "2200", "+10.0%")
    html = (tmp_path / "b.html").read_text()
    assert "<h2>Per benchmark</h2>" in html and "<td>+50.0%</td>" in html
    write_report(res.drop(columns="benchmark"), tmp_path / "n.md")
    assert "Per benchmark" not in (tmp_path / "n.md").read_text()


def test_cli_report_of_a_guidellm_sweep_has_the_per_benchmark_table(tmp_path):
    """The benchmark column survives the replay into the report."""
    from replay.cli import main
    from traces.io import read_trace, write_trace

    trace, cal, opts = make_cli_inputs(tmp_path, error=0.05)
    kind, frame, meta = read_trace(trace)
    frame["benchmark"] = ["low" if i < len(frame) // 2 else "high" for i in range(len(frame))]
    write_trace(frame, kind, trace, meta)
    res = CliRunner().invoke(main, [str(trace), "--calibration", str(cal), *opts, "--report", str(tmp_path / "r.md")])
    assert res.exit_code == 0, res.output
    text = (tmp_path / "r.md").read_text()
    assert "## Per benchmark" in text and "| low |" in text and "| high |" in text


def test_a_disaggregated_replay_s_report_shows_where_the_queue_forms(tmp_path):
    """Issue #34 item 4: per window of arrival time, the median prefill queue, handoff, KV transfer and
    decode queue waits next to TTFT; checked by hand on four requests in two windows."""
    from replay.report.timeseries import disagg_waits_over_time

    res = pd.DataFrame({"request_id": list("abcd"), "arrival_time_s": [0.0, 1.0, 2.0, 3.0],
                        "num_prompt_tokens": [10] * 4, "num_output_tokens": [3] * 4, "ttft_s": [0.1, 0.2, 0.5, 0.7],
                        "tpot_s": [0.01] * 4, "e2e_s": [1.0] * 4, "pred_status": ["ok"] * 4,
                        "pred_queue_wait_s": [0.0, 0.0, 0.4, 0.6], "pred_ttft_s": [0.1, 0.1, 0.5, 0.7],
                        "pred_tpot_s": [0.01] * 4, "pred_e2e_s": [1.0] * 4,
                        "pred_handoff_wait_s": [0.0, 0.2, 2.0, 4.0], "pred_kv_transfer_s": [0.01] * 4,
                        "pred_decode_queue_wait_s": [0.0, 0.0, 0.1, 0.3]})
    win = disagg_waits_over_time(res, num_windows=2)  # arrivals [0, 1.5) and [1.5, 3]
    assert list(win["n"]) == [2, 2]
    assert list(win["pred_handoff_wait_s"]) == pytest.approx([0.1, 3.0])
    assert list(win["pred_queue_wait_s"]) == pytest.approx([0.0, 0.5])
    assert list(win["meas_ttft_p50"]) == pytest.approx([0.15, 0.6])
    written = write_report(res, tmp_path / "d.md")
    text = written[0].read_text()
    assert "## Where the queue forms (disaggregated pools)" in text and "handoff_p50_ms" in text
    assert any(p.name == "disagg_waits.png" for p in written)
