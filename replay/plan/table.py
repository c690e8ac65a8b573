"""A plan's tables: printed within 100 columns, and written whole as CSV or Parquet."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from ..analysis.bands import BAND_STATS
from ..errors import ConfigError
from ..text import WIDTH, render_table
from .search import DOMINATED, FAILS, MEETS, NOT_EVALUATED, POINT_ONLY, SKIPPED, SURVIVES, Evaluation, PlanResult
from .slo import Slo

#: Formats ``-o`` can write, by file suffix.
OUTPUT_FORMATS = (".csv", ".parquet")
#: Most rows of the printed table (``--wide``: every candidate with a band).
MAX_ROWS = 12

_VERDICT = {MEETS: "meets", POINT_ONLY: "point", SURVIVES: "-"}


def unit_of(limit_s: float) -> tuple[str, float]:
    """``("s", 1)`` for objectives of a second or more, ``("ms", 1e3)`` below."""
    return ("s", 1.0) if limit_s >= 1.0 else ("ms", 1e3)


def _num(v: float) -> str:
    return f"{v:.3g}" if math.isfinite(v) else "n/a"


def stat_cell(ev: Evaluation, key: str, scale: float) -> str:
    """``"1.84 [1.52, 2.41]"``: the point and (when computed) the band of ``key``, times ``scale``."""
    stat = f"{key}_s"
    p = ev.point[stat] * scale
    if ev.band is None or not ev.band.n_points and not ev.band.n_seeds:
        return _num(p)
    return f"{_num(p)} [{_num(ev.band.low[stat] * scale)}, {_num(ev.band.high[stat] * scale)}]"


def attainment_cell(ev: Evaluation) -> str:
    """The fraction of requests meeting the per-request SLOs, percent, with its band."""
    p = ev.point["attainment"] * 100
    lo, hi = ev.attainment_band
    if ev.band is None or not ev.band.n_points:
        return f"{p:.1f}"
    return f"{p:.1f} [{lo * 100:.1f}, {hi * 100:.1f}]"


def kv_cell(ev: Evaluation) -> str:
    """KV blocks of a replica's (virtual) engine (``disagg``: prefill/decode instance's; a replica's // PP)."""
    return "/".join(str(b) for b in ev.prepared.kv_blocks) or "-"


def _max_rate(ev: Evaluation) -> tuple[str, str]:
    r = ev.max_rate_rps
    if r is None:
        return "-", "-"
    if not math.isfinite(r):
        return "<min", "-"
    return f"{r:.3g}", f"{r / ev.candidate.num_gpus:.3g}"


def shown_rows(result: PlanResult, wide: bool = False) -> list[Evaluation]:
    """The candidates of the printed table: those with a band, cheapest first, then the rest of
    the front; at most :data:`MAX_ROWS` unless ``wide`` (the answer always)."""
    rows = [ev for ev in result.ranked if ev.band is not None]
    rows += [ev for ev in result.front if ev not in rows]
    if not wide and len(rows) > MAX_ROWS:
        keep = rows[:MAX_ROWS]
        if result.answer is not None and result.answer not in keep:
            keep[-1] = result.answer
        rows = keep
    return rows


def format_plan_table(result: PlanResult, slo: Slo, prices: bool, wide: bool = False) -> str:
    """The best candidates: deployment, the settings that vary, GPUs, cost per hour (with
    prices), KV blocks per replica, each objective's statistic ``point [low, high]`` (its unit
    in the header), attainment, max rate (req/s), max rate per GPU, verdict (``meets``: with
    its band; ``point``: at its point only). ``*`` marks the answer."""
    head, lines = plan_cells(result, slo, prices, wide)
    if not lines:
        return "(no candidate meets the SLOs at its point)"
    drop = () if wide else ("rps/GPU", "sched", "budget", "seqs", "cost/h", "KV blocks")
    return render_table(head, lines, None if wide else WIDTH, drop_order=drop, key=2)


def plan_cells(result: PlanResult, slo: Slo, prices: bool, wide: bool = False) -> tuple[list[str], list[list[str]]]:
    """Header and cells of :func:`format_plan_table` (rows: :func:`shown_rows`)."""
    rows = shown_rows(result, wide)
    cands = [ev.candidate for ev in result.evaluations]
    varying = [(name, attr) for name, attr in (("seqs", "max_num_seqs"), ("budget", "max_num_batched_tokens"),
                                               ("sched", "scheduler"))
               if len({getattr(c, attr) for c in cands}) > 1]
    head = ["#", "deployment"] + [n for n, _ in varying] + ["GPUs"] + (["cost/h"] if prices else []) + ["KV blocks"]
    units = {k: unit_of(v) for k, v in slo.latency_s.items()}
    head += [f"{k} {units[k][0]}" for k in slo.latency_s]
    head += (["good %"] if slo.goodput is not None else []) + ["max rps", "rps/GPU", "verdict"]
    lines = []
    for i, ev in enumerate(rows, 1):
        c = ev.candidate
        cells = [f"{'*' if ev is result.answer else ''}{i}", c.label()] + [str(getattr(c, a)) for _, a in varying]
        cells += [str(c.num_gpus)] + ([f"{ev.cost:.2f}"] if prices else []) + [kv_cell(ev)]
        cells += [stat_cell(ev, k, units[k][1]) for k in slo.latency_s]
        cells += ([attainment_cell(ev)] if slo.goodput is not None else []) + list(_max_rate(ev))
        cells.append(_VERDICT.get(ev.status, ev.status))
        lines.append(cells)
    return head, lines


