"""A fit in words (values, intervals, identified or not, within 100 columns) and as a
calibration file."""
from __future__ import annotations

from typing import TYPE_CHECKING

from replay.text import wrap
from schemas.calibration import Calibration, FittedParam
from schemas.cost_params import PARAMS

if TYPE_CHECKING:
    from .fitting import FitResult


def param_cells(name: str, p: FittedParam) -> tuple[str, str, str]:
    """A parameter as printed: value with unit, its 95 % interval (or what bound the data
    give), and its state (``identified``, ``NOT IDENTIFIED`` or ``fixed``)."""
    unit, scale = _unit(PARAMS[name].unit, p.value)
    val = f"{p.value / scale:.4g}{unit}"
    if not p.vary:
        return val, "", "fixed"
    if not p.identifiable:
        bound = p.bound.split("the data give ")[-1] if p.bound and "the data give " in p.bound else ""
        return val, bound if bound != "nothing more" else "", "NOT IDENTIFIED"
    ci = p.ci95 or ((p.value - 1.96 * p.stderr, p.value + 1.96 * p.stderr) if p.stderr is not None else None)
    return val, f"[{ci[0] / scale:.4g}, {ci[1] / scale:.4g}]" if ci else "", "identified"


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


def fmt(name: str, value: float) -> str:
    """``value`` of parameter ``name`` with its unit, 3 significant digits (``0.489 ms``)."""
    unit, scale = _unit(PARAMS[name].unit, value)
    return f"{value / scale:.3g}{unit}"


def _unit(unit: str, value: float) -> tuple[str, float]:
    """A printed unit and its scale: seconds as ms or us where that reads better."""
    if unit != "s":
        return (f" {unit}" if unit else ""), 1.0
    if abs(value) >= 0.1 or value == 0:
        return " s", 1.0
    return (" ms", 1e-3) if abs(value) >= 1e-4 else (" us", 1e-6)


def to_calibration(fit: FitResult, cost_model, method: str, source: dict, engine: dict | None = None,
                   variants: list | None = None) -> Calibration:
    """The calibration file contents of ``fit`` for ``cost_model``'s hardware and terms."""
    stats = dict(fit.stats)
    points = stats.pop("band_points", [])
    stats.update({"method": method, "variant": fit.variant, "score": fit.score,
                  "correlations": fit.correlations, "warnings": fit.warnings})
    if variants:
        stats["variants"] = {v.variant: {"score": v.score, "values": v.values()} for v in variants}
    return Calibration(model=cost_model.model, gpu=cost_model.gpu, tp=cost_model.tp, params=dict(fit.params),
                       terms=list(cost_model.terms), dp=cost_model.dp, expert_parallel=cost_model.expert_parallel,
                       engine=dict(engine or {}), fit=stats, source=source, band_points=points,
                       pp=getattr(cost_model, "pp", 1))
