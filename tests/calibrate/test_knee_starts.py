"""A fit starts its knee at the same n_half_tokens per GPU and, on several GPUs, at the same knee
in the step's tokens (calibrate.fitting.knee_starts)."""
from calibrate.fitting import knee_starts
from replay.cost.cost_model import RooflineCostModel
from schemas.specs import get_gpu, get_model

STARTS = ({"eta_compute": 0.3, "n_half_tokens": 100.0}, {"eta_compute": 0.8, "n_half_tokens": 10.0}, {"eta_mem": 0.5})


def _cm(tp, dp):
    return RooflineCostModel(get_model("qwen3-30b-a3b"), get_gpu("h100-80gb"), tp=tp, dp=dp)


def test_one_gpu_keeps_the_starts():
    assert knee_starts(STARTS, _cm(1, 1)) == list(STARTS)


def test_four_gpus_add_the_knees_a_step():
    """TP 2 x DP 2: 100 and 10 tokens a step are 25 and 2.5 per GPU; a start without a knee is not repeated."""
    assert knee_starts(STARTS, _cm(2, 2)) == list(STARTS) + [{"eta_compute": 0.3, "n_half_tokens": 25.0},
                                                             {"eta_compute": 0.8, "n_half_tokens": 2.5}]
