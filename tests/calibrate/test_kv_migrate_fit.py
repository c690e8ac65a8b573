"""The KV handoff's cost in the engine (``t_kv_migrate_s``, issue #34 item 2): a disaggregated replay adds
it to the link's latency, once per transfer, and a request-log fit of a disaggregated
run recovers it, with the decode instance's loop waiting on each migration (``--kv-handoff pull``)."""
import pytest

from calibrate.request_fit import fit_requests
from calibrate.run_errors import Run
from replay.config import DisaggOptions, EngineOptions, ReplayConfig
from replay.core.disagg_pools import resolve_pools
from replay.cost.cost_model import LINKS, RooflineCostModel
from replay.simulate import replay_frame
from schemas.cost_params import CostParams
from schemas.specs import get_gpu, get_model
from traces.synth import synth_requests

TRUTH = CostParams(eta_compute=0.55, eta_mem=0.80, t_step_s=4e-4, t_seq_s=2e-5, t_kv_migrate_s=0.015)


def _model(params=None):
    return RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb"), params or CostParams())


def test_the_engines_cost_adds_to_the_links_latency():
    preset = _model().tp_link.latency_s
    assert resolve_pools(_model(), DisaggOptions())[2].latency_s == preset  # 0 unless fitted
    assert resolve_pools(_model(TRUTH), DisaggOptions())[2].latency_s == pytest.approx(preset + 0.015)
    assert resolve_pools(_model(TRUTH), DisaggOptions(link_latency_s=0.002))[2].latency_s == pytest.approx(0.017)
    link = resolve_pools(_model(TRUTH), DisaggOptions(link="400gbe"))[2]
    assert link.latency_s == pytest.approx(0.015 + LINKS["400gbe"].latency_s) and link.name == "400gbe"


def test_each_migration_costs_it_once():
    """Moving t_kv_migrate_s from 0 to 15 ms moves every request's migration by exactly 15 ms."""
    cfg = ReplayConfig(engine=EngineOptions(max_num_seqs=32)).with_scheduler("disagg", DisaggOptions())
    trace = synth_requests(30, 2.0, "uniform:100,400", "uniform:5,20", seed=3)
    at = {v: replay_frame(trace, _model(TRUTH.replace(t_kv_migrate_s=v)), cfg)[0] for v in (0.0, 0.015)}
    moved = at[0.0]["pred_kv_transfer_s"].notna()
    assert moved.sum() == 30
    assert (at[0.015]["pred_kv_transfer_s"] - at[0.0]["pred_kv_transfer_s"])[moved].to_numpy() == pytest.approx(
        [0.015] * 30, abs=1e-12)


def test_a_request_fit_of_a_disaggregated_run_recovers_it():
    cfg = ReplayConfig(engine=EngineOptions(max_num_seqs=64)).with_scheduler("disagg", DisaggOptions(tp_decode=1))
    trace = synth_requests(400, 10.0, "lognormal:mean=800,sigma=0.8", "lognormal:mean=150,sigma=0.7", seed=5)
    measured, _ = replay_frame(trace, _model(TRUTH), cfg)
    trace = trace.assign(ttft_s=measured["pred_ttft_s"], tpot_s=measured["pred_tpot_s"])
    start = TRUTH.replace(t_kv_migrate_s=0.0)
    fit = fit_requests([Run("disagg", trace, cfg, {})], _model(start), ("max",), free=("t_kv_migrate_s",), jobs=1)[0]
    p = fit.params["t_kv_migrate_s"]
    assert p.value == pytest.approx(0.015, rel=0.1)
    assert p.ci95 is not None and p.ci95[0] <= 0.015 <= p.ci95[1]
