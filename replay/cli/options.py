"""The options of ``replay`` that ``calibrate`` and ``servecal plan`` share, made from the
declared engine settings (:mod:`schemas.engine_settings`: one click option per setting, every
spelling, vLLM's among them), and the checks of option values that need no trace
(tolerances, the Chrome trace window).

Nothing heavy is imported here: these definitions are built for ``--help``.
"""
from __future__ import annotations

import math

import click

from schemas.engine_settings import SETTINGS, of_part

from ..errors import ConfigError


#: ``default`` of :func:`setting_option`: the declared one.
_DECLARED = object()


def _click_type(spec):
    """The click type of a declared setting: its names, or its range (an upper bound of
    ``inf`` is left to :mod:`replay.config`, whose message says "finite")."""
    known = spec.known()
    if known is not None:
        return click.Choice(list(known))
    if spec.low is None:
        return None
    high = spec.high if spec.high is not None and math.isfinite(spec.high) else None
    if spec.type is int:
        return click.IntRange(min=spec.low, max=high)
    return click.FloatRange(min=spec.low, max=high, min_open=spec.low_open,
                            max_open=spec.high_open and high is not None)


def setting_option(name: str, default=_DECLARED, default_help: str = "", values_help: str | None = None):
    """The click option of engine setting ``name``, from its declaration
    (:data:`schemas.engine_settings.SETTINGS`): every flag that spells it (vLLM's among
    them), its type and range, its help; the value goes to parameter ``name``.

    Parameters
    ----------
    default : the command's default (the declared one when not given); a None default is
        not shown: ``default_help`` says where the value then comes from.
    default_help : appended to the help (``" [default: the calibration's]"``).
    values_help : a list of values (``servecal plan``'s ``--tp 1,2,4``): a string the
        command parses, with this help instead of the declared one.
    """
    spec = SETTINGS[name]
    default = spec.default if default is _DECLARED else default
    text = values_help or f"{spec.meaning.rstrip('.')}{default_help}."
    if values_help is not None:
        return click.option(*spec.flags, name, default=default, help=text)
    if spec.type is bool:
        return click.option(*(f"{f}/--no-{f[2:]}" for f in spec.flags), name, default=default,
                            show_default=default is not None, help=text)
    return click.option(*spec.flags, name, type=_click_type(spec), default=default, show_default=default is not None,
                        help=text)


#: The settings of :func:`replay_options`: those of the replay's configuration with a flag, but
#: ``seed`` (``replay``'s own option: ``calibrate fit --seed`` seeds its bootstrap).
REPLAY_SETTINGS = tuple(s.name for s in SETTINGS.values() if s.flags and s.part != "hardware" and s.name != "seed")
#: The parallelism settings (``--tp``, ``--data-parallel-size``, ``--pp``, ``--enable-expert-parallel``).
HARDWARE_SETTINGS = tuple(s.name for s in of_part("hardware"))
#: Options of :func:`replay_options` that only ``--scheduler disagg`` uses (None when not given).
DISAGG_OPTIONS = tuple(s.name for s in of_part("disagg"))


