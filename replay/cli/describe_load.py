"""``traces describe --calibration``: the offered load of a trace on a calibrated server (M/G/1)."""
from __future__ import annotations

import click

from schemas.calibration import Calibration
from traces.cli.support import DataError, user_errors
from schemas.kinds import REQUEST_TRACE, a_kind
from schemas.specs import get_model
from schemas.status import OK

from ..errors import ConfigError, ReplayError
from ..text import wrap
from .engine_settings import calibrated_cost_model

_errors = user_errors(data_errors=(ReplayError,), usage_errors=(ConfigError,))


def with_load(describe: click.Command) -> click.Command:
    """A new ``describe`` command: ``traces describe`` (left as it is) plus the
    ``--calibration``/``--model`` options that add the offered load (M/G/1).

    ``traces`` sits below ``replay`` and cannot import it, so the top-level command line
    (calibrate/umbrella.py) composes the two parts into the ``describe`` it runs.
    """
    load_options = [
        click.Option(["--calibration", "calibration_path"], type=click.Path(dir_okay=False), default=None,
                     help="Show the offered load rho, E[S], E[S^2] and the Pollaczek-Khinchine wait of a "
                          "request-at-a-time server with this calibration, next to the replayed wait."),
        click.Option(["--model"], default=None, help="With --calibration: another model on the calibrated GPU."),
    ]

    @_errors
    def callback(calibration_path=None, model=None, **kwargs):
        if calibration_path:  # a file it cannot load refused before any output
            from traces.io import read_trace

            kind = read_trace(kwargs["file"])[0]
            if kind != REQUEST_TRACE:
                raise DataError(f"{kwargs['file']}: is {a_kind(kind)}; --calibration needs a request trace")
        describe.callback(**kwargs)
        if calibration_path:
            click.echo(describe_load(kwargs["file"], calibration_path, model))

    help_text = describe.help + ("\n\n    With --calibration, the M/G/1 view (seed section 3): each request served "
                                 "alone on the roofline,\n    rho = lambda E[S], and the P-K mean wait next to a "
                                 "batch-size-1 FCFS replay.")
    return type(describe)(describe.name, context_settings=describe.context_settings, callback=callback,
                          params=[*describe.params, *load_options], help=help_text, epilog=describe.epilog,
                          short_help=describe.short_help, options_metavar=describe.options_metavar,
                          add_help_option=describe.add_help_option, no_args_is_help=describe.no_args_is_help,
                          hidden=describe.hidden, deprecated=describe.deprecated)


def describe_load(trace: str, calibration_path: str, model: str | None) -> str:
    """The offered-load section of ``traces describe --calibration``."""
    import numpy as np

    from traces.io import read_trace

    from ..analysis.queueing import offered_load
    from ..config import EngineOptions, ReplayConfig, SchedulingOptions
    from ..simulate import replay_frame

    cal = Calibration.read(calibration_path)
    cost_model = calibrated_cost_model(calibration_path, cal, get_model(model) if model else None)
    kind, frame, _ = read_trace(trace)
    if kind != REQUEST_TRACE:
        raise DataError(f"{trace}: is {a_kind(kind)}; --calibration needs a request trace")
    if "status" in frame:
        frame = frame[frame["status"].isna() | (frame["status"] == OK)]
    load = offered_load(frame["arrival_time_s"], frame["num_prompt_tokens"], frame["num_output_tokens"], cost_model)
    lines = [f"offered load on 1 x {cost_model.gpu.name} ({cost_model.model.name}), one request at a time:",
             f"  lambda = {load['arrival_rate_per_s']:.4g} req/s, E[S] = {load['mean_service_s'] * 1e3:.1f} ms, "
             f"E[S^2] = {load['second_moment_s2']:.4g} s^2, SCV = {load['scv']:.3f}, rho = {load['rho']:.3f}"]
    if load["rho"] < 1:
        one_at_a_time = ReplayConfig(EngineOptions(max_num_seqs=1, max_num_batched_tokens=1 << 62),
                                     SchedulingOptions("fcfs"))
        res, _ = replay_frame(frame, cost_model, one_at_a_time)
        lines.append(f"  P-K mean wait (M/G/1) = {load['pk_mean_wait_s'] * 1e3:.1f} ms; batch-size-1 FCFS replay "
                     f"mean wait = {np.nanmean(res['pred_queue_wait_s']) * 1e3:.1f} ms (arrivals as traced, "
                     "so equal only for Poisson arrivals)")
    else:
        lines.append("  rho >= 1: a request-at-a-time server cannot keep up; the load needs batching "
                     "(see replay) and has no M/G/1 steady state")
    if "queue_wait_s" in frame and frame["queue_wait_s"].notna().any():
        lines.append(f"  measured mean queue wait = {frame['queue_wait_s'].mean() * 1e3:.1f} ms (the batching engine)")
    return wrap("\n".join(lines))
