"""``calibrate``: fit the roofline cost model to traces; list the model and GPU catalog."""
from __future__ import annotations

import click

from schemas.calibration import sha256_of
from schemas.cli_support import DataError, user_errors, version_option
from schemas.errors import SpecError
from schemas.specs import get_gpu, get_model, gpu_from_json, list_gpus, list_models, model_from_hf_config
from schemas.tables import REQUEST_TRACE, STEP_TRACE
from replay.cli import replay_config, replay_options
from replay.errors import ConfigError, ReplayError

from .errors import CalibrationError
from .step_fit import bootstrap_ci95, calibration_from_fit, fit_steps, set_ci95

_errors = user_errors(data_errors=(CalibrationError, ReplayError), usage_errors=(SpecError, ConfigError))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@version_option()
def main():
    """Fit the simulator's cost model to measured traces.

    \b
    Example:
      calibrate fit steps.parquet --model llama-3.1-8b --gpu rtx-pro-6000 -o cal.json
      calibrate catalog
    """


def print_fit(fits, dropped) -> None:
    """Print lmfit's report of the best fit, R^2, residual percentiles and warnings."""
    best = fits[0]
    click.echo("lmfit report of the best form (t_launch_frac = t_launch_s / median step duration, "
               "so every fitted number is of order 1):")
    click.echo(best.report)
    for reason, n in dropped.items():
        click.echo(f"dropped {n} row(s): {reason}")
    click.echo(f"\nform={best.form}  R^2={best.r2:.4f}  |rel residual| p50={best.rel_residual_pct['p50']:.2%} "
               f"p90={best.rel_residual_pct['p90']:.2%} p99={best.rel_residual_pct['p99']:.2%}  "
               f"compute-bound steps {best.n_compute_bound}/{best.n_rows}")
    for f in fits:
        kinds = ", ".join(f"{k} {v:.1%}" for k, v in f.rel_residual_p50_by_group.items())
        click.echo(f"form={f.form}: score {f.score:.2%} (mean over step kinds of median |rel residual|: {kinds})")
    for k, v in best.values.items():
        se = best.stderr.get(k)
        unit = " s" if k.endswith("_s") else ""
        state = "" if best.identifiable[k] else f"  NOT IDENTIFIED ({best.bounds[k]})"
        click.echo(f"  {k} = {v:.6g}{unit} +/- {se:.2g}{unit}{state}" if se is not None else f"  {k} = {v:.6g}{unit}{state}")
    for w in best.warnings:
        click.echo(f"warning: {w}", err=True)


@main.command()
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option("--model", default=None, help="Catalog key or Hugging Face id (see 'calibrate catalog').")
@click.option("--model-config", type=click.Path(dir_okay=False), default=None,
              help="A Hugging Face config.json instead of --model (dense or mixture-of-experts).")
@click.option("--gpu", default=None, help="Catalog key or the name nvidia-smi prints.")
@click.option("--gpu-spec", type=click.Path(dir_okay=False), default=None,
              help="A JSON with name, peak_flops, mem_bandwidth_bytes_per_s, mem_bytes instead of --gpu.")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True, help="Tensor-parallel degree of the trace.")
@click.option("--form", default="max,sum", show_default=True,
              help="Roofline forms to fit (comma separated); the best is written.")
@click.option("--loss", type=click.Choice(["linear", "soft_l1", "huber", "cauchy"]), default="soft_l1",
              show_default=True, help="Robust loss of the least squares.")
@click.option("--balance-kinds/--no-balance-kinds", default=True, show_default=True,
              help="Step traces: weigh prefill-only, decode-only and mixed steps equally (profiling grids "
                   "skew the counts).")
@click.option("--ci", "ci_method", type=click.Choice(["stderr", "bootstrap"]), default="stderr", show_default=True,
              help="95 % intervals: value +/- 1.96 stderr, or a bootstrap over steps (step traces).")
@click.option("--ci-samples", type=click.IntRange(min=20), default=200, show_default=True,
              help="Bootstrap resamples.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seed of the bootstrap.")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="Request logs: processes running the fit's starts in parallel [default: CPU count]; "
                   "the result does not depend on it.")
@click.option("--ray-address", default=None, metavar="ADDR",
              help="Request logs: run the fit's starts on the Ray cluster at ADDR (auto, ray://host:10001) "
                   "instead; the same result. Needs pip install 'servecal[ray]' here and servecal on the cluster.")
