"""``calibrate.fit_traces``: the fit of ``calibrate fit`` as a library call (the command prints
around it). A step trace is fitted by least squares of step durations
(:func:`calibrate.step_fit.fit_steps`); request logs by simulation in the loop
(:func:`calibrate.request_fit.fit_requests`). Imports nothing heavy at module level:
``servecal --help`` loads this package."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, NamedTuple, Sequence

from schemas.cost_params import REQUEST_FIT_FREE, VARIANTS
from schemas.kinds import AGGREGATE_TARGETS, REQUEST_TRACE, STEP_TRACE

from .errors import FitError, RunSpecError

if TYPE_CHECKING:
    import pandas as pd

    from replay.config import ReplayConfig
    from replay.cost.cost_model import RooflineCostModel
    from schemas.calibration import Calibration

#: ``method`` of the calibration of each kind of fit.
METHODS = {STEP_TRACE: "lmfit least_squares of step durations, relative residuals",
           REQUEST_TRACE: "simulation in the loop: lmfit least_squares on relative quantile errors",
           AGGREGATE_TARGETS: ("simulation in the loop: lmfit least_squares on relative errors of reported aggregate "
                               "statistics (percentiles, means), each level's workload synthesized from its recorded "
                               "lengths")}


class Loaded(NamedTuple):
    """The traces as the fit takes them, before it starts (what :func:`fit_traces` passes to
    ``on_loaded``)."""

    #: ``step_trace/1`` or ``request_trace/1``.
    kind: str
    #: Request logs: one :class:`calibrate.run_errors.Run` per run; a step trace: none.
    runs: list
    #: A step trace: its rows (seconds, tokens); request logs: None.
    steps: pd.DataFrame | None
    #: A step trace's ``servecal.*`` metadata; request logs: each run has its own.
    metadata: dict
    #: What was read on the way (the KV cache's size from the logs), one sentence each.
    notes: list[str]


class TracesFit(NamedTuple):
    """What :func:`fit_traces` returns."""

    #: The calibration ``calibrate fit -o`` writes (:meth:`Calibration.write`).
    calibration: Calibration
    #: One :class:`calibrate.fitting.FitResult` per variant, best first (the calibration's).
    fits: list
    #: A step trace: rows left out, reason -> count; request logs: empty.
    dropped: dict
    #: The traces as fitted.
    loaded: Loaded


def fit_traces(traces: Sequence, cost_model: RooflineCostModel, config: ReplayConfig | None = None, *,
               keep: frozenset = frozenset(), fixed: dict | None = None, free: Sequence[str] = REQUEST_FIT_FREE,
               variants: Sequence[str] = tuple(VARIANTS), loss: str = "soft_l1", balance_kinds: bool = True,
               ci: str = "stderr", ci_samples: int = 200, seed: int = 0, jobs: int | None = None,
               ray_address: str | None = None, held_why: dict | None = None,
               on_loaded: Callable[[Loaded], None] | None = None) -> TracesFit:
    """Fit ``cost_model``'s parameters to one step trace or to request logs of one deployment.

    Parameters
    ----------
    traces : sequence of str, os.PathLike or pandas.DataFrame
        One step trace (``step_trace/1`` Parquet), or request logs with measured latencies:
        files (``FILE[#K][@START:END]``, :func:`calibrate.runs.parse_run_spec`) or frames of
        ``request_trace/1`` rows (validated here; named ``traces[i]``).
    cost_model : RooflineCostModel
        The hardware and terms; its parameters are where the fit starts.
    config : ReplayConfig, optional
        Request logs: the measured engine's settings (default: vLLM's), updated per file with
        the settings its importer recorded but those named in ``keep``.
    fixed : dict, optional
        Parameters held at these values (natural units: seconds, fractions).
    free : names of the parameters a request-log fit varies (when they have an effect).
    variants : how compute and memory combine (``max``, ``sum``, ``blend``); each is fitted.
    loss, balance_kinds : a step trace's robust loss and weighting of step kinds.
    ci : ``"stderr"`` or ``"bootstrap"`` (step trace: ``ci_samples`` resamples seeded by ``seed``).
    jobs, ray_address : request logs: local processes, or a Ray cluster, running the starts.
    held_why : dict, optional
        Name -> (why a held parameter is held, whether its source identified it), said in the
        calibration instead of "given" (:func:`mark_held`).
    on_loaded : callable, optional
        Called with the :class:`Loaded` traces before the fit starts (the command prints its
        checks there).

    Returns
    -------
    TracesFit
        The calibration, the fits by variant, the rows dropped and the traces as fitted.

    Raises
    ------
    schemas.errors.SchemaError
        A file that cannot be read or breaks its schema, naming it.
    RunSpecError
        Several step traces, a Ray cluster or a bootstrap for the wrong kind, a bad run spec.
    FitError
        Data that cannot support a fit (too few usable steps, a request log that is not one,
        no request that can be simulated), naming the file or run.
    ConfigError
        Settings that cannot be replayed.
    """
    from schemas.calibration import sha256_of

    from .runs import parse_run_spec

    if not traces:
        raise RunSpecError("no trace to fit")
    specs = [t for t in traces if not _is_frame(t)]
    paths = [parse_run_spec(str(t))[0] for t in specs]
    source = {"paths": [str(s) for s in specs], "sha256": [sha256_of(p) for p in paths]}
    if len(traces) == 1 and specs:
        source = {"path": str(specs[0]), "sha256": source["sha256"][0]}
    loaded = _load(traces, paths, config, keep, cost_model, ray_address, ci)
    source["kind"] = loaded.kind
    if loaded.metadata.get("source_format"):  # a kernel profile's calibration is carried to an engine's runs
        source["format"] = loaded.metadata["source_format"]
    if on_loaded is not None:
        on_loaded(loaded)
    if loaded.kind == STEP_TRACE:
        fits, dropped = _fit_steps(loaded.steps, specs[0], cost_model, variants, loss, fixed, balance_kinds, ci,
                                   ci_samples, seed)
        mark_held(fits, held_why)
        return TracesFit(_calibration(fits, cost_model, STEP_TRACE, source), fits, dropped, loaded)
    from .aggregate_runs import fit_runs
    from .request_fit import engine_settings
    from .step_fit import set_ci95

    fits = fit_runs(loaded.runs, cost_model, variants=tuple(variants), free=tuple(free), fixed=fixed, jobs=jobs,
                    ray_address=ray_address)
    mark_held(fits, held_why)
    set_ci95(fits[0], ci)
    if any(r.targets is not None for r in loaded.runs):
        source["kind"] = AGGREGATE_TARGETS
    cal = _calibration(fits, cost_model, source["kind"], source, engine_settings(loaded.runs[0].config))
    return TracesFit(cal, fits, {}, loaded)


def mark_held(fits: list, held_why: dict | None) -> None:
    """Say why each parameter of ``held_why`` (name -> (why, identified there)) is held, in
    place, in every fit where it is held as "given" (a value taken from another calibration)."""
    for fit in fits:
        for n, (why, identified) in (held_why or {}).items():
            p = fit.params.get(n)
            if p is not None and not p.vary and p.bound == "given":
                p.bound, p.identifiable = why, identified


def _is_frame(trace) -> bool:
    import pandas as pd

    return isinstance(trace, pd.DataFrame)


def _load(traces, paths, config, keep, cost_model, ray_address, ci) -> Loaded:
    """The traces read: the one step trace, or every request log as runs with the KV cache
    their logs show (:func:`_kv_blocks_read`)."""
    from traces.io import read_trace

    if not _is_frame(traces[0]):
        kind, frame, meta = read_trace(paths[0])
        if kind == STEP_TRACE:
            if len(traces) > 1:
                raise RunSpecError("give one step trace (several logs at once are request logs)")
            if ray_address is not None:
                raise RunSpecError("--ray-address: only a request log is fitted by replays; a step trace fits here")
            return Loaded(STEP_TRACE, [], frame, meta, [])
    if ci != "stderr":
        raise RunSpecError("--ci: a bootstrap of a simulation-in-the-loop fit would take hundreds of fits; "
                           "use --ci stderr for request logs")
    if ray_address is not None:
        from replay.ray_tasks import check_ray

        check_ray()
    runs, notes = _kv_blocks_read(_runs(traces, config, keep), cost_model)
    return Loaded(REQUEST_TRACE, runs, None, {}, notes)


def _runs(traces, config, keep) -> list:
    """The request logs of ``traces`` as runs (:func:`calibrate.runs.load_runs`; a frame is
    one run named ``traces[i]``)."""
    from replay.config import ReplayConfig
    from traces.io import read_trace, validated_frame

    from .run_errors import Run
    from .runs import load_runs, named_once

    cfg = config if config is not None else ReplayConfig()
    runs = []
    for i, trace in enumerate(traces):
        if _is_frame(trace):
            runs.append(Run(f"traces[{i}]", validated_frame(trace, REQUEST_TRACE, f"traces[{i}]"), cfg, {}))
        else:
            runs += load_runs([str(trace)], cfg, read_trace, keep=keep)
    return named_once(runs)


def _kv_blocks_read(runs: list, cost_model) -> tuple[list, list[str]]:
    """``runs`` with the KV blocks their logs show when no run records them and none was
    given (:func:`replay.analysis.kv_capacity_log.kv_blocks_from_logs`: the plateau's blocks
    of the logs whose cache fills), and what was read or the bound the logs give.

    The runs are of one deployment, so one size holds for all; the calibration then records
    it among its engine settings, for ``replay`` to take.
    """
    from dataclasses import replace

    from replay.analysis.kv_capacity_log import kv_blocks_from_logs

    if not runs or any(r.config.engine.num_gpu_blocks is not None for r in runs):
        return runs, []
    cfg = runs[0].config
    colocated = cfg.disagg is None and cfg.scheduling.replicas == 1
    blocks, line = kv_blocks_from_logs([(r.name, r.trace) for r in runs], cfg.engine, cost_model, colocated)
    notes = [line] if line else []
    if blocks is None:
        return runs, notes
    return [replace(r, config=r.config.with_options(num_gpu_blocks=blocks)) for r in runs], notes


def _fit_steps(steps, name, cost_model, variants, loss, fixed, balance_kinds, ci, ci_samples, seed):
    """The step trace's fits (best first, intervals set) and the rows it dropped."""
    from .step_fit import StepData, bootstrap_ci95, fit_steps, set_ci95

    try:
        fits, dropped = fit_steps(steps, cost_model, tuple(variants), loss, fixed, balance_kinds)
    except FitError as exc:
        raise FitError(f"{name}: {exc}") from None
    boot = None
    if ci == "bootstrap":
        boot = bootstrap_ci95(StepData(steps, balance_kinds), cost_model, fits[0], loss, ci_samples, seed)
    set_ci95(fits[0], ci, boot)
    return fits, dropped


def _calibration(fits, cost_model, kind, source, engine=None) -> Calibration:
    from .summary import to_calibration

    return to_calibration(fits[0], cost_model, METHODS[kind], source, engine=engine, variants=fits)
