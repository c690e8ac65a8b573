"""The pools of ``--scheduler disagg``: each pool's cost model (its own TP and PP), the KV link between
them, their GPU count and the one-line description a run header prints
(:class:`replay.core.disagg.DisaggEngine` replays through them).
"""
from __future__ import annotations

from dataclasses import replace

from ..config import DisaggOptions, check_link_options
from ..cost.cost_model import LINKS, Link, RooflineCostModel
from ..errors import ConfigError


def pool_cost_models(cost_model: RooflineCostModel, tp_prefill: int | None, tp_decode: int | None,
                     pp_prefill: int | None = None,
                     pp_decode: int | None = None) -> tuple[RooflineCostModel, RooflineCostModel]:
    """The roofline of each pool: ``cost_model`` with the pool's tensor- and pipeline-parallel
    degrees (a pipelined pool's model prices one stage, :mod:`replay.core.pipeline`).

    None keeps ``cost_model.tp`` (``cost_model.pp``). Weights, KV and FLOPs split over the pool's TP and its
    all-reduces are added (:class:`~replay.cost.cost_model.RooflineCostModel`), so each phase is
    timed with its own TP (docs/CASES.md BR-23).

    Raises
    ------
    ConfigError
        A TP below 1.
    """
    out = []
    for name, tp, pp in (("prefill", tp_prefill, pp_prefill), ("decode", tp_decode, pp_decode)):
        for opt, v in ((f"--tp-{name}", tp), (f"--pp-{name}", pp)):
            if v is not None and v < 1:
                raise ConfigError(f"{opt} must be >= 1, not {v}")
        tp_pool = cost_model.tp if tp is None else tp
        pp_pool = cost_model.pp if pp is None else pp
        same = tp_pool == cost_model.tp and pp_pool == cost_model.pp
        out.append(cost_model if same else replace(cost_model, tp=tp_pool, pp=pp_pool))
    return out[0], out[1]


def resolve_link(name: str | None, bandwidth_bytes_per_s: float | None, latency_s: float | None,
                 default: Link) -> Link:
    """The prefill-to-decode link: a preset of :data:`~replay.cost.cost_model.LINKS`, or explicit values.

    Parameters
    ----------
    name : str or None
        Preset name (``pcie4``, ``nvlink4``, ``400gbe``, ...); None takes ``default``.
    bandwidth_bytes_per_s, latency_s : float or None
        Override the preset's bandwidth (bytes/s, > 0) and one-way latency (seconds, >= 0).
    default : Link
        The link when no name is given (the replay uses the GPUs' own ``tp_link``).

    Raises
    ------
    ConfigError
        Unknown preset, bandwidth <= 0 or NaN, latency < 0 or not finite.
    """
    check_link_options(name, bandwidth_bytes_per_s, latency_s)
    base = LINKS[name] if name is not None else default
    if bandwidth_bytes_per_s is None and latency_s is None:
        return base
    return Link(base.name if bandwidth_bytes_per_s is None else "custom",
                base.bandwidth_bytes_per_s if bandwidth_bytes_per_s is None else float(bandwidth_bytes_per_s),
                base.latency_s if latency_s is None else float(latency_s))


def resolve_pools(cost_model: RooflineCostModel,
                  cfg: DisaggOptions) -> tuple[RooflineCostModel, RooflineCostModel, Link]:
    """The prefill pool's and the decode pool's cost models and the KV link of a replay.

    Parameters
    ----------
    cost_model : RooflineCostModel
        The calibrated roofline (its ``tp`` is the default of both pools).
    cfg : replay.config.DisaggOptions
        The pools' TPs and the link (``link``, ``link_bandwidth_bytes_per_s``,
        ``link_latency_s``); with no link given, the GPUs' own ``tp_link`` (the two pools in one
        node, as DistServe's placement puts the two phases of a model stage). The engine's cost of
        a transfer, ``t_kv_migrate_s`` of ``cost_model``, is added to the link's latency (both are
        paid once per transfer: :func:`~replay.cost.cost_model.kv_transfer_time_s`).

    Raises
    ------
    ConfigError
        See :func:`pool_cost_models` and :func:`resolve_link`.
    """
    prefill, decode = pool_cost_models(cost_model, cfg.tp_prefill, cfg.tp_decode, cfg.pp_prefill, cfg.pp_decode)
    link = resolve_link(cfg.link, cfg.link_bandwidth_bytes_per_s, cfg.link_latency_s, prefill.tp_link)
    migrate_s = cost_model.params["t_kv_migrate_s"]
    return prefill, decode, replace(link, latency_s=link.latency_s + migrate_s) if migrate_s else link


def pool_gpus(cost_model: RooflineCostModel, cfg: DisaggOptions) -> int:
    """GPUs of the two pools: prefill instances x their TP x PP x DP + decode instances x theirs, as
    :attr:`replay.core.deployment.Deployment.num_gpus` counts a resolved deployment's pools."""
    prefill, decode, _ = resolve_pools(cost_model, cfg)
    return cfg.prefill_replicas * _instance_gpus(prefill) + cfg.decode_replicas * _instance_gpus(decode)


def _instance_gpus(cost_model: RooflineCostModel) -> int:
    """GPUs of one instance (replica) of a pool: TP x PP x DP."""
    return cost_model.tp * getattr(cost_model, "pp", 1) * getattr(cost_model, "dp", 1)


def describe_config(cost_model: RooflineCostModel, cfg: DisaggOptions) -> str:
    """The resolved pools in one line for a run header, e.g. ``1 prefill x 2 x h100-80gb +
    1 decode x 1 x h100-80gb (3 GPUs; prefill TP=2, decode TP=1), KV link nvlink4 (450 GB/s,
    2 us), first token from prefill`` (``prefill PP=2, decode PP=1`` and ``DP=2`` when used).
    """
    prefill, decode, link = resolve_pools(cost_model, cfg)
    gpus = pool_gpus(cost_model, cfg)
    ppp, ppd, dp = getattr(prefill, "pp", 1), getattr(decode, "pp", 1), getattr(prefill, "dp", 1)
    pps = ("" if ppp == ppd == 1 else f", prefill PP={ppp}, decode PP={ppd}") + (f", DP={dp}" if dp > 1 else "")
    return (f"{cfg.prefill_replicas} prefill x {_instance_gpus(prefill)} x {prefill.gpu.name} + {cfg.decode_replicas} "
            f"decode x {_instance_gpus(decode)} x {decode.gpu.name} ({gpus} GPUs; prefill TP={prefill.tp}, decode "
            f"TP={decode.tp}{pps}), KV link {link.name} "
            f"({link.bandwidth_bytes_per_s / 1e9:g} GB/s, {link.latency_s * 1e6:g} us), "
            f"first token from {cfg.first_token_from}")
