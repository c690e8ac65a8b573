"""Content keys of a prompt's full KV blocks, from a trace's hash blocks (prefix caching's identity of a block).

:func:`prompt_block_keys` is what :class:`~replay.core.kv_cache.PrefixCachingKVCache` matches and
registers; :class:`~replay.core.trace_requests.TraceRequests` computes them once per trace when it is
replayed many times.
"""
from __future__ import annotations


def prompt_block_keys(block_hashes, num_prompt_tokens: int, block_size: int, hash_block_size: int) -> list[int]:
    """Content keys of the full engine blocks of a prompt, from the trace's hash blocks.

    Parameters
    ----------
    block_hashes : sequence of int, shape (k,)
        The trace's hash of each ``hash_block_size``-token block of the prompt (Mooncake's
        ``hash_ids``); the last one may cover a partial block.
    num_prompt_tokens : int
    block_size : int
        Tokens per engine KV block.
    hash_block_size : int
        Tokens per hash block of the trace (Mooncake: 512).

    Returns
    -------
    list of int, length ``min(num_prompt_tokens, k * hash_block_size) // block_size``
        Key of engine block ``j`` (tokens ``[j * block_size, (j + 1) * block_size)``).
        Equal keys mean equal content *and* equal prefix.

    Notes
    -----
    Engine block ``j`` lies in the hash block ``i = ((j + 1) * block_size - 1) // hash_block_size``
    that holds its last token (BR-14: 512-token hash blocks over 16-token engine blocks give
    32 engine blocks per hash block). Its key is ``hash((c_i, j))`` with the chained prefix hash
    ``c_i = hash((c_{i-1}, h_i))``, so a block matches only when every hash block up to its own
    matches (vLLM's chained block hashes). Engine blocks past the last hash block are not
    cacheable. Python's hash of ints and tuples is deterministic (PYTHONHASHSEED affects only
    str and bytes); a 64-bit collision is negligible at trace sizes.
    """
    if block_hashes is None:
        return []
    n_full = min(num_prompt_tokens, len(block_hashes) * hash_block_size) // block_size
    if not n_full:
        return []
    used = block_hashes[:(n_full * block_size - 1) // hash_block_size + 1]  # the hash blocks the keys reach
    chains = []
    c = 0
    for h in (used.tolist() if hasattr(used, "tolist") else used):  # an array's items as Python ints, at once
        c = hash((c, int(h)))
        chains.append(c)
    if hash_block_size == block_size:  # one hash per engine block (i = j)
        return [hash((c, j)) for j, c in enumerate(chains)]
    return [hash((chains[((j + 1) * block_size - 1) // hash_block_size], j)) for j in range(n_full)]
