"""``servecal plan``: the cheapest deployment that meets a percentile SLO, with the stated confidence.

The workload is a request trace at a target rate; the candidates a grid of GPU types, TP, PP and DP
degrees, replicas, engine limits and schedulers (:mod:`.grid`); each is replayed with its
calibrated (or carried) cost model, and the search (:mod:`.search`) prunes by the point
prediction before it computes bands (:mod:`replay.analysis.bands`) and max rates. :mod:`.slo` parses
and checks the objectives, :mod:`.advice` says which parameters to measure when the band
changes the answer, :mod:`.table` prints and writes the result, :mod:`.runner` runs the
replays here, in local processes or on Ray.

Example::

    plan = plan_deployments(frame, meta, Calibrations([("cal.json", cal)]), axes,
                            parse_slo(["ttft_p90=2s"]), rate_rps=3.0)
    print(plan.result.answer.candidate.label())
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from schemas.status import OK
from traces.transform import rescaled_arrival_problem

from ..config import OPTION_PART
from ..errors import ConfigError
from .grid import NOT_CARRIED, Axes, Calibrations, Candidate, Prepared, prepare
from .runner import Runner, Workload
from .search import CONFIDENCES, PlanResult, search
from .slo import Slo, parse_slo

__all__ = ["CONFIDENCES", "Axes", "Calibrations", "Candidate", "Plan", "PlanResult", "Prepared", "Slo", "base_options",
           "parse_slo", "plan_deployments", "trace_rate_rps", "workload"]


def base_options(cals: Calibrations, slo: Slo, overrides: dict | None = None) -> dict:
    """The replay options every candidate shares: the reference calibration's recorded engine
    settings (vLLM names) but :data:`.grid.NOT_CARRIED`, then ``overrides``, and the per-request
    SLOs of the goodput."""
    out = {k: v for k, v in cals.reference.engine.items()
           if k in OPTION_PART and k not in NOT_CARRIED and OPTION_PART[k] == "engine" and v is not None}
    if "router" in cals.reference.engine and cals.reference.engine["router"]:
        out["router"] = cals.reference.engine["router"]
    out.update({k: v for k, v in (overrides or {}).items() if v is not None})
    out.update(slo_ttft_s=slo.slo_ttft_s, slo_tpot_s=slo.slo_tpot_s)
    return out


def workload(frame: pd.DataFrame, metadata: dict, max_model_len: int) -> tuple[Workload, int]:
    """The requests a plan replays: those not failed in the measured run and fitting
    ``max_model_len`` (prompt + output); returns the workload and how many were left out for
    their length."""
    keep = np.ones(len(frame), bool)
    if "status" in frame:
        keep &= (frame["status"].isna() | (frame["status"] == OK)).to_numpy(bool)
    total = (frame["num_prompt_tokens"].to_numpy(np.int64) + frame["num_output_tokens"].to_numpy(np.int64))
    too_long = keep & (total > max_model_len)
    keep &= ~too_long
    if not keep.any():
        raise ConfigError(f"no request of the trace fits max_model_len={max_model_len}: nothing to plan for")
    sub = frame.loc[keep].reset_index(drop=True)
    return Workload(sub, metadata, len(sub)), int(too_long.sum())


def trace_rate_rps(frame: pd.DataFrame) -> float:
    """Mean arrival rate of a trace, requests/s: ``n / (last - first arrival)`` (as
    ``traces describe`` gives it); NaN when every request arrives at once."""
    t = frame["arrival_time_s"].to_numpy(float)
    span = float(t.max() - t.min()) if len(t) else 0.0
    return len(t) / span if span > 0 else float("nan")


@dataclass
class Plan:
    """A plan's result and what it was run on.

    Attributes
    ----------
    result : PlanResult
    prepared : list of Prepared
    work : Workload
    rate_scale : float
        Arrival times were divided by it.
    target_rate_rps, trace_rate_rps : float
    left_out : int
        Requests left out for exceeding ``max_model_len``.
    base : dict
        The options every candidate shares.
    """

    result: PlanResult
    prepared: list
    work: Workload
    rate_scale: float
    target_rate_rps: float
    trace_rate_rps: float
    left_out: int = 0
    base: dict = field(default_factory=dict)


def plan_deployments(frame: pd.DataFrame, metadata: dict, cals: Calibrations, axes: Axes, slo: Slo,
                     rate_rps: float | None = None, rate_scale: float | None = None, prices: dict | None = None,
                     confidence: str = "band", top_k: int = 5, probes: int = 8, jobs: int | None = None,
                     ray_address: str | None = None, overrides: dict | None = None, exhaustive: bool = False) -> Plan:
    """Search the cheapest candidate of ``axes`` meeting ``slo`` on ``frame``.

    Parameters
    ----------
    frame, metadata
        A request trace (``request_trace/1``, sorted by arrival) and its metadata.
    cals : Calibrations
    axes : Axes
    slo : Slo
    rate_rps, rate_scale : float, optional
        The target: arrival times rescaled to this mean rate (requests/s), or divided by this
        factor; neither: the trace's own times. Not both.
    prices : dict, optional
        Price per GPU-hour by GPU key; without, the cost is the GPU count.
    confidence, top_k, probes
        See :func:`replay.plan.search.search`.
    jobs, ray_address
        Where the replays run (:class:`replay.plan.runner.Runner`).
    overrides : dict, optional
        Engine options replacing the calibration's (``gpu_memory_utilization``, ``router``).
    exhaustive : bool
        Replay every candidate at its point (see :func:`replay.plan.search.search`).

    Raises
    ------
    ConfigError
        Both or a bad rate, a trace whose arrivals span no time with ``rate_rps``, an axis
        that cannot be built, Ray not installed.
    """
    if rate_rps is not None and rate_scale is not None:
        raise ConfigError("--rate and --rate-scale: give one")
    base = base_options(cals, slo, overrides)
    max_len = base.get("max_model_len") or cals.reference.model.max_model_len
    work, left_out = workload(frame, metadata, max_len)
    own = trace_rate_rps(work.frame)
    if rate_rps is not None:
        if not 0 < rate_rps < float("inf"):
            raise ConfigError(f"--rate {rate_rps}: expected requests/s > 0")
        rate_scale = rate_rps / own if own > 0 else rate_scale
    if not own > 0 and (rate_rps is not None or rate_scale is not None):
        # dividing arrival times that are all equal changes nothing: no rate to reach
        raise ConfigError(f"{'--rate' if rate_rps is not None else '--rate-scale'}: the trace's "
                          f"{len(work.frame)} request(s) all arrive at once, so it has no rate to rescale; "
                          "plan the burst as it is (without --rate, --rate-scale) or give a trace whose "
                          "arrivals spread over time")
    if not own > 0:
        probes = 0  # no max rate either: a burst has no rate to bisect
    scale = 1.0 if rate_scale is None else float(rate_scale)
    if not 0 < scale < float("inf"):
        raise ConfigError(f"--rate-scale {rate_scale}: expected a factor > 0")
    problem = (rescaled_arrival_problem(work.frame["arrival_time_s"], scale, own, " req/s") if rate_rps is not None
               else rescaled_arrival_problem(work.frame["arrival_time_s"], scale))
    if problem:
        raise ConfigError(f"--rate {rate_rps:g}: {problem}" if rate_rps is not None else
                          f"--rate-scale {scale:g}: {problem}")
    longest = int((work.frame["num_prompt_tokens"] + work.frame["num_output_tokens"]).max())
    prepared = [prepare(c, cals, base, prices or {}, longest) for c in axes.candidates()]
    with Runner(work, jobs, ray_address) as runner:
        result = search(prepared, work, slo, scale, own * scale, runner, confidence, top_k, probes, exhaustive)
    return Plan(result, prepared, work, scale, own * scale, own, left_out, base)
