"""Prediction bands on every real run a calibration did not see (issue #18): is the measured value inside?

For every case of bench/fidelity.py (the same cases, calibrated the same way) and every run
it is scored on out of sample, the what-if "this run under this calibration" is replayed at
the calibration's values and at each point of its 95 % confidence set it carries
(``band_points``: a request fit's traced set, a step fit's covariance ellipsoid axes), with
the run's frame, engine settings and metadata as ``calibrate.runs.score_runs`` replays it
(``replay.analysis.bands.predict_with_band``); each statistic's band is its [min, max] over those
replays (the projection method). The statistics are those of FIDELITY.md, over the run's
scored requests (a time window's, ``@15:``), on the requests completed on both sides
(``replay.analysis.compare.compare``): p50/p90 TTFT, TPOT and E2E.

    python bench/bands.py [--data ../shared/data/real] [--out bench/BANDS.md] [--only NAME]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.runs import score_runs
from calibrate.step_fit import set_ci95
from fidelity import ROOT, calibrated, cases, imported
from replay.analysis.bands import BandJob, predict_with_band
from replay.analysis.compare import compare
from replay.config import RecordOptions
from replay.analysis.metrics import PERCENTILES
from replay.simulate import replay_frame

#: The statistics of the table (FIDELITY.md's), as ``replay.analysis.bands`` names them.
STATS = tuple(f"{m}_p{q}_s" for m in ("ttft", "tpot", "e2e") for q in (50, 90))
#: A band reaching less than this far below its point (relative) counts as one-sided in the summary.
ONE_SIDED = 0.001
#: Every statistic a band row carries (``replay.analysis.bands.BAND_STATS`` less the rates, which
#: ``compare`` does not give).
ROW_STATS = tuple(f"{m}_p{q}_s" for m in ("queue_wait", "ttft", "tpot", "e2e") for q in PERCENTILES)


def stats_of(table: pd.DataFrame, side: str = "pred") -> dict:
    """``{"ttft_p50_s": ...}`` of a ``compare()`` table, its ``pred`` or ``meas`` side (seconds)."""
    by = table.set_index("metric")
    return {s: float(by.loc[s.split("_p")[0], f"{side}_{s.split('_')[-2]}"]) if s.split("_p")[0] in by.index
            else np.nan for s in ROW_STATS}


@dataclass
class ScoredBandJob(BandJob):
    """A :class:`replay.analysis.bands.BandJob` whose statistics are those ``score_runs`` scores: over
    the run's scored rows (``Run.scored``, a time window; None: every row) completed on both
    sides, ``compare``'s percentiles."""

    scored: np.ndarray | None = None

    def row(self, cost_model, cfg) -> dict:
        result, _ = replay_frame(self.frame, cost_model, cfg, self.metadata)
        return stats_of(compare(result if self.scored is None else result[self.scored]))


def not_identified(fit) -> list[str]:
    """Parameters of ``fit`` the data did not identify: fitted NOT IDENTIFIED, or held as NOT
    IDENTIFIED by the fit (``calibrate.summary.summary_lines`` prints both)."""
    if fit is None:
        return []
    return [n for n, p in fit.params.items() if (p.vary and not p.identifiable)
            or (not p.vary and (p.bound or "").startswith("NOT IDENTIFIED ("))]


def why_not_identified(fit, where: str) -> list[str]:
    """``"t_step_s (fitted): at its lower bound; ..."``: each parameter of :func:`not_identified`
    and why, as the fit says it."""
    return [f"{n} ({where}{'' if fit.params[n].vary else ', held'}): "
            f"{(fit.params[n].bound or '').removeprefix('NOT IDENTIFIED (').split('); held')[0]}"
            for n in not_identified(fit)]