def format_front(result: PlanResult, slo: Slo) -> str:
    """The Pareto front: GPUs, deployment, throughput per GPU at the target rate (req/s), the
    first objective's statistic at the point and band, the max rate and its per-GPU value."""
    return render_table(*front_cells(result, slo), WIDTH, drop_order=("max rps",))


def front_cells(result: PlanResult, slo: Slo) -> tuple[list[str], list[list[str]]]:
    """Header and cells of :func:`format_front`."""
    key = slo.primary
    name, scale = unit_of(slo.latency_s[key])
    head = ["GPUs", "deployment", "rps/GPU", f"{key} {name}", "max rps", "max rps/GPU"]
    lines = []
    for ev in result.front:
        c = ev.candidate
        lines.append([str(c.num_gpus), c.label(), f"{ev.point['throughput_rps'] / c.num_gpus:.3g}",
                      stat_cell(ev, key, scale), *_max_rate(ev)])
    return head, lines


def count_line(result: PlanResult) -> str:
    """``48 candidates: 6 skipped, 20 fail at their point, 10 dominated, 12 survive, 8 costlier not
    replayed; 5 with a band``."""
    evs = result.evaluations
    n = {s: sum(ev.status == s for ev in evs) for s in (SKIPPED, FAILS, DOMINATED, NOT_EVALUATED)}
    errors = sum(ev.status == "error" for ev in evs)
    banded = sum(ev.band is not None for ev in evs)
    parts = [f"{n[SKIPPED]} skipped", f"{n[FAILS]} fail at their point", f"{n[DOMINATED]} dominated",
             f"{len(result.ranked)} survive"] + ([f"{errors} refused by the replay"] if errors else [])
    if n[NOT_EVALUATED]:
        parts.append(f"{n[NOT_EVALUATED]} costlier not replayed")
    return f"{len(evs)} candidates: {', '.join(parts)}; {banded} with a band"


def plan_frame(result: PlanResult, slo: Slo, prices: bool) -> pd.DataFrame:
    """Every candidate, one row each, in grid order: the deployment, its GPUs, cost, KV
    blocks, status and reason, every predicted statistic at its point (seconds, requests/s),
    the band of each objective (``_low_s``, ``_high_s``), the attainment and its band
    (fractions), the max rate (requests/s; NaN: not searched or none found) and its value per GPU."""
    out = []
    for ev in result.evaluations:
        c, p = ev.candidate, ev.prepared
        row = {"gpu": c.gpu, "tp": c.tp, "replicas": c.replicas, "scheduler": c.scheduler,
               "max_num_seqs": c.max_num_seqs, "max_num_batched_tokens": c.max_num_batched_tokens,
               "prefill_replicas": c.prefill_replicas, "decode_replicas": c.decode_replicas,
               "tp_decode": c.tp_decode, "pp": c.pp, "dp": c.dp, "num_gpus": c.num_gpus,
               "cost_per_hour": ev.cost if prices else math.nan,
               "kv_blocks": p.kv_blocks[0] if p.kv_blocks else -1,
               "kv_blocks_decode": p.kv_blocks[1] if len(p.kv_blocks) > 1 else -1,
               "calibration": p.calibration, "extrapolated": p.extrapolated,
               "status": ev.status, "reason": ev.reason, "answer": ev is result.answer}
        point = ev.point if ev.point and "error" not in ev.point else {}
        row["n_ok"] = point.get("n_ok", -1)
        for s in BAND_STATS:
            row[s] = point.get(s, math.nan)
        for k in slo.latency_s:
            row[f"{k}_low_s"] = ev.band.low[f"{k}_s"] if ev.band else math.nan
            row[f"{k}_high_s"] = ev.band.high[f"{k}_s"] if ev.band else math.nan
        row["attainment"] = point.get("attainment", math.nan)
        row["attainment_low"], row["attainment_high"] = ev.attainment_band if ev.band else (math.nan, math.nan)
        row["max_rate_rps"] = ev.max_rate_rps if ev.max_rate_rps is not None else math.nan
        row["max_rate_rps_per_gpu"] = row["max_rate_rps"] / c.num_gpus
        out.append(row)
    return pd.DataFrame(out)


def check_output_path(path: str) -> None:
    """Raise a ConfigError unless ``path`` ends in a format of :data:`OUTPUT_FORMATS`."""
    if Path(path).suffix.lower() not in OUTPUT_FORMATS:
        raise ConfigError(f"-o {path}: give a .csv or .parquet file")


def write_plan(frame: pd.DataFrame, path: str) -> None:
    """Write :func:`plan_frame` as CSV or Parquet (by suffix), atomically."""
    from schemas.atomic import atomic_output

    check_output_path(path)
    with atomic_output(path) as tmp:
        if Path(path).suffix.lower() == ".csv":
            frame.to_csv(tmp, index=False)
        else:
            frame.to_parquet(tmp, index=False)
