"""The design of the next measurement: how much a candidate run would tell about a calibration's
parameters, and about a what-if, from its predictions at the points of the calibration's confidence set.

Pure functions of arrays; :mod:`calibrate.advise` replays the candidates and calls them.

Method
------
A calibration carries ``K`` points of its parameters' 95 % confidence set
(:attr:`schemas.calibration.Calibration.band_points`). Replayed at each point and at the calibration's
values, a candidate workload ``c`` gives ``K + 1`` predictions of ``S`` statistics (p50/p90 of TTFT,
TPOT, E2E), taken in logs (the parameters act on a time as factors): the rows of ``Y_c``. The points
stand for the parameter vectors the data still allow, weighted equally; a measurement of ``c`` with
noise ``R_c`` (diagonal, log units: each percentile's sampling noise over the run's requests and the
model's own error, which no parameter can remove) tells them apart where their predictions differ by
more than the noise.

- Information: the Bayesian D-optimality criterion with a Gaussian prior and noise,
  ``0.5 log det(I + R^-1/2 C_c R^-1/2)``, ``C_c`` the covariance of ``Y_c``'s rows (nats): the expected
  information a measurement of ``c`` gives on the parameters (Atkinson, Donev & Tobias, "Optimum
  Experimental Designs, with SAS", Oxford 2007, chapters 10 (D-optimality) and 18 (Bayesian
  designs); Chaloner & Verdinelli, Statistical Science 10, 1995, section 2.2). The candidate where the
  set's points disagree most, relative to the noise, is the one whose measurement pins them.
- Bearing on a what-if ``w`` (its log predictions ``Y_w`` at the same points): the Gaussian
  conditioning of ``Y_w`` on a measurement of ``Y_c``,
  ``var(w | c) = var(w) - C_wc (C_cc + R_c)^-1 C_cw`` (the Kalman update): a candidate whose
  predictions move with the what-if's across the points (correlated) narrows its parameter part; one
  that moves in other directions does not, however informative. The square root of
  ``var(w | c) / var(w)`` per statistic scales the parameters' part of the what-if's band.
- Terms: the parameters whose values across the points follow the direction in which the candidate's
  predictions spread most (the first principal component of ``Y_c`` scaled by the noise), by absolute
  correlation.

The points are the far ends of the set's line searches, not a sample of a posterior: the covariances
are those of the set's extent, and their ratios (how much of it a measurement removes), not their
sizes, are what is used. With ``K`` of about 9 points, a covariance of 6 statistics is poorly
estimated; the noise ``R`` regularises the inverse.
"""
from __future__ import annotations

import numpy as np

#: The statistics a candidate's measurement is scored on (``prediction_row`` keys, seconds).
DESIGN_STATS = tuple(f"{m}_p{q}_s" for m in ("ttft", "tpot", "e2e") for q in (50, 90))
#: The least relative noise of a measured percentile (no benchmark repeats better than this).
MIN_NOISE = 0.01
#: A parameter is named as a term a candidate identifies when its correlation with the candidate's
#: main direction of spread is at least this (in absolute value).
MIN_TERM_CORRELATION = 0.5


