"""Block hashes of prompt text, and the prefix-cache hits they imply.

For sources that record prompts as text but no token ids (GuideLLM): chained hashes of
fixed-size token blocks, placed at a constant number of characters per token, so the
replay's prefix cache (``replay/core/kv_cache.py``) can tell shared prefixes apart.
"""
from __future__ import annotations

import hashlib

import numpy as np

#: Tokens per block of the derived ``block_hashes``: vLLM's default KV block size, so the
#: replay's prefix cache (``replay/core/kv_cache.py``) uses one hash per engine block.
HASH_BLOCK_TOKENS = 16


def text_block_hashes(text: str, num_tokens: int, chars_per_token: float,
                      block_tokens: int = HASH_BLOCK_TOKENS) -> np.ndarray:
    """Chained prefix hashes of the full ``block_tokens``-token blocks of a prompt, from its text.

    Parameters
    ----------
    text : str
        The prompt as sent.
    num_tokens : int
        The prompt's token count (the server's).
    chars_per_token : float
        One ratio for the whole file: total prompt characters / total prompt tokens.
    block_tokens : int
        Tokens per block.

    Returns
    -------
    ndarray of int64, shape (num_tokens // block_tokens,)
        Hash ``k`` = BLAKE2b (8 bytes, big-endian, signed) of the UTF-8 text up to character
        ``round((k + 1) * block_tokens * chars_per_token)``. Equal hashes mean equal text up to
        the block's end, so equal prefixes (Mooncake-style chained hashes: block ``k`` of two
        prompts is shared exactly when their texts agree up to its boundary).

    Notes
    -----
    An approximation of the token boundaries: a tokenizer would place them exactly, this
    places them at a constant number of characters per token. Blocks past the end of the
    text (a prompt with fewer characters per token than the file's) hash the whole text.
    """
    n = int(num_tokens) // block_tokens
    out = np.empty(n, np.int64)
    h = hashlib.blake2b(digest_size=8)
    prev = 0
    for k in range(n):
        end = min(int(round((k + 1) * block_tokens * chars_per_token)), len(text))
        if end > prev:
            h.update(text[prev:end].encode("utf-8"))
            prev = end
        out[k] = int.from_bytes(h.copy().digest(), "big", signed=True)
    return out


def implied_prefix_cache_hits(block_hashes, num_prompt_tokens, block_tokens: int = HASH_BLOCK_TOKENS) -> np.ndarray:
    """Prefix-cache hit (tokens) of each request in order, with an unbounded cache.

    Parameters
    ----------
    block_hashes : sequence of int64 arrays (chained prefix hashes, one per full block) or None
    num_prompt_tokens : sequence of int
    block_tokens : int

    Returns
    -------
    ndarray of int64, shape (n,)
        Leading blocks already seen in an earlier request, times ``block_tokens``, capped at
        ``(n - 1) // block_tokens`` blocks so the last prompt token is computed (vLLM v1,
        ``KVCacheManager.get_computed_blocks``). vLLM's "Prefix cache hit rate" is
        ``sum(hits) / sum(prompt tokens)`` over the requests it has looked up (its
        ``CachingMetrics``, last 1000 requests), so this gives the rate the hashes imply.
    """
    seen: set[int] = set()
    hits = np.zeros(len(num_prompt_tokens), np.int64)
    for i, (hs, n) in enumerate(zip(block_hashes, num_prompt_tokens)):
        if hs is None:
            continue
        cap = (int(n) - 1) // block_tokens
        m = 0
        for h in hs[:cap]:
            if int(h) not in seen:
                break
            m += 1
        hits[i] = m * block_tokens
        seen.update(int(h) for h in hs)
    return hits


def shared_leading_blocks(block_hashes) -> int:
    """Leading blocks whose hash is the same in every one of ``block_hashes`` (non-empty)."""
    hs = [h for h in block_hashes if h is not None]
    if not hs:
        return 0
    m = min(len(h) for h in hs)
    first = hs[0]
    for k in range(m):
        if any(h[k] != first[k] for h in hs[1:]):
            return k
    return m
