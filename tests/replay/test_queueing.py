"""M/G/1 theory (replay.analysis.queueing) and the engine replayed against it (seed, theory.md section 3)."""
import math

import numpy as np
import pytest

from helpers import LinearStepCost, run, step_rows
from replay.analysis.queueing import (batch_means_ci, md1_mean_wait_s, mean_residual_s, mg1_mean_wait_s,
                                      mm1_mean_wait_s, service_moments, utilization)

#: Seconds per prompt token of the test cost model: a 1-token-output request's service time.
PER_TOKEN_S = 1e-3


# -- closed forms -------------------------------------------------------------------------------

@pytest.mark.parametrize("lam,mu", [(0.5, 1.0), (9.0, 10.0), (0.1, 4.0)])
def test_mm1_is_rho_over_mu_minus_lambda(lam, mu):
    rho = lam / mu
    assert mm1_mean_wait_s(lam, mu) == pytest.approx(rho / (mu - lam), rel=1e-12)
    assert mm1_mean_wait_s(lam, mu) == pytest.approx(mg1_mean_wait_s(lam, 1 / mu, 2 / mu**2), rel=1e-12)


def test_md1_is_half_of_mm1_at_the_same_load():
    # E[S^2] = D^2 instead of 2 D^2: P-K halves.
    assert md1_mean_wait_s(0.8, 1.0) == pytest.approx(0.8 * 1.0 / (2 * 0.2))
    assert md1_mean_wait_s(0.8, 1.0) == pytest.approx(mm1_mean_wait_s(0.8, 1.0) / 2)


def test_pk_hand_worked():
    # lambda = 2/s, E[S] = 0.3 s, E[S^2] = 0.2 s^2: rho = 0.6, W_q = 2 * 0.2 / (2 * 0.4) = 0.5 s.
    assert utilization(2.0, 0.3) == pytest.approx(0.6)
    assert mg1_mean_wait_s(2.0, 0.3, 0.2) == pytest.approx(0.5)


def test_pk_grows_with_variance_at_fixed_load():
    # The seed's "variance kills latency": same rho, E[S^2] = (1 + SCV) E[S]^2.
    waits = [mg1_mean_wait_s(0.7, 1.0, 1.0 + scv) for scv in (0.0, 1.0, 4.0, 24.0)]
    assert waits == pytest.approx([0.7 * (1 + scv) / 0.6 for scv in (0.0, 1.0, 4.0, 24.0)])


@pytest.mark.parametrize("lam", [1.0, 1.5])
def test_unstable_queue_raises(lam):
    with pytest.raises(ValueError, match=r"rho = lambda\*E\[S\] = .* >= 1"):
        mg1_mean_wait_s(lam, 1.0, 2.0)
    with pytest.raises(ValueError, match="unstable"):
        mm1_mean_wait_s(lam, 1.0)
    with pytest.raises(ValueError, match="unstable"):
        md1_mean_wait_s(lam, 1.0)


def test_impossible_moments_raise():
    with pytest.raises(ValueError, match="below E"):
        mg1_mean_wait_s(0.5, 1.0, 0.5)
    with pytest.raises(ValueError, match="arrival rate > 0"):
        mg1_mean_wait_s(0.0, 1.0, 1.0)


def test_service_moments():
    m = service_moments([1.0, 2.0, 3.0])
    assert (m.mean_s, m.second_moment_s2) == pytest.approx((2.0, 14 / 3))
    assert m.variance_s2 == pytest.approx(2 / 3)
    assert m.scv == pytest.approx(1 / 6)
    assert mg1_mean_wait_s(0.25, *m) == pytest.approx(0.25 * 14 / 3 / (2 * 0.5))
    for bad in ([], [1.0, -1.0], [1.0, np.nan]):
        with pytest.raises(ValueError, match="service"):
            service_moments(bad)


def test_mean_residual_is_the_inspection_paradox():
    # Steps of 1 s and 3 s back to back over 4 s: a random instant falls in the 3 s step
    # with probability 3/4, so E[R] = (1/4)(1/2) + (3/4)(3/2) = 1.25 s, not E[D]/2 = 1 s.
    assert mean_residual_s([1.0, 3.0], 4.0) == pytest.approx(1.25)
    # Half idle: arrivals in the idle half see R = 0.
    assert mean_residual_s([1.0, 3.0], 8.0) == pytest.approx(0.625)
    with pytest.raises(ValueError, match="cover"):
        mean_residual_s([1.0, 3.0], 3.0)


