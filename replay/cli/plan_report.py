"""What ``servecal plan`` prints: what was planned for, the table of the best candidates, the
answer with its band, what to measure when the band changes it, the Pareto front and the
candidates skipped. Every line fits 100 columns."""
from __future__ import annotations

import click

from ..text import wrap


def _echo(line: str = "") -> None:
    click.echo(wrap(line) if line else "")


def header_lines(plan, cals, slo, trace) -> list[str]:
    """What was planned for: the workload and target, the objectives, the calibrations and
    their bands, the shared engine settings, the KV cache sizing, the extrapolations."""
    from ..cost.kv_capacity import kv_capacity_blocks

    ref_path, ref = cals.items[0]
    res = plan.result
    at = (f"at {plan.target_rate_rps:.3g} req/s (the trace's {plan.trace_rate_rps:.3g} req/s x "
          f"{plan.rate_scale:.3g})" if plan.trace_rate_rps > 0 else
          "arriving all at once (a burst: no rate, so no max rate)")
    lines = [f"plan: {plan.work.num_requests} requests of {trace} {at}; SLO {slo.describe()}; confidence "
             f"{res.confidence}"]
    if plan.left_out:
        lines.append(f"note: {plan.left_out} requests longer than max_model_len are left out")
    for path, cal in cals.items:
        band = (f"{len(cal.band_points)} band points (its 95 % confidence set)" if cal.band_points else
                "no band points (a file from before bands): its band is its point")
        lines.append(f"calibration {path}: {cal.model.name} on {cal.gpu.name} {_layout(cal)}, {band}")
    shared = {k: v for k, v in plan.base.items() if k not in ("slo_ttft_s", "slo_tpot_s")}
    if shared:
        lines.append(f"engine settings from {ref_path}: " + ", ".join(f"{k}={v}" for k, v in shared.items()))
    recorded = ref.engine.get("num_gpu_blocks")
    util, bs = plan.base.get("gpu_memory_utilization", 0.9), plan.base.get("block_size", 16)
    kv = (f"KV blocks per replica (with PP: per virtual engine, a replica's // PP) derived from each candidate's "
          f"GPU memory at its TP and PP (gpu_memory_utilization={util}, block_size={bs})")
    if recorded:
        try:
            mine = kv_capacity_blocks(ref.model, ref.gpu, ref.tp, util, bs)
        except ValueError:
            mine = "none"
        kv += (f"; the calibrated run recorded num_gpu_blocks={recorded} on {ref.gpu.name} TP{ref.tp}, derived "
               f"there: {mine} (activations and CUDA context are not counted)")
    lines.append(kv)
    ran = [p for p in plan.prepared if not p.skip]
    carried = sorted({p.candidate.gpu for p in ran if p.extrapolated})
    if carried:
        lines.append(f"note: {', '.join(carried)}: no calibration of its own; the efficiencies and host times "
                     f"fitted on {ref.gpu.name} (eta_compute, eta_mem, t_step_s, ...) are carried to its datasheet "
                     "FLOP/s and bandwidth: an extrapolation, check it against a measured run")
    tps = sorted({p.candidate.tp for p in ran} | {p.candidate.tp_decode for p in ran if p.candidate.disagg})
    other = [t for t in tps if t != ref.tp]
    if other:
        lines.append(f"note: TP {', '.join(map(str, other))} {'differ' if len(other) > 1 else 'differs'} from the "
                     f"calibrated TP{ref.tp}: their "
                     "all-reduces use the link preset's bandwidth and latency with the calibration's eta_link, "
                     "not a measurement at that TP")
    for name, fitted, why in (("PP", ref.pp, "each stage is priced as 1/PP of the layers plus an activation transfer "
                                             "on the link preset"),
                              ("DP", ref.dp, "the ranks' lock step is priced from the calibration's values")):
        other = sorted({getattr(p.candidate, name.lower()) for p in ran} - {fitted})
        if other:
            lines.append(f"note: {name} {', '.join(map(str, other))} {'differ' if len(other) > 1 else 'differs'} "
                         f"from the calibrated {name}{fitted}: {why}, not a measurement at that {name} (an "
                         "extrapolation; its band holds the transfer error)")
    return lines


def _layout(cal) -> str:
    """``TP2``, ``TP2 PP2`` or ``TP1 DP2``: the parallelism a calibration was fitted at."""
    return f"TP{cal.tp}" + (f" PP{cal.pp}" if cal.pp > 1 else "") + (f" DP{cal.dp}" if cal.dp > 1 else "")