def log_matrix(rows: list[dict], stats=DESIGN_STATS) -> np.ndarray:
    """``(len(rows), len(stats))`` logs of the statistics (NaN where not finite or not positive)."""
    v = np.array([[r.get(s, np.nan) for s in stats] for r in rows], float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(np.isfinite(v) & (v > 0), np.log(np.where(v > 0, v, 1.0)), np.nan)


def usable(*mats: np.ndarray) -> np.ndarray:
    """Columns finite in every row of every matrix (bool, one per statistic)."""
    return np.logical_and.reduce([np.all(np.isfinite(m), axis=0) for m in mats])


def information_nats(y: np.ndarray, noise: np.ndarray) -> float:
    """Expected information of a measurement on the parameters, nats: ``0.5 log det(I + R^-1/2 C R^-1/2)``.

    Parameters
    ----------
    y : array (K + 1, S)
        Log predictions at the set's points (:func:`log_matrix`); columns with a NaN are left out.
    noise : array (S,)
        Standard deviation of each measured statistic, log units (relative).
    """
    keep = usable(y)
    if not keep.any() or y.shape[0] < 2:
        return 0.0
    z = y[:, keep] / noise[keep]
    c = np.atleast_2d(np.cov(z, rowvar=False))
    sign, logdet = np.linalg.slogdet(np.eye(c.shape[0]) + c)
    return float(0.5 * logdet) if sign > 0 else 0.0


def conditioned_shrink(y_c: np.ndarray, noise_c: np.ndarray, y_w: np.ndarray) -> np.ndarray:
    """Per what-if statistic, ``sqrt(var(w | c) / var(w))``: the factor by which measuring the candidate
    narrows the spread of the what-if's predictions over the set's points (1: not at all).

    Parameters
    ----------
    y_c : array (K + 1, S)
        The candidate's log predictions at the points.
    noise_c : array (S,)
        Its measurement noise, log units.
    y_w : array (K + 1, T)
        The what-if's log predictions at the same points.

    Returns
    -------
    array (T,)
        In [0, 1]; 1 for a statistic that does not vary over the points or is not finite.
    """
    keep = usable(y_c)
    out = np.ones(y_w.shape[1])
    if not keep.any() or y_c.shape[0] < 2:
        return out
    yc = y_c[:, keep] - y_c[:, keep].mean(axis=0)
    n = y_c.shape[0] - 1
    c_cc = yc.T @ yc / n + np.diag(noise_c[keep] ** 2)
    solve = np.linalg.pinv(c_cc)
    for t in range(y_w.shape[1]):
        w = y_w[:, t]
        if not np.all(np.isfinite(w)):
            continue
        wc = w - w.mean()
        var = float(wc @ wc / n)
        if var <= 0:
            continue
        c_wc = wc @ yc / n
        after = max(var - float(c_wc @ solve @ c_wc), 0.0)
        out[t] = float(np.sqrt(after / var))
    return out


def main_direction(y: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """Each point's score on the first principal component of ``y`` scaled by ``noise`` (the
    direction in which the set's predictions of the candidate spread most); zeros without spread."""
    keep = usable(y)
    if not keep.any() or y.shape[0] < 2:
        return np.zeros(y.shape[0])
    z = y[:, keep] / noise[keep]
    z = z - z.mean(axis=0)
    if not np.any(z):
        return np.zeros(y.shape[0])
    u, s, _ = np.linalg.svd(z, full_matrices=False)
    return u[:, 0] * s[0]


def terms_moved(values: dict, score: np.ndarray, limit: int = 3) -> list[tuple[str, float]]:
    """``(parameter, correlation)`` of the parameters whose values over the points follow ``score``
    (:func:`main_direction`) with ``|r| >=`` :data:`MIN_TERM_CORRELATION`, strongest first.

    Parameters
    ----------
    values : dict
        Parameter -> array (K + 1,) of its value at each point (natural units).
    score : array (K + 1,)
    """
    out = []
    if not np.any(score):
        return out
    for name, v in values.items():
        v = np.asarray(v, float)
        if not np.all(np.isfinite(v)) or np.ptp(v) <= 1e-12 * max(1.0, float(np.max(np.abs(v)))):
            continue
        r = float(np.corrcoef(v, score)[0, 1])
        if np.isfinite(r) and abs(r) >= MIN_TERM_CORRELATION:
            out.append((name, r))
    return sorted(out, key=lambda t: -abs(t[1]))[:limit]


def measurement_noise(point: dict, noise_halfwidths: dict, model_sd: dict, stats=DESIGN_STATS) -> np.ndarray:
    """Standard deviation of each measured statistic, log units: the percentile's sampling noise over
    the run's requests (``noise_halfwidths``: statistic -> ``(below, above)`` 95 % half widths, seconds,
    :func:`replay.analysis.band_parts.percentile_noise`) and the model's own error (``model_sd``:
    metric ``ttft``/``tpot``/``e2e`` -> relative standard deviation) in quadrature, at least
    :data:`MIN_NOISE`."""
    out = []
    for s in stats:
        p = point.get(s, np.nan)
        lo, hi = noise_halfwidths.get(s, (0.0, 0.0))
        sampling = (lo + hi) / 2 / 1.959963984540054 / p if np.isfinite(p) and p > 0 else 0.0
        model = model_sd.get(s.split("_p")[0], 0.0)
        out.append(max(float(np.hypot(sampling, model)), MIN_NOISE))
    return np.array(out)
