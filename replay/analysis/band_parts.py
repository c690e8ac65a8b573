"""The parts of a prediction band beyond the parameters' range: how far a what-if is from what
the calibration saw, the model's out-of-sample error, the sampling noise of a percentile, and
the error of carrying a calibration to another model, GPU, parallelism or engine.

Pure functions of arrays and the calibration's stored numbers; :mod:`replay.analysis.bands`
composes them with the parameters' part into one band.

Notes
-----
Distance. A replayed workload is summarised by its arrival rate (requests/s), the mean number of
requests in the system and of those running (Little's law, ``L = sum(E2E) / T`` over the time ``T``
from the first arrival to the last completion, and the same sum less the queue waits: the batch the
engine carried), and its mean prompt length (tokens), all from
the replay at the calibration's values. A what-if's distance from the calibration is the largest
``log2`` ratio by which the running requests or the mean prompt leave the range the calibration's
runs span (0 inside): 1 is a batch twice the largest fitted. The arrival rate and the requests in
the system are kept for the record, not used: a burst (every request at once) or a closed loop has
a rate that says nothing of the load, and the requests waiting in a queue ask nothing of the cost
model that the running ones do not.

Model error. The calibration stores relative errors ``e_i`` of its own held-out parts (a run left out,
a later window), each with the distance ``d_i`` of the part from what the refit saw
(:mod:`calibrate.holdout`). The band's model part at distance ``d`` is ``q * growth(d)`` of the point,
``q`` the split-conformal quantile of ``|e_i| / growth(d_i)``, the ``ceil((n + 1) * 0.95)``-th smallest
(Lei, G'Sell, Rinaldo, Tibshirani & Wasserman, "Distribution-free predictive inference for
regression", JASA 113, 2018, section 2.2; the scaled scores of their section 5.2, "locally weighted"
conformal, with ``growth`` as the spread). ``growth(d) = 2^d``, the ratio of the load to the nearest
fitted one: a cost the model lacks that grows with the batch (per-request CPU work, a kernel's
efficiency falling with batch size) adds a relative error that grows at least in proportion to
the load beyond what the fit saw, which the held-out parts, all near the fitted load, cannot show.
With fewer than 19 errors the conformal rank is past the largest, and the largest is used: the
stated 95 % is then not guaranteed, and the band says so.

Sampling noise. A percentile ``q`` over ``n`` requests of a future run lies between the order
statistics of ranks ``n q -+ 1.96 sqrt(n q (1 - q))`` with probability about 0.95 (the binomial count
of values below the true quantile; David & Nagaraja, "Order Statistics", 3rd ed., 2003, section 7.1);
the predicted values at those ranks give the part. Requests of a busy period are correlated, so this
is a lower bound of the noise; the held-out errors carry the rest.
"""
from __future__ import annotations

import math

import numpy as np

#: The features of a workload :func:`load_features` gives, with the words a warning uses.
FEATURES = {"rate_rps": ("the arrival rate", "req/s"),
            "in_system": ("the mean requests in the system (Little's law)", "requests"),
            "running": ("the mean requests running (Little's law on E2E less queue wait)", "requests"),
            "prompt_tokens": ("the mean prompt", "tokens")}
#: The features a distance is measured on (:func:`distance`).
DISTANCE_FEATURES = ("running", "prompt_tokens")
#: The largest distance (log2 units) a band widens for: beyond 2^20 = a million times the fitted load
#: it says nothing more (and a float would overflow).
MAX_DISTANCE = 20.0
#: Nominal coverage of a band.
COVERAGE = 0.95
#: Standard normal quantile of :data:`COVERAGE`, two-sided.
Z95 = 1.959963984540054
#: The metric whose held-out errors stand for each band metric's (ITL is TPOT's gaps; the queue wait
#: is a part of TTFT, whose absolute error it takes; throughput moves as 1 / E2E).
ERROR_SOURCE = {"ttft": "ttft_s", "tpot": "tpot_s", "itl": "tpot_s", "e2e": "e2e_s", "queue_wait": "ttft_s",
                "goodput": "e2e_s", "throughput": "e2e_s"}
#: The error of a calibration carried to another model, GPU, parallelism or engine, relative, per
#: metric: the 95th percentile of |error| of the carried rows of bench/BANDS.md (4 cases, 12 runs:
#: a kernel profile to a run, Llama-3.1-8B's calibrations to Qwen3-32B TP 2, a vLLM v0 fit to
#: DistServe's disaggregated engine at 3-12 req/s), each metric's p50 and p90 pooled ("Over every
#: carried case" in its summary). bench/bands.py scores each carried case with it recomputed
#: without that case.
TRANSFER_ERROR = {"ttft_s": 0.51, "tpot_s": 0.88, "e2e_s": 0.55}