def _band_text(ev, slo) -> str:
    from ..plan.table import stat_cell, unit_of

    parts = []
    for k, v in slo.latency_s.items():
        name, scale = unit_of(v)
        parts.append(f"{k} {stat_cell(ev, k, scale)} {name}")
    if slo.goodput is not None:
        from ..plan.table import attainment_cell

        parts.append(f"goodput {attainment_cell(ev)} %")
    return ", ".join(parts)


def _deployment(ev, prices) -> str:
    c = ev.candidate
    cost = f", {ev.cost:.2f}/h" if prices else ""
    return f"{c.label()} ({c.num_gpus} GPU{'s' if c.num_gpus > 1 else ''}{cost})"


def answer_lines(plan, cals, slo, prices) -> list[str]:
    """The answer with its band and max rate; when the cheapest by point is not the cheapest
    by band, which one and why, with the parameters to measure."""
    from ..plan.advice import advice_lines, advise_command
    from ..plan.search import MEETS

    res = plan.result
    rate = f"at {res.target_rate_rps:.3g} req/s" if res.target_rate_rps > 0 else "on the burst"
    lines = []
    ans = res.answer
    if ans is None:
        if not res.ranked:
            lines.append(f"no candidate meets {slo.describe()} {rate}, even at its point: add GPUs, replicas "
                         "or another layout, or lower the rate")
        else:
            lines.append(f"no candidate meets {slo.describe()} {rate} at the worst end of its band "
                         f"({sum(ev.band is not None for ev in res.ranked)} tried, cheapest first); with "
                         "--confidence point the cheapest is " + _deployment(res.cheapest_point, prices))
    else:
        how = "with its 95 % band" if res.confidence == "band" else "at its point"
        mr = ("" if ans.max_rate_rps is None or not ans.max_rate_rps > 0 else
              f"; sustains up to {ans.max_rate_rps:.3g} req/s")
        lines.append(f"answer: {_deployment(ans, prices)} meets {slo.describe()} {rate} {how}: "
                     f"{_band_text(ans, slo)}{mr}")
        if res.confidence == "point" and ans.status != MEETS:
            lines.append(f"  its band breaks them at the worst end ({ans.reason.removeprefix('band: ')})")
    cp, cb = res.cheapest_point, res.cheapest_band
    if cp is not None and cp is not cb:
        later = f"the cheapest with its band is {_deployment(cb, prices)}" if cb else "none meets them with its band"
        lines.append(f"note: the cheapest by point, {_deployment(cp, prices)}, breaks the SLOs at the worst end of "
                     f"its band ({cp.reason.removeprefix('band: ')}); {later}")
        path, cal, _ = cals.for_gpu(cp.candidate.gpu)
        breaking = [pt for pt, row in zip(cp.prepared.band_points, cp.band_rows)
                    if slo.violations(row, row["attainment"])]
        lines += ["measure: " + s for s in advice_lines(cal, cp.candidate.label(), breaking,
                                                          len(cp.prepared.band_points))]
        if breaking:
            lines.append(f"which run: {advise_command(path, cp.candidate, res.target_rate_rps)} (ranks benchmark "
                         "runs by how much each would narrow this band, one replica's share of the rate)")
    return lines


def skipped_lines(plan, limit: int = 5) -> list[str]:
    """The candidates that cannot run, grouped by reason, one example each."""
    groups: dict[str, list] = {}
    for ev in plan.result.evaluations:
        if ev.status in ("skipped", "error"):
            groups.setdefault(ev.reason, []).append(ev.candidate.label())
    out = []
    for reason, labels in list(groups.items())[:limit]:
        out.append(f"skipped {len(labels)} (e.g. {labels[0]}): {reason}")
    if len(groups) > limit:
        out.append(f"skipped: {len(groups) - limit} more reasons (see -o)")
    return out


def print_plan(plan, cals, slo, trace, prices, wide: bool = False) -> bool:
    """Print the plan; True when a candidate meets the SLOs under the chosen confidence."""
    from ..plan.table import count_line, format_front, format_plan_table

    for line in header_lines(plan, cals, slo, trace):
        _echo(line)
    _echo(count_line(plan.result))
    _echo()
    click.echo(format_plan_table(plan.result, slo, bool(prices), wide))
    _echo()
    for line in answer_lines(plan, cals, slo, prices):
        _echo(line)
    if plan.result.front:
        _echo()
        _echo(f"Pareto front (throughput per GPU at the target rate vs {slo.primary}):")
        click.echo(format_front(plan.result, slo))
    skipped = skipped_lines(plan)
    if skipped:
        _echo()
        for line in skipped:
            _echo(line)
    return plan.result.answer is not None
