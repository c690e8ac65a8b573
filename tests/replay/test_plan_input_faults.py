"""``servecal plan`` on bad or odd input: an axis given no value, a price without a GPU or
twice, a trace whose requests all arrive at once, and a table of several objectives within
100 columns."""
import pandas as pd
import pytest
from click.testing import CliRunner

from calibrate.umbrella import main as servecal
from replay.errors import ConfigError
from replay.plan.grid import parse_gpus, parse_int_list, parse_prices
from replay.text import WIDTH, render_table
from schemas.tables import REQUEST_TRACE
from test_plan import TRACE, calibration, plan_cli, plan_files
from traces.io import write_trace


@pytest.fixture
def files(tmp_path):
    return plan_files(tmp_path, 20)


plan = plan_cli


def one_error(res) -> str:
    assert "Traceback" not in res.output and max(map(len, res.output.splitlines())) <= WIDTH, res.output
    assert sum(line.startswith("Error:") for line in res.output.splitlines()) == 1, res.output
    return " ".join(res.output[res.output.index("Error:"):].split())


@pytest.mark.parametrize("args, needle", [
    (["--price", "=2.5"], "--price '=2.5': expected GPU=PRICE per GPU-hour"),
    (["--price", "h100-80gb=2,h100-80gb=3"], "h100-80gb priced more than once"),
    (["--price", ","], "--price ',': no price given"),
    (["--gpu", ","], "--gpu ',': no GPU named"),
    (["--scheduler", ","], "--scheduler ',': no scheduler named"),
    (["--tp", ""], "--tp '': no value; expected integers or ranges"),
    (["--replicas", " "], "--replicas ' ': no value"),
    (["--scheduler", "disagg", "--prefill-replicas", ""], "--prefill-replicas '': no value"),
    # one replica of TP 1 at most: no prefill + decode layout fits that budget (was "0 candidates ... no
    # candidate meets", exit 3); mixed with a colocated scheduler, disagg was dropped silently
    (["--scheduler", "disagg", "--replicas", "1"], "no disaggregated candidate fits the colocated GPU budget (1"),
    (["--scheduler", "chunked,disagg", "--replicas", "1"], "no disaggregated candidate fits"),
])
def test_an_axis_or_price_without_a_value_is_a_usage_error_not_an_empty_grid(files, tmp_path, args, needle):
    out = tmp_path / "plan.csv"
    res = plan(*files, "--slo", "ttft_p90=2s", *args, "-o", out)
    assert res.exit_code == 2, res.output
    assert needle in one_error(res)
    assert not out.exists()


def test_the_parsers_refuse_what_names_nothing():
    with pytest.raises(ConfigError, match="no value"):
        parse_int_list("--tp", "")
    with pytest.raises(ConfigError, match="no GPU named"):
        parse_gpus(" , ")
    with pytest.raises(ConfigError, match="expected GPU=PRICE"):
        parse_prices(" =1", ["h100-80gb"])
    assert parse_prices(None, ["h100-80gb"]) == {}
    assert parse_prices("H100-80GB=2.5", ["h100-80gb"]) == {"h100-80gb": 2.5}


@pytest.mark.parametrize("n", [1, 20])
def test_a_burst_trace_has_no_rate_to_print_or_rescale(tmp_path, n):
    trace, cal = tmp_path / "t.parquet", tmp_path / "cal.json"
    write_trace(TRACE.head(n).assign(arrival_time_s=5.0), REQUEST_TRACE, trace)
    calibration().write(cal)
    for opt in ("--rate", "--rate-scale"):
        res = plan(trace, cal, "--slo", "ttft_p90=20s", opt, "2")
        assert res.exit_code == 2, res.output
        assert f"{opt}: the trace's {n} request(s) all arrive at once, so it has no rate to rescale" in one_error(res)
    res = CliRunner().invoke(servecal, ["plan", str(trace), "--calibration", str(cal), "--jobs", "1",
                                        "--slo", "ttft_p90=20s"])  # max-rate probes asked for
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "nan" not in text and "<min" not in text, res.output
    assert f"{n} requests of {trace} arriving all at once (a burst: no rate, so no max rate)" in text
    assert "meets ttft_p90 <= 20 s on the burst with its 95 % band" in text, res.output


