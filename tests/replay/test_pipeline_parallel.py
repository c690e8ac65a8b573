"""Pipeline parallelism (replay/core/pipeline.py, ``replay --pp K``): hand-worked pipeline timelines,
the stage cost, the activation transfer and the KV capacity by hand, PP 1 unchanged, options.

Hand-worked costs: a stage of a micro-batch of N tokens takes 10 ms + 0.1 ms/token
(:class:`StageCost`), the activation transfer between two stages 1 ms + 0.01 ms/token. With two
stages a micro-batch entering stage 1 at s leaves stage 1 at e1 = s + t, enters stage 2 at
max(e1 + x, when stage 2 frees) and emits its tokens when it leaves stage 2.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from helpers import LinearStepCost, replay_both_paths, step_rows, write_calibration
from pp_golden import fingerprint
from replay.config import DisaggOptions, EngineOptions, RecordOptions, ReplayConfig, SchedulingOptions
from replay.cost.cost_model import Link, RooflineCostModel
from replay.core.engine_config import EngineConfig
from replay.errors import ConfigError
from replay.cost.kv_capacity import kv_block_bytes_per_rank, kv_capacity_blocks
from replay.core.pipeline import PipelineDisaggEngine, PipelineEngine
from replay.core.request import Request
from replay.schedulers import get_scheduler_factory
from replay.schedulers.base import SchedulerConfig
from replay.simulate import replay_frame
from schemas.calibration import Calibration
from schemas.cost_params import CostParams
from schemas.specs import GpuSpec, ModelSpec, get_gpu, get_model

MS = 1e-3
LLAMA, H100 = get_model("llama-3.1-8b"), get_gpu("h100-80gb")


class StageCost(LinearStepCost):
    """One stage: 10 ms + 0.1 ms per token; stage-to-stage transfer 1 ms + 0.01 ms per token."""

    model, gpu, tp = LLAMA, H100, 1

    def __init__(self, pp=2, base_s=10 * MS, per_token_s=0.1 * MS):
        super().__init__(base_s, per_token_s)
        self.pp = pp

    def pp_transfer_s(self, num_tokens):
        return 1 * MS + 0.01 * MS * num_tokens


def _requests(specs):
    return [Request(i, rid, a, p, o, record_token_times=True) for i, (rid, a, p, o) in enumerate(specs)]


#: A (t=0, prompt 100, 3 tokens), B (t=5 ms, prompt 50, 2 tokens), C (t=30 ms, prompt 20, 2 tokens)
CASE = [("A", 0.0, 100, 3), ("B", 5 * MS, 50, 2), ("C", 30 * MS, 20, 2)]


def test_hand_worked_two_stage_timeline():
    # Virtual engines VE0, VE1 (vLLM v0: each its own scheduler; an arrival goes to the one with the
    # fewest unfinished requests, ties to the first).
    #  0    A -> VE0; VE0 schedules A's prompt (100): t = 20, x = 2. stage 1 [0, 20], stage 2 [22, 42]
    #  5    B -> VE1 (VE0 holds A); stage 1 busy until 20: VE1 tries again at 20
    # 20    VE1: B's prompt (50): t = 15, x = 1.5. stage 1 [20, 35]; stage 2 max(36.5, 42) -> [42, 57]
    # 30    C -> VE0 (loads 1 and 1: the first); VE0's micro-batch is in flight
    # 42    A token 1. VE0: A decode + C prompt 20 = 21 tokens: t = 12.1, x = 1.21.
    #       stage 1 [42, 54.1]; stage 2 max(55.31, 57) -> [57, 69.1]
    # 57    B token 1. VE1: B decode: t = 10.1, x = 1.01. stage 1 [57, 67.1]; stage 2 max(68.11, 69.1)
    #       -> [69.1, 79.2]
    # 69.1  A token 2, C token 1. VE0: 2 decodes: t = 10.2, x = 1.02. stage 1 [69.1, 79.3];
    #       stage 2 max(80.32, 79.2) -> [80.32, 90.52]
    # 79.2  B token 2 (done). 90.52: A token 3, C token 2 (done)
    expected = {"A": [42, 69.1, 90.52], "B": [57, 79.2], "C": [69.1, 90.52]}
    reqs = _requests(CASE)
    eng = PipelineEngine(StageCost(), get_scheduler_factory("chunked"), SchedulerConfig(256, 2048),
                         EngineConfig(10**6, 16, None, True, True, exact_steps=True), num_replicas=1, pp=2)
    eng.run(reqs)
    for r in reqs:
        assert r.token_times_s == pytest.approx([t * MS for t in expected[r.request_id]], rel=1e-12, abs=1e-15)
        assert r.replica_id == 0  # the replica, not its virtual engine
    assert [r.first_scheduled_time_s / MS for r in reqs] == pytest.approx([0, 20, 42])
    # step trace: each micro-batch's pass through stage 1 (start, stage time); never overlapping
    assert [(s.replica_id, round(s.step_start_time_s / MS, 9), round(s.step_duration_s / MS, 9))
            for s in step_rows(eng)] == [
        (0, 0, 20), (0, 20, 15), (0, 42, 12.1), (0, 57, 10.1), (0, 69.1, 10.2)]


def test_replay_frame_pp2_is_the_same_timeline_on_both_paths():
    trace = pd.DataFrame({"request_id": [c[0] for c in CASE], "arrival_time_s": [c[1] for c in CASE],
                          "num_prompt_tokens": [c[2] for c in CASE], "num_output_tokens": [c[3] for c in CASE]})
    slow, fast = replay_both_paths(trace, StageCost(), atol=0.0, num_gpu_blocks=10**6, record_token_times=True)
    got = {rid: [(t + a) / MS for t in times] for rid, a, times in
           zip(fast["request_id"], fast["arrival_time_s"], fast["pred_token_times_s"])}
    assert got["A"] == pytest.approx([42, 69.1, 90.52])
    assert got["C"] == pytest.approx([69.1, 90.52])


def test_a_full_pipeline_completes_one_micro_batch_per_stage_time_without_transfers():
    # two identical decoding requests on two virtual engines, transfers free: the micro-batches
    # alternate, the pipeline is full, and each request gets a token every 2 t (its latency)
    cost = StageCost(base_s=10 * MS, per_token_s=0.0)
    cost.pp_transfer_s = lambda n: 0.0
    reqs = _requests([("A", 0.0, 10, 4), ("B", 0.0, 10, 4)])
    eng = PipelineEngine(cost, get_scheduler_factory("chunked"), SchedulerConfig(256, 2048),
                         EngineConfig(10**6, 16, None, True, True, exact_steps=True), pp=2)
    eng.run(reqs)
    a, b = (r.token_times_s for r in reqs)
    assert a == pytest.approx([20 * MS, 40 * MS, 60 * MS, 80 * MS])
    assert b == pytest.approx([30 * MS, 50 * MS, 70 * MS, 90 * MS])
    starts = [s.step_start_time_s for s in step_rows(eng)]
    assert [round((y - x) / MS, 9) for x, y in zip(starts, starts[1:])] == [10] * 7  # one per stage time


def test_disagg_with_two_decode_stages_hand_worked():
    # prefill: one instance, 10 ms + 0.1 ms/token, no pipeline. A (prompt 100, 3 tokens) and
    # B (prompt 50, 2 tokens) at t=0 share a prefill step [0, 25 ms]: token 1 of both at 25.
    # KV over the link (Llama's D_kv at 1.31072e9 B/s: 0.1 ms/token) + 1 ms, migrated one after the other
    # by the instance's driver loop (pull, DistServe): A 25 -> 36, B 36 -> 42; no micro-batch enters
    # stage 1 before 42. Decode virtual engines of the one 2-stage decode instance (least loaded,
    # inbound counted): A -> VE 0, B -> VE 1. Decode stage 5 ms + 0.1 ms/token, transfer 1 ms + 0.01 ms/token.
    # 42     VE0: A decode, t = 5.1, x = 1.01: stage 1 [42, 47.1], stage 2 [48.11, 53.21] -> A token 2
    #        VE1: stage 1 busy until 47.1; B decode: [47.1, 52.2], stage 2 max(53.21, 53.21)
    #        -> [53.21, 58.31] -> B token 2
    # 53.21  VE0: A decode: [53.21, 58.31], stage 2 [59.32, 64.42] -> A token 3
    link = Link("test", LLAMA.kv_bytes_per_token * 1e4, 1e-3)
    reqs = _requests([("A", 0.0, 100, 3), ("B", 0.0, 50, 2)])
    eng = PipelineDisaggEngine(LinearStepCost(10 * MS, 0.1 * MS), StageCost(base_s=5 * MS),
                               SchedulerConfig(2, 2048), EngineConfig(10**6, 16, None, True, True, exact_steps=True),
                               decode_num_gpu_blocks=10**6, model=LLAMA, link=link, pp_decode=2)
    eng.run(reqs)
    a, b = (r.token_times_s for r in reqs)
    assert a == pytest.approx([25 * MS, 53.21 * MS, 64.42 * MS], rel=1e-12)
    assert b == pytest.approx([25 * MS, 58.31 * MS], rel=1e-12)
    cols = eng.result_columns(2)
    assert cols["pred_decode_replica_id"].tolist() == [1, 1]  # the decode instance (P + 0), not its VE
    assert eng.process_names() == ["prefill 0", "decode 1"]


def test_a_pipelined_decode_instance_migrates_once_its_stages_have_drained():
    # As the test above, A and B now 4 tokens each, and C (prompt 20, 2 tokens) arrives at 38 ms:
    # its prefill [38, 50] (10 + 2 ms) emits token 1 at 50, while A is in stage 2 [48.11, 53.21] and
    # B in stage 1 [47.1, 52.2]. The decode loop accepts C between its steps, when A's micro-batch
    # leaves at 53.21; DistServe's migration is a call to every stage's worker, each running it after
    # the step it holds, so it starts when stage 2 has passed B [53.21, 58.31]: 58.31 -> 61.31
    # (20 x 0.1 + 1 ms), not at 53.21 (what the loop alone would allow: 53.21 -> 56.21).
    # 61.31  VE0: A and C (routed to VE 0: tie at one request each, lowest id), 2 tokens: t = 5.2,
    #        x = 1.02: stage 1 [61.31, 66.51], stage 2 [67.53, 72.73] -> A token 3, C token 2
    link = Link("test", LLAMA.kv_bytes_per_token * 1e4, 1e-3)
    reqs = _requests([("A", 0.0, 100, 4), ("B", 0.0, 50, 4), ("C", 38 * MS, 20, 2)])
    eng = PipelineDisaggEngine(LinearStepCost(10 * MS, 0.1 * MS), StageCost(base_s=5 * MS),
                               SchedulerConfig(2, 2048), EngineConfig(10**6, 16, None, True, True, exact_steps=True),
                               decode_num_gpu_blocks=10**6, model=LLAMA, link=link, pp_decode=2)
    eng.run(reqs)
    c = eng.transfers[2]
    assert (c.start_time_s, c.end_time_s) == pytest.approx((58.31 * MS, 61.31 * MS), rel=1e-12)
    assert eng.result_columns(3)["pred_handoff_wait_s"][2] == pytest.approx(8.31 * MS, rel=1e-12)
    a, _, c_times = (r.token_times_s for r in reqs)
    assert a[:3] == pytest.approx([25 * MS, 53.21 * MS, 72.73 * MS], rel=1e-12)
    assert c_times == pytest.approx([50 * MS, 72.73 * MS], rel=1e-12)


def test_a_pipelined_decode_instance_accepts_under_one_share_over_its_virtual_engines():
    """DistServe's pipelined decode instance has one scheduler over its pp batch queues: the 5 % share of
    accepted, unbatched prompts is the instance's (both virtual engines' blocks), not each one's."""
    link = Link("test", LLAMA.kv_bytes_per_token * 1e4, 1e-3)
    eng = PipelineDisaggEngine(LinearStepCost(10 * MS, 0.1 * MS), StageCost(base_s=5 * MS),
                               SchedulerConfig(2, 2048), EngineConfig(10**6, 16, None, True, True, exact_steps=True),
                               decode_num_gpu_blocks=100, model=LLAMA, link=link, pp_decode=2, decode_replicas=2)
    assert [eng._instance_of(i) for i in range(4)] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    (req,) = _requests([("A", 0.0, 16, 2)])
    eng._accepted_blocks = [0, 9, 0, 0]  # 9 of the first instance's 200 blocks: 4.5 % < 5 %, it accepts
    assert eng._accepts(0, req) and eng._accepts(1, req)
    eng._accepted_blocks = [0, 10, 0, 0]  # 10 of 200: 5 %, it does not, though VE 0 alone holds none
    assert not eng._accepts(0, req) and not eng._accepts(1, req) and eng._accepts(2, req)


