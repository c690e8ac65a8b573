"""KV-cache capacity: how many paged-KV blocks a replica holds, sized as vLLM sizes them.

vLLM v1 (``gpu_worker.py``, ``kv_cache_utils.py``) requests ``total memory * gpu_memory_utilization``
of each GPU at start-up, refuses to start when less than that is free, and gives the KV cache
what is left of the request after the weights, the peak activations of a profiling run and
the memory outside PyTorch (CUDA context, NCCL buffers). Each GPU of a tensor-parallel replica
holds its share of every block, so the block count is what fits on one GPU (case NC-04). Under
pipeline parallelism each GPU holds the weights and the KV of its stage's ``1 / pp`` of the
layers (vLLM's ``get_pp_indices``), so a GPU holds more blocks than at ``pp`` 1.
"""
from __future__ import annotations

import math

from schemas.specs import GpuSpec, ModelSpec

from ..errors import ConfigError


def kv_block_bytes_per_rank(model: ModelSpec, tp: int, block_size: int, pp: int = 1) -> float:
    """Bytes one KV block (``block_size`` tokens, all layers of a stage) takes on each GPU [bytes].

    ``block_size * model.kv_bytes_per_token_per_rank(tp) / pp``: at TP beyond the KV-head count
    the heads are replicated (case NC-01), MLA's latent is whole on every rank; each of ``pp``
    pipeline stages holds ``1 / pp`` of the layers.
    """
    return block_size * model.kv_bytes_per_token_per_rank(tp) / pp


def kv_capacity_blocks(model: ModelSpec, gpu: GpuSpec, tp: int, gpu_memory_utilization: float,
                       block_size: int, *, activation_bytes: float = 0.0,
                       non_torch_bytes: float = 0.0, free_bytes: float | None = None, pp: int = 1,
                       max_num_seqs: int = 0) -> int:
    """Number of KV blocks a replica of ``tp x pp`` GPUs holds, as vLLM sizes its cache.

    Parameters
    ----------
    model : ModelSpec
        Its ``weight_bytes`` and ``kv_bytes_per_token_per_rank(tp)`` are used; an fp8 KV cache
        (``model.with_kv_cache_dtype("fp8")``) halves the block bytes and doubles the blocks.
    gpu : GpuSpec
        ``mem_bytes`` is the total memory of one GPU [bytes].
    tp : int
        Tensor-parallel degree; each GPU holds ``weight_bytes / tp`` of the weights.
    gpu_memory_utilization : float
        vLLM's ``--gpu-memory-utilization``, in (0, 1].
    block_size : int
        Tokens per block.
    activation_bytes : float, optional
        Peak activation memory of vLLM's profiling run on one GPU [bytes] (default 0).
    non_torch_bytes : float, optional
        Memory outside PyTorch's allocator on one GPU (CUDA context, NCCL) [bytes] (default 0).
    free_bytes : float, optional
        Free memory of one GPU at start-up [bytes], when another process holds some; vLLM
        refuses to start when it is below the requested ``mem_bytes * utilization``.
    pp : int, optional
        Pipeline-parallel stages (default 1); each GPU holds ``1 / pp`` of the layers, their
        weights and their KV. (vLLM v0 then splits the blocks between its ``pp`` virtual
        engines; :func:`replay.core.deployment.resolve_deployment` does.)
    max_num_seqs : int, optional
        vLLM's ``--max-num-seqs`` (default 0): for a model with windowed or linear-attention
        layers, the length-independent state of that many sequences is set aside before the
        blocks are counted (see Notes); nothing for a model with full attention only.

    Returns
    -------
    int
        ``floor((mem_bytes * util - (weight_bytes / (tp pp) + activation_bytes + non_torch_bytes
        + max_num_seqs * seq_state_bytes_per_rank(tp) / pp)) / (block_size * kv_bytes_per_token_per_rank(tp) / pp))``.

    Raises
    ------
    ConfigError
        (a ``ValueError``) for options out of range, when the free memory is below the
        request (the engine would not start; blocks are never derived from free memory), or
        when the weights and the rest do not fit.

    Notes
    -----
    Windowed and linear-attention layers (:meth:`ModelSpec.seq_state_bytes_per_rank`, ``B_seq``
    per sequence): the blocks count the full-attention layers' KV alone, and the memory the others
    can hold at once is set aside, ``n B_seq`` for ``n = min(max_num_seqs, available / (B_seq +
    w D_kv_rank))`` sequences (``w`` the window, at least a block: a sequence holds a whole window
    only once it holds as many tokens of full-attention KV; ``available`` the memory left beside
    the weights). vLLM's hybrid KV-cache manager takes both from one pool as sequences come: the
    set-aside is exact when ``n`` sequences run with whole windows and leaves fewer blocks than
    vLLM would when fewer run; it never exceeds the memory, so the engine always starts.

    Case NC-04: 80 GiB, 18 GiB of weights, activations and non-torch memory, a 2 MiB block
    (32 layers, 8 KV heads, head_dim 128, bf16, 16 tokens): 27,648 blocks at 0.90, 29,696 at
    0.95, 55,296 with an fp8 KV cache at 0.90. Replicated weights under TP (norms, the KV
    projections when TP exceeds the KV heads) are not counted.
    """
    if tp < 1 or block_size < 1 or pp < 1:
        raise ConfigError(f"tp ({tp}), pp ({pp}) and block_size ({block_size}) must be >= 1")
    if not 0 < gpu_memory_utilization <= 1:
        raise ConfigError(f"gpu_memory_utilization must be in (0, 1], not {gpu_memory_utilization}")
    requested = gpu.mem_bytes * gpu_memory_utilization
    if free_bytes is not None and free_bytes < requested:
        raise ConfigError(
            f"{gpu.name}: {free_bytes / 2**30:.2f} GiB free is less than the "
            f"{requested / 2**30:.2f} GiB requested at gpu_memory_utilization="
            f"{gpu_memory_utilization}: vLLM refuses to start; lower the utilization")
    non_kv = model.weight_bytes / (tp * pp) + activation_bytes + non_torch_bytes
    available = requested - non_kv
    state = _state_set_aside_bytes(model, tp, pp, block_size, max_num_seqs, available)
    available -= state
    if available <= 0:
        other = activation_bytes + non_torch_bytes
        raise ConfigError(
            f"{model.name} weights ({model.weight_bytes / 1e9:.1f} GB)"
            f"{f' and {other / 2**30:.2f} GiB per GPU of other non-KV memory' if other else ''}"
            f" do not fit in {tp * pp} x {gpu.name} at gpu_memory_utilization={gpu_memory_utilization}")
    return int(math.floor(available / kv_block_bytes_per_rank(model, tp, block_size, pp)))


def _state_set_aside_bytes(model: ModelSpec, tp: int, pp: int, block_size: int, max_num_seqs: int,
                           available: float) -> float:
    """Memory per GPU set aside for the sequences' window KV and linear-attention state [bytes]
    (:func:`kv_capacity_blocks`, Notes); 0 for full attention only or no memory left."""
    state = model.seq_state_bytes_per_rank(tp) / pp
    if not state or available <= 0:
        return 0.0
    window = max(model.sliding_window_tokens, block_size)
    seqs = min(max_num_seqs, math.floor(available / (state + window * model.kv_bytes_per_token_per_rank(tp) / pp)))
    return seqs * state
