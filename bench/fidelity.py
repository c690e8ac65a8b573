"""Fidelity on every real run in ../shared/data/real: in-sample and out-of-sample errors.

Each case calibrates on some data (a kernel profile, a run, a benchmark of a sweep, or the
early time window of a run) and scores measured vs predicted p50/p90 TTFT, TPOT and E2E on
data the fit did not see (``out``), and on the data it was fitted on (``in``). Rerun it
whenever the cost model changes; a change that improves one run and worsens another is not
an improvement.

    python bench/fidelity.py [--data ../shared/data/real] [--out bench/FIDELITY.md] [--only NAME]
                             [--add-terms NAME,...]

``--add-terms`` puts optional cost terms on top of the default ones in every case (an
experiment: bench/FIDELITY_cudagraph_padding.md is ``--add-terms cudagraph_padding``).
"""
from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.request_fit import fit_requests
from calibrate.runs import load_runs, score_runs
from calibrate.step_fit import fit_steps
from replay.cost.cost_model import RooflineCostModel
from replay.cost.cost_terms import DEFAULT_TERMS
from replay.config import DisaggOptions, EngineOptions, ReplayConfig, SchedulingOptions
from schemas.cost_params import CostParams
from schemas.specs import get_gpu, get_model
from traces.cli import main as traces_cli
from traces.io import read_trace

ROOT = Path(__file__).resolve().parents[1]
PRO6000 = dict(max_num_seqs=128, max_num_batched_tokens=2048)
CODELLAMA = dict(max_num_seqs=32, max_num_batched_tokens=64, max_model_len=8192, num_gpu_blocks=2790,
                 enable_prefix_caching=True)
#: vLLM v0 (the DistServe paper's baseline, 2024): prefill-priority whole prompts (``fcfs``),
#: its defaults max_num_seqs 256 and max_num_batched_tokens max(max_model_len 2048, 2048); the
#: KV blocks are not recorded, so they come from GPU memory (gpu_memory_utilization 0.9).
VLLM_V0 = dict(max_num_seqs=256, max_num_batched_tokens=2048)
#: DistServe's OPT-13B runs: prefill instance TP 2, decode instance TP 1 (the file names, c21d11).
DISTSERVE = DisaggOptions(tp_prefill=2, tp_decode=1)
#: The vLLM runs' names (requests-rate) and the DistServe runs' rates, PROVENANCE.md.
OPT_VLLM_LOW, OPT_VLLM_HIGH = ("100-1", "150-1.5", "100-2", "200-2"), ("250-2.5", "300-3", "350-3.5", "400-4")
DISTSERVE_RATES = ("3", "4.5", "6", "7.5", "9", "10.5", "12")
#: DistServe's long runs at 12 req/s (1,200 requests; PROVENANCE.md): decode PP 1 and PP 2 (c21d12).
DISTSERVE_LONG = ("c21d11-1200-12", "c21d12-1200-12")
#: What a decode engine other than vLLM's is fitted on (the prefill terms held from vLLM's fit).
DECODE_ENGINE = ("eta_mem", "t_step_s", "t_seq_s")
#: What a run of another parallelism calibrates on top of a TP-1 calibration of the same GPU: the link.
LINK = ("eta_link", "t_allreduce_hop_s", "t_alltoall_s", "t_frontend_s")


def on_top(fit) -> dict:
    """``fit_requests`` options that hold ``fit``'s values but the link's (``calibrate fit --fix-from``)."""
    held = {k: v for k, v in fit.values().items() if k not in LINK and np.isfinite(v)}
    return dict(fixed=held, free=LINK, variants=("blend",))