def test_stage_time_is_the_step_time_of_half_the_layers():
    # every per-layer term halves at PP 2 (compute, weights, KV, TP all-reduces); the per-step and
    # per-sequence CPU time does not
    p = CostParams(eta_compute=0.5, eta_mem=0.8, t_step_s=3e-4, t_seq_s=2e-5, overlap=0.3)
    one, two = RooflineCostModel(LLAMA, H100, p, 2), RooflineCostModel(LLAMA, H100, p, 2, pp=2)
    for shape in [(0, 32, 32 * 900, 0, 0), (512, 8, 8000, 1024, 2), (2048, 0, 0, 0, 1)]:
        cpu = 3e-4 + 2e-5 * (shape[4] + shape[1])
        assert two.step_time_s(*shape) - cpu == pytest.approx((one.step_time_s(*shape) - cpu) / 2, rel=1e-12)


def test_activation_transfer_bytes_by_hand():
    cm = RooflineCostModel(LLAMA, H100, pp=2)
    # Llama-3.1-8B: hidden 4096, bf16 (2 bytes): 100 tokens -> 100 * 4096 * 2 = 819,200 bytes
    assert cm.pp_activation_bytes(100) == 819_200
    # over the H100's own link (nvlink4: 450 GB/s, 2 us)
    assert cm.pp_link.name == "nvlink4"
    assert cm.pp_transfer_s(100) == pytest.approx(819_200 / 450e9 + 2e-6, rel=1e-15)
    assert RooflineCostModel(LLAMA, H100).pp_transfer_s(100) == 0.0  # no stage boundary at PP 1


