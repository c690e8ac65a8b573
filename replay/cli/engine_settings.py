"""Where ``replay``'s engine settings come from: the command line, a vLLM log, the calibration;
the check that they can describe the measured run; the :class:`~replay.config.ReplayConfig`
and the cost model they make."""
from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING

import click

from schemas.calibration import Calibration
from schemas.engine_settings import SETTINGS
from schemas.text import wrap_error
from traces.cli.support import DataError

from ..errors import ConfigError
from .options import DISAGG_OPTIONS

if TYPE_CHECKING:
    from ..config import DisaggOptions, RecordOptions, ReplayConfig


#: The settings a vLLM log, a trace or a calibration supplies: (its key there, vLLM's name
#: where vLLM has one; the option it fills), ``recorded`` in :data:`schemas.engine_settings.SETTINGS`.
_FILLED = tuple((s.vllm or s.name, s.name) for s in SETTINGS.values() if s.recorded)
#: Recorded values that say nothing (vLLM logs print ``pipeline_parallel_size=1`` by default): not
#: taken, so a calibration's own ``pp`` stands and nothing more is printed than before PP existed.
_NEUTRAL = {"pipeline_parallel_size": 1}
#: Key of the click context's ``meta``: the settings :func:`fill_engine_options` took, by source.
_TAKEN = "servecal.engine_settings_taken"
#: Key of the click context's ``meta``: options typed unlike a source (:func:`typed_unlike_sources`).
_DIFFER = "servecal.engine_settings_differ"
def flag(name: str) -> str:
    """The command-line flag messages print for parameter ``name``: ``max_num_seqs`` ->
    ``--max-num-seqs``, ``dp`` -> ``--data-parallel-size`` (:attr:`SettingSpec.flag`)."""
    return SETTINGS[name].flag if name in SETTINGS else f"--{name.replace('_', '-')}"


def typed_unlike_sources() -> list[tuple[str, object, object, str]]:
    """``(flag, typed value, recorded value, source label)`` of every option
    :func:`fill_engine_options` saw typed on the command line unlike the first source that
    records it (the measured run's settings)."""
    return list(click.get_current_context().meta.get(_DIFFER, []))


def recorded_setting(sources: list, key: str):
    """``(value, label)`` of setting ``key`` (vLLM's name) in the first source of ``sources``
    that records it (:func:`engine_sources`), or ``(None, None)``."""
    for label, settings in sources:
        value = (settings or {}).get(key)
        if value is not None:
            return value, label
    return None, None

def fill_engine_options(kwargs: dict, sources: list) -> list[str]:
    """Fill the engine options left at their defaults from ``sources`` (``(label, settings)``
    pairs, vLLM's names, first source first), in place; return what to tell the user: the
    options taken, and those given on the command line that differ from a source.

    Command-line options win, then the sources in order; vLLM's keys fill the options of
    other names (``tensor_parallel_size`` fills ``tp``...) when present in ``kwargs``.
    What was taken is kept in the click context for :func:`taken_settings_checked`.
    """
    import textwrap

    ctx = click.get_current_context()
    taken, differ = {}, []
    for key, name in _FILLED:
        if name not in kwargs:
            continue
        src = ctx.get_parameter_source(name)
        given = src is not None and src != click.core.ParameterSource.DEFAULT
        for label, settings in sources:
            value = (settings or {}).get(key)
            if value is None or (key in _NEUTRAL and value == _NEUTRAL[key]):
                continue
            if given:
                if value != kwargs[name]:
                    differ.append(f"{flag(name)} {kwargs[name]} (the {label} says {value})")
                    ctx.meta.setdefault(_DIFFER, []).append((flag(name), kwargs[name], value, label))
            else:
                kwargs[name] = value
                taken.setdefault(label, []).append(f"{name}={value}")
            break
    for label, items in taken.items():
        ctx.meta.setdefault(_TAKEN, {}).setdefault(label, []).extend(items)
    lines = [f"engine settings from the {label}: {', '.join(items)}" for label, items in taken.items()]
    if differ:
        lines.append(f"note: given on the command line, unlike the measured run: {'; '.join(differ)}")
    return [textwrap.fill(line, 100, subsequent_indent="  ") for line in lines]