def imported(data: Path, tmp: Path, only=None) -> dict:
    """The real files as servecal traces (through the CLI's importers): every one, or those named in
    ``only`` (``"sweep.parquet"``, ...)."""
    from click.testing import CliRunner

    jobs = {
        "llama.parquet": ["vllm-request-stats", data / "lss_vllm_rtxpro6000_llama31_8b_requests.jsonl"],
        "qwen32.parquet": ["vllm-request-stats", data / "lss_vllm_rtxpro6000_qwen3_32b_requests.jsonl"],
        "moe.parquet": ["vllm-request-stats", data / "lss_vllm_rtxpro6000_qwen3_30b_a3b_requests.jsonl"],
        "steps.parquet": ["llmservingsim-profile", *sorted(data.glob("lss_profile_rtxpro6000_llama31_8b_*"))],
        "sweep.parquet": ["guidellm", data / "guidellm_results_codellama34b_prefill_sweep.json"],
        "spans.parquet": ["vllm-otlp", data / "vllm_otlp_spans_codellama34b_prefill_sweep.jsonl", "--guidellm",
                          data / "guidellm_results_codellama34b_prefill_sweep.json"],
        **{f"opt_vllm_{n}.parquet": ["distserve", data / f"distserve_opt13b_a100_vllm-{n}.exp"]
           for n in OPT_VLLM_LOW + OPT_VLLM_HIGH},
        **{f"opt_distserve_{r}.parquet": ["distserve", data / f"distserve_opt13b_a100_distserve-c21d11-300-{r}.exp"]
           for r in DISTSERVE_RATES},
        **{f"opt_distserve_{n}.parquet": ["distserve", data / f"distserve_opt13b_a100_distserve-{n}.exp"]
           for n in DISTSERVE_LONG},
    }
    out = {}
    for name, args in jobs.items():
        if only is not None and name not in only:
            continue
        res = CliRunner().invoke(traces_cli, ["import", *map(str, args), "-o", str(tmp / name)])
        if res.exit_code:
            raise SystemExit(f"import of {name} failed: {res.output}")
        out[name] = tmp / name
    return out


#: Optional terms every case adds to the default ones (``--add-terms``).
ADDED_TERMS: tuple = ()


def cost_model(model: str, gpu: str, **kw) -> RooflineCostModel:
    return RooflineCostModel(get_model(model), get_gpu(gpu), CostParams(), terms=DEFAULT_TERMS + ADDED_TERMS, **kw)


def errors(table: pd.DataFrame) -> dict:
    """{"ttft_p50": err, ...} of a compare() table."""
    by = table.set_index("metric")
    return {f"{m}_{q}": float(by.loc[m, f"rel_err_{q}"]) if m in by.index else np.nan
            for m in ("ttft", "tpot", "e2e") for q in ("p50", "p90")}


@dataclass
class Case:
    """One calibration of the table and the runs it is scored on (bench/bands.py uses the same cases).

    Attributes
    ----------
    name, fitted_on : str
        As the table shows them.
    cost_model : RooflineCostModel
        Where the fit starts (its values are held where ``fit_kw`` does not free them), or the
        calibration as is when ``fit_runs`` is None.
    fit_runs : list of Run, optional
        The request runs fitted (``fit_requests``); None: ``cost_model`` is not refitted.
    score : list of Run
        The runs it did not see (``out``).
    fit_kw : dict, optional
        ``fit_requests`` options (:func:`on_top`).
    source : FitResult, optional
        With ``fit_runs`` None, the fit ``cost_model``'s values come from (a kernel profile, a link fit).
    held_from : tuple of FitResult
        Fits whose values the calibration holds (:func:`on_top`'s GPU fit).
    slo : bool
        Also report DistServe's SLO attainment and the saturation knee (:func:`slo_rows`).
    """

    name: str
    fitted_on: str
    cost_model: RooflineCostModel
    fit_runs: list | None
    score: list
    fit_kw: dict | None = None
    source: object = None
    held_from: tuple = ()
    slo: bool = False


