"""Routers over replicas, and the replay CLI with routing, prefix caching, SLOs and --chrome-trace."""
import json

import pandas as pd
import pytest
from click.testing import CliRunner

from helpers import LinearStepCost
from replay.core.engine import Engine
from replay.core.engine_config import EngineConfig
from replay.errors import ConfigError
from replay.core.kv_cache import make_kv_cache
from replay.core.request import Request
from replay.core.routing import ROUTERS, RoundRobinRouter, get_router, least_loaded, prefix_affinity
from replay.schedulers import get_scheduler_factory
from replay.schedulers.base import ReplicaState, SchedulerConfig
from replay.cost.cost_model import RooflineCostModel
from schemas.cost_params import CostParams

COST = LinearStepCost(0.010, 1e-4)


def states(loads, prefix_caching=False):
    out = []
    for i, (w, r) in enumerate(loads):
        s = ReplicaState(i, SchedulerConfig(), make_kv_cache(100, 16, prefix_caching))
        s.waiting.extend(Request(j, f"w{j}", 0.0, 1, 1) for j in range(w))
        s.running.extend(Request(j, f"r{j}", 0.0, 1, 1) for j in range(r))
        out.append(s)
    return out


def run(specs, router, replicas=2, prefix=False):
    reqs = [Request(i, k, a, p, o, block_hashes=h) for i, (k, a, p, o, h) in enumerate(specs)]
    eng = Engine(COST, get_scheduler_factory("chunked"), SchedulerConfig(256, 2048),
                 EngineConfig(10**5, 16, enable_prefix_caching=prefix), num_replicas=replicas,
                 router=get_router(router) if router else None)
    eng.run(reqs)
    return {r.request_id: r for r in reqs}


def test_round_robin_matches_the_engine_default():
    specs = [(f"q{i}", 0.01 * i, 10, 2, None) for i in range(7)]
    by_router = run(specs, "round_robin", replicas=3)
    default = run(specs, None, replicas=3)
    assert [by_router[k].replica_id for k in by_router] == [0, 1, 2, 0, 1, 2, 0]
    assert [default[k].replica_id for k in default] == [0, 1, 2, 0, 1, 2, 0]
    rr = RoundRobinRouter()
    assert [rr(None, [0, 0]) for _ in range(3)] == [0, 1, 0]


def test_least_loaded_counts_waiting_and_running_ties_to_lowest_id():
    assert least_loaded(None, states([(1, 1), (0, 1), (1, 0)])) == 1
    assert least_loaded(None, states([(0, 2), (3, 0), (0, 1)])) == 2
    assert least_loaded(None, states([(0, 0), (0, 0)])) == 0


def test_least_loaded_in_the_engine_avoids_the_busy_replica():
    # "long" keeps replica 0 busy (~2 s); "s" is done by 0.5 s, so "b" finds loads [1, 0]: replica 1.
    # Round robin puts "b" back on the busy replica 0.
    specs = [("long", 0.0, 1000, 200, None), ("s", 0.001, 10, 2, None), ("b", 0.5, 10, 2, None)]
    out = run(specs, "least_loaded")
    assert [out[k].replica_id for k in ("long", "s", "b")] == [0, 1, 1]
    out = run(specs, "round_robin")
    assert [out[k].replica_id for k in ("long", "s", "b")] == [0, 1, 0]


def test_prefix_affinity_follows_the_cached_prefix_else_least_loaded():
    p1, p2 = [1, 2, 3, 4], [9, 8, 7, 6]
    specs = [("a", 0.0, 64, 2, p1),          # both empty: least loaded -> 0
             ("b", 0.001, 64, 2, p2),        # 0 is busy -> 1
             ("c", 1.0, 64, 2, p2[:3] + [5]),  # both idle; replica 1 holds 3 blocks of its prefix -> 1
             ("d", 2.0, 64, 2, p1[:1] + [0, 0, 0]),  # replica 0 holds 1 block -> 0
             ("e", 3.0, 64, 2, [42, 43, 44, 45])]  # no match anywhere: least loaded, lowest id -> 0
    out = run(specs, "prefix_affinity", prefix=True)
    assert [out[k].replica_id for k in "abcde"] == [0, 1, 1, 0, 0]
    assert (out["c"].num_cached_tokens, out["d"].num_cached_tokens) == (48, 16)
    # without prefix caching there is nothing to match: it is least_loaded
    out = run(specs, "prefix_affinity", prefix=False)
    assert [out[k].replica_id for k in "abcde"] == [0, 1, 0, 0, 0]


def test_prefix_affinity_prefers_the_longer_match_over_the_lower_load():
    reps = states([(0, 0), (2, 2)], prefix_caching=True)
    r = Request(0, "x", 0.0, 64, 1, block_hashes=[1, 2, 3, 4])
    reps[1].kv.allocate(r, 64)  # replica 1 holds the whole prompt
    q = Request(1, "y", 0.0, 64, 1, block_hashes=[1, 2, 3, 9])
    assert prefix_affinity(q, reps) == 1
    assert least_loaded(q, reps) == 0


