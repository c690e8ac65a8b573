"""``calibrate``: fit the roofline cost model to traces; list the model and GPU catalog."""
from __future__ import annotations

import textwrap

import click

from traces.cli.support import FoldedGroup, user_errors, version_option
from schemas.text import wrap
from schemas.cost_params import VARIANTS
from schemas.errors import SpecError
from schemas.kinds import AGGREGATE_TARGETS, REQUEST_TRACE
from schemas.specs import catalog_key, list_gpus, list_models
from replay.cli.engine_settings import check_limits, replay_config, taken_settings_checked
from replay.cli.options import replay_options
from replay.errors import ConfigError, ReplayError

from .cli_options import (calibration_sources, cost_model_of, engine_options, hardware_options, held_and_free,
                          parse_names, warn_metadata_mismatch)
from .errors import CalibrationError, FitError, RunSpecError

# numpy, pandas, the engine and the fits are imported in the commands: --help stays fast

_errors = user_errors(data_errors=(CalibrationError, ReplayError), usage_errors=(SpecError, ConfigError, RunSpecError))


@click.group(cls=FoldedGroup, context_settings={"help_option_names": ["-h", "--help"]})
@version_option()
def main():
    """Fit the simulator's cost model to measured traces.

    \b
    Example:
      calibrate fit steps.parquet --model llama-3.1-8b --gpu rtx-pro-6000 -o cal.json
      calibrate catalog
    """


def print_fits(fits, verbose: bool) -> None:
    """The calibration summary first (values, 95 % intervals, identified or not, fit quality
    in words), then every variant's score; lmfit's own report only with ``verbose``."""
    from .summary import summary_lines

    best = fits[0]
    if verbose:
        click.echo("lmfit report of the best variant (parameters in their fit scale, e.g. t_step_s in ms):")
        click.echo(best.report)
    click.echo(textwrap.fill(f"best variant: {best.variant} ({quality(best)})", 100, subsequent_indent="  "))
    # a parameter's warning (stderr) gives the reason it is not identified: said once
    warned = frozenset(n for n in best.params if any(w.startswith(f"{n}: ") for w in best.warnings))
    for line in summary_lines(best, warned):
        click.echo(line)
    if len(fits) > 1:
        click.echo("variants (lower is better): " + ", ".join(f"{f.variant} {f.score:.4g}" for f in fits))
    for run, errs in best.stats.get("residual_by_run", {}).items():
        for m, e in errs.items():
            click.echo(f"  {run[-40:]} {m}: " + " ".join(f"{q} {v:+.1%}" for q, v in e.items()
                                                        if q in ("p10", "p50", "p90")))
    held_out = holdout_line(best.stats.get("holdout", {}))
    if held_out:
        click.echo(wrap(held_out))
    for w in best.warnings:
        click.echo(wrap(f"warning: {w}"), err=True)


def holdout_line(holdout: dict) -> str | None:
    """``"out of sample (leave one run out, 8 errors a metric): ttft 6.1 %, ..."``: the model error the
    bands use (:func:`replay.analysis.band_parts.model_error_quantiles`), None without held-out errors."""
    from replay.analysis.band_parts import model_error_quantiles

    q = model_error_quantiles(holdout.get("errors", []))
    if not q:
        return None
    n = max(k for _, k, _ in q.values())
    cells = ", ".join(f"{m.removesuffix('_s')} {v:.1%}" for m, (v, _, _) in q.items())
    return (f"out of sample ({holdout.get('method')}; {n} held-out errors a metric): {cells} (the 95 % model error of "
            "a prediction within the fitted load, widened with the distance from it)")


def quality(fit) -> str:
    """The fit's quality in words, from its own statistics (:func:`schemas.calibration.fit_grade`)."""
    from schemas.calibration import fit_grade

    word, details = fit_grade(fit.stats)
    return f"{word}: {details}"


def fitting_message(runs, variants) -> None:
    """Say that a fit of ``runs`` by simulation in the loop starts (stderr)."""
    n = sum(len(r.trace) for r in runs)
    scored = sum(len(r.scored_rows(r.trace)) for r in runs)
    matched = f" ({scored} in the windows matched)" if scored < n else ""
    click.echo(wrap(f"fitting {len(runs)} run(s), {n} requests{matched}, by simulation in the loop (variants "
                    f"{', '.join(variants)}) ..."), err=True)


def fit_request_runs(runs, cm, variants, free, fixed, jobs, ray_address, verbose, held_why=None):
    """Fit the runs (request logs or aggregates) by simulation in the loop; print the summary;
    return the fits."""
    from .aggregate_runs import fit_runs
    from .traces_fit import mark_held

    fitting_message(runs, variants)
    fits = fit_runs(runs, cm, variants=variants, free=free, fixed=fixed, jobs=jobs, ray_address=ray_address)
    mark_held(fits, held_why)
    print_fits(fits, verbose)
    return fits


