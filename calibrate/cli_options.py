"""What ``calibrate``'s options mean: the hardware, the parameters held and freed, the engine
settings of the logs (the commands themselves are in :mod:`calibrate.cli`)."""
from __future__ import annotations

import click

from schemas.cost_params import PARAMS, REQUEST_FIT_FREE, CostParams, check_value
from schemas.engine_settings import of_part
from schemas.errors import SpecError
from schemas.specs import get_gpu, get_model, gpu_from_json, model_from_hf_config
from schemas.text import wrap, wrap_error
from replay.cli.engine_settings import engine_sources, fill_engine_options
from replay.cli.options import HARDWARE_SETTINGS, hardware_options as parallelism_options
from replay.cost.cost_terms import DEFAULT_TERMS, TERMS
from traces.cli.support import DataError


def parse_fixed(items) -> dict:
    """``("t_step_s=2e-4", ...)`` -> ``{"t_step_s": 2e-4}``, each checked against its range and
    given once."""
    out = {}
    for item in items:
        name, sep, val = item.partition("=")
        try:
            v = float(val)
        except ValueError:
            raise click.BadParameter(f"{item!r}: expected NAME=VALUE, e.g. t_step_s=2e-4", param_hint="--fix") from None
        problem = check_value(name.strip(), v) if sep else "expected NAME=VALUE"
        if problem:
            raise click.BadParameter(f"{item!r}: {problem}", param_hint="--fix")
        if name.strip() in out:
            raise click.BadParameter(f"{name.strip()} is given twice ({out[name.strip()]:g} and {v:g})",
                                     param_hint="--fix")
        out[name.strip()] = v
    return out


def held_and_free(fix, fix_from, free, variants, cm) -> tuple[dict, tuple, str, dict, object]:
    """The parameters held (``--fix``, and ``--fix-from``'s values but the ``--free`` ones), the
    names left free, the variants to try (``--fix-from`` alone: ``blend``, its ``overlap``
    held like the rest; ``--free overlap``: ``blend``, the variants that do not hold it),
    why each value taken from ``--fix-from`` is held and whether CAL identified it (name ->
    ``("from CAL", True)``), and ``cm`` with
    ``--fix-from``'s values (the fit starts there, and a freed parameter without effect on
    the data keeps its value there).

    Raises
    ------
    click.UsageError
        A parameter both held and freed, nothing left to fit, ``--fix-from`` without
        ``--free``, or a calibration of another GPU.
    """
    import math

    fixed, names = parse_fixed(fix), parse_names(free, list(PARAMS), "--free")
    free_given = click.get_current_context().get_parameter_source("free") not in (
        None, click.core.ParameterSource.DEFAULT)
    if free_given and set(names) & set(fixed):
        raise click.UsageError(f"{', '.join(n for n in names if n in fixed)}: both held (--fix) and freed (--free)")
    if set(names) <= set(fixed):
        raise click.UsageError("no parameter left to fit: --fix holds every one --free names")
    default_variants = "blend" if free_given and "overlap" in names else "max,sum,blend"  # max and sum hold it
    if fix_from is None:
        return fixed, names, variants or default_variants, {}, cm
    from schemas.calibration import Calibration

    if not free_given:
        raise click.UsageError("--fix-from holds every parameter: name the ones to fit with --free "
                               "(e.g. --free eta_link,t_allreduce_hop_s,t_frontend_s)")
    cal = Calibration.read(fix_from)
    spec = ("peak_flops", "mem_bandwidth_bytes_per_s")
    if [getattr(cal.gpu, k) for k in spec] != [getattr(cm.gpu, k) for k in spec]:
        raise click.UsageError(f"--fix-from {fix_from}: fitted on {cal.gpu.name} ({cal.gpu.peak_flops:.4g} FLOP/s, "
                               f"{cal.gpu.mem_bandwidth_bytes_per_s:.4g} B/s), not {cm.gpu.name} "
                               f"({cm.gpu.peak_flops:.4g}, {cm.gpu.mem_bandwidth_bytes_per_s:.4g}); "
                               "efficiencies do not carry over to another GPU")
    values = {n: p.value for n, p in cal.params.items() if n in PARAMS and not math.isnan(p.value)}
    held = {n: v for n, v in values.items() if n not in names}
    why = {n: (f"from {fix_from}" + ("" if cal.params[n].identifiable else ", NOT IDENTIFIED there"),
               cal.params[n].identifiable) for n in held if n not in fixed}
    return ({**held, **fixed}, names, variants or "blend", why,
            cm.with_params(cm.params.replace(**{**values, **fixed})))