@contextmanager
def taken_settings_checked():
    """Inside, a :class:`~replay.errors.ConfigError` (settings that cannot run: a TP degree
    that does not divide the heads...) is a usage error when every engine setting was typed,
    or when the error names the settings at fault (``ConfigError.options``) and every one of
    them was typed; a :class:`DataError` (exit 1) naming the settings taken from a trace, log
    or calibration otherwise: those files recorded something that cannot be replayed."""
    try:
        yield
    except ConfigError as exc:
        ctx = click.get_current_context()
        taken = ctx.meta.get(_TAKEN)
        typed = (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)
        if not taken or exc.options and all(ctx.get_parameter_source(o) in typed for o in exc.options):
            raise  # the options typed are at fault, whatever else was taken: a usage error
        import textwrap

        where = "; ".join(f"from the {label}: {', '.join(items)}" for label, items in taken.items())
        note = textwrap.fill(f"(engine settings taken {where}; an option given on the command line overrides them)",
                             100, initial_indent="  ", subsequent_indent="  ")
        raise DataError(f"{wrap_error(str(exc))}\n{note}") from None


def max_running(trace) -> int | None:
    """Most requests the measured engine ran at once, from ``queue_wait_s`` and ``e2e_s``
    (scheduled = arrival + queue wait, until arrival + E2E); None without both columns."""
    import numpy as np
    

    if "queue_wait_s" not in trace or "e2e_s" not in trace:
        return None
    t0 = (trace["arrival_time_s"] + trace["queue_wait_s"]).to_numpy(float)
    t1 = (trace["arrival_time_s"] + trace["e2e_s"]).to_numpy(float)
    ok = np.isfinite(t0) & np.isfinite(t1)
    if not ok.any():
        return None
    events = np.concatenate([np.stack([t0[ok], np.ones(ok.sum())], 1), np.stack([t1[ok], -np.ones(ok.sum())], 1)])
    events = events[np.lexsort((events[:, 1], events[:, 0]))]  # ends before starts at a tie
    return int(np.max(np.cumsum(events[:, 1])))


def check_limits(name: str, trace, max_num_seqs: int, dp: int = 1) -> str | None:
    """A warning when the measured run had more requests running at once than the limits allow."""
    most = max_running(trace)
    if most is not None and most > max_num_seqs * dp:
        # the file name last: a long path folded by wrap() leaves the limit on the first line
        return (f"warning: the run had up to {most} requests running at once, above --max-num-seqs "
                f"{max_num_seqs}{f' x {dp} ranks' if dp > 1 else ''} ({name}): the options do not describe "
                "the measured engine (give its settings, or --vllm-log)")
    return None


#: Options of :func:`replay_options` that are not :class:`~replay.config.ReplayConfig` options.
_NOT_CONFIG = ("vllm_log", "exact_steps")


def replay_config(kwargs: dict, record: RecordOptions | None = None) -> ReplayConfig:
    """The ReplayConfig of the options of :func:`replay_options` (and ``seed``).

    The checks are the library's (:class:`~replay.config.ReplayConfig`): bad values, and
    options the chosen scheduler would ignore (``disagg`` options with another scheduler,
    ``--replicas`` with ``disagg``).
    """
    from ..config import ReplayConfig

    options = {k: v for k, v in kwargs.items() if k not in _NOT_CONFIG}
    return ReplayConfig.from_options(record, bool(kwargs.get("exact_steps")), **options)


def multi_scheduler_config(kwargs: dict) -> tuple[ReplayConfig, DisaggOptions | None]:
    """For runs over several schedulers (``--compare-schedulers``, ``--sweep scheduler=...``):
    the configuration of every run but its scheduler, and the pools of the ``disagg`` runs
    (None when no ``disagg`` option is given); :meth:`ReplayConfig.with_scheduler` combines them.
    """
    from ..config import DisaggOptions

    colocated = {k: v for k, v in kwargs.items() if k not in DISAGG_OPTIONS}
    if colocated.get("scheduler") == "disagg":  # the scheduler of each run comes from the list
        colocated["scheduler"] = "chunked"
    given = {k: kwargs[k] for k in DISAGG_OPTIONS if kwargs.get(k) is not None}
    return replay_config(colocated), DisaggOptions(**given) if given else None


def trace_engine_settings(path) -> dict | None:
    """The engine settings an importer recorded in a trace's metadata
    (:func:`traces.io.recorded_engine_settings`), or None: none recorded, or a file that
    cannot be read here (reading the trace reports that).

    Raises
    ------
    DataError
        A recorded setting that is not valid, naming the file.
    """
    import pyarrow.parquet as pq

    from schemas.tables import table_metadata
    from traces.errors import TraceError
    from traces.io import recorded_engine_settings

    try:
        meta = table_metadata(pq.read_schema(path))
    except (OSError, ValueError, TypeError, ArithmeticError, RecursionError):
        return None
    try:
        return recorded_engine_settings(meta, path)
    except TraceError as exc:
        raise DataError(str(exc)) from None


