"""``servecal plan --pp ... --dp ...``: candidates with pipeline stages and data-parallel ranks,
counted in GPUs, their pools sized exactly as ``replay`` sizes them, and bad values refused
with one usage error naming the option (issue #32 item 5)."""
import math

import pandas as pd
import pytest

from replay.config import ReplayConfig
from replay.core.deployment import resolve_deployment
from replay.cost.cost_model import cost_model_from_calibration
from replay.plan import Axes, Calibrations, base_options, parse_slo
from replay.plan.grid import Candidate, prepare
from replay.simulate import replay_frame
from replay.text import WIDTH
from test_plan import GPU, MODEL, SLO, TRACE, calibration, plan_cli, plan_files

#: The engine settings of the calibration (test_plan.ENGINE) a replay of a candidate takes.
LIMITS = dict(max_num_seqs=64, max_num_batched_tokens=512, block_size=16, gpu_memory_utilization=0.9)


def by_hand_blocks(tp: int, pp: int) -> int:
    """KV blocks of one replica of ``tp x pp`` H100s for llama-3.1-8b at utilization 0.9, from
    the spec's numbers: each GPU holds 1/(tp pp) of the weights and, per block of 16 tokens,
    the K and V of its 1/pp of the 32 layers, 8 KV heads / tp, head size 128, 2 bytes."""
    assert (MODEL.num_layers, MODEL.num_kv_heads, MODEL.head_dim, MODEL.kv_dtype_bytes) == (32, 8, 128, 2)
    assert GPU.mem_bytes == 80 * 2 ** 30 and MODEL.weight_bytes == 16.06e9
    block_bytes = 16 * 2 * 32 * (8 // tp) * 128 * 2 / pp
    return math.floor((80 * 2 ** 30 * 0.9 - 16.06e9 / (tp * pp)) / block_bytes)


def test_pp_and_dp_axes_list_every_layout_with_its_gpu_count():
    axes = Axes(["h100-80gb"], [1, 2], [1, 2], [64], [512], ["chunked"], pp=[1, 2], dp=[1, 2])
    got = {(c.label(), c.num_gpus) for c in axes.candidates()}
    assert len(got) == 16
    assert {("1 x h100-80gb TP1", 1), ("1 x h100-80gb TP1 PP2", 2), ("1 x h100-80gb TP1 DP2", 2),
            ("2 x h100-80gb TP2 PP2", 8), ("2 x h100-80gb TP2 DP2", 8), ("2 x h100-80gb TP2 PP2 DP2", 16)} <= got
    assert all(c.num_gpus == c.replicas * c.tp * c.pp * c.dp for c in axes.candidates())
    # disaggregated: each pool's instances x their TP, x PP x DP; within the colocated budget of its layout
    dis = Axes(["h100-80gb"], [1], [1, 2], [64], [512], ["disagg"], pp=[1, 2]).candidates()
    assert {(c.label(), c.num_gpus) for c in dis} == {
        ("P1xTP1 + D1xTP1 h100-80gb", 2), ("P1xTP1 + D1xTP1 h100-80gb PP2", 4)}
    assert Candidate("h100-80gb", 2, 1, 64, 512, "disagg", 1, 3, 1, dp=2).num_gpus == (1 * 2 + 3 * 1) * 2


@pytest.mark.parametrize("pp, dp", [(2, 1), (1, 2)])
def test_the_plan_sizes_a_candidates_kv_as_replay_does(pp, dp):
    """PP 2: each of a replica's 2 virtual engines holds half the blocks of a replica whose GPUs
    hold half the layers; DP 2: the replica holds both ranks' blocks. Replay's own path (the
    calibration at that layout, its options, the engine it builds) gets the same."""
    cal = calibration()
    cals = Calibrations([("c", cal)])
    p = prepare(Candidate("h100-80gb", 1, 1, 64, 512, "chunked", dp=dp, pp=pp), cals,
                base_options(cals, parse_slo([SLO])), {}, 4000)
    assert p.skip is None
    expected = by_hand_blocks(1, pp) * dp // pp
    assert expected == {(2, 1): 33034, (1, 2): 58410}[pp, dp]
    assert p.kv_blocks == (expected,) and p.deployment.prefill.num_gpu_blocks == expected
    # replay's path: the cost model at that layout, the options as `replay` would build them
    cm = cost_model_from_calibration(cal, dp=dp, pp=pp)
    dep = resolve_deployment(cm, ReplayConfig.from_options(**LIMITS))
    assert dep.prefill.num_gpu_blocks == expected and dep.num_gpus == p.candidate.num_gpus == 2
    _, engine = replay_frame(TRACE.head(5), p.cost_model, p.cfg)
    assert {r.kv.num_gpu_blocks for r in engine.replicas} == {expected}


def test_a_disaggregated_dp_candidates_decode_pool_holds_its_ranks_blocks_as_replay_does():
    cal = calibration()
    cals = Calibrations([("c", cal)])
    p = prepare(Candidate("h100-80gb", 2, 1, 64, 512, "disagg", 1, 2, 1, dp=2), cals,
                base_options(cals, parse_slo([SLO])), {}, 4000)
    # each pool's instance holds its DP ranks' blocks together, as its limits are theirs and its GPUs counted
    assert p.kv_blocks == (by_hand_blocks(2, 1) * 2, by_hand_blocks(1, 1) * 2)
    dep = resolve_deployment(cost_model_from_calibration(cal, tp=2, dp=2),
                             ReplayConfig.from_options(**LIMITS, scheduler="disagg", prefill_replicas=1,
                                                       decode_replicas=2, tp_prefill=2, tp_decode=1))
    assert (dep.prefill.num_gpu_blocks, dep.decode.num_gpu_blocks) == p.kv_blocks
    assert dep.num_gpus == p.candidate.num_gpus == 8


def test_pp_with_dp_is_skipped_with_the_engines_reason():
    cals = Calibrations([("c", calibration())])
    p = prepare(Candidate("h100-80gb", 1, 1, 64, 512, "chunked", dp=2, pp=2), cals,
                base_options(cals, parse_slo([SLO])), {}, 4000)
    assert "--pp with --data-parallel-size is not modelled" in p.skip


@pytest.fixture
def files(tmp_path):
    return plan_files(tmp_path, 40)


def plan(trace, cal, *args):
    return plan_cli(trace, cal, "--slo", "ttft_p90=5s", *args)


def test_cli_lists_pp_and_dp_candidates_with_their_gpus(files, tmp_path):
    out = tmp_path / "plan.csv"
    res = plan(*files, "--pp", "1,2", "--dp", "1,2", "--exhaustive", "--wide", "-o", out)
    assert res.exit_code == 0, res.output
    table = pd.read_csv(out)
    assert sorted(zip(table["pp"], table["dp"], table["num_gpus"], table["status"] == "skipped")) == [
        (1, 1, 1, False), (1, 2, 2, False), (2, 1, 2, False), (2, 2, 4, True)]
    text = " ".join(res.output.split())
    assert "1 x h100-80gb TP1 PP2" in text and "1 x h100-80gb TP1 DP2" in text
    # a layout the calibration was not fitted at is labelled an extrapolation, as a TP is
    assert "note: PP 2 differs from the calibrated PP1" in text and "note: DP 2 differs from the calibrated DP1" in text
    assert "--pp with --data-parallel-size is not modelled" in text  # the skipped one, with the engine's reason
    assert table.loc[(table["pp"] == 2) & (table["dp"] == 1), "kv_blocks"].item() == 33034


@pytest.mark.parametrize("args, needle", [
    (["--pp", "0"], "--pp 0: 0 is below 1"),
    (["--dp", "x"], "--dp x: 'x' is not an integer"),
    (["--data-parallel-size", "1,0"], "--dp 1,0: 0 is below 1"),
    (["--pp", "1,33"], "Invalid value for '--pp': 33 pipeline stages exceed the 32 layers of llama-3.1-8b"),
    (["--pp", "2", "--dp", "2,4"], "--pp 2 with --dp 2,4: pipeline stages with DP ranks are not modelled"),
])
def test_bad_pp_or_dp_is_one_usage_error_naming_the_option(files, tmp_path, args, needle):
    out = tmp_path / "plan.csv"
    res = plan(*files, *args, "-o", out)
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and max(map(len, res.output.splitlines())) <= WIDTH, res.output
    assert sum(line.startswith("Error:") for line in res.output.splitlines()) == 1, res.output
    assert needle in " ".join(res.output[res.output.index("Error:"):].split())
    assert not out.exists()


def test_a_run_headers_gpu_count_of_disaggregated_pools_is_the_deployments():
    """describe_config / pool_gpus count each pool's instances x TP x PP x DP, as the resolved
    Deployment and the plan's candidate do (DP was left out before)."""
    from replay.core.disagg_pools import describe_config, pool_gpus

    cm = cost_model_from_calibration(calibration(), tp=2, dp=2)
    cfg = ReplayConfig.from_options(**LIMITS, scheduler="disagg", prefill_replicas=1, decode_replicas=3, tp_decode=1)
    dep = resolve_deployment(cm, cfg)
    assert pool_gpus(cm, cfg.disagg) == dep.num_gpus == Candidate("h100-80gb", 2, 1, 64, 512, "disagg", 1, 3, 1,
                                                                   dp=2).num_gpus == 10
    assert describe_config(cm, cfg.disagg).startswith(
        "1 prefill x 4 x h100-80gb + 3 decode x 2 x h100-80gb (10 GPUs; prefill TP=2, decode TP=1, DP=2)")
