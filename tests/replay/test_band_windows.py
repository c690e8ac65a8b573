"""A long trace's band from windows of it (replay.analysis.band_windows, issue #30): the windows' positions
by hand, and on a stationary trace the windowed band equals the band of whole replays within the
windows' sampling noise, from a quarter of the replayed requests."""
import pandas as pd
import pytest

from replay.analysis import band_windows
from replay.analysis.bands import BandJob, predict_with_band
from replay.config import EngineOptions, ReplayConfig
from replay.cost.cost_model import RooflineCostModel
from schemas.cost_params import CostParams
from schemas.specs import get_gpu, get_model
from traces.synth import synth_requests

#: Points of a confidence set around the model's values: memory and compute efficiency and the step constant.
POINTS = [{"eta_mem": 0.76}, {"eta_mem": 0.84}, {"eta_compute": 0.5}, {"t_step_s": 6e-4}]


def test_windows_by_hand():
    # 100,000 rows, 4 windows of 2,000 warm-up + 4,000 scored: starts linspace(0, 94,000, 4); the first has no warm-up
    assert band_windows.windows(100_000) == [(0, 0, 6000), (31333, 33333, 37333), (62666, 64666, 68666),
                                             (94000, 96000, 100000)]
    frame = pd.DataFrame({"arrival_time_s": [float(i) for i in range(100_000)][::-1]})
    parts = band_windows.window_frames(frame)
    assert [(len(f), warm) for f, warm in parts] == [(6000, 0), (6000, 2000), (6000, 2000), (6000, 2000)]
    assert parts[1][0]["arrival_time_s"].iloc[0] == 31333.0  # in arrival order, whatever the frame's


def test_scaled_rows_take_the_windows_ratio():
    rows = band_windows.scaled_rows({"a": 10.0, "b": 4.0}, {"a": 2.0, "b": 0.0}, [{"a": 3.0, "b": 1.0}], ("a", "b"))
    assert rows[0]["a"] == 15.0 and rows[0]["b"] != rows[0]["b"]  # NaN where the windows' optimum is 0


def test_the_windowed_band_is_the_whole_replays_band(monkeypatch):
    cm = RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb"),
                           CostParams(eta_compute=0.55, eta_mem=0.8, t_step_s=4e-4, t_seq_s=2e-5))
    trace = synth_requests(48_000, 30.0, "lognormal:mean=600,sigma=0.6", "lognormal:mean=120,sigma=0.6", seed=2)
    cfg = ReplayConfig(EngineOptions(max_num_seqs=128, max_num_batched_tokens=2048))
    job = BandJob(trace, {}, cm, cfg, POINTS)
    assert band_windows.windowed(trace, cfg)
    windowed = predict_with_band(job)
    monkeypatch.setattr(band_windows, "WINDOWED_ABOVE", 10**9)
    whole = predict_with_band(job)
    for s in ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s", "e2e_p50_s", "e2e_p90_s"):
        p, half = whole.point[s], (whole.high[s] - whole.low[s]) / 2
        assert windowed.point[s] == p
        assert half > 0.15 * p  # the points move the prediction by 16-35 %: a band to compare
        # measured when written: each end within 0.1-2.8 % of the point, at most 9 % of the half width (TTFT p90)
        assert windowed.low[s] == pytest.approx(whole.low[s], abs=0.15 * half), s
        assert windowed.high[s] == pytest.approx(whole.high[s], abs=0.15 * half), s