#: Words a flag setting takes in ``--measured-with`` (``enable_prefix_caching=true``).
_FLAG_WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def parse_measured_with(pairs) -> dict:
    """``--measured-with SETTING=VALUE`` (repeatable) as settings by name: the engine settings the
    trace's run was measured with, when its file does not record them (a trace imported from a
    client's results). The hardware (TP, DP, PP, expert parallelism) is the calibration's or
    ``--tp``'s, not a setting of the run's engine, and is not taken here.

    Raises
    ------
    click.UsageError
        Not ``SETTING=VALUE``, an unknown or hardware setting, a value of the wrong type or range, an
        unknown scheduler, or one setting given twice with different values; naming the pair and
        what is expected.
    """
    from schemas.engine_settings import ALIASES, SETTINGS, problem

    usable = [n for n, spec in SETTINGS.items() if spec.recorded and spec.part != "hardware" and n != "seed"]
    out: dict = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        name, text = ALIASES.get(name.strip(), name.strip()).replace("-", "_"), text.strip()
        if not sep or name not in usable:
            raise click.UsageError(f"--measured-with {pair[:60]!r}: expected SETTING=VALUE with a setting of "
                                   f"{', '.join(usable)}")
        spec = SETTINGS[name]
        value = _measured_value(pair, spec, text)
        why = problem(name, value)
        if why:
            raise click.UsageError(f"--measured-with {pair[:60]!r}: expected {why[1]}")
        if name == "scheduler":
            from ..schedulers import get_scheduler_factory

            try:
                get_scheduler_factory(value)
            except ConfigError as exc:
                raise click.UsageError(f"--measured-with {pair[:60]!r}: {exc}") from None
        if name in out and out[name] != value:
            raise click.UsageError(f"--measured-with gives {name} twice, {out[name]!r} and {value!r}; give it once")
        out[name] = value
    return out


def _measured_value(pair: str, spec, text: str):
    """The value of one ``--measured-with`` pair in ``spec``'s type (a usage error naming the pair if not)."""
    if spec.type is bool:
        if text.lower() not in _FLAG_WORDS:
            raise click.UsageError(f"--measured-with {pair[:60]!r}: expected true or false")
        return _FLAG_WORDS[text.lower()]
    if spec.type is int:
        if not (text.isascii() and text.isdigit()):
            raise click.UsageError(f"--measured-with {pair[:60]!r}: expected a whole number, not {text[:20]!r}")
        return int(text)
    if spec.type is float:
        try:
            return float(text)
        except ValueError:
            raise click.UsageError(f"--measured-with {pair[:60]!r}: expected a number, not {text[:20]!r}") from None
    if not text:
        raise click.UsageError(f"--measured-with {pair[:60]!r}: expected a value after '='")
    return text


def engine_sources(vllm_log: str | None, cal: Calibration | None = None, cal_path=None, trace=None,
                   measured_with: dict | None = None) -> list:
    """The sources of engine settings, first wins: the measured server's log, the settings the
    user says the trace was measured with (``--measured-with``), those recorded in the trace's
    metadata, then the calibration's recorded settings (:func:`fill_engine_options`).

    Raises
    ------
    DataError
        A ``--vllm-log`` that cannot be read or is no vLLM server log (naming the file).
    """
    out = []
    if vllm_log:
        from traces.errors import TraceError
        from traces.importers.vllm_log import engine_settings_from_vllm_log

        try:
            out.append((f"vLLM log {vllm_log}", engine_settings_from_vllm_log(vllm_log)))
        except TraceError as exc:
            raise DataError(f"--vllm-log {exc}") from None
        except OSError as exc:
            raise DataError(f"--vllm-log {vllm_log}: cannot read ({exc.strerror or exc})") from None
    if measured_with:
        out.append(("run's --measured-with", dict(measured_with)))
    recorded = trace_engine_settings(trace) if trace is not None else None
    if recorded:
        out.append((f"trace {trace}", recorded))
    if cal is not None and cal.engine:
        out.append((f"calibration {cal_path}", cal.engine))
    return out


def calibrated_cost_model(path, cal: Calibration, model_spec=None, tp: int | None = None, dp: int | None = None,
                          pp: int | None = None, expert_parallel: bool | None = None):
    """The cost model of calibration file ``path``; a model it cannot build (an unknown
    term, a TP that does not divide the heads) is the file's fault when nothing overrides it.

    Raises
    ------
    DataError
        Naming the file, when the file alone is at fault.
    ConfigError
        When ``--model``, ``--tp``, ``--pp`` or ``--enable-expert-parallel`` makes the combination
        impossible.
    """
    from ..cost.cost_model import cost_model_from_calibration

    try:
        return cost_model_from_calibration(cal, model_spec, tp, dp, pp, expert_parallel=expert_parallel)
    except ConfigError as exc:
        if model_spec is None and tp is None and dp is None and pp is None and expert_parallel is None:
            raise DataError(f"{path}: {exc}") from None
        raise
