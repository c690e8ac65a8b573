"""Whether ``replay`` reproduces the measured run or asks a what-if of it, and the KV cache of a
what-if at another tensor-parallel degree.

The measured run's settings are those recorded in the trace, the ``--vllm-log`` and the
calibration (:func:`.engine_settings.engine_sources`, first wins), its model, TP and DP
those of the trace's metadata or else the calibration's, its scheduler vLLM's (``chunked``).
An option typed on the command line unlike them makes the replay a what-if: its comparison
with the measured latencies is a baseline, not an error, and ``--tolerance`` does not apply.
"""
from __future__ import annotations

import click

from schemas.calibration import Calibration

from .engine_settings import recorded_setting, typed_unlike_sources

#: The scheduler of the measured run when nothing records one (vLLM v1's).
MEASURED_SCHEDULER = "chunked"


def _typed(name: str) -> bool:
    return click.get_current_context().get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE


def _trace_int(meta: dict | None, key: str) -> int | None:
    v = str((meta or {}).get(key) or "")
    return int(v) if v.isdigit() else None


def _trace_model(meta: dict | None) -> str | None:
    """The model an importer recorded in the trace's metadata, resolved to a catalog name (None:
    none recorded or unknown)."""
    from schemas.errors import SpecError
    from schemas.specs import get_model

    named = (meta or {}).get("model")
    if not named:
        return None
    try:
        return get_model(named).name
    except SpecError:
        return None


def whatif_differences(cal: Calibration, cal_path, model_spec, cost_model, scheduler: str,
                       trace_meta: dict | None = None, trace_path=None, sources: list = ()) -> list[str]:
    """What makes this replay differ from the measured run, one phrase per option
    (``"--tp 2 (the calibration cal.json says 1)"``); empty when it replays the measured run.

    Parameters
    ----------
    cal, cal_path : the calibration and its file.
    model_spec : the ``--model`` given (None: the calibration's).
    cost_model : the replayed one (its ``tp``, ``dp``, ``pp`` and ``expert_parallel``).
    scheduler : the scheduler replayed.
    trace_meta : the trace's ``servecal.*`` metadata (an importer's ``model``, ``tp``).
    trace_path : the trace; the calibration's model, parallelism and scheduler are the measured
        run's only when the calibration was fitted on it (same sha256,
        :func:`replay.report.provenance.in_sample`): replaying another run with a calibration
        carried to its model or TP (a transfer being validated) is not a what-if.
    sources : the engine settings' sources (:func:`.engine_settings.engine_sources`).

    Notes
    -----
    Engine options typed unlike a recorded setting come from
    :func:`.engine_settings.fill_engine_options`; ``--model``, ``--tp`` and
    ``--data-parallel-size``, ``--pp`` and ``--enable-expert-parallel`` are compared with the
    trace's metadata (``--tp``), else the calibration's when it was fitted on this trace; a
    typed ``--scheduler`` that no source records with vLLM's ``chunked``, also only then.
    ``--scheduler disagg`` on a run no source records as disaggregated is always a what-if: its
    pools are other GPUs than the measured run's.
    """
    from ..report.provenance import in_sample

    fitted_here = trace_path is not None and in_sample(trace_path, cal).startswith("in sample")
    out = [f"{f} {given} (the {label} says {value})" for f, given, value, label in typed_unlike_sources()]
    seen = {f for f, *_ in typed_unlike_sources()}
    cal_label = f"calibration {cal_path}"
    cal_or_none = (lambda v: (v, cal_label)) if fitted_here else (lambda v: (None, None))
    if model_spec is not None:
        measured, label = (_trace_model(trace_meta), "trace") if _trace_model(trace_meta) else \
            cal_or_none(cal.model.name)
        if measured is not None and model_spec.name != measured:
            out.append(f"--model {model_spec.name} (the {label} says {measured})")
    for f, name, value, (recorded, label) in (
            ("--tp", "tp", cost_model.tp, (_trace_int(trace_meta, "tp"), "trace") if _trace_int(trace_meta, "tp")
             else cal_or_none(cal.tp)),
            ("--data-parallel-size", "dp", cost_model.dp, cal_or_none(cal.dp)),
            ("--pp", "pp", cost_model.pp, cal_or_none(cal.pp)),
            ("--enable-expert-parallel", "expert_parallel", cost_model.expert_parallel,
             cal_or_none(cal.expert_parallel))):
        if _typed(name) and f not in seen and recorded is not None and value != recorded:
            out.append(f"{f} {value} (the {label} says {recorded})")
    recorded_scheduler = recorded_setting(list(sources), "scheduler")[0]
    if (_typed("scheduler") and "--scheduler" not in seen and fitted_here and scheduler != MEASURED_SCHEDULER
            and recorded_scheduler is None):
        out.append(f"--scheduler {scheduler} (the measured run: vLLM's {MEASURED_SCHEDULER})")
    elif scheduler == "disagg" and recorded_scheduler != "disagg" and "--scheduler" not in seen:
        # other GPUs than the measured run's, whatever the calibration was fitted on: never a validation
        out.append("--scheduler disagg (the measured run records no disaggregated pools)")
    return out