@main.command()
@click.argument("traces", nargs=-1, required=True)
@hardware_options
@click.option("--loss", type=click.Choice(["linear", "soft_l1", "huber", "cauchy"]), default="soft_l1",
              show_default=True, help="Step traces: robust loss of the least squares.")
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
def fit(traces, model, model_config, gpu, gpu_spec, tp, dp, expert_parallel, pp, terms, fix, fix_from, free, variants,
        verbose, loss, balance_kinds, ci_method, ci_samples, seed, jobs, ray_address, output, **replay_kwargs):
    """Fit the cost model to a step trace, or to one or several request logs of one deployment.

    The kind of TRACES is read from their schema metadata. A step trace (step_trace/1)
    is fitted by least squares of step durations. Request logs (request_trace/1 with
    measured TTFT/TPOT) are fitted by simulation in the loop: every log is replayed with
    candidate parameters under the replay options below (the measured engine's
    settings; a log's recorded settings where an option is not given) until the predicted
    TTFT and TPOT quantiles (p10..p90) of all logs match. FILE#K takes benchmark K of a
    GuideLLM sweep; a sweep file without #K is one run per benchmark. An aggregate
    (aggregate_targets/1, from 'traces import summary') is one run per load level (FILE#K:
    level K): a workload synthesized from its lengths, replayed at its concurrency or rate,
    matched to its reported percentiles and means (TTFT, TPOT, E2E).

    \b
    Example:
      calibrate fit steps.parquet --model llama-3.1-8b --gpu rtx-pro-6000 -o cal.json
      calibrate fit low.parquet high.parquet --model qwen3-14b --gpu h100-80gb \\
                    --max-num-seqs 128 --max-num-batched-tokens 2048 -o cal.json
    """
    from .traces_fit import fit_traces

    tp, dp, expert_parallel, set_here, pp = engine_options(replay_kwargs, tp, dp, expert_parallel, traces, pp)
    with taken_settings_checked():
        cm = cost_model_of(model, model_config, gpu, gpu_spec, tp, dp, expert_parallel, terms, pp)
    fixed, free_names, variants, held_why, cm = held_and_free(fix, fix_from, free, variants, cm)
    names = parse_names(variants, list(VARIANTS), "--variants")

    def checked(loaded):
        """What the command says of the traces before the fit starts."""
        if loaded.kind != REQUEST_TRACE:
            warn_metadata_mismatch(loaded.metadata, cm.model, cm.gpu, tp)
            return
        for line in loaded.notes:
            click.echo(wrap(line), err=True)
        for r in loaded.runs:
            warn_metadata_mismatch(r.metadata, cm.model, cm.gpu, tp)
            warning = check_limits(r.name, r.trace, r.config.engine.max_num_seqs, dp)
            if warning:
                click.echo(wrap(warning), err=True)
        fitting_message(loaded.runs, names)

    fitted = fit_traces(traces, cm, replay_config(replay_kwargs), keep=set_here, fixed=fixed, free=free_names,
                        variants=names, loss=loss, balance_kinds=balance_kinds, ci=ci_method,
                        ci_samples=ci_samples, seed=seed, jobs=jobs, ray_address=ray_address,
                        held_why=held_why, on_loaded=checked)
    for reason, n in fitted.dropped.items():
        click.echo(wrap(f"dropped {n} row(s): {reason}"))
    print_fits(fitted.fits, verbose)
    cal = fitted.calibration
    cal.write(output)
    click.echo(f"wrote {output}")


@main.command()
@click.option("--fit-on", "fit_on", multiple=True, required=True, metavar="TRACE",
              help="Request log(s) to calibrate on: FILE, FILE#K (benchmark K of a sweep), FILE@START:END "
                   "(requests arriving in a time window, seconds); repeatable.")
@click.option("--score-on", "score_on", multiple=True, required=True, metavar="TRACE",
              help="Request log(s) or windows the calibration does not see, to measure its error on, or "
                   "aggregates (FILE, FILE#K: each level's reported statistics against its replay); repeatable.")
@hardware_options
@click.option("--jobs", type=click.IntRange(min=1), default=None, help="Processes running the fit's starts.")
@replay_options
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Also write the calibration fitted on --fit-on.")
@click.option("--table-out", type=click.Path(dir_okay=False), default=None,
              help="Write the error table (.csv or .parquet; seconds and fractions).")
