"""Prediction bands on every real run a calibration did not see (issues #18, #36): is the measured value inside?

For every case of bench/fidelity.py (the same cases, calibrated the same way) and every run
it is scored on out of sample, the what-if "this run under this calibration" is predicted with its
band as ``replay`` computes it (``replay.analysis.bands.predict_with_band``): the parameters' part
(replays at the points of the calibration's 95 % confidence set), the sampling noise of each
percentile, the model's error held out inside the calibration's own data (``calibrate.holdout``)
scaled by the run's distance from the fitted load, and for a carried calibration the transfer
error. The transfer error of a case is measured on the other carried cases only (leave one case
out): no band uses the run it is scored on. The statistics are those of FIDELITY.md, over the
run's scored requests (a time window's, ``@15:``), on the requests completed on both sides
(``replay.analysis.compare.compare``): p50/p90 TTFT, TPOT and E2E.

    python bench/bands.py [--data ../shared/data/real] [--out bench/BANDS.md] [--only NAME] [--csv rows.csv]

The interval score of a band [l, u] at coverage 1 - a for a measured x is (u - l) + (2/a)(l - x) if
x < l, + (2/a)(x - u) if x > u (Gneiting & Raftery, "Strictly proper scoring rules, prediction and
estimation", JASA 102, 2007, section 6.2); here relative to x, median and mean over the statistics,
before (the committed table's bands) and after.
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
from schemas.calibration import fit_grade
from fidelity import ROOT, calibrated, cases, imported
from replay.analysis.bands import BandBasis, BandJob, point_details, predict_with_band
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

    def row(self, cost_model, cfg, details: bool = False) -> dict:
        result, _ = replay_frame(self.frame, cost_model, cfg, self.metadata)
        scored = result if self.scored is None else result[self.scored]
        row = stats_of(compare(scored))
        if details:
            row["details"] = point_details(scored, self.basis.new_sample)
        return row


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
    # the transfer part is added later, from the other carried cases (leave one case out)
    basis = BandBasis(fit.stats.get("model_error", {}), fit.stats.get("holdout", {}),
                      grade=fit_grade(fit.stats)[0]) if fit is not None else BandBasis()
    held_out = [abs(e["rel_err"]) for e in basis.holdout.get("errors", [])]
    holdout_max = max(held_out) if held_out else np.nan
    for run in case.score:
        job = ScoredBandJob(run.trace, run.metadata, cm, replace(run.config, record=RecordOptions()), points,
                            basis, scored=run.scored)
        band = predict_with_band(job)
        g = score_runs([run], cm)
        meas = stats_of(g, "meas")
        for s in STATS:
            parts = band.parts.get(s, {})
            rows.append({"case": case.name, "scored on": Path(run.name).name, "variant": variant,
                         "carried": case.fit_runs is None, "n_points": band.n_points,
                         "not identified": ", ".join(unknown), "stat": s, "measured": meas[s],
                         "point": band.point[s], "low": band.low[s], "high": band.high[s],
                         "inside": band.holds(s, meas[s]), "half_width": band.half_width(s),
                         "distance": band.distance, "grade": basis.grade, "holdout_max": holdout_max,
                         **{f"part_{k}_{side}": v[i] for k, v in parts.items() for i, side in enumerate(("lo", "hi"))}})
    print(f"{case.name}: {len(points)} band points, {time.perf_counter() - t0:.1f} s", flush=True)
    return rows, why


def label(stat: str) -> str:
    return stat.removesuffix("_s").replace("_", " ")


def cell(r) -> str:
    """``"-1.2% (band -0.8%..+2.1%) OUT"``: the point's error, the band's ends relative to the point."""
    err = (r["point"] - r["measured"]) / r["measured"]
    lo, hi = (r["point"] - r["low"]) / r["point"], (r["high"] - r["point"]) / r["point"]
    return f"{err:+.1%} (band -{lo:.1%}..+{hi:.1%}) {'in' if r['inside'] else 'OUT'}"


#: Issue #36's median half width of same-deployment bands.
WIDTH_TARGET = 0.10


def scaled_coverage(df: pd.DataFrame, width: float) -> str:
    """The coverage of ``df``'s bands with both sides of each scaled about its point by the one
    factor that makes their median half width ``width``."""
    if not len(df):
        return "none (no such case)"
    k = width / np.nanmedian(df["half_width"])
    low, high = df["point"] - k * (df["point"] - df["low"]), df["point"] + k * (df["high"] - df["point"])
    inside = (low <= df["measured"]) & (df["measured"] <= high)
    return f"{int(inside.sum())}/{len(df)} ({inside.mean():.0%})"


def coverage(df: pd.DataFrame) -> str:
    n = len(df)
    return f"{int(df['inside'].sum())}/{n} ({df['inside'].mean():.0%})" if n else "none (no such case)"


def widths(df: pd.DataFrame) -> str:
    return f", median half width {np.nanmedian(df['half_width']):.1%}" if len(df) else ""


#: Nominal miss rate of a band (the interval score's alpha).
ALPHA = 0.05


def transfer_of(rows: pd.DataFrame) -> dict:
    """Per metric, the 95th percentile of |point / measured - 1| over ``rows`` (p50 and p90 pooled):
    :data:`replay.analysis.band_parts.TRANSFER_ERROR` when ``rows`` are every carried case's."""
    err = (rows["point"] / rows["measured"] - 1).abs()
    metric = rows["stat"].str.split("_p").str[0] + "_s"
    return {m: float(np.nanpercentile(err[metric == m], 95)) for m in sorted(metric.unique())}