def test_several_objectives_fit_100_columns_and_keep_every_cell(files):
    res = plan(*files, "--slo", "ttft_p90=20s,tpot_p90=1s,e2e_p99=60s,queue_wait_p50=10s,goodput=0.5",
               "--replicas", "1,2", "--max-num-seqs", "32,64", "--price", "h100-80gb=2")
    assert res.exit_code == 0, res.output
    assert max(map(len, res.output.splitlines())) <= WIDTH, res.output
    heads = [line for line in res.output.splitlines() if line.lstrip().startswith("#")]
    cols = " ".join(heads).split()
    for name in ("ttft_p90", "tpot_p90", "e2e_p99", "queue_wait_p50", "good", "verdict"):
        assert name in cols, res.output
    assert len(heads) >= 2 and all(h.split()[:2] == ["#", "deployment"] for h in heads), res.output
    two = plan(*files, "--slo", "ttft_p90=20s,tpot_p90=1s")  # two objectives: one table
    assert two.exit_code == 0 and max(map(len, two.output.splitlines())) <= WIDTH, two.output


def test_render_table_splits_on_its_key_columns_only_when_asked():
    head = ["#", "name"] + [f"col{i}" for i in range(8)]
    rows = [["1", "x"] + ["0123456789abc"] * 8]
    assert len(render_table(head, rows, 100).splitlines()[0]) > 100  # as before: no key, no split
    parts = render_table(head, rows, 100, key=2).split("\n\n")
    assert len(parts) == 2 and all(p.split()[:2] == ["#", "name"] for p in parts)
    assert all(len(line) <= 100 for p in parts for line in p.splitlines())
    assert sum(p.splitlines()[0].count("col") for p in parts) == 8
    assert render_table(head[:3], [rows[0][:3]], 100, key=2) == render_table(head[:3], [rows[0][:3]], 100)


def test_the_plan_frame_still_holds_every_objective(files, tmp_path):
    out = tmp_path / "plan.csv"
    res = plan(*files, "--slo", "ttft_p90=20s,tpot_p90=1s,e2e_p99=60s", "-o", out)
    assert res.exit_code == 0, res.output
    frame = pd.read_csv(out)
    assert {"ttft_p90_low_s", "tpot_p90_high_s", "e2e_p99_low_s", "kv_blocks"} <= set(frame.columns)


@pytest.mark.parametrize("args, needle", [
    (["--rate", "1e-310"], "--rate 1e-310: stretches the trace's last arrival"),
    (["--rate", "1e-12"], "expected more than"),
    (["--rate-scale", "1e-320"], "to infinity, beyond 1e+09 s"),
])
def test_a_rate_that_pushes_arrivals_past_1e9_s_is_refused_not_replayed_wrong(files, args, needle):
    res = plan(*files, "--slo", "ttft_p90=2s", *args)
    assert res.exit_code == 2, res.output  # before: '144 of 145 requests not completed', exit 3
    assert needle in one_error(res)


def test_the_same_bound_holds_for_a_sweep_and_traces_scale(files, tmp_path):
    from replay.cli import main as replay
    from traces.cli import main as traces
    from traces.transform import rescaled_arrival_problem

    trace, cal = files
    last = TRACE.head(20)["arrival_time_s"].max()
    assert rescaled_arrival_problem([0.0, last], last / 1e9 * 1.01) is None
    assert "expected more than" in rescaled_arrival_problem([0.0, last], last / 1e9 * 0.99)
    res = CliRunner().invoke(replay, [str(trace), "--calibration", str(cal), "--no-band", "--jobs", "1",
                                      "--sweep", "rate-scale=1e-320,1"])
    assert res.exit_code == 2 and "--sweep rate-scale=" in one_error(res), res.output
    res = CliRunner().invoke(traces, ["scale", str(trace), "--rate-scale", "1e-320", "-o", str(tmp_path / "s.parquet")])
    assert res.exit_code == 2 and "to infinity" in one_error(res), res.output
    assert not (tmp_path / "s.parquet").exists()
