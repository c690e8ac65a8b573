"""traces.binned: the maximum-entropy distribution of known segment masses and a known mean,
checked against scipy's truncated exponential and hand-computed piecewise-uniform values."""
import numpy as np
import pytest
from scipy import stats

from traces.binned import segment_tilt, tilted_quantiles

P = np.array([0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0])


def test_a_mean_the_uniform_has_keeps_the_piecewise_linear_quantiles():
    # segments [0, 10] and [10, 30], half the mass each: the uniform's mean is 0.5 * 5 + 0.5 * 20 = 12.5
    edges, cum = np.array([0.0, 10.0, 30.0]), np.array([0.0, 5.0, 10.0])
    assert segment_tilt(edges, np.diff(cum), 12.5) == 0.0
    want = [0.0, 2.0, 5.0, 10.0, 20.0, 26.0, 30.0]
    assert tilted_quantiles(edges, cum, 12.5, P) == pytest.approx(want, abs=1e-12)
    assert tilted_quantiles(edges, cum, None, P) == pytest.approx(want, abs=1e-12)  # histogram_quantile's


def test_one_segment_is_scipys_truncated_exponential_of_that_mean():
    # density ∝ exp(-(x - 25) / 8) on [25, 50]: scipy's truncexpon(b=25/8, loc=25, scale=8)
    d = stats.truncexpon(b=25 / 8, loc=25, scale=8)
    assert segment_tilt(np.array([25.0, 50.0]), np.array([1.0]), d.mean()) == pytest.approx(-1 / 8, rel=1e-9)
    assert tilted_quantiles(np.array([25.0, 50.0]), np.array([0.0, 1.0]), d.mean(), P) == \
        pytest.approx(d.ppf(P), rel=1e-9)


def test_every_segment_keeps_its_mass_and_the_distribution_has_the_mean():
    edges = np.array([200.0, 500.0, 1000.0, 2000.0, 5000.0])
    cum = np.array([0.0, 90.0, 210.0, 285.0, 300.0])  # counts, as a histogram's
    # the uniform's mean: (90 * 350 + 120 * 750 + 75 * 1500 + 15 * 3500) / 300 = 955.0; the known one is lower
    u = (np.arange(100_000) + 0.5) / 100_000
    x = tilted_quantiles(edges, cum, 857.0, u)
    assert x.mean() == pytest.approx(857.0, abs=0.01)
    assert tilted_quantiles(edges, cum, 857.0, cum / 300.0) == pytest.approx(edges, abs=1e-9)  # the bounds stay
    assert np.mean(x <= 500.0) == pytest.approx(0.3, abs=1e-5) and np.mean(x <= 2000.0) == pytest.approx(0.95, abs=1e-5)
    # a lower mean than the uniform's: each segment's own mean below its middle (one common λ < 0)
    assert np.mean(x[x <= 500.0]) < 350.0 and np.mean(x[(x > 2000.0)]) < 3500.0


def test_an_empty_segment_holds_no_value_and_p0_is_the_first_held_edge():
    edges, cum = np.array([0.0, 10.0, 20.0, 30.0]), np.array([0.0, 0.0, 5.0, 10.0])
    assert tilted_quantiles(edges, cum, None, np.array([0.0, 0.5, 1.0])) == pytest.approx([10.0, 20.0, 30.0])


def test_a_mean_the_segments_cannot_reach_is_approached_at_their_edge():
    # every value in [0, 1] cannot have the mean 2: as close as the segments allow, all at 1
    assert tilted_quantiles(np.array([0.0, 1.0]), np.array([0.0, 1.0]), 2.0, np.array([0.01, 0.5])) == \
        pytest.approx([1.0, 1.0], abs=1e-4)


@pytest.mark.parametrize("edges, masses, mean", [([0.0, 2.0, 1.0], [1.0, 1.0], 1.0), ([0.0, 1.0], [-1.0], 0.5),
                                                 ([0.0, 1.0], [0.0], 0.5), ([0.0, 1.0], [1.0], np.nan)])
def test_bad_segments_are_a_value_error(edges, masses, mean):
    with pytest.raises(ValueError, match="segment_tilt"):
        segment_tilt(np.array(edges), np.array(masses), mean)