@replay_options
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Calibration JSON to write.")
@_errors
def fit(trace, model, model_config, gpu, gpu_spec, tp, form, loss, balance_kinds, ci_method, ci_samples, seed, jobs,
        ray_address, output, **replay_kwargs):
    """Fit eta_compute, eta_mem and t_launch_s to a step trace or a request log.

    The kind of TRACE is read from its schema metadata. A step trace (step_trace/1) is
    fitted by nonlinear least squares of step durations. A request log (request_trace/1
    with measured ttft_s and tpot_s) is fitted by simulation in the loop: the trace is
    replayed with candidate parameters under the replay options below (give the measured
    engine's settings) until the predicted TTFT and TPOT quantiles (p10..p90) match.

    \b
    Example:
      calibrate fit steps.parquet --model llama-3.1-8b --gpu rtx-pro-6000 -o cal.json
      calibrate fit run.parquet --model llama-3.1-8b --gpu rtx-pro-6000 \\
                    --max-num-seqs 128 --max-num-batched-tokens 2048 -o cal.json
    """
    from traces.io import read_trace

    forms = tuple(f.strip() for f in form.split(",") if f.strip())
    bad = [f for f in forms if f not in ("max", "sum")]
    if bad or not forms:
        raise click.BadParameter(f"{form!r}: expected max, sum or max,sum", param_hint="--form")
    model_spec = model_from_options(model, model_config)
    if (gpu is None) == (gpu_spec is None):
        raise click.UsageError("give exactly one of --gpu and --gpu-spec")
    gpu_spec = get_gpu(gpu) if gpu else gpu_from_json(gpu_spec)
    kind, frame, meta = read_trace(trace)
    source = {"path": str(trace), "sha256": sha256_of(trace), "kind": kind}
    warn_metadata_mismatch(meta, model_spec, gpu_spec, tp)
    if kind == STEP_TRACE:
        if ray_address is not None:
            raise click.UsageError("--ray-address: only a request log is fitted by replays; a step trace fits here")
        fits, dropped = fit_steps(frame, model_spec, gpu_spec, tp, forms, loss, balance_kinds=balance_kinds)
        print_fit(fits, dropped)
        cal = calibration_from_fit(fits, model_spec, gpu_spec, tp, source, dropped)
        boot = None
        if ci_method == "bootstrap":
            boot = bootstrap_ci95(frame, model_spec, gpu_spec, tp, fits[0].form, loss, balance_kinds, ci_samples, seed)
        set_ci95(cal, ci_method, boot)
    elif kind == REQUEST_TRACE:
        from .request_fit import calibration_from_request_fit, fit_requests

        if ci_method == "bootstrap":
            raise click.BadParameter("a bootstrap of a simulation-in-the-loop fit would take hundreds of fits; "
                                     "use --ci stderr for request logs", param_hint="--ci")

        cfg = replay_config(replay_kwargs)
        if ray_address is not None:
            from replay.sweep import check_ray

            check_ray()
        fits = []
        for f in forms:
            click.echo(f"fitting form={f} by simulation in the loop ({len(frame)} requests, scheduler "
                       f"{cfg.scheduler}, max_num_seqs={cfg.max_num_seqs}, "
                       f"max_num_batched_tokens={cfg.max_num_batched_tokens}) ...", err=True)
            fits.append(fit_requests(frame, model_spec, gpu_spec, tp, cfg, form=f, jobs=jobs, ray_address=ray_address))
        fits.sort(key=lambda r: r.cost)
        print_request_fit(fits)
        cal = calibration_from_request_fit(fits, model_spec, gpu_spec, tp, source, cfg)
        set_ci95(cal, ci_method)
    else:
        raise DataError(f"{trace}: is a {kind}; give a step trace or a request log")
    for k, p in cal.params.items():
        if p.ci95:
            click.echo(f"  95% interval ({ci_method}) {k}: [{p.ci95[0]:.6g}, {p.ci95[1]:.6g}]")
    cal.write(output)
    click.echo(f"wrote {output}")


def warn_metadata_mismatch(meta: dict, model_spec, gpu_spec, tp: int) -> None:
    """Warn when the trace's own metadata (an importer's ``gpu``, ``model``, ``tp``) disagrees
    with the options: the fit would describe hardware the trace did not run on."""
    for key, given in (("gpu", gpu_spec.name), ("model", model_spec.name)):
        named = meta.get(key)
        if not named:
            continue
        try:
            resolved = (get_gpu if key == "gpu" else get_model)(named).name
        except SpecError:
            continue
        if resolved != given:
            click.echo(f"warning: the trace says {key} {named!r} ({resolved}); fitting it as --{key} {given}", err=True)
    if meta.get("tp") and meta["tp"].isdigit() and int(meta["tp"]) != tp:
        click.echo(f"warning: the trace says tp {meta['tp']}; fitting it as --tp {tp}", err=True)


def model_from_options(model: str | None, model_config: str | None):
    """The model of ``--model`` or ``--model-config`` (exactly one must be given)."""
    if (model is None) == (model_config is None):
        raise click.UsageError("give exactly one of --model and --model-config")
    return get_model(model) if model else model_from_hf_config(model_config)


def print_request_fit(fits) -> None:
    """Print the best request fit, every form's cost, and the quantile errors at the optimum."""
    best = fits[0]
    click.echo("lmfit report of the best form (t_launch_ms = t_launch_s in milliseconds; its uncertainties "
               "are recomputed below from a central-difference Jacobian):")
    click.echo(best.report)
    for f in fits:
        click.echo(f"form={f.form}: cost {f.cost:.4g} (sum of squared relative quantile errors), {f.n_replays} replays")
    for m, errs in best.residual_by_metric.items():
        click.echo(f"  {m} quantile errors: " + ", ".join(f"{q} {e:+.1%}" for q, e in errs.items()))
    for k, v in best.values.items():
        se = best.stderr.get(k)
        unit = " s" if k.endswith("_s") else ""
        state = "" if best.identifiable[k] else f"  NOT IDENTIFIED ({best.bounds[k]})"
        click.echo(f"  {k} = {v:.6g}{unit}" + (f" +/- {se:.2g}{unit}" if se is not None else "") + state)
    for w in best.warnings:
        click.echo(f"warning: {w}", err=True)


@main.command()
def catalog():
    """List the built-in models and GPUs with their sources.

    \b
    Example:
      calibrate catalog
    """
    click.echo("GPUs:")
    for row in list_gpus():
        click.echo("  " + "  ".join(f"{k}={v}" for k, v in row.items()))
    click.echo("Models:")
    for row in list_models():
        click.echo("  " + "  ".join(f"{k}={v}" for k, v in row.items()))