def replay_options(fn):
    """The engine options shared by ``replay``, ``calibrate fit`` and ``calibrate validate``
    (:data:`REPLAY_SETTINGS`, vLLM's names accepted), then ``--exact-steps`` and ``--vllm-log``.
    The ``disagg`` ones default to None, so that giving them with another scheduler is an error."""
    opts = [setting_option(n, None if n in DISAGG_OPTIONS else _DECLARED) for n in REPLAY_SETTINGS] + [
        click.option("--exact-steps", is_flag=True, default=False,
                     help="Simulate every step and request one by one, through the event heap: the reference "
                          "the fast path is tested against (same results, slower)."),
        click.option("--vllm-log", type=click.Path(dir_okay=False), default=None,
                     help="The measured server's stdout log: its engine settings (max_num_seqs, "
                          "max_num_batched_tokens, KV blocks, prefix caching, TP/DP, ...) fill every option "
                          "not given here."),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def hardware_options(default=_DECLARED, default_help: str = "", pp_help: str = ""):
    """``--tp``, ``--data-parallel-size``, ``--pp``, ``--enable-expert-parallel`` (vLLM's
    ``--tensor-parallel-size``... accepted too), shared by ``replay`` (default None: the
    calibration's) and ``calibrate`` (the declared defaults); ``pp_help`` is added to ``--pp``'s."""
    def decorate(fn):
        for name in reversed(HARDWARE_SETTINGS):
            fn = setting_option(name, default, (pp_help if name == "pp" else "") + default_help)(fn)
        return fn
    return decorate


def output_options(fn):
    """``--wide`` and ``--quiet``: how much a command prints (shared with ``calibrate``)."""
    fn = click.option("-q", "--quiet", is_flag=True, default=False,
                      help="No progress bars or timings on stderr (they only show on a terminal anyway).")(fn)
    return click.option("--wide", is_flag=True, default=False,
                        help="Print every column of the tables [default: what fits 100 columns].")(fn)


def show_progress(quiet: bool) -> None:
    """Progress bars on stderr, when it is a terminal, until the current command ends (none with ``quiet``)."""
    from .progress import reporting

    click.get_current_context().with_resource(reporting(enabled=not quiet))


def report_folders(kwargs: dict) -> dict:
    """``{"--report": (folder, "figures", names)}`` for a Markdown ``--report`` (its figures'
    folder, :func:`replay.report.figures_folder`, and the files it may write there,
    :data:`replay.report.FIGURE_NAMES`), else ``{}``: ``user_errors`` refuses, before any
    work, a file of that name, any input or output inside it, and a figure's name there
    that is not a regular file."""
    if not kwargs.get("report"):
        return {}
    from ..report import FIGURE_NAMES, figures_folder

    folder = figures_folder(kwargs["report"])
    return {"--report": (str(folder), "figures", FIGURE_NAMES)} if folder is not None else {}


def parse_tolerances(text: str | None) -> dict[str, float]:
    """``"ttft_p50=0.1,tpot_p50=0.1"`` -> ``{"ttft_p50": 0.1, "tpot_p50": 0.1}``."""
    from ..analysis.compare import METRIC_LABELS

    known = set(METRIC_LABELS)
    out = {}
    for part in filter(None, (text or "").split(",")):
        key, sep, val = part.partition("=")
        key = key.strip()
        metric, _, stat = key.rpartition("_")
        try:
            out[key] = float(val)
        except ValueError:
            out[key] = math.nan
        if not (sep and out[key] >= 0):  # NaN fails too
            raise click.BadParameter(f"{part!r}: expected metric_stat=fraction, e.g. ttft_p50=0.1",
                                     param_hint="--tolerance") from None
        if metric not in known or not (stat == "mape" or stat in ("p50", "p90", "p99")):
            raise click.BadParameter(f"{key!r}: expected <metric>_<stat> with metric one of "
                                     f"{', '.join(sorted(known))} and stat p50, p90, p99 or mape",
                                     param_hint="--tolerance")
    return out


def chrome_trace_options(chrome_trace, window: str | None, max_requests: int):
    """The parsed ``--chrome-trace-window`` (None when not given).

    Raises
    ------
    click.UsageError
        ``--chrome-trace-window`` or a non-default ``--chrome-trace-max-requests`` without
        ``--chrome-trace``; a bad window.
    """
    from ..analysis.chrome_trace import parse_window

    ctx = click.get_current_context()
    given = [opt for opt, name in (("--chrome-trace-window", "chrome_trace_window"),
                                   ("--chrome-trace-max-requests", "chrome_trace_max_requests"))
             if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE]
    if given and not chrome_trace:
        raise click.UsageError(f"{', '.join(given)}: give --chrome-trace too")
    try:
        return parse_window(window)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None


def command_line() -> str:
    """The command being run as typed, from its parameters given on the command line
    (``replay run.parquet --calibration cal.json --tp 2``; shell-quoted), for a report."""
    import shlex

    ctx = click.get_current_context()
    words = ctx.command_path.split()  # 'servecal plan': two words, not one quoted
    for p in ctx.command.params:
        if ctx.get_parameter_source(p.name) != click.core.ParameterSource.COMMANDLINE:
            continue
        value = ctx.params.get(p.name)
        if isinstance(p, click.Argument):
            words.append(str(value))
        elif getattr(p, "is_flag", False) and not getattr(p, "count", False):
            words.append(p.opts[0] if value or not p.secondary_opts else p.secondary_opts[0])
        else:
            for v in (value if p.multiple else [value]):
                words += [p.opts[-1] if p.opts[-1].startswith("--") else p.opts[0], str(v)]
    return shlex.join(words)
