"""``calibrate advise``: the command around :func:`calibrate.advise.advise` (its options, the workload it
reads, what it prints)."""
from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path

import click

from replay.errors import ConfigError, ReplayError
from schemas.errors import SpecError
from schemas.text import wrap
from traces.cli.support import user_errors

from .advise_commands import DEFAULT_TARGET, FORMATS
from .errors import CalibrationError, RunSpecError

_errors = user_errors(data_errors=(CalibrationError, ReplayError), usage_errors=(SpecError, ConfigError, RunSpecError))
#: The statistics printed for the what-if, with their labels.
_SHOWN = (("ttft_p90_s", "TTFT p90"), ("tpot_p90_s", "TPOT p90"), ("e2e_p90_s", "E2E p90"))


def source_specs(cal, cal_path: str) -> list[str]:
    """The runs ``cal`` was fitted on (``source.path``/``paths``, ``FILE[#K][@START:END]``), each found as
    recorded or beside the calibration file.

    Raises
    ------
    click.UsageError
        When the calibration records none, or one of them is not found: naming ``--trace``.
    """
    from .runs import parse_run_spec

    src = cal.source or {}
    specs = src.get("paths") or [src.get("path")]
    out = []
    for spec in specs:
        if not isinstance(spec, str):
            raise click.UsageError(wrap(f"{cal_path}: records no trace it was fitted on; give the workload with "
                                        "--trace FILE (a request log or aggregate of this deployment)"))
        path, _, _ = parse_run_spec(spec)
        beside = Path(cal_path).parent / path
        if not Path(path).exists() and beside.exists():
            spec = str(beside) + spec[len(path):]
        elif not Path(path).exists():
            raise click.UsageError(wrap(f"{cal_path}: was fitted on {spec}, not found here or beside the "
                                        "calibration; give the workload with --trace FILE"))
        out.append(spec)
    return out


def _band_text(band, stat: str) -> str:
    """``"1.21 s [0.93, 1.57]"``: a statistic of a band in seconds, 3 significant digits."""
    def fmt(x):
        return f"{x:.3g}"
    return f"{band.cell(stat, fmt=fmt)} s"


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "a duration not predicted (no request completes)"
    return f"about {seconds / 60:.0f} min" if seconds >= 90 else f"about {seconds:.0f} s"


def print_advice(cal, advice, top: int, fmt: str, model: str, target: str) -> None:
    """The what-if's band now, then the ``top`` candidates: workload, terms, band after, duration, command."""
    from replay.plan.advice import not_identified

    from .advise_candidates import MeasuredRun
    from .advise_commands import command, folded, server_command

    w = advice.what_if
    click.echo(wrap(f"what-if: {w.workload.label()} ({w.workload.why})"))
    click.echo(wrap("  band now: " + ", ".join(f"{label} {_band_text(advice.now, s)}" for s, label in _SHOWN)))
    rank = ("the what-if's band after each (the mean half width of its p50/p90 TTFT, TPOT, E2E)"
            if advice.by_what_if else "the information each gives on the parameters (D-optimal; no --what-if)")
    click.echo(wrap(f"{len(advice.ranked)} candidate runs, each replayed at the calibration and its "
                    f"{len(cal.band_points)} band points ({advice.n_replays} replays); ranked by {rank}"))
    for i, s in enumerate(advice.ranked[:top], 1):
        run = s.run.workload
        click.echo("")
        click.echo(wrap(f"#{i} {run.label()} ({run.why}); {_duration(s.run.duration_s)}"))
        terms = ", ".join(f"{n}{' (NOT IDENTIFIED)' if not_identified(cal, n) is not None else ''} r={r:+.2f}"
                         for n, r in s.terms) or "none of the set's parameters in particular"
        click.echo(wrap(f"  information {s.information_nats:.2f} nats; pins {terms}"))
        click.echo(wrap("  what-if band after (estimate): " + ", ".join(
            f"{label} {_band_text(s.after, st)}" for st, label in _SHOWN)))
        if isinstance(run, MeasuredRun):
            click.echo(wrap(f"  measured already: refit on the calibration's runs and {run.run.name} "
                            "(calibrate fit, each as FILE[#K])"))
            continue
        server = server_command(run, model)
        if server:
            click.echo(wrap(f"  restart the server with: {server}"))
        text = command(run, fmt, model, target)
        if fmt == "inference-perf":
            click.echo(f"  run: inference-perf --config_file advise_{i}.yaml, with advise_{i}.yaml:")
            click.echo("\n".join("    " + line for line in text.splitlines()))
        else:
            click.echo(folded(f"  run: {text}", indent="       "))
    click.echo("")
    click.echo(wrap("(the band after is an estimate before the run: each band point's prediction drawn towards "
                    "the calibration's as far as the run's measurement, within its sampling noise and the model's "
                    "held-out error, would tell them apart, and the model error's widening taken from the fitted "
                    "load extended by the run's; a joint refit may also move the calibration itself)"))


@click.command()
@click.argument("calibration_path", metavar="CAL.json", type=click.Path(dir_okay=False))
@click.option("--trace", "trace", multiple=True, metavar="TRACE",
              help="The workload whose lengths the candidates take (FILE, FILE#K; repeatable) [default: the "
                   "runs the calibration was fitted on, found as recorded or beside it].")
@click.option("--candidates", "measured", multiple=True, metavar="TRACE",
              help="Rank these measured runs (FILE, FILE#K, FILE@START:END; repeatable) instead of synthesized "
                   "ones: which of them to add to the fit. Each is replayed as measured (its arrivals and "
                   "engine settings); runs the calibration was fitted on are left out.")