def cases(f: dict) -> list[Case]:
    """Every case of the table, on the imported files ``f`` (:func:`imported`)."""
    pro = ReplayConfig(EngineOptions(**PRO6000))
    cl = ReplayConfig(EngineOptions(**CODELLAMA))
    llama = cost_model("llama-3.1-8b", "rtx-pro-6000")
    qwen = cost_model("qwen3-32b", "rtx-pro-6000", tp=2)
    moe = cost_model("qwen3-30b-a3b", "rtx-pro-6000", dp=2, expert_parallel=True)
    code = cost_model("codellama-34b", "h100-80gb")
    _, steps, _ = read_trace(f["steps.parquet"])
    profile = fit_steps(steps, llama)[0][0]
    from_profile = llama.with_params(profile.cost_params())

    def runs(spec, cfg):
        return load_runs([str(spec)], cfg, read_trace)

    # the GPU and host terms of the PRO 6000 from the Llama run (TP 1), the link from the MoE
    # run (expert-parallel all-to-alls over the same PCIe): Qwen3-32B TP 2 never seen
    gpu_fit = fit_requests(runs(f["llama.parquet"], pro), llama, jobs=1)[0]
    link_fit = fit_requests(runs(f["moe.parquet"], pro), moe, jobs=1, **on_top(gpu_fit))[0]

    return [
        Case("llama-8b: kernel profile -> run", "profile (LLMServingSim)", from_profile, None,
             runs(f["llama.parquet"], pro), source=profile),
        Case("llama-8b: first 15 s -> rest", "run@0:15", llama, runs(f"{f['llama.parquet']}@0:15", pro),
             runs(f"{f['llama.parquet']}@15:", pro)),
        Case("qwen3-32b tp2: llama profile -> run", "llama-8b profile", qwen.with_params(profile.cost_params()), None,
             runs(f["qwen32.parquet"], pro), source=profile),
        Case("qwen3-32b tp2: first 15 s -> rest", "run@0:15", qwen, runs(f"{f['qwen32.parquet']}@0:15", pro),
             runs(f"{f['qwen32.parquet']}@15:", pro)),
        Case("qwen3-32b tp2: llama run (GPU) + moe run (link) -> run", "llama + moe runs",
             qwen.with_params(link_fit.cost_params()), None, runs(f["qwen32.parquet"], pro), source=link_fit,
             held_from=(gpu_fit,)),
        Case("qwen3-32b tp2: llama run (GPU) + first 15 s (link) -> rest", "llama run + run@0:15", qwen,
             runs(f"{f['qwen32.parquet']}@0:15", pro), runs(f"{f['qwen32.parquet']}@15:", pro), on_top(gpu_fit),
             held_from=(gpu_fit,)),
        Case("qwen3-30b-a3b dp2+ep: own log", "run", moe, runs(f["moe.parquet"], pro), []),
        Case("qwen3-30b-a3b dp2+ep: first 15 s -> rest", "run@0:15", moe, runs(f"{f['moe.parquet']}@0:15", pro),
             runs(f"{f['moe.parquet']}@15:", pro)),
        Case("codellama-34b: sync (GuideLLM) -> sweep", "sweep#0", code, runs(f"{f['sweep.parquet']}#0", cl),
             [r for k in (1, 2, 3, 4) for r in runs(f"{f['sweep.parquet']}#{k}", cl)]),
        Case("codellama-34b: sync (vLLM OTLP) -> sweep", "spans#0", code, runs(f"{f['spans.parquet']}#0", cl),
             [r for k in (1, 2, 3, 4) for r in runs(f"{f['spans.parquet']}#{k}", cl)]),
        *opt_cases(f, runs),
    ]