def test_batch_means_ci_covers_a_known_mean():
    rng = np.random.default_rng(0)
    mean, lo, hi = batch_means_ci(rng.normal(5.0, 1.0, 10_000), 20, 0.99)
    assert lo < 5.0 < hi and hi - lo < 0.1
    assert mean == pytest.approx(5.0, abs=0.05)
    with pytest.raises(ValueError, match="too few"):
        batch_means_ci([1.0, 2.0, 3.0], 2)


# -- the engine against P-K ---------------------------------------------------------------------

def replay_poisson(prompts, arrival_rate_per_s, rng, scheduler="fcfs", budget=10**9, max_num_seqs=1,
                   per_token_s=PER_TOKEN_S):
    """Replay 1-token-output requests with these prompt lengths at Poisson arrivals.

    With :class:`LinearStepCost` ``(0, per_token_s)`` a prefill step of N tokens lasts
    ``N * per_token_s`` and a 1-token request finishes at the end of its prefill, so at batch
    size 1 a request's service time is its prompt times ``per_token_s``.

    Returns
    -------
    reqs : list of replay.core.request.Request, in arrival order
    engine : replay.core.engine.Engine (steps recorded)
    """
    arrivals = np.cumsum(rng.exponential(1.0 / arrival_rate_per_s, len(prompts)))
    rows = [(str(i), float(a), int(p), 1) for i, (a, p) in enumerate(zip(arrivals, prompts))]
    out, engine = run(rows, LinearStepCost(0.0, per_token_s), scheduler=scheduler, budget=budget,
                      max_num_seqs=max_num_seqs, num_gpu_blocks=10**8)
    return [out[r[0]] for r in rows], engine


def _prompts(dist, n, mean_tokens, rng):
    """Prompt lengths (tokens) whose service times follow ``dist``; returns (prompts, E[S], E[S^2])."""
    es = mean_tokens * PER_TOKEN_S
    if dist == "exponential":
        x, es2 = rng.exponential(mean_tokens, n), 2 * es**2
    elif dist == "deterministic":
        x, es2 = np.full(n, float(mean_tokens)), es**2
    else:  # lognormal with sigma = 1: E[S^2] = E[S]^2 exp(sigma^2), SCV = e - 1 = 1.72
        sigma = 1.0
        x, es2 = rng.lognormal(math.log(mean_tokens) - sigma**2 / 2, sigma, n), es**2 * math.exp(sigma**2)
    # Whole tokens: rounding moves E[S] by < 0.05 % at a mean of 1000 tokens (far inside the CI).
    return np.maximum(1, np.rint(x)).astype(np.int64), es, es2


#: (service distribution, seed) of the M/G/1 replays; rho = 0.6, 100k requests, 1k warm-up.
MG1_CASES = [("exponential", 11), ("deterministic", 12), ("lognormal", 13)]


def mg1_replay(dist, seed, n=100_000, rho=0.6, warmup=1_000):
    """P-K prediction and the simulated mean queue wait (99 % batch-means CI) of one case."""
    rng = np.random.default_rng(seed)
    prompts, es, es2 = _prompts(dist, n, 1000, rng)
    lam = rho / es
    reqs, engine = replay_poisson(prompts, lam, rng)
    # batch size 1, 1-token outputs: one step per request, lasting exactly its service time
    assert [s.step_duration_s for s in step_rows(engine)] == pytest.approx(prompts * PER_TOKEN_S)
    waits = np.array([r.first_scheduled_time_s - r.arrival_time_s for r in reqs])
    return mg1_mean_wait_s(lam, es, es2), batch_means_ci(waits[warmup:], num_batches=33, confidence=0.99)


@pytest.mark.parametrize("dist,seed", MG1_CASES)
def test_batch1_fcfs_replay_matches_pollaczek_khinchine(dist, seed):
    predicted, (mean, lo, hi) = mg1_replay(dist, seed)
    msg = f"{dist}: P-K {predicted:.4f} s, simulated {mean:.4f} s, 99% CI [{lo:.4f}, {hi:.4f}]"
    assert lo <= predicted <= hi, msg
    # the test has power: the interval is narrow compared with the prediction
    assert hi - lo < 0.25 * predicted, msg


# -- chunked prefill vs whole prompts -----------------------------------------------------------