def load_features(result) -> dict:
    """The load of a replayed workload: :data:`FEATURES` by name.

    Parameters
    ----------
    result : pandas.DataFrame
        A replay result (``arrival_time_s``, ``num_prompt_tokens``, ``pred_status``, ``pred_e2e_s``,
        ``pred_queue_wait_s``; seconds), or the rows of it that are scored.

    Returns
    -------
    dict
        ``rate_rps`` (``(n - 1)`` over the arrivals' span), ``in_system`` (``sum(E2E) / T``) and
        ``running`` (``sum(E2E - queue wait) / T``) over the completed requests, ``T`` from the first
        arrival to the last completion, ``prompt_tokens`` (mean); NaN where a span is 0.
    """
    from schemas.status import OK

    t = result["arrival_time_s"].to_numpy(float)
    ok = (result["pred_status"] == OK).to_numpy()
    e2e = result["pred_e2e_s"].to_numpy(float, na_value=np.nan)[ok]
    wait = result["pred_queue_wait_s"].to_numpy(float, na_value=np.nan)[ok]
    fine = np.isfinite(e2e) & np.isfinite(wait)
    arrivals = float(t.max() - t.min()) if t.size > 1 else 0.0
    # the time the system held them: first arrival to last completion (a burst arrives in no time)
    busy = float(np.max(t[ok][fine] + e2e[fine]) - t.min()) if fine.any() else 0.0
    prompt = float(np.mean(result["num_prompt_tokens"])) if t.size else math.nan
    return {"rate_rps": (t.size - 1) / arrivals if arrivals > 0 else math.nan,
            "in_system": float(e2e[fine].sum()) / busy if busy > 0 else math.nan,
            "running": float((e2e[fine] - wait[fine]).sum()) / busy if busy > 0 else math.nan,
            "prompt_tokens": prompt}


def feature_range(features: list[dict]) -> dict:
    """``{name: [low, high]}`` over the finite values of several workloads' :func:`load_features`."""
    out = {}
    for name in FEATURES:
        v = [f[name] for f in features if np.isfinite(f.get(name, math.nan)) and f[name] > 0]
        if v:
            out[name] = [float(min(v)), float(max(v))]
    return out


def distance(features: dict, fitted_range: dict) -> tuple[float, str | None]:
    """How far ``features`` (:func:`load_features`) lie outside ``fitted_range`` (:func:`feature_range`).

    Returns
    -------
    (float, str or None)
        The largest ``log2`` ratio by which a feature leaves its range (0 inside, or when nothing
        is known), and the phrase saying which (``"the mean requests in the system 8 requests is 4.0x the largest
        fitted (2.0 req/s)"``; None at 0); over :data:`DISTANCE_FEATURES` only.
    """
    d, words = 0.0, None
    for name, (lo, hi) in fitted_range.items():
        if name not in DISTANCE_FEATURES:
            continue
        x = features.get(name, math.nan)
        if not (np.isfinite(x) and x > 0 and lo > 0):
            continue
        what, unit = FEATURES[name]
        above, below = math.log2(x / hi), math.log2(lo / x)
        if max(above, below) > d:
            d = max(above, below)
            words = (f"{what} {x:.3g} {unit} is {x / hi:.1f}x the largest fitted ({hi:.3g} {unit})" if above > below
                     else f"{what} {x:.3g} {unit} is {lo / x:.1f}x below the smallest fitted ({lo:.3g} {unit})")
    return d, words


def growth(d: float) -> float:
    """How much a model error grows at distance ``d`` (log2 units) from the fitted load: ``2^d``, the
    load's ratio to the nearest fitted one (the module's Notes); 1 inside the range."""
    return 2.0 ** min(max(0.0, d), MAX_DISTANCE)


def conformal_quantile(scores, coverage: float = COVERAGE) -> tuple[float, bool]:
    """The split-conformal quantile of ``scores`` (non-negative): the ``ceil((n + 1) coverage)``-th
    smallest; the largest when that rank is past ``n`` (then False: the coverage is not guaranteed).

    Returns ``(quantile, guaranteed)``; ``(nan, False)`` for no score."""
    s = np.sort(np.asarray([x for x in scores if np.isfinite(x)], float))
    if not s.size:
        return math.nan, False
    k = math.ceil((s.size + 1) * coverage)
    return float(s[min(k, s.size) - 1]), k <= s.size


def model_error_quantiles(errors: list[dict], coverage: float = COVERAGE) -> dict:
    """Per metric of the held-out ``errors`` (``{"metric", "rel_err", "distance", ...}``, as
    :attr:`schemas.calibration.Calibration.holdout` stores them), the conformal quantile of
    ``|rel_err| / growth(distance)``: ``{metric: (q, n, guaranteed)}``."""
    by_metric: dict = {}
    for e in errors:
        by_metric.setdefault(e["metric"], []).append(abs(e["rel_err"]) / growth(e.get("distance", 0.0)))
    out = {}
    for m, v in by_metric.items():
        q, guaranteed = conformal_quantile(v, coverage)
        out[m] = (q, len(v), guaranteed)
    return out


def percentile_noise(values, q: float, presorted: bool = False) -> tuple[float, float]:
    """How far a future run's ``q``-th percentile over as many values may fall below and above the
    percentile of ``values`` (the order-statistic interval of the module's Notes), in their units;
    ``presorted``: ``values`` are already sorted and finite (one sort for several percentiles).

    Returns ``(below, above)`` (non-negative; 0 with fewer than 2 finite values)."""
    v = np.asarray(values, float) if presorted else np.sort(np.asarray(values, float))
    v = v[np.isfinite(v)]
    n = v.size
    if n < 2:
        return 0.0, 0.0
    p = q / 100.0
    point = float(np.percentile(v, q))
    half = Z95 * math.sqrt(n * p * (1 - p))
    lo_rank, hi_rank = max(0, math.floor(n * p - half) - 1), min(n - 1, math.ceil(n * p + half) - 1)
    return max(0.0, point - float(v[lo_rank])), max(0.0, float(v[hi_rank]) - point)