@_errors
def validate(fit_on, score_on, model, model_config, gpu, gpu_spec, tp, dp, expert_parallel, pp, terms, fix, fix_from,
             free, variants, verbose, jobs, output, table_out, **replay_kwargs):
    """Out-of-sample error: calibrate on some runs, print measured vs predicted on the others.

    The error on runs the fit did not see is what a what-if deserves to be trusted by.
    Each run is replayed under its own engine settings (as for 'calibrate fit'). A level of
    an aggregate (traces import summary) is replayed as the fit replays it, and every mean and
    percentile it reports of TTFT, TPOT and E2E is set beside the replay's, one table a level.

    \b
    Example:
      calibrate validate --fit-on sweep.parquet#0 --score-on sweep.parquet#1 \\
                         --score-on sweep.parquet#2 --model codellama-34b --gpu h100-80gb \\
                         --max-num-seqs 32 --max-num-batched-tokens 64 --enable-prefix-caching
      calibrate validate --fit-on run.parquet@0:15 --score-on run.parquet@15: ...
      calibrate validate --fit-on dsr1_1k1k.parquet --score-on dsr1_8k1k.parquet ...
    """
    import pandas as pd

    from traces.io import read_trace

    from .request_fit import engine_settings
    from .aggregate_score import format_aggregate_validation, score_aggregates
    from .runs import in_source, load_runs, score_runs, share_requests
    from .traces_fit import METHODS
    from .step_fit import set_ci95
    from .summary import to_calibration

    if table_out:
        from replay.sweep import check_output_path

        check_output_path(table_out, "--table-out")  # before the fit
    tp, dp, expert_parallel, set_here, pp = engine_options(replay_kwargs, tp, dp, expert_parallel,
                                                           (*fit_on, *score_on), pp)
    with taken_settings_checked():
        cm = cost_model_of(model, model_config, gpu, gpu_spec, tp, dp, expert_parallel, terms, pp)
        cfg = replay_config(replay_kwargs)
    train, test = load_runs(fit_on, cfg, read_trace, keep=set_here), load_runs(score_on, cfg, read_trace, keep=set_here)
    unmeasured = [r.name for r in test if not any(r.measures(m) for m in ("ttft_s", "tpot_s", "e2e_s"))]
    if unmeasured:  # was skipped silently: the table had no row of it
        raise FitError(f"{', '.join(unmeasured)}: no measured ttft_s, tpot_s or e2e_s; --score-on needs measured "
                       "latencies to score")
    fixed, free_names, variants, held_why, cm = held_and_free(fix, fix_from, free, variants, cm)
    seen = [r for r in test if any(share_requests(r, f) for f in train)]
    if seen:  # scored as what it is: in sample
        click.echo(wrap(f"warning: --score-on names run(s) whose requests the fit sees: "
                        f"{', '.join(r.name for r in seen)}; scored in sample"), err=True)
    held_seen = [r for r in test if not any(r is s for s in seen)
                 and any(in_source(r, spec, sha) for spec, sha in calibration_sources(fix_from))]
    if held_seen:  # the values --fix-from holds were fitted on them
        click.echo(wrap(f"warning: --fix-from {fix_from} was fitted on requests of: "
                        f"{', '.join(r.name for r in held_seen)}; scored in sample"), err=True)
    seen += held_seen
    test = [r for r in test if not any(r is s for s in seen)]
    names = parse_names(variants, list(VARIANTS), "--variants")
    fits = fit_request_runs(train, cm, names, free_names, fixed, jobs, None, verbose, held_why)
    fitted = cm.with_params(fits[0].cost_params())
    logs = [r for r in train if r.targets is None]
    scored = {"in": train + seen, "out": test}
    table = pd.concat([score_runs([r for r in runs if r.targets is None], fitted).assign(sample=sample)
                       for sample, runs in scored.items()], ignore_index=True)
    aggregates = pd.concat([score_aggregates([r for r in runs if r.targets is not None], fitted).assign(sample=sample)
                            for sample, runs in scored.items()], ignore_index=True)
    if not table.empty:
        click.echo(format_validation(table))
    if not aggregates.empty:
        click.echo(format_aggregate_validation(aggregates))
    table = pd.concat([table, aggregates], ignore_index=True)
    if output:
        set_ci95(fits[0], "stderr")
        kind = AGGREGATE_TARGETS if len(logs) < len(train) else REQUEST_TRACE
        to_calibration(fits[0], cm, METHODS[kind], {"paths": list(fit_on), "kind": kind},
                       engine=engine_settings(train[0].config), variants=fits).write(output)
        click.echo(f"wrote {output}")
    if table_out:
        from replay.sweep import write_sweep_table

        write_sweep_table(table, table_out, "--table-out")
        click.echo(f"wrote {table_out}")


