"""Prefill/decode disaggregation's options: each phase with its own tensor parallelism (BR-23), the
command line's per-pool flags and their errors, the KV link's presets and overrides.

BR-23's hand values: a 8e9-parameter model on a GPU of 1e15 FLOP/s and 3e12 B/s at eta_compute 0.5
and eta_mem 0.75: a 1,000-token prefill takes 2 x 8e9 x 1000 / (TP x 0.5 x 1e15) s, a decode step
16e9 / (TP x 0.75 x 3e12) s (seed theory.md section 1, ignoring launch latency and KV reads).
"""
import math

import pandas as pd
import pytest
from click.testing import CliRunner

from replay.config import DisaggOptions, ReplayConfig, SchedulingOptions
from replay.core.disagg_pools import pool_cost_models, resolve_link
from replay.cost.cost_model import Link, RooflineCostModel
from replay.cost.cost_terms import SEED_TERMS
from replay.errors import ConfigError
from replay.schedulers import get_scheduler_factory
from replay.simulate import replay_frame
from schemas.cost_params import CostParams
from schemas.specs import GpuSpec, ModelSpec


# -- BR-23: each phase with its own tensor parallelism -----------------------------------------------

BR23_MODEL = ModelSpec("br23-8b", num_params=8e9, num_active_params=8e9, num_layers=1, hidden_size=1,
                       num_attention_heads=8, num_kv_heads=1, head_dim=1, dtype_bytes=2, max_model_len=4096)
BR23_GPU = GpuSpec("br23-gpu", peak_flops=1e15, mem_bandwidth_bytes_per_s=3e12, mem_bytes=80 * 2**30,
                   tp_link="nvlink4")
BR23_PARAMS = CostParams(eta_compute=0.5, eta_mem=0.75, t_step_s=0.0)
BR23_TRACE = pd.DataFrame({"request_id": ["r"], "arrival_time_s": [0.0], "num_prompt_tokens": [1000],
                           "num_output_tokens": [2]})


@pytest.mark.parametrize("tp_prefill, tp_decode, ttft_s, tpot_s", [
    (2, 1, 2 * 8e9 * 1000 / (2 * 0.5 * 1e15), 16e9 / (1 * 0.75 * 3e12)),  # 16 ms, 7.11 ms
    (1, 2, 2 * 8e9 * 1000 / (1 * 0.5 * 1e15), 16e9 / (2 * 0.75 * 3e12)),  # swapped flags: 32 ms, 3.56 ms
])
def test_br23_each_phase_uses_its_own_tp(tp_prefill, tp_decode, ttft_s, tpot_s):
    # BR-23 ignores launch latency, communication and KV reads: an ideal TP link, a free KV link and
    # D_kv = 4 B/token (1001 tokens of KV read per decode step: ~2e-9 s).
    cost = RooflineCostModel(BR23_MODEL, BR23_GPU, BR23_PARAMS, tp=1, tp_link=Link("ideal", math.inf, 0.0),
                             terms=SEED_TERMS)
    cfg = ReplayConfig(scheduling=SchedulingOptions("disagg"),
                       disagg=DisaggOptions(tp_prefill=tp_prefill, tp_decode=tp_decode,
                                            link_bandwidth_bytes_per_s=1e30, link_latency_s=0.0))
    res, eng = replay_frame(BR23_TRACE, cost, cfg)
    assert [cm.tp for cm in eng.cost_models] == [tp_prefill, tp_decode]
    assert res["pred_ttft_s"][0] == pytest.approx(ttft_s, rel=1e-6)
    assert res["pred_tpot_s"][0] == pytest.approx(tpot_s, rel=1e-6)


def test_pool_tp_defaults_to_the_calibrated_tp():
    cost = RooflineCostModel(BR23_MODEL, BR23_GPU, BR23_PARAMS, tp=4, terms=SEED_TERMS)
    p, d = pool_cost_models(cost, None, 2)
    assert (p.tp, d.tp) == (4, 2) and p is cost and d.params == cost.params
    with pytest.raises(ConfigError, match="--tp-prefill"):
        pool_cost_models(cost, 0, None)