def case_rows(case) -> tuple[list[dict], list[str]]:
    """One row per out-of-sample run of ``case`` and statistic: measured, point, band; and
    what its calibration did not identify, and why."""
    t0 = time.perf_counter()
    cm, variant, fit = calibrated(case)
    set_ci95(fit, "stderr")  # as `calibrate fit` does: a step fit's band points (a request fit keeps its own)
    points = fit.stats.get("band_points", [])
    unknown = sorted(set(not_identified(fit)).union(*(not_identified(h) for h in case.held_from)))
    why = why_not_identified(fit, "this calibration") + [w for h in case.held_from
                                                        for w in why_not_identified(h, "the GPU fit it holds")]
    rows = []
    table = score_runs(case.score, cm)
    for run in case.score:
        g = table[table["run"] == run.name]
        job = ScoredBandJob(run.trace, run.metadata, cm, replace(run.config, record=RecordOptions()), points,
                            fit.stats.get("model_error", {}) if fit is not None else {}, scored=run.scored)
        band = predict_with_band(job, point_row=stats_of(g))
        meas = stats_of(g, "meas")
        for s in STATS:
            rows.append({"case": case.name, "scored on": Path(run.name).name, "variant": variant,
                         "carried": case.fit_runs is None, "n_points": band.n_points,
                         "not identified": ", ".join(unknown), "stat": s, "measured": meas[s],
                         "point": band.point[s], "low": band.low[s], "high": band.high[s],
                         "inside": band.holds(s, meas[s]), "half_width": band.half_width(s)})
    print(f"{case.name}: {len(points)} band points, {time.perf_counter() - t0:.1f} s", flush=True)
    return rows, why


def label(stat: str) -> str:
    return stat.removesuffix("_s").replace("_", " ")


def cell(r) -> str:
    """``"-1.2% (band -0.8%..+2.1%) OUT"``: the point's error, the band's ends relative to the point."""
    err = (r["point"] - r["measured"]) / r["measured"]
    lo, hi = (r["point"] - r["low"]) / r["point"], (r["high"] - r["point"]) / r["point"]
    return f"{err:+.1%} (band -{lo:.1%}..+{hi:.1%}) {'in' if r['inside'] else 'OUT'}"


def coverage(df: pd.DataFrame) -> str:
    n = len(df)
    return f"{int(df['inside'].sum())}/{n} ({df['inside'].mean():.0%})" if n else "none (no such case)"


def widths(df: pd.DataFrame) -> str:
    return f", median half width {np.nanmedian(df['half_width']):.1%}" if len(df) else ""


HEADER = """# Prediction bands on the real runs (bench/bands.py)

Issue #18: for every out-of-sample row of bench/FIDELITY.md, the 95 % band of each predicted
statistic and whether the measured value falls inside it.

How a band is computed: each case is calibrated exactly as bench/fidelity.py does (the same
case list, imported from it); the scored run is then replayed (its frame, engine settings and
metadata, as `calibrate.runs.score_runs` does) at the calibration's values and at every point
of its 95 % confidence set that the calibration carries (`band_points`: for a request-log fit,
the ends of the line searches that traced the set, also along the NOT IDENTIFIED parameters it
held; for the kernel-profile step fit, the +- principal axes of its delta-method covariance
ellipsoid, `calibrate.confidence.covariance_points`, as `calibrate fit` gives them). The band of
a statistic is its [min, max] over those replays, `replay.analysis.bands.predict_with_band`: the
projection of the confidence set onto the prediction, an inner approximation of it since the
points are a finite sample of the set. Statistics are FIDELITY.md's: percentiles over the run's
scored requests (the window's, for `@15:`), completed on both sides (`replay.analysis.compare.compare`).

What the band does not hold:
- the measured run's own sampling noise: a measured p90 is itself an estimate from a few
  hundred requests. The band is the uncertainty of the prediction only, so a measured value a
  little outside a narrow band is not by itself a contradiction;
- model error: a cost model that misses something of the run (another model or TP than the
  one fitted, a mechanism it does not simulate) is off by more than its parameters'
  uncertainty, and the band says nothing of that;
- the uncertainty of values a calibration holds from another one (the GPU fit under the link
  fits of the "llama run (GPU) + ..." cases: their points move only what those fits freed) or
  never fits (the front-end terms of a step fit; parameters a request fit does not free).

The point errors are recomputed here, as bench/fidelity.py computes them at this commit on this
machine (they are its `out` rows byte for byte). The committed FIDELITY.md (600cbe0) differs from
that in the MoE rows, the Qwen3-32B "llama run (GPU) + moe run (link)" row and the CodeLlama
GuideLLM rows (variant max, not blend); fidelity.py of 600cbe0 itself, run here, gives the
CodeLlama GuideLLM rows as here, so that part is the environment, not a code change.

Cells: `err (band -a..+b) in/OUT`: `err` = (point - measured) / measured as in FIDELITY.md;
`-a..+b` the band's ends relative to the point ((low - point) / point, (high - point) / point);
`in` when low <= measured <= high. `points`: confidence-set points replayed. `NOT IDENTIFIED`:
parameters the calibration, or a fit it holds values from, did not identify (why: below).
"""