def opt_cases(f: dict, runs) -> list[Case]:
    """OPT-13B on A100-80GB (DistServe's alignment runs, issue #19): vLLM v0 calibrated at <= 2
    req/s, scored at the knee (2.5 to 4 req/s); DistServe's disaggregated runs predicted from
    that calibration (another engine: only the hardware terms transfer), and with the decode
    engine's terms fitted on one of its runs: the lowest rate (3 req/s), and the sweep's median
    rate (7.5 req/s). At 3 req/s the decode batches hold few contexts, so the KV-read slope
    (``eta_mem``) trades against the per-step constant and extrapolates badly to the loaded
    runs; the median run puts the what-ifs on both sides of the fit (issue #19)."""
    opt = cost_model("opt-13b", "a100-80gb")
    v0 = ReplayConfig(EngineOptions(**VLLM_V0), SchedulingOptions("fcfs"))
    ds = ReplayConfig(EngineOptions(**VLLM_V0)).with_scheduler("disagg", DISTSERVE)
    low = [r for n in OPT_VLLM_LOW for r in runs(f[f"opt_vllm_{n}.parquet"], v0)]
    high = [r for n in OPT_VLLM_HIGH for r in runs(f[f"opt_vllm_{n}.parquet"], v0)]
    distserve = {r: runs(f[f"opt_distserve_{r}.parquet"], ds) for r in DISTSERVE_RATES}
    ds_pp2 = ReplayConfig(EngineOptions(**VLLM_V0)).with_scheduler("disagg", replace(DISTSERVE, pp_decode=2))
    long = [r for n in DISTSERVE_LONG for r in runs(f[f"opt_distserve_{n}.parquet"], ds_pp2 if "c21d12" in n else ds)]
    vllm_fit = fit_requests(low, opt, jobs=1)[0]
    held = {k: v for k, v in vllm_fit.values().items() if k not in DECODE_ENGINE and np.isfinite(v)}
    return [
        Case("opt-13b vllm a100: <= 2 req/s -> 2.5 to 4 req/s", "vllm 1-2 req/s", opt, low, high, slo=True),
        Case("opt-13b distserve c21d11: vllm <= 2 req/s -> runs", "vllm 1-2 req/s",
             opt.with_params(vllm_fit.cost_params()), None, [r for rs in distserve.values() for r in rs] + long,
             source=vllm_fit, slo=True),
        Case("opt-13b distserve c21d11: vllm (prefill) + 3 req/s run (decode) -> rest", "vllm + distserve 3 req/s",
             opt.with_params(vllm_fit.cost_params()), distserve["3"],
             [r for k, rs in distserve.items() if k != "3" for r in rs] + long,
             dict(fixed=held, free=DECODE_ENGINE, variants=("blend",)), held_from=(vllm_fit,), slo=True),
        Case("opt-13b distserve c21d11: vllm (prefill) + 7.5 req/s run (decode) -> rest", "vllm + distserve 7.5 req/s",
             opt.with_params(vllm_fit.cost_params()), distserve["7.5"],
             [r for k, rs in distserve.items() if k != "7.5" for r in rs] + long,
             dict(fixed=held, free=DECODE_ENGINE, variants=("blend",)), held_from=(vllm_fit,), slo=True),
    ]


def calibrated(case: Case) -> tuple:
    """The case's calibration: ``(cost model at its values, variant, FitResult)``; the fit is the
    request fit of ``fit_runs``, else ``case.source``."""
    if case.fit_runs:
        fit = fit_requests(case.fit_runs, case.cost_model, jobs=1, **(case.fit_kw or {}))[0]
        return case.cost_model.with_params(fit.cost_params()), fit.variant, fit
    return case.cost_model, case.cost_model.params.form, case.source


def case_rows(case: Case) -> tuple[list[dict], list[dict]]:
    """Fit (request runs, with ``fit_requests`` options ``fit_kw``) or take the cost model as is;
    score in and out of sample; the SLO rows of a ``slo`` case."""
    t0 = time.perf_counter()
    fit_cm, variant, _ = calibrated(case)
    rows = []
    for sample, runs in (("in", case.fit_runs or []), ("out", case.score)):
        if not runs:
            continue
        table = score_runs(runs, fit_cm)
        for run, g in table.groupby("run", sort=False):
            rows.append({"case": case.name, "fitted on": case.fitted_on, "sample": sample, "scored on": run,
                         "variant": variant, **errors(g)})
    print(f"{case.name}: {time.perf_counter() - t0:.1f} s", flush=True)
    return rows, slo_rows(case, fit_cm) if case.slo else []


#: DistServe's SLO (its align_with_real.py): TTFT < 200 ms and TPOT < 100 ms, strictly.
SLO_TTFT_S, SLO_TPOT_S = 0.2, 0.1
#: The knee: the rate at which TTFT p90 crosses this (issue #19).
KNEE_TTFT_P90_S = 2.0


def attainment(ttft_s, tpot_s) -> float:
    """Share of requests with TTFT < 200 ms and TPOT < 100 ms (a one-token request has no
    TPOT, NaN here, 0 in DistServe's files: it meets that objective)."""
    ttft, tpot = np.asarray(ttft_s, float), np.asarray(tpot_s, float)
    return float(np.mean((ttft < SLO_TTFT_S) & (np.isnan(tpot) | (tpot < SLO_TPOT_S))))


