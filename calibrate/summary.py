"""A fit in words (values, intervals, identified or not, within 100 columns) and as a
calibration file."""
from __future__ import annotations

from typing import TYPE_CHECKING

from replay.text import wrap
from schemas.calibration import Calibration
from schemas.cost_params import param_cells

if TYPE_CHECKING:
    from .fitting import FitResult


def summary_lines(fit: FitResult, warned: frozenset = frozenset()) -> list[str]:
    """The fit in words: a line per fitted parameter (value, 95 % interval, identified or
    NOT IDENTIFIED with the reason on the next line, unless the parameter is in ``warned``:
    a warning gives the reason), then the fixed ones by reason; no line over 100 characters."""
    lines, fixed = [], {}
    for n, p in fit.params.items():
        v, ci, state = param_cells(n, p)
        if state == "fixed" and (p.bound or "").startswith("NOT IDENTIFIED ("):
            lines.append(f"  {n:24s} {v:>14s} {'':>22s}  NOT IDENTIFIED, held")
            if n not in warned:
                lines.append(wrap(f"      {p.bound[len('NOT IDENTIFIED ('):].split('); held')[0]}", indent="        "))
            continue
        if state == "fixed":
            fixed.setdefault(p.bound or "held fixed", []).append(f"{n}={v.replace(' ', '')}")
            continue
        lines.append(f"  {n:24s} {v:>14s} {ci:>22s}  {state}")
        if state == "NOT IDENTIFIED" and p.bound and n not in warned:
            lines.append(wrap(f"      {p.bound}", indent="        "))
    for why, names in fixed.items():
        lines.append(wrap(f"  fixed ({why}): {', '.join(names)}", indent="    "))
    return lines


def to_calibration(fit: FitResult, cost_model, method: str, source: dict, engine: dict | None = None,
                   variants: list | None = None) -> Calibration:
    """The calibration file contents of ``fit`` for ``cost_model``'s hardware and terms."""
    stats = dict(fit.stats)
    points, discrepancy = stats.pop("band_points", []), stats.pop("model_error", {})
    held_out = stats.pop("holdout", {})
    stats.update({"method": method, "variant": fit.variant, "score": fit.score,
                  "correlations": fit.correlations, "warnings": fit.warnings})
    if variants:
        stats["variants"] = {v.variant: {"score": v.score, "values": v.values()} for v in variants}
    return Calibration(model=cost_model.model, gpu=cost_model.gpu, tp=cost_model.tp, params=dict(fit.params),
                       terms=list(cost_model.terms), dp=cost_model.dp, expert_parallel=cost_model.expert_parallel,
                       engine=dict(engine or {}), fit=stats, source=source, band_points=points,
                       model_error=discrepancy, holdout=held_out,
                       pp=getattr(cost_model, "pp", 1))