def test_chunked_prefill_lowers_step_variance_and_the_ttft_delay_of_short_requests():
    """Why chunking lowers short requests' TTFT, with the work held equal.

    Workload: 90 % short prompts (100 tokens), 10 % long (4000), one output token each,
    Poisson arrivals at rho = 0.7; a step of N tokens lasts N * 0.1 ms, no per-step overhead.
    Both schedulers do the same work in the same FCFS order, so the unfinished work an
    arrival finds (mean: the P-K wait W_q) is the same; only the step boundaries differ.

    * ``fcfs`` (whole prompts, unbounded budget) prefills everything waiting in one step, and
      a token exists only at its step's end. A request arriving during step k is served in
      step k+1 together with everything else that arrived during step k, including the work
      that arrived *after* it, during the residual R of step k. So its TTFT minus its own
      prefill time is ``W_q + rho * E[R]``, ``E[R] = sum(D^2) / (2 T)`` (inspection paradox:
      an arrival most likely lands in a long step).
    * ``chunked`` with a 256-token budget bounds every step, so Var(D) and E[R] collapse and
      a short request waits for about the work ahead of it only: W_q plus at most one
      bounded step of co-batched work.

    The gain is driven by Var(step), as the seed argues, but it is not a shorter queue in
    the P-K sense: the busy time is identical. The engine's *queue wait* (first scheduled -
    arrival) of short requests even moves the other way (a whole-prompt batch "schedules" a
    request at the start of a long step), so the effect is on TTFT, not on queue_wait_s.
    """
    per_token_s, budget = 1e-4, 256
    n, rho, warmup = 50_000, 0.7, 1_000
    rng = np.random.default_rng(7)
    is_long = rng.random(n) < 0.1
    prompts = np.where(is_long, 4000, 100)
    es, es2 = per_token_s * (0.1 * 4000 + 0.9 * 100), per_token_s**2 * (0.1 * 4000**2 + 0.9 * 100**2)
    lam = rho / es
    w_q = mg1_mean_wait_s(lam, es, es2)
    arrival_seed = int(rng.integers(2**31))

    def go(scheduler, budget):
        # the same arrival times for both schedulers (common random numbers: a paired comparison)
        reqs, eng = replay_poisson(prompts, lam, np.random.default_rng(arrival_seed), scheduler, budget,
                                   max_num_seqs=10**6, per_token_s=per_token_s)
        delay = np.array([r.first_token_time_s - r.arrival_time_s for r in reqs]) - prompts * per_token_s
        qwait = np.array([r.first_scheduled_time_s - r.arrival_time_s for r in reqs])
        steps = np.array([s.step_duration_s for s in step_rows(eng)])
        return delay, qwait, steps, max(r.last_token_time_s for r in reqs)

    f_delay, f_qwait, f_steps, f_horizon = go("fcfs", 10**9)
    c_delay, c_qwait, c_steps, _ = go("chunked", budget)
    short = ~is_long
    short[:warmup] = False

    # same work: identical busy time (work-conserving, no per-step overhead)
    assert c_steps.sum() == pytest.approx(f_steps.sum(), rel=1e-9)
    # the seed's premise: chunking bounds the step, so Var(D) collapses
    assert c_steps.max() <= budget * per_token_s * (1 + 1e-9)
    assert c_steps.var() < f_steps.var() / 100

    # fcfs: TTFT delay = W_q + rho * E[R] (explained above), inside its 99 % CI
    mean, lo, hi = batch_means_ci(f_delay[short], 25, 0.99)
    explained = w_q + rho * mean_residual_s(f_steps, f_horizon)
    assert lo <= explained <= hi, (mean, lo, hi, explained)
    # chunked: W_q plus at most one bounded step
    c_mean, c_lo, c_hi = batch_means_ci(c_delay[short], 25, 0.99)
    assert c_lo <= w_q + budget * per_token_s and c_hi >= w_q, (c_mean, c_lo, c_hi, w_q)
    # the gain on the same arrivals: positive, a sizeable fraction of the delay, 99 % CI
    gain, g_lo, g_hi = batch_means_ci((f_delay - c_delay)[short], 25, 0.99)
    assert g_lo > 0.15 * mean, (gain, g_lo, g_hi, mean)
    # ... while the queue-wait column says the opposite (see the docstring)
    assert c_qwait[short].mean() > f_qwait[short].mean()