def _br23_calibration(tmp_path):
    from helpers import write_calibration
    from schemas.tables import REQUEST_TRACE
    from traces.io import write_trace

    trace, cal = tmp_path / "t.parquet", tmp_path / "cal.json"
    write_trace(BR23_TRACE, REQUEST_TRACE, trace)
    write_calibration(RooflineCostModel(BR23_MODEL, BR23_GPU, BR23_PARAMS, terms=SEED_TERMS), cal)
    return trace, cal


@pytest.mark.parametrize("flags, header, ttft_s, tpot_s", [
    (("--tp-prefill", "2", "--tp-decode", "1"), "prefill TP=2, decode TP=1", 0.016, 16e9 / 2.25e12),
    (("--tp-prefill", "1", "--tp-decode", "2"), "prefill TP=1, decode TP=2", 0.032, 16e9 / 4.5e12),
])
def test_br23_cli_echoes_the_resolved_per_phase_tp(tmp_path, flags, header, ttft_s, tpot_s):
    from replay.cli import main

    trace, cal = _br23_calibration(tmp_path)
    out = tmp_path / "pred.parquet"
    res = CliRunner().invoke(main, [str(trace), "--calibration", str(cal), "--scheduler", "disagg", *flags,
                                    "--link-bandwidth-bytes-per-s", "1e30", "--link-latency-s", "0", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert header in " ".join(res.output.split("\nsimulated")[0].split())  # the first line, folded at 100 columns
    assert "1 prefill x" in res.output and "1 decode x" in res.output
    pred = pd.read_parquet(out)
    # TP=2 adds the all-reduces over the GPU's NVLink (~8 us here): within 0.5 %
    assert pred["pred_ttft_s"][0] == pytest.approx(ttft_s, rel=5e-3)
    assert pred["pred_tpot_s"][0] == pytest.approx(tpot_s, rel=5e-3)
    assert {"pred_decode_replica_id", "pred_kv_transfer_s", "pred_decode_queue_wait_s"} <= set(pred.columns)
    assert pred["pred_decode_replica_id"][0] == 1 and pred["pred_replica_id"][0] == 0


@pytest.mark.parametrize("args, needle", [
    (("--scheduler", "chunked", "--tp-prefill", "2"), "--tp-prefill: only --scheduler disagg"),
    (("--scheduler", "fcfs", "--link", "pcie5", "--decode-replicas", "2"), "--decode-replicas, --link"),
    (("--scheduler", "disagg", "--replicas", "2"), "--prefill-replicas and --decode-replicas"),
    (("--scheduler", "disagg", "--link", "carrier-pigeon"), "carrier-pigeon"),
    (("--scheduler", "disagg", "--link-bandwidth-bytes-per-s", "0"), "--link-bandwidth-bytes-per-s"),
    (("--scheduler", "disagg", "--link-latency-s", "inf"), "--link-latency-s must be >= 0"),
    (("--scheduler", "disagg", "--first-token-from", "both"), "--first-token-from"),
    (("--scheduler", "disagg", "--preemption-mode", "swap", "--tp-prefill", "2"), "--tp-prefill equal to --tp-decode"),
])
def test_bad_disagg_options_exit_2_with_one_message(tmp_path, args, needle):
    from replay.cli import main

    trace, cal = _br23_calibration(tmp_path)
    res = CliRunner().invoke(main, [str(trace), "--calibration", str(cal), *args])
    assert res.exit_code == 2, res.output
    assert needle in res.output and "Traceback" not in res.output


def test_resolve_link_presets_and_overrides():
    default = Link("nvlink4", 450e9, 2e-6)
    assert resolve_link(None, None, None, default) is default
    assert resolve_link("100gbe", None, None, default).bandwidth_bytes_per_s == 12.5e9
    assert resolve_link("100gbe", None, 1e-5, default) == Link("100gbe", 12.5e9, 1e-5)
    assert resolve_link(None, 1e9, None, default) == Link("custom", 1e9, 2e-6)
    for bad in ((None, float("nan"), None), (None, None, -1.0), ("pcie9", None, None)):
        with pytest.raises(ConfigError):
            resolve_link(*bad, default)


def test_disagg_is_not_a_per_replica_scheduler():
    with pytest.raises(ConfigError, match="prefill pool and a decode pool"):
        get_scheduler_factory("disagg")
