"""gpt-oss-120b on InferenceMAX's grid: calibrate on one TP and one shape of one GPU, predict the rest.

Issue #35: InferenceMAX's nightly points (``../shared/data/real/inferencemax/``, PROVENANCE.md) of
gpt-oss-120b (MXFP4, vLLM 0.11.2) on H100, H200 and B200 over TP 1-8, three input/output shapes
(1k/1k, 1k/8k, 8k/1k) and closed-loop concurrency 4-128. The calibration is fitted on ONE
deployment and shape (``--fit``, default H100, TP 2, 1k/1k, its five concurrencies) and every other point is
predicted: the same GPU at the other TPs and shapes, then H200 and B200 from their datasheets with
the H100 calibration's efficiencies (an extrapolation across GPUs). Each point is replayed as the
fit replays a level (:mod:`calibrate.aggregate_runs`: lengths uniform in [0.8 L, L], conc x 10
requests) and its reported mean TTFT, TPOT and E2E set beside the replay's
(:func:`calibrate.aggregate_score.score_aggregates`).

Each GPU runs with the settings of its own InferenceMAX launch script for gpt-oss on vLLM
(:data:`SCRIPTS`; every script: ``--max-num-batched-tokens 8192 --no-enable-prefix-caching
--gpu-memory-utilization 0.9``; H200's and B200's also async scheduling, which the replay does not
model). H100 (``gptoss_fp4_h100.sh``) and H200
(``gptoss_fp4_h200_slurm.sh``): ``--max-num-seqs $CONC``, ``VLLM_MXFP4_USE_MARLIN=1`` (the MXFP4
experts run W4A16: BF16 GEMMs), the KV cache in BF16. B200 (``gptoss_fp4_b200_docker.sh``):
``--max-num-seqs 512``, ``kv-cache-dtype: fp8`` and ``VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1`` (the
experts multiply MXFP4 weights by MXFP8 activations: the FP8 tensor-core peak); its all-reduce +
RMSNorm fusion (``compilation-config``) is not modelled.

The other TPs: a GEMM's knee is per GPU (:class:`replay.cost.cost_terms.DenseCompute`: the step's
``n_half`` is ``tp x`` the fitted per-GPU one), so a decode step too small to fill the GPUs is not
``tp`` times faster on ``tp`` GPUs. With the knee fixed in tokens instead, the same fit predicted
the TPOT of TP 8 at 4 clients 18 % fast (the measured TPOT falls 1.4x from TP 2 to 8, the old
model's 1.8x). Vidur's H100 profile of Llama-2-7B's linear layers (``vidur_mlp_h100_llama2_7b.csv``)
puts the knee at ``n_half tp^0.91``. Of the gain on H100 out of sample (mean TTFT / TPOT / E2E
median 11.8 / 8.2 / 7.8 % before), the knee alone gives 10.6 / 5.4 / 4.9 % with the earlier fit's
values; the rest is the fit's optimum: it now starts its knee both per GPU and per step
(:func:`calibrate.fitting.knee_starts`), and the better one in sample is new (mean TTFT 1.8 %
median in sample, was 9.2 %). The prefill's
time per extra prompt token still falls less with TP than the model says at 8k prompts (TP 8
8k/1k -20..-26 %); the all-reduce's bandwidth does not explain it: Vidur's NCCL profile of an
H100 DGX (``vidur_allreduce_h100_dgx.csv``) gives 0.65-0.83 of NVLink 4 per byte plus 19-43 us a
call, about 2 us a token at TP 8 of the ~4-5 us missing, so ``eta_link`` stays at 1 (one TP
cannot identify it).

    python bench/inferencemax.py [--data ../shared/data/real] [--out bench/INFERENCEMAX.md]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd

from calibrate.aggregate_runs import fit_runs
from calibrate.aggregate_score import score_aggregates
from calibrate.runs import load_runs
from calibrate.summary import to_calibration
from replay.analysis.band_basis import BandBasis, carried_across
from replay.analysis.bands import BandJob, predict_with_band
from replay.config import EngineOptions, ReplayConfig
from replay.cost.cost_model import RooflineCostModel
from replay.cost.cost_terms import DEFAULT_TERMS
from schemas.cost_params import CostParams
from schemas.kinds import AGGREGATE_TARGETS
from schemas.specs import get_gpu, get_model
from traces.errors import TraceFormatError
from traces.importers.inferencemax import import_inferencemax
from traces.io import read_trace, write_trace

ROOT = Path(__file__).resolve().parents[1]
RUN = "inferencemax/inferencemax_run_20218553330_agg_bmk.json"
MODEL = "gpt-oss-120b"
#: InferenceMAX's vLLM flags for gpt-oss common to every GPU's script.
ENGINE = dict(max_num_batched_tokens=8192, max_model_len=10240, enable_prefix_caching=False,
              gpu_memory_utilization=0.9)
#: Each GPU's launch script (InferenceMAX/InferenceMAX, ``benchmarks/gptoss_fp4_<gpu>*.sh``): vLLM's
#: ``--max-num-seqs`` (H100, H200: ``$CONC``, the same as 128 for a closed loop of at most 128
#: clients), ``--kv-cache-dtype`` and the precision the MoE experts' GEMMs multiply in (Marlin
#: W4A16 -> ``bf16``; FlashInfer MXFP4 x MXFP8 -> ``fp8``). The same settings on the command
#: line: ``--max-num-seqs``, and ``kv_cache_dtype`` / ``expert_gemm_precision`` in ``--model-config``.
SCRIPTS = {
    "h100": dict(max_num_seqs=128, kv_cache_dtype="auto", expert_gemm_precision="bf16"),  # gptoss_fp4_h100.sh
    "h200": dict(max_num_seqs=128, kv_cache_dtype="auto", expert_gemm_precision="bf16"),  # gptoss_fp4_h200_slurm.sh
    "b200": dict(max_num_seqs=512, kv_cache_dtype="fp8", expert_gemm_precision="fp8"),    # gptoss_fp4_b200_docker.sh
}
GPUS = {"h100": "h100-80gb", "h200": "h200", "b200": "b200"}
SHAPES = ((1024, 1024), (1024, 8192), (8192, 1024))
#: The plan's question of issue #35: the fewest GPUs meeting this mean TPOT at this concurrency.
PLAN_TPOT_MS, PLAN_CONC = 20.0, 64


def point_files(data: Path, tmp: Path) -> dict:
    """``(hw, tp, shape) -> (aggregate file, its levels' concurrency)`` of every deployment and shape
    the run holds (vLLM points)."""
    files = {}
    for hw in GPUS:
        for tp in (1, 2, 4, 8):
            for isl, osl in SHAPES:
                try:
                    frame, meta = import_inferencemax(data / RUN, {"hw": (hw,), "tp": (tp,), "isl": (isl,),
                                                                   "osl": (osl,), "framework": ("vllm",)})
                except TraceFormatError:  # a deployment the run does not hold
                    continue
                path = tmp / f"{hw}_tp{tp}_{isl}_{osl}.parquet"
                write_trace(frame, AGGREGATE_TARGETS, path, metadata=meta)
                concurrency = frame.groupby("level")["level_value"].first().astype(int).tolist()
                files[hw, tp, (isl, osl)] = (path, concurrency)
    return files


def median_band(cal, cm: RooflineCostModel, run) -> dict:
    """Whether the reported median TTFT, TPOT and E2E of ``run`` (a level) fall inside the 95 % band
    ``replay`` would print for it (:func:`replay.analysis.bands.predict_with_band`: the calibration's
    band points, its held-out model error, the transfer error when carried to another GPU or TP, and
    the sampling noise of a new run's median), and each band's half width relative to its point."""
    basis = BandBasis.of(cal, carried_across(cal, cm), new_sample=True)
    band = predict_with_band(BandJob(run.trace, run.metadata, cm, run.config, cal.band_points, basis))
    out = {}
    for m in ("ttft", "tpot", "e2e"):
        pcts, values = run.reported[f"{m}_s"]
        median = float(values[pcts == 50][0]) if (pcts == 50).any() else float("nan")
        stat = f"{m}_p50_s"
        out[f"{m}_inside"] = band.holds(stat, median) if median == median else None
        out[f"{m}_half_width"] = band.half_width(stat)
    return out


def engine_config(hw: str) -> ReplayConfig:
    """The replay's engine settings on GPU ``hw``: :data:`ENGINE` and its script's ``max_num_seqs``."""
    return ReplayConfig(EngineOptions(**ENGINE, max_num_seqs=SCRIPTS[hw]["max_num_seqs"]))


def cost_model(hw: str, tp: int, params: CostParams | None = None) -> RooflineCostModel:
    """gpt-oss-120b on ``tp`` GPUs ``hw`` as its launch script runs it (:data:`SCRIPTS`: the KV
    cache's dtype, the experts' GEMM precision), with ``params`` (default: the declared defaults)."""
    script = SCRIPTS[hw]
    model = replace(get_model(MODEL).with_kv_cache_dtype(script["kv_cache_dtype"]),
                    expert_gemm_precision=script["expert_gemm_precision"])
    return RooflineCostModel(model, get_gpu(GPUS[hw]), params or CostParams(), tp=tp, terms=DEFAULT_TERMS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "real")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "INFERENCEMAX.md")
    ap.add_argument("--fit", default="h100,2,1024,1024",
                    help="GPU,TP,ISL,OSL of the one deployment and shape the calibration sees")
    args = ap.parse_args()
    hw, tp, isl, osl = args.fit.split(",")
    fit_at = (hw, int(tp), (int(isl), int(osl)))

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        files = point_files(args.data, Path(tmp))
        hw, tp, shape = fit_at
        fit_on = load_runs([str(files[fit_at][0])], engine_config(hw), read_trace)
        fit = fit_runs(fit_on, cost_model(hw, tp), jobs=2)[0]
        params = fit.cost_params()
        cal = to_calibration(fit, cost_model(hw, tp, params), "request", {"format": "inferencemax-summary"})
        print(f"fitted on {hw} TP{tp} {shape[0]}/{shape[1]}: {time.perf_counter() - t0:.0f} s", flush=True)
        rows = []
        for (hw, tp, shape), (path, concurrency) in sorted(files.items()):
            runs = load_runs([str(path)], engine_config(hw), read_trace)
            cm = cost_model(hw, tp, params)
            scored = score_aggregates(runs, cm)
            table = scored[scored["statistic"] == "mean"]
            ttft = scored[scored["metric"] == "ttft"].set_index(["run", "statistic"])["rel_err"]
            for conc, run, (name, g) in zip(concurrency, runs, table.groupby("run", sort=False)):
                err = dict(zip(g["metric"], g["rel_err"]))
                meas = dict(zip(g["metric"], g["meas_s"]))
                pred = dict(zip(g["metric"], g["pred_s"]))
                rows.append({"gpu": hw, "tp": tp, "shape": f"{shape[0]}/{shape[1]}", "level": conc,
                             "sample": "in" if (hw, tp, shape) == fit_at else "out",
                             **{f"{m}_meas_ms": meas[m] * 1e3 for m in meas},
                             **{f"{m}_pred_ms": pred[m] * 1e3 for m in pred},
                             **{f"{m}_err": err[m] for m in err},
                             **{f"ttft_{q}_err": ttft.get((name, q), float("nan")) for q in ("p50", "p99")},
                             **median_band(cal, cm, run)})
            print(f"{hw} TP{tp} {shape}: {time.perf_counter() - t0:.0f} s", flush=True)
    write(pd.DataFrame(rows), fit, fit_at, args.out, time.perf_counter() - t0)


def group(row, fit_at: tuple) -> str:
    """The row's group in the summary: in sample, the fitted GPU and TP, its other TPs, another GPU."""
    hw, tp, shape = fit_at
    if row["sample"] == "in":
        return f"in sample ({hw.upper()} TP {tp}, {shape[0]}/{shape[1]})"
    if row["gpu"] != hw:
        return f"{row['gpu'].upper()} (carried from {hw.upper()})"
    if row["tp"] == tp:
        return f"{hw.upper()} TP {tp}, other shapes"
    same = row["shape"] == f"{shape[0]}/{shape[1]}"
    return f"{hw.upper()} other TP, " + (f"{shape[0]}/{shape[1]}" if same else "other shapes")


def write(table: pd.DataFrame, fit, fit_at: tuple, out: Path, seconds: float) -> None:
    table["group"] = table.apply(group, axis=1, fit_at=fit_at)
    lines = [f"# {MODEL} on InferenceMAX's grid (bench/inferencemax.py)", "",
             (__doc__ or "").split("\n\n", 1)[1].split("\n\n    python")[0], "",
             "Fitted values: " + ", ".join(f"{k}={v:.4g}" for k, v in fit.values().items()), "",
             "## Mean TTFT, TPOT and E2E: median and worst |error| per group", "",
             "| group | points | TTFT median | TTFT worst | TPOT median | TPOT worst | E2E median | E2E worst "
             "| medians in band | band half width (median) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    hw = fit_at[0]
    groups = list(table.groupby("group", sort=False)) + [
        (f"every {hw.upper()} point out of sample", table[(table["gpu"] == hw) & (table["sample"] == "out")])]
    for name, g in groups:
        cells = []
        for m in ("ttft", "tpot", "e2e"):
            e = g[f"{m}_err"].abs()
            cells += [f"{e.median():.1%}", f"{e.max():.1%}"]
        inside = pd.concat([g[f"{m}_inside"] for m in ("ttft", "tpot", "e2e")]).dropna().astype(bool)
        width = pd.concat([g[f"{m}_half_width"] for m in ("ttft", "tpot", "e2e")])
        cells += [f"{int(inside.sum())}/{len(inside)} ({inside.mean():.0%})", f"{width.median():.1%}"]
        lines.append(f"| {name} | {len(g)} | " + " | ".join(cells) + " |")
    lines += ["", "Errors are of the mean (InferenceMAX's headline statistic); the band columns check the reported "
              "median of TTFT, TPOT and E2E against the 95 % band `replay` prints for its p50 (parameters, held-out "
              "model error, transfer error where the GPU or TP is not the fitted one, sampling noise of a new "
              "run's median), computed from the calibration alone."]
    lines += ["", "## TTFT's median and p99, signed: the first requests of a closed loop", "",
              "At concurrency C every client sends at once, so the level's first C prompts queue behind each "
              "other: its p99 TTFT is about the time to prefill all of them, the prefill's throughput in full "
              "token-budget steps, and at C >= 32 that first wave is much of the mean. Its median is one prompt "
              "among running decodes, the prefill's latency. Median signed error per group (+: predicted "
              "slower):", "", "| group | points | TTFT mean | TTFT p50 | TTFT p99 |", "|---|---|---|---|---|"]
    for name, g in groups:
        lines.append(f"| {name} | {len(g)} | " + " | ".join(
            f"{g[c].median():+.1%}" for c in ("ttft_err", "ttft_p50_err", "ttft_p99_err")) + " |")
    lines += ["", f"## The plan's question: the fewest GPUs meeting mean TPOT <= {PLAN_TPOT_MS:g} ms at concurrency "
              f"{PLAN_CONC}", "", "Per GPU and shape, the smallest TP whose point at that concurrency meets it, "
              "measured and predicted (- where no TP of the grid does, or the grid has no such point).", "",
              "| gpu | shape | measured | predicted | TPs in the grid |", "|---|---|---|---|---|"]
    at = table[table["level"] == PLAN_CONC]
    for (gpu, shape), g in at.groupby(["gpu", "shape"], sort=True):
        g = g.sort_values("tp")
        meas = next((int(t) for t, v in zip(g["tp"], g["tpot_meas_ms"]) if v <= PLAN_TPOT_MS), None)
        pred = next((int(t) for t, v in zip(g["tp"], g["tpot_pred_ms"]) if v <= PLAN_TPOT_MS), None)
        lines.append(f"| {gpu} | {shape} | {meas or '-'} | {pred or '-'} | "
                     f"{', '.join(str(int(t)) for t in g['tp'])} |")
    lines += ["", "## Every point", "", "| gpu | tp | shape | level | sample | TTFT meas ms | pred | err | "
              "TPOT meas ms | pred | err | E2E meas ms | pred | err |", "|" + "---|" * 14]
    for _, r in table.iterrows():
        lines.append(f"| {r['gpu']} | {r['tp']} | {r['shape']} | {r['level']} | {r['sample']} | " + " | ".join(
            f"{r[f'{m}_meas_ms']:.1f} | {r[f'{m}_pred_ms']:.1f} | {r[f'{m}_err']:+.1%}"
            for m in ("ttft", "tpot", "e2e")) + " |")
    lines += ["", f"Run time: {seconds / 60:.1f} min (one process, 2 cores)."]
    out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