def format_validation(table) -> str:
    """One line per run (``table``: :func:`calibrate.runs.score_runs` rows with a ``sample``
    column): p50/p90 errors of TTFT, TPOT and E2E, in and out of sample (98 columns)."""
    import numpy as np

    lines = [f"{'run':34s} {'sample':6s} {'TTFT p50':>9s} {'p90':>7s} {'TPOT p50':>9s} {'p90':>7s} {'E2E p50':>8s} "
             f"{'p90':>7s}"]
    columns = (("ttft", 50, 9), ("ttft", 90, 7), ("tpot", 50, 9), ("tpot", 90, 7), ("e2e", 50, 8), ("e2e", 90, 7))
    for (run, sample), g in table.groupby(["run", "sample"], sort=False):
        by = {r["metric"]: r for _, r in g.iterrows()}
        cells = [f"{by[m][f'rel_err_p{q}']:+.1%}".rjust(width) if m in by else "n/a".rjust(width)
                 for m, q, width in columns]
        lines.append(f"{run[-34:]:34s} {sample:6s} " + " ".join(cells))
    out = table[table["sample"] == "out"]
    if not out.empty:
        errs = out[out["metric"].isin(["ttft", "tpot", "e2e"])][["rel_err_p50", "rel_err_p90"]].abs().to_numpy()
        lines.append(f"out of sample: median |error| {np.nanmedian(errs):.1%}, worst {np.nanmax(errs):.1%} "
                     "(p50/p90 of TTFT, TPOT, E2E)")
    return "\n".join(lines)


@main.command()
@click.option("--name", "name", default=None, metavar="KEY",
              help="Print every value of one model or GPU (its key, an alias or its Hugging Face id), "
                   "with its source.")
@_errors
def catalog(name):
    """List the built-in models and GPUs: one table each, within 100 columns.

    \b
    Example:
      calibrate catalog
      calibrate catalog --name llama-3.1-8b
    """
    from replay.text import WIDTH, render_table

    gpus, models = list_gpus(), list_models()
    if name is not None:
        key = catalog_key(name)
        rows = [r for r in gpus + models if r["key"] == key]
        if not rows:
            raise click.UsageError(f"--name {name}: no such model or GPU (a key, an alias or a Hugging Face id); "
                                   "the keys are the first column of 'calibrate catalog'")
        for k, v in rows[0].items():
            text = f"{k}: {', '.join(map(str, v)) if isinstance(v, list) else v}"
            click.echo(textwrap.fill(text, WIDTH, subsequent_indent="    ", break_long_words=False,
                                     break_on_hyphens=False))
        return
    click.echo("GPUs: dense tensor TFLOP/s per precision ('-': no such tensor cores, priced at BF16), memory")
    kw = max(len(r["key"]) for r in gpus + models)
    click.echo(f"  {'key':<{kw}}   BF16   FP8   FP4   TB/s   GB  description")
    for g in gpus:
        peaks = " ".join(f"{g[f] / 1e12:>5.0f}" if g[f] else f"{'-':>5}"
                         for f in ("peak_flops", "peak_flops_fp8", "peak_flops_fp4"))
        nums = f"{peaks}  {g['mem_bandwidth_bytes_per_s'] / 1e12:>5.2f} {g['mem_bytes'] / 2**30:>4.0f}  "
        lead = f"  {g['key']:<{kw}}  {nums}"
        click.echo(textwrap.fill(g["description"], WIDTH, initial_indent=lead,
                                 subsequent_indent=" " * len(lead), break_on_hyphens=False))
    click.echo("Models:")
    head = ["params", "active", "layers", "hidden", "heads", "kv_heads", "KV B/token", "context"]
    cells = [[f"{m['num_params'] / 1e9:.1f}B", f"{m['num_active_params'] / 1e9:.1f}B", str(m["num_layers"]),
              str(m["hidden_size"]), str(m["num_attention_heads"]), str(m["num_kv_heads"]),
              str(m["kv_bytes_per_token"]), str(m["max_model_len"])] for m in models]
    for key, line in zip(["key"] + [m["key"] for m in models], render_table(head, cells).splitlines()):
        click.echo(f"  {key:<{kw}}  {line}")
    for m in models:  # the layers whose state does not grow with the context
        kinds = ([f"{m['num_window_layers']} windowed ({m['sliding_window_tokens']} tokens)"]
                 * bool(m["num_window_layers"]))
        kinds += [f"{m['num_linear_layers']} linear-attention"] * bool(m["num_linear_layers"])
        if kinds:
            click.echo(wrap(f"  {m['key']}: {' and '.join(kinds)} of {m['num_layers']} layers, outside KV B/token: "
                            f"{m['seq_state_bytes'] / 1e6:.1f} MB a sequence whatever its length", indent="    "))
    click.echo(wrap("(every value with its source, the aliases and the Hugging Face id: calibrate catalog --name KEY)"))


def _add_advise() -> None:
    """``calibrate advise`` (its own module: :mod:`calibrate.advise_cli`)."""
    from .advise_cli import advise

    main.add_command(advise)


_add_advise()
