"""``servecal demo``: the whole loop on a synthetic (labelled) step log and workload.

A known "true" roofline of Llama-3.1-8B on one H100 (with CPU overhead and noise the
roofline does not model) plays the cluster; its step log is fitted; the fitted model
replays the workload; the table shows how far the prediction is from the "measurement".
"""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import click
import numpy as np

from replay.analysis.compare import compare, format_table
from replay.text import wrap
from replay.cost.cost_model import RooflineCostModel, cost_model_from_calibration
from replay.config import EngineOptions, RecordOptions, ReplayConfig, SchedulingOptions
from replay.core.result_columns import steps_frame
from replay.simulate import replay_frame
from schemas.atomic import check_writable
from schemas.calibration import sha256_of
from schemas.cost_params import FittedParam
from schemas.cost_params import CostParams
from schemas.errors import OutputError
from schemas.specs import get_gpu, get_model
from schemas.tables import REPLAY_RESULT, REQUEST_TRACE, STEP_TRACE
from traces.io import write_trace
from traces.synth import synth_requests

from .summary import param_cells, to_calibration
from .step_fit import fit_steps, set_ci95

#: The synthetic cluster's true parameters (what calibration should recover).
TRUTH = CostParams(eta_compute=0.55, n_half_tokens=64.0, eta_mem=0.80, overlap=0.0, t_step_s=4e-4, t_seq_s=2e-5)


@click.command()
@click.option("--out-dir", type=click.Path(file_okay=False), default="servecal-demo", show_default=True,
              help="Folder for the demo's trace, step log, calibration and replay.")
@click.option("--requests", "num_requests", type=click.IntRange(min=10), default=2000, show_default=True)
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=8.0, show_default=True,
              help="Arrival rate, requests/s.")