def slo_rows(case: Case, fit_cm) -> list[dict]:
    """Per run of ``case`` (in and out): its rate, measured and predicted SLO attainment and TTFT p90."""
    from dataclasses import replace as dc_replace

    from replay.config import RecordOptions
    from replay.simulate import replay_frame
    from schemas.status import OK

    rows = []
    for sample, runs in (("in", case.fit_runs or []), ("out", case.score)):
        for run in runs:
            res, _ = replay_frame(run.trace, fit_cm, dc_replace(run.config, record=RecordOptions()), run.metadata)
            ok = res["pred_status"] == OK
            rows.append({"case": case.name, "sample": sample, "scored on": Path(run.name).stem,
                         "long": any(n in run.name for n in DISTSERVE_LONG),
                         "rate_rps": float(run.metadata.get("request_rate", np.nan)),
                         "meas_attain": attainment(res["ttft_s"], res["tpot_s"]),
                         "pred_attain": attainment(res["pred_ttft_s"].where(ok, np.inf), res["pred_tpot_s"]),
                         "meas_ttft_p90_s": float(np.percentile(res["ttft_s"], 90)),
                         "pred_ttft_p90_s": float(np.percentile(res.loc[ok, "pred_ttft_s"], 90))})
    return rows


def knee_rps(rates, ttft_p90_s) -> float:
    """The rate where TTFT p90 first crosses :data:`KNEE_TTFT_P90_S`, by linear interpolation
    between the runs' rates (NaN when it never does). Runs of one sweep: a rate given twice
    (two runs at 2 req/s) takes their mean TTFT p90."""
    by_rate = pd.Series(list(ttft_p90_s), index=list(rates), dtype=float).groupby(level=0).mean()
    pts = list(by_rate.items())
    for (r0, t0), (r1, t1) in zip(pts, pts[1:]):
        if t0 < KNEE_TTFT_P90_S <= t1:
            return r0 + (r1 - r0) * (KNEE_TTFT_P90_S - t0) / (t1 - t0)
    return float("nan")


def knee_text(name: str, sweep: pd.DataFrame) -> str:
    """The knee of case ``name`` over the runs of its rate sweep (the long runs, all at one rate, left out)."""
    meas, pred = knee_rps(sweep["rate_rps"], sweep["meas_ttft_p90_s"]), knee_rps(sweep["rate_rps"], sweep["pred_ttft_p90_s"])
    if np.isfinite(meas) and np.isfinite(pred):
        return (f"{name}: the knee (TTFT p90 crosses {KNEE_TTFT_P90_S:g} s, linear between the runs' rates) at "
                f"{meas:.2f} req/s measured, {pred:.2f} predicted ({(pred - meas) / meas:+.1%}).")
    top = sweep["rate_rps"].max()
    say = {True: "crosses it at {:.2f} req/s", False: f"stays under it up to {top:g} req/s"}
    return (f"{name}: TTFT p90 against {KNEE_TTFT_P90_S:g} s over the sweep's runs: measured "
            f"{say[bool(np.isfinite(meas))].format(meas)}, predicted {say[bool(np.isfinite(pred))].format(pred)}.")


