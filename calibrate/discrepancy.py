"""What a request-log fit leaves unexplained: the model's discrepancy beyond sampling noise.

At the true parameters of a cost model that describes the engine, the relative quantile
errors of a request-log fit are the measured quantiles' sampling error: their mean square is
the mean of their sampling variances. A mean square above that is the part of the misfit no
parameter value removes, the model's discrepancy (Kennedy & O'Hagan, "Bayesian calibration of
computer models", JRSS B 63(3), 2001): a what-if predicted by that model is off by about as
much, whatever its parameters, so a prediction band (:mod:`replay.analysis.bands`) adds it to the
parameters' uncertainty.
"""
from __future__ import annotations

import numpy as np

from .run_errors import QuantileResidual

#: Measured latencies whose discrepancy is estimated (queue wait is often ~0: a relative
#: error of it is meaningless, and it is a part of TTFT).
METRICS = ("ttft_s", "tpot_s", "e2e_s")


def model_error(runs, cost_model, quantiles) -> dict:
    """Per measured metric, the relative discrepancy of the fitted model: ``sqrt(max(0,
    mean(r^2) - mean(var)))`` over every run and quantile, ``r`` the relative quantile errors at
    the fit's values and ``var`` their sampling variances (the moving-block bootstrap of
    :meth:`calibrate.run_errors.QuantileResidual.sampling_cov`).

    Parameters
    ----------
    runs : list of calibrate.run_errors.Run
        The fitted runs (prepared: rejected requests left out).
    cost_model : replay.cost.cost_model.RooflineCostModel
        At the fit's values.
    quantiles : percentiles compared.

    Returns
    -------
    dict
        ``{"ttft_s": 0.12, ...}`` (fractions) for the metrics of :data:`METRICS` some run
        measured; 0 where the misfit is within sampling noise.
    """

    out = {}
    for m in METRICS:
        measured = [r for r in runs if r.measures(m)]
        if not measured:
            continue
        res = QuantileResidual(measured, cost_model, (m,), quantiles)
        r = np.concatenate([e[m] for e in res.errors(cost_model.params)])
        var = np.diag(res.sampling_cov())
        excess = float(np.mean(r ** 2) - np.mean(var)) if np.all(np.isfinite(var)) else float(np.mean(r ** 2))
        out[m] = float(np.sqrt(max(excess, 0.0)))
    return out