@click.option("--noise", type=click.FloatRange(min=0), default=0.03, show_default=True,
              help="Lognormal sigma of the step-time noise of the synthetic cluster.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
def demo(out_dir, num_requests, rate, noise, seed):
    """Run import -> fit -> replay -> compare on a SYNTHETIC cluster and workload.

    \b
    Example:
      servecal demo --out-dir /tmp/demo
    """
    out = _output_folder(out_dir)
    rng = np.random.default_rng(seed)
    model, gpu = get_model("llama-3.1-8b"), get_gpu("h100-80gb")
    click.echo(wrap(f"SYNTHETIC DEMO: {model.name} on 1 x {gpu.name}; the 'cluster' is a roofline with "
               f"eta_compute={TRUTH.eta_compute}, n_half_tokens={TRUTH.n_half_tokens:g}, eta_mem={TRUTH.eta_mem}, "
               f"t_step_s={TRUTH.t_step_s}, t_seq_s={TRUTH.t_seq_s} "
               f"and {noise:.0%} lognormal step noise; nothing here was measured on hardware."))
    trace = synth_requests(num_requests, rate, "lognormal:mean=1024,sigma=0.8", "lognormal:mean=256,sigma=0.7",
                           seed=seed)
    cfg = ReplayConfig(EngineOptions(max_num_seqs=128, max_num_batched_tokens=2048), SchedulingOptions("chunked"),
                       record=RecordOptions(steps=True))
    eng = cfg.engine

    truth = NoisyCostModel(RooflineCostModel(model, gpu, TRUTH), noise, rng)
    measured, engine = replay_frame(trace, truth, cfg)
    trace = trace.assign(queue_wait_s=measured["pred_queue_wait_s"], ttft_s=measured["pred_ttft_s"],
                         tpot_s=measured["pred_tpot_s"], e2e_s=measured["pred_e2e_s"])
    steps = steps_frame(engine)
    # what the synthetic run ran on, as an importer records it: a replay at another TP is then a what-if
    write_trace(trace, REQUEST_TRACE, out / "requests.parquet",
                {"source": "servecal demo (synthetic)", "model": model.name, "tp": "1"})
    write_trace(steps, STEP_TRACE, out / "steps.parquet", {"source": "servecal demo (synthetic)"})
    click.echo(wrap(f"1. synthetic 'measured' run: {len(trace)} requests, {len(steps)} steps -> "
                    f"{out}/requests.parquet, {out}/steps.parquet"))

    fits, _ = fit_steps(steps, RooflineCostModel(model, gpu))
    best = fits[0]
    set_ci95(best, "stderr")  # the intervals and the band points, as calibrate fit stores them
    cal = to_calibration(best, RooflineCostModel(model, gpu), "lmfit least_squares of step durations",
                         {"path": str(out / "steps.parquet"), "sha256": sha256_of(out / "steps.parquet"),
                          "kind": STEP_TRACE}, engine={"max_num_seqs": eng.max_num_seqs,
                                                       "max_num_batched_tokens": eng.max_num_batched_tokens},
                         variants=fits)
    cal.write(out / "calibration.json")
    click.echo(wrap(f"2. calibrate fit (variant {best.variant}, R^2={best.stats['r2']:.4f}) -> {out}/calibration.json"))
    click.echo(f"     {'parameter':22s} {'true':>9s} {'fitted':>10s} {'95 % interval':>20s}")
    for name, p in best.params.items():
        if p.vary:
            v, ci, state = param_cells(name, p)
            true = param_cells(name, FittedParam(TRUTH[name]))[0]
            click.echo(f"     {name:22s} {true:>9s} {v:>10s} {ci:>20s}  {state}"[:100])

    pred, _ = replay_frame(trace, cost_model_from_calibration(cal), replace(cfg, record=RecordOptions()))
    write_trace(pred, REPLAY_RESULT, out / "replay.parquet", {"source": "servecal demo (synthetic)"})
    click.echo(wrap(f"3. replay with the calibration (scheduler {cfg.scheduling.scheduler}, "
                    f"--max-num-seqs {eng.max_num_seqs} --max-num-batched-tokens {eng.max_num_batched_tokens}) "
                    f"-> {out}/replay.parquet") + "\n")
    click.echo(format_table(compare(pred)))
    _what_if(trace, truth, cal, replace(cfg, record=RecordOptions()))


#: The files the demo writes into its ``--out-dir``.
DEMO_OUTPUTS = ("requests.parquet", "steps.parquet", "calibration.json", "replay.parquet")


def _output_folder(out_dir: str) -> Path:
    """``--out-dir``, made if new, once every file the demo writes there (:data:`DEMO_OUTPUTS`)
    is known to be writable: a regular file or a new name (:func:`schemas.atomic.check_writable`).

    Raises
    ------
    click.UsageError
        Naming ``--out-dir`` and the path: not a folder, cannot be made, or a file in it that
        may not be replaced (a device, a FIFO, a symbolic link, a folder).
    """
    out = Path(out_dir)
    if os.path.lexists(out) and not out.is_dir():
        raise click.UsageError(f"--out-dir {out_dir}: exists and is not a folder; expected a folder or a new name")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise click.UsageError(f"--out-dir {out_dir}: cannot create the folder ({exc.strerror})") from None
    try:
        for name in DEMO_OUTPUTS:
            check_writable(out / name)
    except OutputError as exc:
        raise click.UsageError(f"--out-dir {exc}") from None
    return out


#: The demo's what-if: the same requests arriving this many times faster.
WHAT_IF_RATE_SCALE = 1.5


def _what_if(trace, truth, cal, cfg) -> None:
    """Step 4: a what-if the fit never saw (the load x :data:`WHAT_IF_RATE_SCALE`), predicted
    with its 95 % band (:mod:`replay.analysis.bands`) and checked against the synthetic cluster."""
    from replay.analysis.band_tables import format_prediction
    from replay.analysis.bands import BandBasis, BandJob, predict_with_band, prediction_row

    faster = trace.assign(arrival_time_s=trace["arrival_time_s"] / WHAT_IF_RATE_SCALE)
    band = predict_with_band(BandJob(faster, {}, cost_model_from_calibration(cal), cfg, cal.band_points,
                                     BandBasis.of(cal)))
    true_row = prediction_row(replay_frame(faster, truth, cfg)[0])
    stats = [f"{m}_p{q}_s" for m in ("ttft", "tpot", "e2e") for q in (50, 90)]
    held = [s for s in stats if band.holds(s, true_row[s])]
    click.echo("\n" + wrap(f"4. what-if: {WHAT_IF_RATE_SCALE:g}x the load (traces scale --rate-scale "
                           f"{WHAT_IF_RATE_SCALE:g}), predicted with the calibration's band:"))
    click.echo(format_prediction(band))
    outside = [f"{s[:-2].replace('_', ' ')} {true_row[s] * 1e3:.2f} ms, band [{band.low[s] * 1e3:.2f}, "
               f"{band.high[s] * 1e3:.2f}]" for s in stats if s not in held]
    click.echo(wrap(f"the synthetic cluster at that load: {len(held)} of {len(stats)} p50/p90 TTFT, TPOT, E2E "
                    "inside their band" + (f"; outside: {'; '.join(outside)}" if outside else "")))


class NoisyCostModel:
    """A cost model whose step times carry multiplicative lognormal noise (the demo's 'hardware')."""

    def __init__(self, base: RooflineCostModel, sigma: float, rng: np.random.Generator):
        self.base, self.sigma, self.rng = base, sigma, rng
        self.model, self.gpu, self.tp = base.model, base.gpu, base.tp

    def step_time_s(self, *args) -> float:
        return self.base.step_time_s(*args) * float(self.rng.lognormal(0.0, self.sigma))
