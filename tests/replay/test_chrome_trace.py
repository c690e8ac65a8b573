"""Chrome/Perfetto traces that scale (replay.analysis.chrome_trace): a window, a request cap with a
warning, .json.gz, prefill/decode processes and KV-transfer slices of a disaggregated run."""
import gzip
import json

import numpy as np
import pytest
from click.testing import CliRunner

from replay.analysis.chrome_trace import DEFAULT_MAX_REQUESTS, chrome_trace_events, parse_window, write_chrome_trace
from replay.cost.cost_model import RooflineCostModel
from replay.errors import ConfigError
from replay.config import RecordOptions, ReplayConfig
from replay.simulate import replay_frame
from schemas.cost_params import CostParams
from schemas.specs import get_gpu, get_model
from traces.synth import synth_requests

COST = RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb"),
                         CostParams(eta_compute=0.5, eta_mem=0.8, t_step_s=3e-4))
TRACE = synth_requests(400, 20.0, "lognormal:mean=500,sigma=0.6", "lognormal:mean=60,sigma=0.6", seed=2)


def replay(**cfg):
    return replay_frame(TRACE, COST, ReplayConfig.from_options(RecordOptions(steps=True, step_requests=True), **cfg))


def request_slices(events):
    return [e for e in events if e["ph"] == "X" and e.get("cat") == "request" and e["name"].startswith("synth-")]


@pytest.mark.parametrize("text, window", [("100:160", (100.0, 160.0)), ("5:", (5.0, np.inf)),
                                          (":60", (-np.inf, 60.0)), (" 1.5 : 2 ", (1.5, 2.0))])
def test_parse_window(text, window):
    assert parse_window(text) == window


@pytest.mark.parametrize("text", ["100", "a:b", "5:5", "9:3", "nan:1"])
def test_parse_window_errors(text):
    with pytest.raises(ConfigError, match="--chrome-trace-window"):
        parse_window(text)


def test_streamed_file_equals_the_events_in_memory(tmp_path):
    result, engine = replay()
    summary = write_chrome_trace(tmp_path / "t.json", engine, result, max_requests=None)
    streamed = json.loads((tmp_path / "t.json").read_text())
    assert streamed["traceEvents"] == chrome_trace_events(engine, result)["traceEvents"]
    assert summary.num_requests == summary.num_in_window == len(TRACE) and summary.cut == 0
    assert summary.num_steps == engine.num_steps == sum(e.get("cat") == "step" for e in streamed["traceEvents"])
    assert DEFAULT_MAX_REQUESTS == 20_000


def test_gzipped_when_the_path_ends_in_gz(tmp_path):
    result, engine = replay()
    write_chrome_trace(tmp_path / "t.json.gz", engine, result)
    raw = (tmp_path / "t.json.gz").read_bytes()
    assert raw[:2] == b"\x1f\x8b"
    events = json.loads(gzip.decompress(raw))["traceEvents"]
    assert len(request_slices(events)) == len(TRACE)
    assert [p.name for p in tmp_path.iterdir()] == ["t.json.gz"]  # no temporary left


def test_window_keeps_what_overlaps_it():
    result, engine = replay()
    events = chrome_trace_events(engine, result, window=(5.0, 8.0))["traceEvents"]
    steps = [e for e in events if e.get("cat") == "step"]
    assert steps and all(e["ts"] <= 8e6 and e["ts"] + e["dur"] >= 5e6 for e in steps)
    reqs = [e for e in request_slices(events) if "num_prompt_tokens" in e["args"]]
    arrival = result.set_index("request_id")["arrival_time_s"]
    done = arrival + result.set_index("request_id")["pred_e2e_s"]
    expected = sorted(arrival.index[(arrival <= 8.0) & (done >= 5.0)])
    assert sorted(e["name"] for e in reqs) == expected and len(expected) < len(TRACE)