def write(df: pd.DataFrame, why: dict, out: Path, seconds: float) -> None:
    head = ["case", "scored on", "points", "NOT IDENTIFIED", *map(label, STATS)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (case, run), g in df.groupby(["case", "scored on"], sort=False):
        by = g.set_index("stat")
        lines.append(f"| {case} | {run} | {by['n_points'].iloc[0]} | {by['not identified'].iloc[0] or '-'} | "
                     + " | ".join(cell(by.loc[s]) for s in STATS) + " |")
    hw = df["half_width"].to_numpy(float)
    ident, unident = df[df["not identified"] == ""], df[df["not identified"] != ""]
    carried, same = df[df["carried"]], df[~df["carried"]]
    err = (df["point"] / df["measured"] - 1).abs()
    flat_low = (df["point"] - df["low"]) / df["point"] < ONE_SIDED
    below, above = df["measured"] < df["low"], df["measured"] > df["high"]
    summary = [
        "", "## Summary", "",
        f"- Coverage: {coverage(df)} measured statistics inside their band "
        f"({df.groupby(['case', 'scored on']).ngroups} scored runs x {len(STATS)} statistics).",
        f"- Band half width ((high - low) / 2 / point): median {np.nanmedian(hw):.1%}, "
        f"p90 {np.nanpercentile(hw, 90):.1%}, max {np.nanmax(hw):.1%}.",
        f"- Cases whose every parameter is identified ({ident['case'].nunique()}): "
        + (f"coverage {coverage(ident)}{widths(ident)}." if len(ident) else
           "none; every case has a NOT IDENTIFIED parameter (below), so this split has one side only."),
        f"- Cases with NOT IDENTIFIED parameters ({unident['case'].nunique()}): coverage "
        f"{coverage(unident)}{widths(unident)}.",
        f"- Calibrations fitted on part of the same deployment (first 15 s -> rest, sync -> sweep): coverage "
        f"{coverage(same)}{widths(same)}; carried from another run, model or parallelism (kernel profile, "
        f"llama -> qwen): {coverage(carried)}{widths(carried)}.",
        "- By statistic: " + ", ".join(f"{label(s)} {coverage(df[df['stat'] == s])}" for s in STATS) + ".",
        f"- |err| median {np.nanmedian(err[~df['inside']]):.1%} where outside, "
        f"{np.nanmedian(err[df['inside']]):.1%} where inside." if (~df["inside"]).any() and df["inside"].any()
        else f"- Outside: {int((~df['inside']).sum())} statistics.",
        f"- One-sided bands: {int(flat_low.sum())} of {len(df)} bands reach less than {ONE_SIDED:.1%} below the "
        f"point (the optimum sits at a bound of some parameter, or every traced point predicts slower); "
        f"{int((below & flat_low).sum())} of the {int((~df['inside']).sum())} statistics outside are measured "
        f"below such a band, {int(below.sum())} below their band at all, {int(above.sum())} above it.",
        f"- Run time: {seconds / 60:.1f} min (bench/bands.py, every case, one process, on 2 shared cores).",
    ]
    notes = ["", "## What each calibration did not identify", ""]
    for case, reasons in why.items():
        notes.append(f"- {case}: " + ("; ".join(reasons) if reasons else "every parameter identified") + ".")
    detail = ["", "## Every statistic", "",
              "Milliseconds; half width = (high - low) / 2 / point.", "",
              "| case | scored on | statistic | measured | point | band low | band high | inside | half width |",
              "|---|---|---|---|---|---|---|---|---|"]
    for _, r in df.iterrows():
        detail.append(f"| {r['case']} | {r['scored on']} | {label(r['stat'])} | {r['measured'] * 1e3:.2f} | "
                      f"{r['point'] * 1e3:.2f} | {r['low'] * 1e3:.2f} | {r['high'] * 1e3:.2f} | "
                      f"{'yes' if r['inside'] else 'no'} | {r['half_width']:.1%} |")
    text = "\n".join(lines + summary + notes + detail) + "\n"
    print(text)
    out.write_text(HEADER + "\n" + text)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "real")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "BANDS.md")
    ap.add_argument("--only", default=None, help="Run only cases whose name contains this.")
    args = ap.parse_args()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        rows, why = [], {}
        for case in cases(imported(args.data, Path(tmp))):
            if case.score and not (args.only and args.only not in case.name):
                case_table, why[case.name] = case_rows(case)
                rows += case_table
    write(pd.DataFrame(rows), why, args.out, time.perf_counter() - t0)


if __name__ == "__main__":
    main()
