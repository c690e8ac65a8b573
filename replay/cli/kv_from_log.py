"""``replay``: the KV blocks of a measured run that does not record them, read from its log
(:mod:`replay.kv_capacity_log`, issue #21 item 6)."""
from __future__ import annotations

from ..config import EngineOptions
from ..kv_capacity_log import kv_blocks_when_not_recorded
from ..simulate import resolve_num_gpu_blocks


def fill_kv_blocks_from_log(kwargs: dict, frame, cost_model, trace, whatif: bool) -> str | None:
    """Set ``kwargs["num_gpu_blocks"]`` from the measured log when nothing set it; return the
    line to print (None: nothing to say).

    Only for a colocated replay of the run as measured (one replica, no DP or PP, no
    what-if): the log shows the cache of the deployment that wrote it. ``kwargs`` are the
    replay options after the recorded settings filled them (an explicit ``--num-gpu-blocks``
    or a recorded value is never replaced).
    """
    if (kwargs.get("num_gpu_blocks") is not None or whatif or kwargs.get("scheduler") == "disagg"
            or kwargs.get("replicas", 1) != 1 or cost_model.dp != 1 or cost_model.pp != 1):
        return None
    default = resolve_num_gpu_blocks(EngineOptions(gpu_memory_utilization=kwargs["gpu_memory_utilization"],
                                                   block_size=kwargs["block_size"]),
                                     cost_model.model, cost_model.gpu, cost_model.tp)
    blocks, line = kv_blocks_when_not_recorded([(str(trace), frame)], kwargs["block_size"], kwargs["max_num_seqs"],
                                               default)
    if blocks is not None:
        kwargs["num_gpu_blocks"] = blocks
    return line