def calibration_sources(path) -> list[tuple[str, str]]:
    """The runs a calibration file was fitted on, as recorded (``(spec, sha256)`` pairs, the
    spec as typed then); none for no file or a source without hashes."""
    if path is None:
        return []
    from schemas.calibration import Calibration

    src = Calibration.read(path).source or {}
    specs, hashes = src.get("paths", [src.get("path")]), src.get("sha256")
    hashes = hashes if isinstance(hashes, list) else [hashes]
    return [(s, h) for s, h in zip(specs, hashes) if isinstance(s, str) and isinstance(h, str)]


def parse_names(text: str, known, option: str) -> tuple:
    """A comma-separated list of names, each one of ``known``."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise click.BadParameter(f"{text!r}: expected names from {', '.join(known)}", param_hint=option)
    return names


def parse_terms(text: str) -> tuple:
    """``--terms``: cost terms by name, or ``+NAME,...`` for the default ones and these."""
    if not text.strip().startswith("+"):
        return parse_names(text, list(TERMS), "--terms")
    added = parse_names(text.replace("+", ""), list(TERMS), "--terms")
    return DEFAULT_TERMS + tuple(n for n in added if n not in DEFAULT_TERMS)


#: ``--tp``... at their declared defaults (1, no expert parallelism).
parallelism = parallelism_options(pp_help=" (a step trace's durations are then one stage's)")


def hardware_options(fn):
    """The hardware of the measured deployment: model, GPU, parallelism (the declared
    settings, :func:`replay.cli.options.hardware_options`), cost terms."""
    opts = [
        click.option("--model", default=None, help="Catalog key or Hugging Face id (see 'calibrate catalog')."),
        click.option("--model-config", type=click.Path(dir_okay=False), default=None,
                     help="A Hugging Face config.json instead of --model (dense, MoE or MLA)."),
        click.option("--gpu", default=None, help="Catalog key or the name nvidia-smi prints."),
        click.option("--gpu-spec", type=click.Path(dir_okay=False), default=None,
                     help="A JSON with name, peak_flops, mem_bandwidth_bytes_per_s, mem_bytes instead of --gpu."),
        parallelism,
        click.option("--terms", default=",".join(DEFAULT_TERMS), show_default=True,
                     help="Cost terms of the step time (replay/cost/cost_terms.py); +NAME,... adds optional "
                          f"ones to these ({', '.join(n for n in TERMS if n not in DEFAULT_TERMS)})."),
        click.option("--fix", multiple=True, metavar="NAME=VALUE", help="Hold a parameter fixed (repeatable)."),
        click.option("--fix-from", type=click.Path(dir_okay=False), default=None, metavar="CAL",
                     help="Hold every parameter at this calibration's value (same GPU, any model) but those "
                          "named by --free, which must then be given; --fix wins. E.g. a TP run's link on "
                          "top of a TP-1 calibration: --free eta_link,t_allreduce_hop_s,t_frontend_s."),
        click.option("--free", default=",".join(REQUEST_FIT_FREE), show_default=True,
                     help="Request logs: parameters fitted when they have an effect."),
        click.option("--variants", default=None,
                     help="How compute and memory combine: max, sum, blend (comma separated) "
                          "[default: all three; the best is written]."),
        click.option("--verbose", is_flag=True, default=False, help="Also print lmfit's own report."),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def cost_model_of(model, model_config, gpu, gpu_spec, tp, dp, expert_parallel, terms, pp=1):
    """The cost model (declared default values) of the hardware options."""
    from replay.cost.cost_model import RooflineCostModel

    model_spec = model_from_options(model, model_config)
    if (gpu is None) == (gpu_spec is None):
        raise click.UsageError("give exactly one of --gpu and --gpu-spec")
    gpu_s = get_gpu(gpu) if gpu else gpu_from_json(gpu_spec)
    return RooflineCostModel(model_spec, gpu_s, CostParams(), tp, dp=dp, expert_parallel=expert_parallel,
                             terms=parse_terms(terms), pp=pp)


def engine_options(replay_kwargs: dict, tp: int, dp: int, expert_parallel: bool, specs=(), pp: int = 1) -> tuple:
    """Fill the replay options (and TP, DP, expert parallelism, PP) not given from ``--vllm-log``,
    then TP and DP from the settings recorded in the first trace of ``specs`` (the runs are of
    one deployment); print what was taken and what differs; return the hardware settings and
    the names of the replay options set here (given, or from the log), which the traces'
    own recorded settings do not override (:func:`calibrate.runs.load_runs`): ``(tp, dp,
    expert_parallel, set_here, pp)``.

    Raises
    ------
    DataError
        A later trace recording another TP or DP degree than the one modelled.
    """
    from replay.cli.engine_settings import trace_engine_settings

    from .runs import parse_run_spec

    ctx = click.get_current_context()
    kw = {**replay_kwargs, "tp": tp, "dp": dp, "expert_parallel": expert_parallel, "pp": pp}
    before = dict(kw)
    for line in fill_engine_options(kw, engine_sources(replay_kwargs.pop("vllm_log", None))):
        click.echo(line, err=True)
    set_here = frozenset(k for k in replay_kwargs if kw[k] != before[k] or ctx.get_parameter_source(k) not in
                         (None, click.core.ParameterSource.DEFAULT))
    if specs:
        recorded = trace_engine_settings(parse_run_spec(specs[0])[0]) or {}
        hardware = {k: kw[k] for k in HARDWARE_SETTINGS}
        for line in fill_engine_options(hardware, [(f"trace {specs[0]}", recorded)]):
            click.echo(line, err=True)
        kw.update(hardware)
    for spec in specs[1:]:  # one deployment: every log at the degrees modelled
        recorded = trace_engine_settings(parse_run_spec(spec)[0]) or {}
        for key, name in ((s.vllm, s.name) for s in of_part("hardware") if s.type is int):  # tp, dp, pp
            if recorded.get(key, kw[name]) != kw[name]:
                raise DataError(wrap_error(f"{spec}: records {key}={recorded[key]}, but the fit models "
                                           f"{name}={kw[name]}; fit or score logs of one deployment together"))
    replay_kwargs.update({k: v for k, v in kw.items() if k in replay_kwargs})
    return kw["tp"], kw["dp"], kw["expert_parallel"], set_here, kw["pp"]


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
            click.echo(wrap(f"warning: the trace says {key} {named!r} ({resolved}); fitting it as --{key} {given}"),
                       err=True)
    if meta.get("tp") and meta["tp"].isdigit() and int(meta["tp"]) != tp:
        click.echo(wrap(f"warning: the trace says tp {meta['tp']}; fitting it as --tp {tp}"), err=True)


def model_from_options(model: str | None, model_config: str | None):
    """The model of ``--model`` or ``--model-config`` (exactly one must be given)."""
    if (model is None) == (model_config is None):
        raise click.UsageError("give exactly one of --model and --model-config")
    return get_model(model) if model else model_from_hf_config(model_config)

