"""What to measure when the band changes the answer: the parameters that make a cheaper
deployment break the SLOs at some points of the calibration's confidence set.

A band point (:attr:`schemas.calibration.Calibration.band_points`) whose replay breaks an
objective is a parameter vector the calibration's data cannot reject under which the
deployment fails. The parameters in which such a point lies farthest from the calibration's
values, relative to their 95 % interval on that side, are the ones whose uncertainty decides:
a run that pins them down (the hint of :data:`MEASURE`) narrows the band.
"""
from __future__ import annotations

import math

from schemas.calibration import Calibration

#: Per parameter, a run whose measurement identifies it.
MEASURE = {
    "eta_compute": "a run whose steps are compute-bound (higher load: long prompts, a larger token budget)",
    "n_half_tokens": "runs at several batch sizes, from a few running requests to many",
    "eta_mem": "a decode-heavy run (long outputs, few requests at once)",
    "eta_prefill_kv": "a run with long prompts prefilled in chunks",
    "overlap": "a run whose steps mix prefill and decode at high load",
    "t_step_s": "a run at low load (one request at a time) with short outputs",
    "t_seq_s": "a run with many requests running at once",
    "t_allreduce_hop_s": "a run at this TP degree",
    "eta_link": "a run at this TP degree",
    "t_alltoall_s": "an expert-parallel run",
    "t_frontend_s": "engine-side timings (vLLM OTLP spans) beside the client's log",
    "t_frontend_per_prompt_token_s": "engine-side timings (vLLM OTLP spans) beside the client's log",
    "t_stream_per_token_s": "engine-side timings (vLLM OTLP spans) beside the client's log",
    "t_kv_migrate_s": "a disaggregated run at a rate where the decode instances accept prompts often",
}
#: A parameter counts when a breaking point moves it at least this fraction of the way to its
#: interval's end (or, without an interval, of its value).
MIN_SHIFT = 0.5


def relative_shift(cal: Calibration, name: str, value: float) -> float:
    """How far ``value`` lies from the calibration's value of ``name``: in units of the
    distance to its 95 % interval's end on that side (1: at the end), or relative to the
    value itself when there is no interval; 0 when equal."""
    p = cal.params.get(name)
    center = cal.value(name)
    if not math.isfinite(value) or not math.isfinite(center) or value == center:
        return 0.0
    if p is not None and p.ci95 is not None:
        end = p.ci95[1] if value > center else p.ci95[0]
        if end != center:
            return abs(value - center) / abs(end - center)
    return abs(value - center) / abs(center) if center else math.inf


def not_identified(cal: Calibration, name: str) -> str | None:
    """The calibration's NOT IDENTIFIED reason for ``name`` (its ``bound``), or None."""
    p = cal.params.get(name)
    if p is None:
        return None
    bound = p.bound or ""
    if p.identifiable and not bound.startswith("NOT IDENTIFIED"):
        return None
    text = bound.removeprefix("NOT IDENTIFIED").strip()
    if not text.startswith("("):
        return text or "no interval"
    depth = 0
    for i, ch in enumerate(text):  # the parenthesis after NOT IDENTIFIED, nested ones inside
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0:
            return text[1:i]
    return text[1:]


def deciding_parameters(cal: Calibration, breaking: list[dict]) -> list[tuple[str, float, float]]:
    """``(name, shift, value)`` of the parameters the breaking band points move most
    (:func:`relative_shift` at least :data:`MIN_SHIFT`), largest shift first; ``value`` is
    the breaking point's value farthest from the calibration's."""
    best: dict[str, tuple[float, float]] = {}
    for pt in breaking:
        for name, v in pt.items():
            s = relative_shift(cal, name, v)
            if s >= MIN_SHIFT and s > best.get(name, (0.0, v))[0]:
                best[name] = (s, v)
    return sorted(((n, s, v) for n, (s, v) in best.items()), key=lambda t: -t[1])


def advice_lines(cal: Calibration, label: str, breaking: list[dict], of_points: int, limit: int = 3) -> list[str]:
    """Sentences saying which parameters to measure before trusting deployment ``label``,
    which breaks the objectives at ``breaking`` (band points) of the calibration's ``of_points``."""
    if not breaking:
        return []
    found = deciding_parameters(cal, breaking)[:limit]
    if not found:
        return [f"{label} breaks the SLOs at {len(breaking)} of {of_points} band points, none far from the "
                "calibration in one parameter: the band's width is the data's, measure a run like this deployment"]
    out = []
    for name, _, v in found:
        why = not_identified(cal, name)
        center = cal.value(name)
        p = cal.params.get(name)
        where = f"{len(breaking)} of {of_points} band points put it at {v:.3g} (calibration {center:.3g}"
        where += f", 95 % interval [{p.ci95[0]:.3g}, {p.ci95[1]:.3g}])" if p is not None and p.ci95 else ")"
        head = f"{name} is NOT IDENTIFIED ({why})" if why is not None else f"{name} is uncertain"
        how = MEASURE.get(name, "a run where it matters")
        out.append(f"{head}; {where} and {label} then breaks the SLOs: measure {how} before trusting {label}")
    return out


def what_if_command(cal_path, what_if: dict) -> str:
    """``calibrate advise CAL --what-if KEY=VALUE,...``: the command that ranks benchmark runs by how much
    each would narrow the band of the what-if ``what_if`` (its ``--what-if`` keys -> values, in order)."""
    import shlex

    parts = ",".join(f"{k}={v}" for k, v in what_if.items())
    return f"calibrate advise {shlex.quote(str(cal_path))} --what-if {parts}"


def advise_command(cal_path, candidate, rate_rps: float) -> str:
    """The ``calibrate advise`` command that ranks the benchmark runs by how much each would narrow the
    band of ``candidate`` (:class:`replay.plan.grid.Candidate`) at ``rate_rps`` (requests/s; 0: a burst,
    no rate given): its engine limits and one replica's share of the rate, since advise replays the
    calibrated GPU and TP."""
    what_if = {"rate": f"{rate_rps / max(1, candidate.replicas):.3g}"} if rate_rps > 0 else {}
    what_if.update(max_num_seqs=candidate.max_num_seqs, max_num_batched_tokens=candidate.max_num_batched_tokens)
    return what_if_command(cal_path, what_if)