def add_transfer(df: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """Each carried case's band with the transfer part measured on the other carried cases (leave
    one case out), combined in quadrature with its other parts; the transfer errors by case."""
    df = df.copy()
    used = {}
    carried = df[df["carried"]]
    for case in carried["case"].unique():
        t = transfer_of(carried[carried["case"] != case])
        used[case] = t
        at = df.index[df["case"] == case]
        for i in at:
            r = df.loc[i]
            w = t.get(r["stat"].split("_p")[0] + "_s", 0.0) * abs(r["point"])
            rest_lo = np.sqrt(r["part_parameters_lo"] ** 2 + r["part_sampling_lo"] ** 2 + r["part_model_lo"] ** 2)
            rest_hi = np.sqrt(r["part_parameters_hi"] ** 2 + r["part_sampling_hi"] ** 2 + r["part_model_hi"] ** 2)
            df.loc[i, "part_transfer_lo"] = df.loc[i, "part_transfer_hi"] = w
            df.loc[i, "low"] = max(0.0, r["point"] - float(np.hypot(rest_lo, w)))
            df.loc[i, "high"] = r["point"] + float(np.hypot(rest_hi, w))
    df["inside"] = (df["low"] <= df["measured"]) & (df["measured"] <= df["high"])
    df["half_width"] = (df["high"] - df["low"]) / 2 / df["point"]
    return df, used


def interval_score(low, high, measured) -> np.ndarray:
    """Gneiting & Raftery's interval score of each band at :data:`ALPHA`, relative to the measured value."""
    low, high, x = (np.asarray(v, float) for v in (low, high, measured))
    score = (high - low) + (2 / ALPHA) * np.maximum(low - x, 0) + (2 / ALPHA) * np.maximum(x - high, 0)
    return score / x


def committed_bands(path: Path) -> pd.DataFrame:
    """The "Every statistic" table of a committed BANDS.md (measured, low, high in ms; empty if none)."""
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            cells = [c.strip() for c in line.strip("|").split("|")]
            if len(cells) >= 9 and cells[2] in {label(s) for s in STATS} and cells[3] != "measured":
                try:
                    rows.append({"case": cells[0], "scored on": cells[1], "stat": cells[2],
                                 "measured": float(cells[3]), "low": float(cells[5]), "high": float(cells[6])})
                except ValueError:
                    continue
    return pd.DataFrame(rows)


HEADER = """# Prediction bands on the real runs (bench/bands.py)

Issues #18 and #36: for every out-of-sample row of bench/FIDELITY.md, the 95 % band of each
predicted statistic and whether the measured value falls inside it.

How a band is computed (as `replay` prints it, `replay.analysis.bands`): each case is calibrated
exactly as bench/fidelity.py does (the same case list, imported from it); the scored run is then
replayed (its frame, engine settings and metadata, as `calibrate.runs.score_runs` does) at the
calibration's values and at the points of its 95 % confidence set (`band_points`). Each side of a
statistic's band is sqrt(parameters^2 + sampling^2 + model^2 + transfer^2) from the point:

- parameters: the farthest the set's points move the prediction, on either side, taken on both
  (a parameter at a bound no longer makes the band one-sided);
- sampling: the order-statistic interval of the percentile over the scored requests (what a run of
  that many requests would measure);
- model: the calibration's own held-out errors (`calibrate.holdout`: leave one run out, or each half
  of a single run fitted and the other half's three windows predicted), their split-conformal 95 %
  quantile after dividing each by 2^d, d its distance from the refit's load (log2 units), times 2^d of
  the scored run's distance from the calibration's load (`replay.analysis.band_parts.growth`: the ratio
  of the load to the nearest fitted one); a calibration without held-out
  errors (a kernel profile's step fit) has none;
- transfer (carried calibrations only): the 95th percentile of |error| of the metric over the
  *other* carried cases of this table (leave one case out; the product's constant,
  `replay.analysis.band_parts.TRANSFER_ERROR`, is the same over all of them).

Nothing of a band comes from the run it is scored on. The low end is clipped at 0.

Cells: `err (band -a..+b) in/OUT`: `err` = (point - measured) / measured as in FIDELITY.md;
`-a..+b` the band's ends relative to the point; `in` when low <= measured <= high. `d`: the scored
run's distance from the calibration's load (log2 units, 0 inside). `NOT IDENTIFIED`: parameters the
calibration, or a fit it holds values from, did not identify (why: below).
"""


def parts_line(df: pd.DataFrame) -> str:
    """The median of each part's half width (the wider side), relative to the point."""
    out = []
    for k in ("parameters", "sampling", "model", "transfer"):
        w = np.maximum(df[f"part_{k}_lo"], df[f"part_{k}_hi"]) / df["point"]
        out.append(f"{k} {np.nanmedian(w):.1%}")
    return ", ".join(out)


def score_line(df: pd.DataFrame, before: pd.DataFrame) -> str:
    """The interval score, relative to the measured value: after (this table), before (``before``)."""
    after = interval_score(df["low"], df["high"], df["measured"])
    text = f"median {np.nanmedian(after):.3f}, mean {np.nanmean(after):.3f} over {len(df)} statistics"
    if len(before):
        b = interval_score(before["low"], before["high"], before["measured"])
        text += (f"; before (the bands of the committed table this run replaces): median {np.nanmedian(b):.3f}, "
                 f"mean {np.nanmean(b):.3f} over {len(before)}")
    return text


def write(df: pd.DataFrame, why: dict, out: Path, seconds: float, transfer: dict, before: pd.DataFrame) -> None:
    head = ["case", "scored on", "points", "d", "NOT IDENTIFIED", *map(label, STATS)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (case, run), g in df.groupby(["case", "scored on"], sort=False):
        by = g.set_index("stat")
        lines.append(f"| {case} | {run} | {by['n_points'].iloc[0]} | {by['distance'].iloc[0]:.2f} | "
                     f"{by['not identified'].iloc[0] or '-'} | " + " | ".join(cell(by.loc[s]) for s in STATS) + " |")
    hw = df["half_width"].to_numpy(float)
    carried, same = df[df["carried"]], df[~df["carried"]]
    err = (df["point"] / df["measured"] - 1).abs()
    flat_low = (df["point"] - df["low"]) / df["point"] < ONE_SIDED
    below, above = df["measured"] < df["low"], df["measured"] > df["high"]
    far = df[df["distance"] > 0]
    summary = [
        "", "## Summary", "",
        f"- Coverage: {coverage(df)} measured statistics inside their band "
        f"({df.groupby(['case', 'scored on']).ngroups} scored runs x {len(STATS)} statistics).",
        f"- Calibrations fitted on part of the same deployment (first 15 s -> rest, sync -> sweep, low rates -> "
        f"high): coverage {coverage(same)}{widths(same)}; carried to another model, parallelism or engine, or "
        f"from a kernel profile: {coverage(carried)}{widths(carried)}.",
        f"- Band half width ((high - low) / 2 / point): median {np.nanmedian(hw):.1%}, "
        f"p90 {np.nanpercentile(hw, 90):.1%}, max {np.nanmax(hw):.1%}.",
        f"- Median half width of each part (relative to the point): same deployment {parts_line(same)}; "
        f"carried {parts_line(carried)}.",
        f"- Interval score (alpha {ALPHA}, relative to the measured value; lower is better): {score_line(df, before)}.",
        f"- Runs outside the calibration's load (d > 0): {far.groupby(['case', 'scored on']).ngroups}, coverage "
        f"{coverage(far)}{widths(far)}.",
        "- By statistic: " + ", ".join(f"{label(s)} {coverage(df[df['stat'] == s])}" for s in STATS) + ".",
        f"- |err| median {np.nanmedian(err[~df['inside']]):.1%} where outside, "
        f"{np.nanmedian(err[df['inside']]):.1%} where inside." if (~df["inside"]).any() and df["inside"].any()
        else f"- Outside: {int((~df['inside']).sum())} statistics.",
        f"- One-sided bands: {int(flat_low.sum())} of {len(df)} bands reach less than {ONE_SIDED:.1%} below the "
        f"point; {int(below.sum())} statistics measured below their band, {int(above.sum())} above it.",
        "- Transfer error used for each carried case (from the other carried cases): "
        + "; ".join(f"{c}: " + ", ".join(f"{m.removesuffix('_s')} {v:.0%}" for m, v in t.items())
                    for c, t in transfer.items()) + ".",
        "- Over every carried case (the product's `TRANSFER_ERROR`): "
        + ", ".join(f"{m.removesuffix('_s')} {v:.2f}" for m, v in transfer_of(carried).items()) + ".",
        f"- Calibrations graded poor: {', '.join(sorted(df.loc[df['grade'] == 'poor', 'case'].unique())) or 'none'}.",
        f"- Run time: {seconds / 60:.1f} min (bench/bands.py, every case, one process, on 2 shared cores).",
    ]
    notes = ["", "## Same-deployment calibrations one by one", "",
             "The width a band of a same-deployment calibration needs is what its own held-out parts "
             "(`calibrate.holdout`) say its error is; the last line scales every same-deployment band "
             f"by one factor so that their median half width is {WIDTH_TARGET:.0%} (issue #36's target) and counts "
             "what it would hold.", "",
             "| calibration | statistics | inside | out-of-sample median abs(err) | median half width | "
             "largest held-out abs(err) |", "|---|---|---|---|---|---|"]
    for case, g in same.groupby("case", sort=False):
        e = (g["point"] / g["measured"] - 1).abs()
        notes.append(f"| {case} | {len(g)} | {coverage(g)} | {np.nanmedian(e):.1%} | "
                     f"{np.nanmedian(g['half_width']):.1%} | "
                     + (f"{g['holdout_max'].iloc[0]:.1%} |" if np.isfinite(g["holdout_max"].iloc[0]) else "none |"))
    notes += ["", f"- Every same-deployment band scaled to a {WIDTH_TARGET:.0%} median half width: "
              f"{scaled_coverage(same, WIDTH_TARGET)} inside.", "",
              "## What each calibration did not identify", ""]
    for case, reasons in why.items():
        notes.append(f"- {case}: " + ("; ".join(reasons) if reasons else "every parameter identified") + ".")
    detail = ["", "## Every statistic", "",
              "Milliseconds; half width = (high - low) / 2 / point; parts: the wider side of each, % of the point.",
              "", "| case | scored on | statistic | measured | point | band low | band high | inside | half width | "
              "parameters | sampling | model | transfer |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for _, r in df.iterrows():
        parts = " | ".join(f"{max(r[f'part_{k}_lo'], r[f'part_{k}_hi']) / r['point']:.1%}"
                           for k in ("parameters", "sampling", "model", "transfer"))
        detail.append(f"| {r['case']} | {r['scored on']} | {label(r['stat'])} | {r['measured'] * 1e3:.2f} | "
                      f"{r['point'] * 1e3:.2f} | {r['low'] * 1e3:.2f} | {r['high'] * 1e3:.2f} | "
                      f"{'yes' if r['inside'] else 'no'} | {r['half_width']:.1%} | {parts} |")
    text = "\n".join(lines + summary + notes + detail) + "\n"
    print(text)
    out.write_text(HEADER + "\n" + text)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "real")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "BANDS.md")
    ap.add_argument("--only", default=None, help="Run only cases whose name contains this.")
    ap.add_argument("--csv", type=Path, default=None, help="Also write every statistic's row and parts here.")
    args = ap.parse_args()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        rows, why = [], {}
        for case in cases(imported(args.data, Path(tmp))):
            if case.score and not (args.only and args.only not in case.name):
                case_table, why[case.name] = case_rows(case)
                rows += case_table
    before = committed_bands(args.out)
    df, transfer = add_transfer(pd.DataFrame(rows))
    if args.csv:
        df.to_csv(args.csv, index=False)
    write(df, why, args.out, time.perf_counter() - t0, transfer, before)


if __name__ == "__main__":
    main()
