"""The all-reduce efficiency prior of a link preset: where it comes from and what a fit holds.

``nvlink4``'s 0.3 is NCCL's bus bandwidth on an H100 DGX at the message size of a ~1k-token prefill
step, read from Vidur's profile (shared/data/real/vidur_allreduce_h100_dgx.csv, PROVENANCE.md).
"""
import pandas as pd
import pytest

from replay.cost.cost_model import RooflineCostModel
from schemas.specs import default_cost_params, get_gpu, get_link, get_model


def test_the_fit_defaults_hold_eta_link_at_the_links_prior():
    assert get_link("nvlink4").allreduce_efficiency == 0.3
    assert default_cost_params(get_gpu("h100-80gb"))["eta_link"] == 0.3
    assert default_cost_params(get_gpu("h200"))["eta_link"] == 0.3          # NVLink 4 too
    # no measured prior: the declared default, 1
    assert default_cost_params(get_gpu("b200"))["eta_link"] == 1.0
    assert default_cost_params(get_gpu("rtx-pro-6000"))["eta_link"] == 1.0
    assert default_cost_params(get_gpu("h100-80gb"))["eta_compute"] == 0.5   # the rest as declared


def test_the_all_reduce_of_a_token_at_the_prior():
    """gpt-oss-120b on 4 H100: two all-reduces a layer of 2,880 x 2 bytes per token over 36 layers,
    2 (k-1)/k of it on the wire, at 0.3 x 450 GB/s: 2 x 36 x 2 x 3/4 x 5,760 / 1.35e11 = 4.608 us a
    token; 1.536 us at the nominal bandwidth (eta_link 1)."""
    cm = RooflineCostModel(get_model("gpt-oss-120b"), get_gpu("h100-80gb"), default_cost_params(get_gpu("h100-80gb")),
                           tp=4, terms=("tp_comm",))
    assert cm.step_time_s(1001, 0, 0, 0, 1) - cm.step_time_s(1, 0, 0, 0, 1) == pytest.approx(1000 * 4.608e-6, rel=1e-9)


def test_the_prior_is_what_vidur_measured(real_data_dir):
    """The bus bandwidth ``2 (k-1)/k size / time`` of the median times at 6,291,456 bytes (a ~1k-token
    prefill's activations): 2 GPUs 45 us -> 139.8 GB/s (0.31 of 450); 4 GPUs 52 us -> 181.5 (0.40);
    8 GPUs 61 us -> 180.5 (0.40). At 4,194,304 bytes: 0.22, 0.30, 0.32."""
    d = pd.read_csv(real_data_dir / "vidur_allreduce_h100_dgx.csv")
    d = d[d["rank"] == 0]
    eta = {}
    for size in (4_194_304, 6_291_456):
        for k, g in d[d["size"] == size].groupby("num_workers"):
            t_s = g["time_stats.all_reduce.median"].iloc[0] * 1e-3
            eta[size, k] = 2 * (k - 1) / k * size / t_s / get_link("nvlink4").bandwidth_bytes_per_s
    assert eta[6_291_456, 2] == pytest.approx(6_291_456 / 45e-6 / 450e9, rel=1e-6)   # 0.3107
    assert [round(eta[6_291_456, k], 2) for k in (2, 4, 8)] == [0.31, 0.40, 0.40]
    assert [round(eta[4_194_304, k], 2) for k in (2, 4, 8)] == [0.22, 0.30, 0.32]
    assert min(eta.values()) <= get_link("nvlink4").allreduce_efficiency <= max(eta.values())