def test_unknown_router():
    assert set(ROUTERS) == {"round_robin", "least_loaded", "prefix_affinity"}
    with pytest.raises(ConfigError, match="least_loaded"):
        get_router("random")


# -- the replay CLI ---------------------------------------------------------------------------------------

@pytest.fixture
def trace_and_calibration(tmp_path):
    from helpers import write_calibration
    from schemas.specs import get_gpu, get_model
    from schemas.tables import REQUEST_TRACE
    from traces.io import write_trace

    n = 12
    df = pd.DataFrame({"request_id": [f"r{i}" for i in range(n)], "arrival_time_s": [0.01 * i for i in range(n)],
                       "num_prompt_tokens": [600 + 10 * i for i in range(n)],
                       "num_output_tokens": [5 + i for i in range(n)],
                       "block_hashes": [[1, 2, 100 + i] if i % 2 else [3, 4, 200 + i] for i in range(n)],
                       "slo_ttft_s": [0.05 if i % 3 else None for i in range(n)]})
    trace = tmp_path / "t.parquet"
    write_trace(df, REQUEST_TRACE, trace, {"hash_block_tokens": 256})
    cal = tmp_path / "cal.json"
    write_calibration(RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb"),
                                        CostParams(eta_compute=0.5, eta_mem=0.8, t_step_s=1e-4)), cal)
    return trace, cal, df


@pytest.mark.parametrize("scheduler", ["static", "sjf", "edf"])
def test_replay_cli_with_router_prefix_caching_slos_and_chrome_trace(tmp_path, trace_and_calibration, scheduler):
    from replay.cli import main

    trace, cal, df = trace_and_calibration
    out, ct = tmp_path / "pred.parquet", tmp_path / "trace.json"
    res = CliRunner().invoke(main, [str(trace), "--calibration", str(cal), "--scheduler", scheduler, "--replicas", "2",
                                    "--router", "prefix_affinity", "--enable-prefix-caching", "--slo-ttft-s", "0.5",
                                    "--slo-tpot-s", "0.05", "--preemption-mode", "swap", "--num-gpu-blocks", "300",
                                    "-o", str(out), "--chrome-trace", str(ct)])
    assert res.exit_code == 0, res.output
    assert "prefix cache:" in res.output and "goodput" in res.output
    pred = pd.read_parquet(out)
    assert (pred["pred_status"] == "ok").all()
    # metadata hash_block_size 256: the two prompt families share 2 x 256 tokens after their first request
    assert pred["pred_num_cached_tokens"].tolist()[2:] == [512] * (len(df) - 2)
    assert set(pred["pred_replica_id"]) == {0, 1}

    events = json.loads(ct.read_text())["traceEvents"]
    steps = [e for e in events if e["ph"] == "X" and e.get("cat") == "step"]
    reqs = [e for e in events
            if e["ph"] == "X" and e.get("cat") == "request" and "num_prompt_tokens" in e.get("args", {})]
    assert {e["pid"] for e in steps} == {0, 1}
    assert sorted(e["name"] for e in reqs) == sorted(df["request_id"])
    assert all("num_decode_seqs" in e["args"] and e["args"]["requests"] for e in steps)
    for rid in df["request_id"]:  # one flow per request: arrival -> ... -> completing step
        flow = [e for e in events if e["ph"] in "stf" and e.get("name") == rid]
        assert flow[0]["ph"] == "s" and flow[-1]["ph"] == "f" and len({e["id"] for e in flow}) == 1
        row = pred.set_index("request_id").loc[rid]
        assert flow[0]["ts"] == pytest.approx(row["arrival_time_s"] * 1e6)
        done = (row["arrival_time_s"] + row["pred_e2e_s"]) * 1e6
        last = next(e for e in steps if e["ts"] <= flow[-1]["ts"] <= e["ts"] + e["dur"] and e["pid"] == flow[-1]["pid"])
        assert last["ts"] + last["dur"] == pytest.approx(done) and rid in last["args"]["requests"]
    # per lane, request slices never overlap
    lanes = {}
    for e in reqs:
        lanes.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in lanes.values():
        spans.sort()
        assert all(a[1] < b[0] for a, b in zip(spans, spans[1:]))


def test_chrome_trace_needs_recorded_step_requests():
    from replay.analysis.chrome_trace import chrome_trace_events

    eng = Engine(COST, get_scheduler_factory("chunked"), SchedulerConfig(), EngineConfig(100, 16, record_steps=True))
    eng.run([Request(0, "a", 0.0, 10, 2)])
    with pytest.raises(ValueError, match="record_step_requests"):
        chrome_trace_events(eng, pd.DataFrame())