def test_kv_blocks_at_pp2_by_hand():
    GiB = 2**30
    m = ModelSpec(name="nc04", num_params=8 * GiB, num_active_params=8 * GiB, num_layers=32, hidden_size=4096,
                  num_attention_heads=32, num_kv_heads=8, head_dim=128, dtype_bytes=2, max_model_len=32768)
    gpu = GpuSpec("80gib", 1e15, 2e12, 80 * GiB)
    non_kv = dict(activation_bytes=1.5 * GiB, non_torch_bytes=0.5 * GiB)
    # a block of one stage: 16 layers x 16 tokens x (K, V) x 8 heads x 128 x 2 B = 1 MiB
    assert kv_block_bytes_per_rank(m, 1, 16, pp=2) == 16 * 16 * 2 * 8 * 128 * 2 == 2**20
    # (72 GiB - (16 GiB / 2 + 2 GiB)) / 1 MiB = 62 GiB / 1 MiB = 63,488 (PP 1: 54 GiB / 2 MiB = 27,648)
    assert kv_capacity_blocks(m, gpu, 1, 0.9, 16, pp=2, **non_kv) == 62 * 1024 == 63_488
    assert kv_capacity_blocks(m, gpu, 1, 0.9, 16, **non_kv) == 27_648
    # the replay gives each of the 2 virtual engines half: Llama-3.1-8B on an H100 at 0.9
    w, kv_tok = LLAMA.weight_bytes, LLAMA.kv_bytes_per_token
    replica = math.floor((H100.mem_bytes * 0.9 - w / 2) / (16 * kv_tok / 2))
    trace = pd.DataFrame({"request_id": ["a"], "arrival_time_s": [0.0], "num_prompt_tokens": [10],
                          "num_output_tokens": [2]})
    _, eng = replay_frame(trace, RooflineCostModel(LLAMA, H100, pp=2), ReplayConfig())
    assert [s.kv.num_gpu_blocks for s in eng.replicas] == [replica // 2] * 2


def test_pp1_is_bit_identical_to_before_pipeline_parallelism():
    golden = json.loads((Path(__file__).parents[1] / "data" / "pp1_golden.json").read_text())
    assert fingerprint() == golden


def test_pp_needs_layers_and_refuses_dp():
    with pytest.raises(ConfigError, match="exceeds the 32 layers"):
        RooflineCostModel(LLAMA, H100, pp=33)
    trace = pd.DataFrame({"request_id": ["a"], "arrival_time_s": [0.0], "num_prompt_tokens": [10],
                          "num_output_tokens": [2]})
    with pytest.raises(ConfigError, match="data-parallel"):
        replay_frame(trace, RooflineCostModel(LLAMA, H100, dp=2, pp=2), ReplayConfig())


def _cli_setup(tmp_path):
    from traces.io import write_trace
    from traces.synth import synth_requests
    from schemas.tables import REQUEST_TRACE

    cal, trace = tmp_path / "cal.json", tmp_path / "t.parquet"
    write_calibration(RooflineCostModel(LLAMA, H100, CostParams(eta_compute=0.5, eta_mem=0.8, t_step_s=3e-4)), cal)
    write_trace(synth_requests(60, 8.0, "uniform:100,600", "uniform:20,80", seed=1), REQUEST_TRACE, trace)
    return cal, trace


def test_cli_pipeline_parallel_size_is_an_alias_of_pp(tmp_path):
    from replay.cli import main

    cal, trace = _cli_setup(tmp_path)
    outs = []
    for flag in ("--pp", "--pipeline-parallel-size"):
        out = tmp_path / f"{flag.strip('-')}.parquet"
        res = CliRunner().invoke(main, [str(trace), "--calibration", str(cal), flag, "2", "-o", str(out)])
        assert res.exit_code == 0, res.output
        assert "PP=2" in res.output
        outs.append(pd.read_parquet(out))
    pd.testing.assert_frame_equal(outs[0], outs[1])
    one = tmp_path / "one.parquet"
    assert CliRunner().invoke(main, [str(trace), "--calibration", str(cal), "-o", str(one)]).exit_code == 0
    # two stages of half the layers on twice the GPUs: each micro-batch's latency is about its
    # step time at PP 1 plus a transfer, so TPOT does not drop, while throughput grows
    assert (outs[0]["pred_tpot_s"].median() > 0.9 * pd.read_parquet(one)["pred_tpot_s"].median())


def test_cli_disagg_pp_decode(tmp_path):
    from replay.cli import main

    cal, trace = _cli_setup(tmp_path)
    res = CliRunner().invoke(main, [str(trace), "--calibration", str(cal), "--scheduler", "disagg",
                                    "--pp-decode", "2", "--decode-replicas", "2"])
    assert res.exit_code == 0, res.output
    assert "prefill PP=1, decode PP=2" in res.output and "(5 GPUs;" in res.output
    res = CliRunner().invoke(main, [str(trace), "--calibration", str(cal), "--pp-decode", "2"])
    assert res.exit_code == 2 and "only --scheduler disagg" in res.output
    cfg = ReplayConfig(scheduling=SchedulingOptions("disagg"), disagg=DisaggOptions(pp_decode=2),
                       record=RecordOptions(token_times=True))
    df = pd.read_parquet(trace)
    result, eng = replay_frame(df, RooflineCostModel(LLAMA, H100, CostParams(eta_mem=0.8)), cfg)
    assert set(result["pred_decode_replica_id"]) == {1} and (result["pred_status"] == "ok").all()
    assert len(eng.replicas) == 3  # 1 prefill + 2 decode virtual engines


def test_calibrate_fit_records_pp_and_old_files_read_pp1(tmp_path):
    from calibrate.cli import main as calibrate_main
    from replay.core.result_columns import steps_frame
    from schemas.tables import STEP_TRACE
    from traces.io import read_trace, write_trace

    # a step trace of a PP-2 replay: its rows are stage times, which a --pp 2 fit recovers
    truth = CostParams(eta_compute=0.5, eta_mem=0.7, t_step_s=4e-4)
    cm = RooflineCostModel(LLAMA, H100, truth, pp=2)
    _, trace = _cli_setup(tmp_path)
    _, df, _ = read_trace(trace)
    _, eng = replay_frame(df, cm, ReplayConfig(EngineOptions(max_num_batched_tokens=512),
                                               record=RecordOptions(steps=True)))
    steps = tmp_path / "steps.parquet"
    write_trace(steps_frame(eng), STEP_TRACE, steps)
    out = tmp_path / "fit.json"
    res = CliRunner().invoke(calibrate_main, ["fit", str(steps), "--model", "llama-3.1-8b", "--gpu", "h100-80gb",
                                              "--pipeline-parallel-size", "2", "--variants", "max", "-o", str(out)])
    assert res.exit_code == 0, res.output
    cal = Calibration.read(out)
    assert cal.pp == 2 and json.loads(out.read_text())["pp"] == 2
    assert cal.value("eta_mem") == pytest.approx(0.7, rel=0.02)
    d = json.loads(out.read_text())
    del d["pp"]  # a file written before pipeline parallelism
    old = tmp_path / "old.json"
    old.write_text(json.dumps(d))
    assert Calibration.read(old).pp == 1


def test_chrome_trace_names_replicas_not_virtual_engines():
    from replay.analysis.chrome_trace import chrome_trace_events
    from traces.synth import synth_requests

    trace = synth_requests(80, 10.0, "uniform:50,400", "uniform:5,40", seed=3)
    cfg = ReplayConfig(scheduling=SchedulingOptions(replicas=2), record=RecordOptions(steps=True, step_requests=True))
    result, engine = replay_frame(trace, RooflineCostModel(LLAMA, H100, CostParams(eta_mem=0.8), pp=2), cfg)
    events = chrome_trace_events(engine, result)["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {0: "replica 0", 1: "replica 1"}
    assert set(result["pred_replica_id"]) == {0, 1} and (result["pred_status"] == "ok").all()
    # the step slices of a replica (stage-1 passes) never overlap
    for pid in (0, 1):
        steps = sorted((e["ts"], e["dur"]) for e in events if e["pid"] == pid and e.get("cat") == "step")
        assert steps and all(a + d <= b + 2e-3 for (a, d), (b, _) in zip(steps, steps[1:]))


@pytest.mark.parametrize("scheduler", ["chunked", "sjf"])
def test_least_loaded_router_sees_each_replicas_virtual_engines(scheduler):
    # sjf replaces state.waiting with its own queue: the router's view must follow it
    from replay.core.pipeline import ReplicaGroupView

    reqs = _requests([(f"r{i}", i * MS, 5000, 3) for i in range(6)])  # r4 waits: r5 must see it
    eng = PipelineEngine(StageCost(), get_scheduler_factory(scheduler), SchedulerConfig(1, 64),
                         EngineConfig(10**6, 16, None, True, True, exact_steps=True), num_replicas=2, pp=2,
                         router=lambda req, views: min(
                             range(len(views)), key=lambda i: (len(views[i].waiting) + len(views[i].running), i)))
    eng.run(reqs)
    assert [r.replica_id for r in reqs] == [0, 1, 0, 1, 0, 1]
    view = ReplicaGroupView(0, eng.replicas[:2])
    assert len(view.waiting) == len(view.running) == 0