def refuse_tolerance(differences: list[str]) -> None:
    """``--tolerance`` judges a replay of the measured run: a usage error (exit 2) on a what-if."""
    if differences:
        from schemas.text import wrap_error

        raise click.UsageError(wrap_error("--tolerance judges a replay of the measured run, and this one is a "
                                          f"what-if: {'; '.join(differences)}. Drop --tolerance, or the options "
                                          "that differ."))


def rederive_kv_blocks(kwargs: dict, sources: list, cal: Calibration, cost_model) -> str | None:
    """At a TP other than the measured run's, size the KV cache from GPU memory instead of
    keeping the recorded ``num_gpu_blocks`` (in ``kwargs``, in place); what to tell the user.

    The recorded count ``B0`` at TP ``t0`` says how much memory per GPU the run had beside the
    weights and the cache: ``other = mem * util - weights / t0 - B0 * block_bytes(t0) - state(t0)``
    (clipped at 0; ``state`` the ``max_num_seqs`` sequences' window KV and linear-attention state,
    0 for full attention), kept at the new TP ``t``:
    ``floor((mem * util - weights / t - state(t) - other) / block_bytes(t))``
    (:func:`replay.cost.kv_capacity.kv_capacity_blocks`; bytes per GPU, ``block_bytes`` of
    :func:`replay.cost.kv_capacity.kv_block_bytes_per_rank`). A typed ``--num-gpu-blocks`` wins;
    a count recorded at the same TP is kept. Another DP degree keeps the per-rank count
    (each rank has its own cache and GPU).

    Returns
    -------
    str or None
        ``"num_gpu_blocks 2790 (recorded at TP 1) -> 6000 from GPU memory at TP 2 (...)"``.

    Raises
    ------
    ConfigError
        The weights do not fit at the new TP.
    """
    from ..cost.kv_capacity import kv_block_bytes_per_rank, kv_capacity_blocks

    old = kwargs.get("num_gpu_blocks")
    if old is None or _typed("num_gpu_blocks"):
        return None
    _, label = recorded_setting(sources, "num_gpu_blocks")
    settings = dict(sources).get(label) or {}
    t0 = settings.get("tensor_parallel_size") or cal.tp
    t = cost_model.tp
    if t == t0:
        return None
    m, g = cost_model.model, cost_model.gpu
    util, bs, seqs = kwargs["gpu_memory_utilization"], kwargs["block_size"], kwargs.get("max_num_seqs", 0)
    other = max(0.0, g.mem_bytes * util - m.weight_bytes / t0 - old * kv_block_bytes_per_rank(m, t0, bs)
                - seqs * m.seq_state_bytes_per_rank(t0))
    new = kv_capacity_blocks(m, g, t, util, bs, non_torch_bytes=other, max_num_seqs=seqs)
    kwargs["num_gpu_blocks"] = new
    return (f"num_gpu_blocks {old} (recorded at TP {t0}) -> {new} from GPU memory at TP {t} (weights / {t}; the "
            f"{other / 2**30:.2f} GiB per GPU beside weights and KV that the recorded count implies kept; "
            "--num-gpu-blocks overrides)")