def slo_text(slo: pd.DataFrame) -> str:
    """The SLO attainment table and the knee, in Markdown."""
    if slo.empty:
        return ""
    lines = ["\n## SLO attainment and the knee (OPT-13B, A100-80GB)\n",
             f"Attainment: share of requests with TTFT < {SLO_TTFT_S * 1e3:g} ms and TPOT < {SLO_TPOT_S * 1e3:g} ms "
             "(DistServe's definition); points = predicted - measured.\n",
             "| case | sample | run | rate (req/s) | attainment meas | pred | points | TTFT p90 meas (ms) | pred (ms) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in slo.to_dict("records"):
        lines.append(f"| {r['case']} | {r['sample']} | {r['scored on']} | {r['rate_rps']:g} | {r['meas_attain']:.1%} | "
                     f"{r['pred_attain']:.1%} | {(r['pred_attain'] - r['meas_attain']) * 100:+.1f} | "
                     f"{r['meas_ttft_p90_s'] * 1e3:.0f} | {r['pred_ttft_p90_s'] * 1e3:.0f} |")
    for name, g in slo.groupby("case", sort=False):
        lines.append("\n" + knee_text(name, g[~g["long"]]))
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "real")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "FIDELITY.md")
    ap.add_argument("--only", default=None, help="Run only cases whose name contains this.")
    ap.add_argument("--add-terms", default="", help="Optional cost terms added to the default ones, comma-separated.")
    args = ap.parse_args()
    global ADDED_TERMS
    ADDED_TERMS = tuple(n for n in args.add_terms.split(",") if n)
    with tempfile.TemporaryDirectory() as tmp:
        rows, slo = [], []
        for case in cases(imported(args.data, Path(tmp))):
            if args.only and args.only not in case.name:
                continue
            r, s = case_rows(case)
            rows, slo = rows + r, slo + s
    write(pd.DataFrame(rows), args.out, pd.DataFrame(slo))


#: Errors other simulators publish on the same runs, for the side-by-side (sources inline).
PUBLISHED = """
Published by others on the same runs, (sim - vLLM) / vLLM, p50 / p90:

| simulator | run | ttft | tpot | e2e | source |
|---|---|---|---|---|---|
| LLMServingSim | Llama-3.1-8B, RTX PRO 6000 | -8.6 / -4.4 % | -0.0 / +0.5 % | -1.2 / -1.8 % | casys-kaist/LLMServingSim@5daddb21, bench/examples/RTXPRO6000/Llama-3.1-8B/validation/summary.txt |
| LLMServingSim | Qwen3-32B TP2 | +1.7 / +0.9 % | +0.8 / +0.9 % | +0.9 / +0.8 % | same commit, bench/examples/RTXPRO6000/Qwen3-32B/validation/summary.txt |
| LLMServingSim | Qwen3-30B-A3B DP2+EP | -21.8 / -10.9 % | -1.6 / -0.8 % | -2.0 / -1.8 % | same commit, bench/examples/RTXPRO6000/Qwen3-30B-A3B-Instruct-2507/validation/summary.txt |
| BLIS (inference-sim) | CodeLlama-34B sweep | not published | | | its headline 6.7 % E2E / 17.6 % TTFT median over 36 other held-out runs (docs/blog/posts/how-blis-learns-latency.md) |

LLMServingSim simulates from a kernel profile of the same GPU and model: in-sample to that profile.
"""


def write(table: pd.DataFrame, out: Path, slo: pd.DataFrame) -> None:
    cols = [c for c in table.columns if c.endswith(("_p50", "_p90"))]
    lines = ["| case | sample | scored on | variant | " + " | ".join(c.replace("_", " ") for c in cols) + " |",
             "|---|---|---|---|" + "---|" * len(cols)]
    for _, r in table.iterrows():
        cells = [f"{r[c]:+.1%}" if np.isfinite(r[c]) else "n/a" for c in cols]
        lines.append(f"| {r['case']} | {r['sample']} | {Path(str(r['scored on'])).name} | {r['variant']} | "
                     + " | ".join(cells) + " |")
    out_rows = table[table["sample"] == "out"][cols].abs().to_numpy()
    summary = (f"\nOut of sample: median |error| {np.nanmedian(out_rows):.1%}, p90 {np.nanpercentile(out_rows, 90):.1%}, "
               f"worst {np.nanmax(out_rows):.1%} over {len(out_rows)} scored runs x {len(cols)} statistics.\n")
    text = "\n".join(lines) + "\n" + summary + slo_text(slo) + PUBLISHED
    print(text)
    out.write_text("# Fidelity on the real runs (bench/fidelity.py)\n\n"
                   "Errors are (predicted - measured) / measured of each percentile. `in`: scored on the data the "
                   "calibration was fitted on; `out`: on data it did not see.\n\n" + text)


if __name__ == "__main__":
    main()