@click.option("--what-if", "what_if", default=None, metavar="KEY=VALUE,...",
              help="The question to narrow: rate=R (req/s) or concurrency=N, prompt_tokens, output_tokens, "
                   "requests, max_num_seqs, max_num_batched_tokens; the others the fitted workload's "
                   "[default: twice the fitted rate, and candidates ranked by information on the parameters].")
@click.option("--budget", type=click.IntRange(min=1, max=64), default=12, show_default=True,
              help="Candidate runs replayed (each at the calibration and every band point).")
@click.option("--top", type=click.IntRange(min=1), default=3, show_default=True, help="Candidates printed.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="guidellm", show_default=True,
              help="The benchmark tool of the printed commands.")
@click.option("--target", default=DEFAULT_TARGET, show_default=True, help="The server the commands target.")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="Processes running the replays [default: CPU count]; the result does not depend on it.")
@_errors
def advise(calibration_path, trace, measured, what_if, budget, top, fmt, target, jobs):
    """Which benchmark run to measure next: the one that narrows the calibration most.

    Candidate runs (other rates and concurrencies, prefill- and decode-heavy length mixes, other
    max_num_seqs / max_num_batched_tokens) are replayed at the points of the calibration's
    confidence set; the run whose predictions disagree most between them, beyond the noise its
    measurement would carry, is the one that pins them (D-optimal design). With --what-if, runs are
    ranked by how much they would narrow that what-if's band. Each is printed with the parameters it
    would pin, the what-if's band now and estimated after, its duration and the command that runs it.
    With --candidates, the runs ranked are measured ones: which of them to add to the fit.

    \b
    Example:
      calibrate advise codellama.json --trace sweep.parquet#0
      calibrate advise opt.json --what-if rate=4 --format vllm-bench
      calibrate advise codellama.json --candidates sweep.parquet#1 --candidates sweep.parquet#4
    """
    from replay.config import OPTION_PART, ReplayConfig
    from replay.cost.cost_model import cost_model_from_calibration
    from schemas.calibration import Calibration
    from traces.io import read_trace

    from .advise import advise as run_advice, fitted_load
    from .advise_candidates import WhatIfError, candidates, parse_what_if
    from .advise_commands import model_id, poisson_arrivals
    from .runs import load_runs

    cal = Calibration.read(calibration_path)
    if not cal.band_points:
        raise CalibrationError(wrap(f"{calibration_path}: has no band points (written before bands): nothing to "
                                    "tell runs apart by; refit it with 'calibrate fit'"))
    specs = list(trace) or source_specs(cal, calibration_path)
    settings = {k: v for k, v in cal.engine.items() if k in OPTION_PART and v is not None}
    base_cfg = ReplayConfig.from_options(**settings)
    cm = cost_model_from_calibration(cal)
    runs = load_runs(specs, base_cfg, read_trace, keep=frozenset(settings))
    base = fitted_load(cal, runs, cm)
    max_len = int(cal.engine.get("max_model_len") or cal.model.max_model_len)
    try:
        question = parse_what_if(what_if, base, max_len)
    except WhatIfError as exc:
        raise click.BadParameter(str(exc), param_hint="--what-if") from None
    click.echo(wrap(f"calibration {calibration_path}: {cal.model.name} on {cal.gpu.name} TP{cal.tp}, fitted on "
                    f"{len(runs)} run(s) up to {base.rate_rps:.3g} req/s and {base.running:.3g} requests running, "
                    f"prompts {base.prompt_tokens:.0f} / outputs {base.output_tokens:.0f} tokens"))
    unknown = [n for n in cal.params if _not_identified(cal, n)]
    if unknown:
        click.echo(wrap(f"NOT IDENTIFIED: {', '.join(unknown)}"))
    workloads = (measured_candidates(measured, runs, base_cfg, settings) if measured
                 else candidates(base, max_len, budget, question.engine))
    with _replayer(jobs) as mapper:
        result = run_advice(cal, cm, base_cfg, question, workloads, what_if is not None, poisson_arrivals(fmt), mapper)
    print_advice(cal, result, top, fmt, model_id(cal.model.name), target)


def measured_candidates(specs, fitted: list, base_cfg, settings: dict) -> list:
    """The runs of ``specs`` (``--candidates``) as :class:`calibrate.advise_candidates.MeasuredRun`, under
    the calibration's engine ``settings`` where their files record none, less those that share measured
    requests with the ``fitted`` runs (said on stderr).

    Raises
    ------
    click.UsageError
        When every one of them was fitted on.
    calibrate.errors.FitError
        A file that cannot be read as runs (:func:`calibrate.runs.load_runs`).
    """
    from traces.io import read_trace

    from .advise_candidates import MeasuredRun
    from .runs import load_runs, share_requests

    out = []
    for run in load_runs(specs, base_cfg, read_trace, keep=frozenset(settings)):
        if any(share_requests(run, f) for f in fitted):
            click.echo(wrap(f"note: --candidates {run.name}: the calibration was fitted on it; left out"), err=True)
        else:
            out.append(MeasuredRun(run))
    if not out:
        raise click.UsageError(wrap("--candidates: the calibration was fitted on every run given; give runs it "
                                    "did not see"))
    return out


@contextlib.contextmanager
def _replayer(jobs: int | None):
    """A map running the replays in ``jobs`` processes (default: one per CPU, at most 8), or None (here)."""
    n = jobs or os.cpu_count() or 1
    if n == 1:
        yield None
        return
    from replay.parallel import worker_pool

    with worker_pool(min(n, 8)) as mapper:
        yield mapper


def _not_identified(cal, name: str) -> bool:
    """Whether parameter ``name`` of ``cal`` is NOT IDENTIFIED (free, yet not pinned by the data)."""
    from replay.plan.advice import not_identified

    return not_identified(cal, name) is not None