def test_cap_keeps_the_first_requests_and_ends_the_window_there():
    result, engine = replay()
    summary = {}
    from replay.analysis.chrome_trace import iter_chrome_trace

    events = [json.loads(e) for e in iter_chrome_trace(engine, result, max_requests=50, summary=summary)]
    reqs = [e for e in request_slices(events) if "num_prompt_tokens" in e["args"]]
    first = result.sort_values("arrival_time_s")["request_id"].tolist()
    assert sorted(e["name"] for e in reqs) == sorted(first[:50])
    assert summary["num_requests"] == 50 and summary["num_in_window"] == len(TRACE)
    cut_at = result.set_index("request_id").loc[first[50], "arrival_time_s"]
    assert summary["end_s"] == pytest.approx(cut_at)
    assert max(e["ts"] for e in events if e.get("cat") == "step") <= cut_at * 1e6


def test_disaggregated_processes_and_kv_transfers():
    result, engine = replay(scheduler="disagg", prefill_replicas=1, decode_replicas=2)
    events = chrome_trace_events(engine, result)["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {0: "prefill 0", 1: "decode 1", 2: "decode 2"}
    moved = result[result["pred_decode_replica_id"] >= 0]
    assert len(moved) > 0
    xfers = [e for e in events if e["name"] == "kv transfer"]
    assert len(xfers) == len(moved) and all(e["pid"] == 0 for e in xfers)
    np.testing.assert_allclose(sorted(e["dur"] for e in xfers), sorted(moved["pred_kv_transfer_s"] * 1e6), rtol=1e-6,
                               atol=1e-3)
    decode = [e for e in events if e["name"] == "decode" and e.get("cat") == "request"]
    assert {e["pid"] for e in decode} <= {1, 2} and len(decode) == len(moved)
    # the decode-side slice of a request ends at its last token, on the decode instance it was sent to
    side = {e["name"]: e for e in request_slices(events) if e["pid"] in (1, 2)}
    for row in moved.itertuples():
        e = side[row.request_id]
        assert e["pid"] == row.pred_decode_replica_id
        assert (e["ts"] + e["dur"]) == pytest.approx((row.arrival_time_s + row.pred_e2e_s) * 1e6, abs=1e-2)
    # each request's flow ends on the decode instance's step that completed it
    for rq in moved["request_id"][:20]:
        flow = [e for e in events if e["ph"] in "stf" and e.get("name") == rq]
        assert flow[0]["pid"] == 0 and flow[-1]["pid"] == side[rq]["pid"]


def _cli_files(tmp_path):
    from helpers import write_calibration
    from schemas.tables import REQUEST_TRACE
    from traces.io import write_trace

    write_trace(TRACE, REQUEST_TRACE, tmp_path / "t.parquet")
    write_calibration(COST, tmp_path / "cal.json")
    return str(tmp_path / "t.parquet"), str(tmp_path / "cal.json")


def test_cli_warns_naming_the_option_when_requests_are_cut(tmp_path):
    from replay.cli import main

    trace, cal = _cli_files(tmp_path)
    out = tmp_path / "ct.json.gz"
    res = CliRunner().invoke(main, [trace, "--calibration", cal, "--chrome-trace", str(out),
                                    "--chrome-trace-max-requests", "100", "--chrome-trace-window", "1:"])
    assert res.exit_code == 0, res.output
    assert "--chrome-trace-max-requests 100" in res.output and "first 100 of" in " ".join(res.output.split())
    events = json.loads(gzip.decompress(out.read_bytes()))["traceEvents"]
    assert len([e for e in request_slices(events) if "num_prompt_tokens" in e["args"]]) == 100
    res = CliRunner().invoke(main, [trace, "--calibration", cal, "--chrome-trace", str(tmp_path / "all.json")])
    assert res.exit_code == 0 and "warning" not in res.output  # 400 requests: under the default cap


@pytest.mark.parametrize("args, needle", [
    (("--chrome-trace-window", "1:2"), "--chrome-trace-window: give --chrome-trace too"),
    (("--chrome-trace-max-requests", "5"), "--chrome-trace-max-requests: give --chrome-trace too"),
    (("--chrome-trace", "x.json", "--chrome-trace-window", "3:1"), "END must be greater than START"),
])
def test_cli_chrome_trace_usage_errors(tmp_path, args, needle):
    from replay.cli import main

    trace, cal = _cli_files(tmp_path)
    res = CliRunner().invoke(main, [trace, "--calibration", cal, *args])
    assert res.exit_code == 2 and needle in res.output and "replaying" not in res.output
