"""Queueing theory of one server: the M/G/1 mean wait and the statistics to test a replay against it.

The seed (``docs/theory.md`` section 3) models a serving replica fed by Poisson
arrivals as an M/G/1 queue. Its mean wait in queue is the Pollaczek-Khinchine formula;
M/M/1 and M/D/1 are its special cases. A batch-size-1 FCFS replay of Poisson arrivals is
such a queue, so the engine must reproduce these numbers (``tests/replay/test_queueing.py``).

All times are seconds, rates per second.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy import stats


class ServiceMoments(NamedTuple):
    """First two moments of a service-time distribution.

    Attributes
    ----------
    mean_s : float
        E[S], seconds.
    second_moment_s2 : float
        E[S^2] = Var(S) + E[S]^2, seconds squared.
    """

    mean_s: float
    second_moment_s2: float

    @property
    def variance_s2(self) -> float:
        """Var(S) = E[S^2] - E[S]^2, seconds squared."""
        return self.second_moment_s2 - self.mean_s ** 2

    @property
    def scv(self) -> float:
        """Squared coefficient of variation Var(S) / E[S]^2 (1 exponential, 0 deterministic)."""
        return self.variance_s2 / self.mean_s ** 2


def service_moments(service_times_s) -> ServiceMoments:
    """Sample moments E[S] and E[S^2] of observed service times.

    Parameters
    ----------
    service_times_s : array_like of float, shape (n,), seconds
        Finite, non-negative service times (e.g. each request's prefill step duration).

    Returns
    -------
    ServiceMoments
        ``(mean_s, second_moment_s2)``; unpacks into :func:`mg1_mean_wait_s`.

    Raises
    ------
    ValueError
        If there is no value, or a value is negative, NaN or infinite.
    """
    s = np.asarray(service_times_s, dtype=float).ravel()
    if s.size == 0:
        raise ValueError("service_moments: no service times given")
    if not np.all(np.isfinite(s)) or np.any(s < 0):
        raise ValueError("service_moments: service times must be finite and >= 0 seconds")
    return ServiceMoments(float(s.mean()), float(np.mean(s * s)))


def utilization(arrival_rate_per_s: float, mean_service_s: float) -> float:
    """Server utilisation rho = lambda * E[S] (seed section 3), dimensionless."""
    return float(arrival_rate_per_s) * float(mean_service_s)


def mg1_mean_wait_s(arrival_rate_per_s: float, mean_service_s: float, second_moment_s2: float) -> float:
    """Mean wait in queue of an M/G/1 FCFS queue (Pollaczek-Khinchine), seconds.

    Parameters
    ----------
    arrival_rate_per_s : float
        Poisson arrival rate lambda, requests per second (> 0).
    mean_service_s : float
        E[S], seconds (> 0).
    second_moment_s2 : float
        E[S^2], seconds squared (>= E[S]^2).

    Returns
    -------
    float
        W_q, the mean time from arrival to the start of service, seconds.

    Raises
    ------
    ValueError
        If rho = lambda E[S] >= 1 (no steady state: the queue grows without bound), or an
        argument is out of range.

    Notes
    -----
    ``W_q = lambda * E[S^2] / (2 * (1 - rho))``, ``rho = lambda * E[S]``
    (seed, theory.md section 3; Kleinrock, *Queueing Systems* Vol. 1, 1975, ch. 5;
    Harchol-Balter, *Performance Modeling and Design of Computer Systems*, 2013, ch. 23).
    By PASTA it is also the mean unfinished work an arrival finds, which is the same for
    every work-conserving discipline.
    """
    lam, es, es2 = float(arrival_rate_per_s), float(mean_service_s), float(second_moment_s2)
    if not (lam > 0 and es > 0 and np.isfinite(lam) and np.isfinite(es2)):
        raise ValueError(f"M/G/1 needs arrival rate > 0 and E[S] > 0 (got lambda={lam}/s, E[S]={es} s)")
    if es2 < es * es * (1 - 1e-12):
        raise ValueError(f"E[S^2] = {es2} s^2 is below E[S]^2 = {es * es} s^2: not the moments of a distribution")
    rho = utilization(lam, es)
    if rho >= 1:
        raise ValueError(f"utilization rho = lambda*E[S] = {lam:g}/s * {es:g} s = {rho:.3f} >= 1: "
                         "the queue is unstable and has no steady-state wait")
    return lam * es2 / (2.0 * (1.0 - rho))


def mm1_mean_wait_s(arrival_rate_per_s: float, service_rate_per_s: float) -> float:
    """Mean wait in queue of an M/M/1 queue, seconds: ``rho / (mu - lambda)``.

    Parameters
    ----------
    arrival_rate_per_s : float
        lambda, per second.
    service_rate_per_s : float
        mu = 1 / E[S], per second.

    Raises
    ------
    ValueError
        If rho = lambda / mu >= 1.

    Notes
    -----
    P-K with exponential service, E[S^2] = 2 / mu^2, gives ``rho / (mu - lambda)``
    (Kleinrock Vol. 1, ch. 3).
    """
    mu = float(service_rate_per_s)
    if not mu > 0:
        raise ValueError(f"M/M/1 needs a service rate mu > 0 (got {mu}/s)")
    return mg1_mean_wait_s(arrival_rate_per_s, 1.0 / mu, 2.0 / mu ** 2)


def md1_mean_wait_s(arrival_rate_per_s: float, service_s: float) -> float:
    """Mean wait in queue of an M/D/1 queue (constant service ``service_s``), seconds.

    Raises
    ------
    ValueError
        If rho = lambda * D >= 1.

    Notes
    -----
    P-K with E[S^2] = D^2: ``W_q = rho * D / (2 (1 - rho))``, half the M/M/1 wait at the
    same load (Kleinrock Vol. 1, ch. 5).
    """
    d = float(service_s)
    return mg1_mean_wait_s(arrival_rate_per_s, d, d * d)


def mean_residual_s(durations_s, horizon_s: float) -> float:
    """Mean remaining time of the service (or step) in progress, seen by a Poisson arrival, seconds.

    Parameters
    ----------
    durations_s : array_like of float, shape (k,), seconds
        Durations of the back-to-back or separated busy intervals (e.g. engine steps) that
        happened within the observation window.
    horizon_s : float
        Length of the observation window, seconds (>= the sum of ``durations_s``).

    Returns
    -------
    float
        ``E[R] = sum(D_k^2) / (2 * horizon_s)``; an arrival in an idle gap counts R = 0.

    Notes
    -----
    Renewal-reward (the inspection paradox): the time-average of the residual life is
    ``sum(D^2 / 2) / T``, which equals ``rho * E[D^2] / (2 E[D])`` with ``rho`` the busy
    fraction; PASTA makes it what a Poisson arrival sees (Harchol-Balter 2013, ch. 23).
    It is the term through which Var(D) enters the P-K wait.
    """
    d = np.asarray(durations_s, dtype=float)
    if not horizon_s > 0 or d.sum() > horizon_s * (1 + 1e-12):
        raise ValueError(f"horizon_s = {horizon_s} s must be > 0 and cover the durations ({d.sum()} s)")
    return float(np.sum(d * d) / (2.0 * horizon_s))


def batch_means_ci(samples, num_batches: int = 20, confidence: float = 0.99) -> tuple[float, float, float]:
    """Mean of a correlated sequence (a simulation output) with a batch-means confidence interval.

    Parameters
    ----------
    samples : array_like of float, shape (n,)
        Consecutive outputs of one run, e.g. per-request queue waits in arrival order;
        drop the warm-up before calling.
    num_batches : int
        Contiguous batches the sequence is cut into (>= 2; the ``n % num_batches`` last
        samples are dropped so all batches are equal).
    confidence : float
        Two-sided confidence level in (0, 1).

    Returns
    -------
    mean, low, high : float
        Grand mean of the batches and the interval ``mean -+ t_{(1+c)/2, k-1} * s_k / sqrt(k)``.

    Raises
    ------
    ValueError
        Fewer than 2 samples per batch, or bad ``num_batches`` / ``confidence``.

    Notes
    -----
    Waits of successive requests are correlated, so the i.i.d. formula understates the
    error; means of long contiguous batches are nearly independent and normal (Law,
    *Simulation Modeling and Analysis*, 5th ed., ch. 9, batch means).
    """
    x = np.asarray(samples, dtype=float).ravel()
    k = int(num_batches)
    if k < 2 or not 0 < confidence < 1:
        raise ValueError(f"batch_means_ci needs num_batches >= 2 and 0 < confidence < 1 (got {k}, {confidence})")
    size = x.size // k
    if size < 2:
        raise ValueError(f"batch_means_ci: {x.size} samples are too few for {k} batches")
    means = x[: size * k].reshape(k, size).mean(axis=1)
    m = float(means.mean())
    half = float(stats.t.ppf(0.5 + confidence / 2, k - 1) * means.std(ddof=1) / np.sqrt(k))
    return m, m - half, m + half


def request_service_times_s(num_prompt_tokens, num_output_tokens, cost_model) -> np.ndarray:
    """Service time of each request served alone (batch size 1, whole-prompt prefill), seconds.

    ``S = T_prefill(prompt) + sum_{j=1}^{output-1} T_decode(1, prompt + j)`` on the cost
    model (seed sections 1 and 3): the M/G/1 view of a replica that runs one request at a
    time. A batching engine serves several at once, so rho >= 1 here means "needs batching",
    not "unstable".

    Parameters
    ----------
    num_prompt_tokens, num_output_tokens : array_like of int, shape (n,)
    cost_model : replay.cost.cost_model.RooflineCostModel (vectorised ``step_time_s``)

    Returns
    -------
    numpy.ndarray of float, shape (n,), seconds
    """
    p = np.asarray(num_prompt_tokens, np.int64)
    o = np.asarray(num_output_tokens, np.int64)
    out = np.empty(p.size)
    for i in range(p.size):
        ctx = p[i] + np.arange(1, o[i], dtype=np.int64) + 1  # sequence length of each decode step
        decode = cost_model.step_time_s(np.zeros_like(ctx), np.ones_like(ctx), ctx).sum() if ctx.size else 0.0
        out[i] = cost_model.step_time_s(int(p[i]), 0, 0) + decode
    return out


def offered_load(arrival_time_s, num_prompt_tokens, num_output_tokens, cost_model) -> dict:
    """Offered load of a trace on one request-at-a-time server (M/G/1 view).

    Returns a dict with ``arrival_rate_per_s`` (n / (t_last - t_first)), ``mean_service_s``
    (E[S]), ``second_moment_s2`` (E[S^2]), ``scv`` (Var(S)/E[S]^2), ``rho`` (lambda E[S])
    and ``pk_mean_wait_s`` (Pollaczek-Khinchine W_q; NaN when rho >= 1).
    """
    t = np.asarray(arrival_time_s, float)
    span = float(t[-1] - t[0]) if t.size > 1 else 0.0
    lam = (t.size / span) if span > 0 else float("nan")
    mom = service_moments(request_service_times_s(num_prompt_tokens, num_output_tokens, cost_model))
    rho = utilization(lam, mom.mean_s)
    wait = mg1_mean_wait_s(lam, mom.mean_s, mom.second_moment_s2) if np.isfinite(rho) and rho < 1 else float("nan")
    return {"arrival_rate_per_s": lam, "mean_service_s": mom.mean_s, "second_moment_s2": mom.second_moment_s2,
            "scv": mom.scv, "rho": rho, "pk_mean_wait_s": wait}
