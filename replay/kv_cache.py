"""Paged KV cache of one replica: fixed-size blocks, counted per request (vLLM PagedAttention)."""
from __future__ import annotations

from .request import Request


class KVCache:
    """Block accounting of a paged KV cache.

    Parameters
    ----------
    num_gpu_blocks : int
        Blocks in the cache (capacity ``num_gpu_blocks * block_size`` tokens).
    block_size : int
        Tokens per block (vLLM's default 16).

    Notes
    -----
    A request that will hold ``t`` tokens of KV needs ``ceil(t / block_size)`` blocks
    (Kwon et al., SOSP'23). ``num_free_blocks`` never goes negative nor above capacity.
    """

    __slots__ = ("num_gpu_blocks", "block_size", "num_free_blocks")

    def __init__(self, num_gpu_blocks: int, block_size: int = 16):
        if num_gpu_blocks < 1 or block_size < 1:
            raise ValueError("num_gpu_blocks and block_size must be >= 1")
        self.num_gpu_blocks = num_gpu_blocks
        self.block_size = block_size
        self.num_free_blocks = num_gpu_blocks

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    def num_new_blocks(self, req: Request, num_new_tokens: int) -> int:
        """Blocks ``req`` must add to feed ``num_new_tokens`` more tokens."""
        return max(0, self.blocks_for(req.num_computed_tokens + num_new_tokens) - req.num_blocks)

    def can_allocate(self, req: Request, num_new_tokens: int) -> bool:
        """Whether the blocks for ``num_new_tokens`` more tokens of ``req`` are free."""
        return self.num_new_blocks(req, num_new_tokens) <= self.num_free_blocks

    def allocate(self, req: Request, num_new_tokens: int) -> None:
        """Take the blocks for ``num_new_tokens`` more tokens (caller checked ``can_allocate``)."""
        n = self.num_new_blocks(req, num_new_tokens)
        assert n <= self.num_free_blocks, "allocate() without can_allocate()"
        self.num_free_blocks -= n
        req.num_blocks += n

    def free(self, req: Request) -> None:
        """Return all blocks of ``req``."""
        self.num_free_blocks += req.num_blocks
        req.num_blocks = 0
        assert self.num_free_blocks <= self.num_gpu_blocks

    @property
    def kv_cache_usage_frac(self) -> float:
        """Fraction of blocks in use, in [0, 1]."""
        return 1.0 - self.num_free_blocks / self.num_gpu_blocks
