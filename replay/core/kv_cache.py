"""Paged KV cache of one replica: fixed-size blocks (vLLM PagedAttention), optional prefix caching.

:class:`KVCache` only counts blocks per request (the fast path). :class:`PrefixCachingKVCache`
tracks every block so that full prompt blocks can be shared between requests, with vLLM v1's
automatic-prefix-caching semantics. :func:`make_kv_cache` picks one from the engine settings.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from .prompt_keys import prompt_block_keys
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

    The prefix-cache arguments (``num_cached``) of :meth:`can_allocate` and :meth:`allocate`
    and :meth:`lookup` exist so that schedulers are written once for both caches; without
    prefix caching :meth:`lookup` is always 0.
    """

    __slots__ = ("num_gpu_blocks", "block_size", "num_free_blocks")

    #: Whether full prompt blocks are shared between requests.
    enable_prefix_caching = False

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

    def lookup(self, req: Request) -> int:
        """Prefix-cache hit of ``req`` in tokens (always 0: no prefix caching)."""
        return 0

    def num_resident_prefix_blocks(self, req: Request) -> int:
        """Leading blocks of ``req``'s prompt resident in this cache (always 0 here)."""
        return 0

    def can_allocate(self, req: Request, num_new_tokens: int, num_cached: int = 0) -> bool:
        """Whether the blocks for ``num_new_tokens`` more tokens of ``req`` are free.

        ``num_cached`` is the prefix-cache hit from :meth:`lookup` (0 here).
        """
        return self.num_new_blocks(req, num_new_tokens) <= self.num_free_blocks

    def try_allocate(self, req: Request, num_new_tokens: int, num_cached: int = 0) -> bool:
        """Take the blocks for ``num_new_tokens`` more tokens of ``req`` if they are free
        (:meth:`can_allocate` then :meth:`allocate`, in one call); return whether it did."""
        # num_new_blocks written out: the engine's hot path (once per admission)
        n = -(-(req.num_computed_tokens + num_new_tokens) // self.block_size) - req.num_blocks
        if n > self.num_free_blocks:
            return False
        if n > 0:
            self.num_free_blocks -= n
            req.num_blocks += n
        return True

    def allocate(self, req: Request, num_new_tokens: int, num_cached: int = 0) -> None:
        """Take the blocks for ``num_new_tokens`` more tokens (caller checked ``can_allocate``)."""
        if not self.try_allocate(req, num_new_tokens, num_cached):
            raise AssertionError("allocate() without can_allocate()")

    def allocate_chunks(self, req: Request, chunk_tokens: int, num_chunks: int) -> None:
        """Take the blocks of ``req``'s next ``num_chunks`` prompt chunks of ``chunk_tokens`` tokens
        each (a closed-form run, :func:`replay.core.step_end.allocate_run`), as
        ``allocate(req, i * chunk_tokens)`` for ``i = 1..num_chunks`` does: here, the last call alone."""
        self.allocate(req, num_chunks * chunk_tokens)

    def free(self, req: Request) -> None:
        """Return all blocks of ``req``."""
        self.num_free_blocks += req.num_blocks
        req.num_blocks = 0
        assert self.num_free_blocks <= self.num_gpu_blocks

    @property
    def kv_cache_usage_frac(self) -> float:
        """Fraction of blocks in use, in [0, 1]."""
        return 1.0 - self.num_free_blocks / self.num_gpu_blocks


class PrefixCachingKVCache(KVCache):
    """Paged KV cache with automatic prefix caching, vLLM v1 semantics.

    Parameters
    ----------
    num_gpu_blocks : int
    block_size : int
        Tokens per engine block.
    hash_block_size : int
        Tokens per hash block of the trace's ``block_hashes`` (Mooncake: 512; default: the
        engine block size, one hash per engine block).

    Notes
    -----
    Semantics of vLLM v1's ``KVCacheManager`` (vllm/v1/core/kv_cache_manager.py,
    block_pool.py; design doc fixed in vllm PR #14920; docs/CASES.md BR-14, BR-15):

    * Only full blocks of the prompt are cached, keyed by the chained hash of everything up
      to and including the block (:func:`prompt_block_keys`); generated tokens have no hash
      in a trace and are never shared.
    * A hit is the longest run of resident blocks from position 0 (a missing block breaks
      the chain, llm-d-inference-sim issue #705), capped so the last token is computed:
      at most ``floor((n - 1) / block_size)`` blocks for an ``n``-token prompt (vllm PR #9972).
    * Blocks are reference-counted. A block whose count drops to 0 stays cached and joins
      the tail of the free queue; a request's blocks are freed last-block-first, so its
      tail is evicted first. New blocks are taken from the head (least recently freed),
      evicting the cached content there (LRU).
    * A block is registered in the cache when it is allocated for the step that fills it
      (``cache_blocks`` in ``allocate_slots``), as vLLM v1 does.
    * The lookup is done only at a request's first admission: a recompute-preempted
      request recomputes its context and those tokens are never counted as hits
      (BR-08, vllm issue #25780); a swapped request brings its own KV back.
      ``Request.num_cached_tokens`` is the first admission's hit.

    A token-level radix cache (SGLang) would hit partial blocks too; this one does not.
    """

    __slots__ = ("hash_block_size", "_ref", "_key_of", "_block_of", "_free", "_held")

    enable_prefix_caching = True

    def __init__(self, num_gpu_blocks: int, block_size: int = 16, hash_block_size: int | None = None):
        super().__init__(num_gpu_blocks, block_size)
        self.hash_block_size = hash_block_size or block_size
        if self.hash_block_size < 1:
            raise ValueError("hash_block_size must be >= 1")
        self._ref = [0] * num_gpu_blocks                  # users of each block
        self._key_of: list[int | None] = [None] * num_gpu_blocks  # cached content of each block
        self._block_of: dict[int, int] = {}              # content key -> block holding it
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_gpu_blocks))  # head = next evicted
        self._held: dict[Request, list] = {}              # req -> [block ids, blocks considered for caching]

    def block_keys(self, req: Request) -> list[int]:
        """Content keys of ``req``'s full prompt blocks: ``req.prompt_keys``, computed here the
        first time it is needed (kept on the request until it finishes)."""
        keys = req.prompt_keys
        if keys is None:
            keys = req.prompt_keys = prompt_block_keys(req.block_hashes, req.num_prompt_tokens, self.block_size,
                                                       self.hash_block_size)
        return keys

    def num_resident_prefix_blocks(self, req: Request) -> int:
        """Leading full prompt blocks of ``req`` resident here (no last-token cap).

        Routers ask every replica before the request waits anywhere: keys computed here are
        not kept (a long queue would hold every waiting prompt's keys).
        """
        keys = req.prompt_keys
        if keys is None:
            keys = prompt_block_keys(req.block_hashes, req.num_prompt_tokens, self.block_size, self.hash_block_size)
        m = 0
        block_of = self._block_of
        for key in keys:
            if key not in block_of:
                break
            m += 1
        return m

    def lookup(self, req: Request) -> int:
        """Prefix-cache hit of ``req`` in tokens: 0 unless it is being admitted the first time.

        Full resident blocks from position 0, at most ``floor((num_tokens - 1) / block_size)``.
        """
        if req.num_blocks or req.num_computed_tokens or req.num_preemptions:
            return 0
        cap = (req.num_tokens - 1) // self.block_size
        m = 0
        block_of = self._block_of
        for key in self.block_keys(req):
            if m >= cap or key not in block_of:
                break
            m += 1
        return m * self.block_size

    def _evictable_hits(self, req: Request, num_cached: int) -> int:
        keys = self.block_keys(req)
        return sum(1 for key in keys[:num_cached // self.block_size] if self._ref[self._block_of[key]] == 0)

    def can_allocate(self, req: Request, num_new_tokens: int, num_cached: int = 0) -> bool:
        """Whether ``req`` can take its hit blocks plus the new blocks for ``num_new_tokens`` tokens.

        Hit blocks nobody uses sit in the free queue, so taking them uses free blocks too.
        """
        if not num_cached:
            return self.num_new_blocks(req, num_new_tokens) <= self.num_free_blocks
        need = self.blocks_for(num_cached + num_new_tokens) - num_cached // self.block_size
        return need + self._evictable_hits(req, num_cached) <= self.num_free_blocks

    def try_allocate(self, req: Request, num_new_tokens: int, num_cached: int = 0) -> bool:
        """:meth:`allocate` if :meth:`can_allocate`; returns whether it did."""
        if not self.can_allocate(req, num_new_tokens, num_cached):
            return False
        self._take(req, num_cached, ((num_cached or req.num_computed_tokens) + num_new_tokens,))
        return True

    def allocate(self, req: Request, num_new_tokens: int, num_cached: int = 0) -> None:
        """Take ``req``'s hit blocks (``num_cached`` tokens from :meth:`lookup`) and new blocks.

        With a hit, ``req.num_computed_tokens`` and ``req.num_cached_tokens`` become
        ``num_cached``. Newly filled full prompt blocks are registered in the cache.
        """
        assert self.can_allocate(req, num_new_tokens, num_cached), "allocate() without can_allocate()"
        self._take(req, num_cached, ((num_cached or req.num_computed_tokens) + num_new_tokens,))

    def allocate_chunks(self, req: Request, chunk_tokens: int, num_chunks: int) -> None:
        """Take the blocks of ``req``'s next ``num_chunks`` prompt chunks of ``chunk_tokens`` tokens
        each (a closed-form run, :func:`replay.core.step_end.allocate_run`) in one call: chunk by
        chunk, as ``allocate(req, i * chunk_tokens)`` for ``i = 1..num_chunks`` does (blocks
        already held are not taken again).

        Chunk by chunk matters: a computed block whose content is still cached in a free block is
        not registered, and a later chunk's new blocks may then evict that copy, leaving the
        content uncached; taking every chunk's blocks first would evict the copy before the
        block is computed and cache it there (tests/replay/test_fast_path.py).

        Raises
        ------
        AssertionError
            If the blocks of all the chunks are not free (the caller checks).
        """
        assert self.can_allocate(req, num_chunks * chunk_tokens), "allocate_chunks() without free blocks"
        c = req.num_computed_tokens
        self._take(req, 0, range(c + chunk_tokens, c + num_chunks * chunk_tokens + 1, chunk_tokens))

    def _take(self, req: Request, num_cached: int, ends_tokens: Iterable[int]) -> None:
        """Take ``req``'s hit blocks (``num_cached`` tokens), then, for each of ``ends_tokens`` in
        turn (its KV tokens after a step, ascending, the hit included), the blocks up to it,
        registering that step's newly filled full prompt blocks before the next step takes its
        own. The blocks are known to be free (checked once, by the caller)."""
        held = self._held.get(req)
        if held is None:
            held = self._held[req] = [[], 0]
        blocks = held[0]
        ref, free, key_of, block_of = self._ref, self._free, self._key_of, self._block_of
        keys = self.block_keys(req)
        bs = self.block_size
        if num_cached:
            assert not blocks and not req.num_computed_tokens, "prefix hit for a request holding KV"
            for key in keys[:num_cached // bs]:
                b = block_of[key]
                if ref[b] == 0:
                    del free[b]
                ref[b] += 1
                blocks.append(b)
            held[1] = len(blocks)
            req.num_computed_tokens = num_cached
            req.num_cached_tokens = num_cached
        for end in ends_tokens:
            for _ in range(-(-end // bs) - len(blocks)):
                b, _ = free.popitem(last=False)
                old = key_of[b]
                if old is not None:  # evict the least recently freed cached block
                    del block_of[old]
                    key_of[b] = None
                ref[b] = 1
                blocks.append(b)
            upto = min(len(keys), end // bs)
            for j in range(held[1], upto):
                key = keys[j]
                if key not in block_of:  # a duplicate computed concurrently stays uncached
                    block_of[key] = blocks[j]
                    key_of[blocks[j]] = key
            if upto > held[1]:
                held[1] = upto
        req.num_blocks = len(blocks)
        self.num_free_blocks = len(free)

    def free(self, req: Request) -> None:
        """Release ``req``'s blocks, last block first; cached contents stay until evicted."""
        held = self._held.pop(req, None)
        if held is not None:
            ref, free = self._ref, self._free
            for b in reversed(held[0]):
                ref[b] -= 1
                if ref[b] == 0:
                    free[b] = None
            self.num_free_blocks = len(free)
        req.num_blocks = 0
        if req.num_generated_tokens >= req.num_output_tokens:
            req.prompt_keys = None  # finished: its keys are not needed again
        assert 0 <= self.num_free_blocks <= self.num_gpu_blocks

    def evict(self, key: int) -> None:
        """Drop the cached content ``key`` (a free block); for tests and what-if experiments.

        Raises
        ------
        KeyError
            If ``key`` is not cached.
        ValueError
            If a running request still uses the block.
        """
        b = self._block_of[key]
        if self._ref[b]:
            raise ValueError("cannot evict a block in use")
        del self._block_of[key]
        self._key_of[b] = None

    def check_invariants(self) -> None:
        """Assert the block bookkeeping is consistent (for tests; O(num_gpu_blocks)).

        Every block's reference count equals the requests holding it; the free queue holds
        exactly the unreferenced blocks; the content index and the blocks agree.
        """
        refs = [0] * self.num_gpu_blocks
        for req, (blocks, _) in self._held.items():
            assert len(blocks) == req.num_blocks, (req, len(blocks))
            for b in blocks:
                refs[b] += 1
        assert refs == self._ref, "reference counts differ from the holders"
        assert set(self._free) == {b for b, r in enumerate(refs) if r == 0}, "free queue != unreferenced blocks"
        assert self.num_free_blocks == len(self._free)
        assert all(self._key_of[b] == k for k, b in self._block_of.items()), "content index out of sync"
        assert sum(k is not None for k in self._key_of) == len(self._block_of)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks whose content is registered in the prefix cache (in use or free)."""
        return len(self._block_of)


def make_kv_cache(num_gpu_blocks: int, block_size: int = 16, enable_prefix_caching: bool = False,
                  hash_block_size: int | None = None) -> KVCache:
    """The KV cache of one replica: :class:`PrefixCachingKVCache` when prefix caching is on."""
    if enable_prefix_caching:
        return PrefixCachingKVCache(num_gpu_blocks, block_size, hash_block_size)
    return KVCache(num_gpu_blocks, block_size)
