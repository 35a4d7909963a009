"""The paged KV cache: a pool of fixed-size blocks with prefix caching by block hash.

This models vLLM v1's ``BlockPool`` (``vllm/v1/core/block_pool.py``) and its
``FreeKVCacheBlockQueue`` (``vllm/v1/core/kv_cache_utils.py``) for a single full-attention
KV cache group. See ``docs/engine-model.md`` for the release followed and the
simplifications.

Vocabulary::

    block        block_size consecutive token slots of one request's KV cache
    ref count    how many live requests hold the block (0 = the block is free)
    block hash   identity of a *full* block's content including its whole prefix:
                 hash(parent block hash, this block's content); two requests may share
                 block i iff their hashes at i are equal
    cached       a full block registered under its hash; it stays cached after it is
                 freed, until it is evicted to be reused for something else

A block is in exactly one of three states::

    in use          ref_count > 0                 (may or may not be cached)
    free, cached    ref_count == 0, has a hash    (an eviction candidate: a prefix hit
                                                   can revive it without recompute)
    free, empty     ref_count == 0, no hash

Free blocks (cached or not) sit in one queue in eviction order: allocation takes the
block at the head (least recently freed) and evicts its hash if it had one; freeing
appends at the tail. A prefix hit on a free cached block pulls it out of the middle of
the queue. Hashes of the blocks that requests compute come from :func:`chain_hash`; a
request may bring the hashes of its prompt blocks (Mooncake traces carry per-512-token
``hash_ids``; :func:`expand_block_hashes` maps them to engine-sized blocks).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Final

__all__ = [
    "BlockPool",
    "chain_block_hashes",
    "chain_hash",
    "expand_block_hashes",
    "unique_block_content",
    "unique_block_hash",
]

_MASK64: Final = (1 << 64) - 1
_ROOT_HASH: Final = 0x6A09E667F3BCC908
"""Parent hash of a request's first block (vLLM's ``NONE_HASH``), a fixed constant."""
_UNIQUE_TAG: Final = 0xB7E151628AED2A6B
"""Salt that keeps request-unique block contents apart from caller-supplied content ids."""


def _mix64(x: int) -> int:
    """A 64-bit finaliser (splitmix64): a bijection that spreads every input bit."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def chain_hash(parent_hash: int | None, content_id: int) -> int:
    """Hash of a full block from its parent block's hash and its own content id.

    This is vLLM's rule ``hash(parent_hash, token_ids)`` with the token ids replaced by an
    integer ``content_id`` that stands for them. ``parent_hash`` is ``None`` for the first
    block of a sequence. Deterministic across processes and platforms (no ``hash()``).
    """
    parent = _ROOT_HASH if parent_hash is None else parent_hash & _MASK64
    return _mix64(_mix64(parent) ^ (content_id & _MASK64))


def chain_block_hashes(content_ids: Iterable[int]) -> list[int]:
    """Chained block hashes for a sequence of per-block content ids.

    ``result[i]`` depends on ``content_ids[0..i]``, so two sequences share a hash at ``i``
    exactly when they share every content id up to ``i`` (barring 64-bit collisions).
    """
    hashes: list[int] = []
    parent: int | None = None
    for content in content_ids:
        parent = chain_hash(parent, content)
        hashes.append(parent)
    return hashes


def unique_block_content(request_salt: int, block_index: int) -> int:
    """Content id of a block that only one request has (its own output, or a prompt block
    whose content the caller did not describe): never shared with another request."""
    return _mix64(_mix64(request_salt ^ _UNIQUE_TAG) ^ block_index)


def unique_block_hash(request_salt: int, block_index: int) -> int:
    """Hash of a request-unique block: a negative integer, so it never equals a chained hash.

    A block whose content only one request has can only be found again by that request
    (after a preemption), so its hash need not chain from its parent; a plain integer keeps
    the hot path free of hashing arithmetic. Indices up to 2³² per request.
    """
    return -(((request_salt & _MASK64) << 32) | block_index) - 1


def expand_block_hashes(
    source_hash_ids: Sequence[int],
    num_prompt_tokens: int,
    *,
    block_size: int,
    source_block_tokens: int = 512,
) -> list[int]:
    """Map a trace's per-``source_block_tokens`` hash ids to the engine's block hashes.

    Mooncake traces give one ``hash_id`` per 512-token block of the prompt (the last one
    possibly partial); equal ids mean equal content. The engine caches blocks of
    ``block_size`` tokens (often 16), so engine block ``i`` covers tokens
    ``[i*block_size, (i+1)*block_size)`` and takes as content the ids of every source
    block that overlaps it together with ``i``; the result is then chained
    (:func:`chain_block_hashes`)::

        source blocks (512):  |        id 7          |        id 9          | id 4 ..
        engine blocks (16):   |b0|b1| ... |b31|b32|b33| ...
        content of b33:       (id 9, 33)

    Only full engine blocks inside the prompt that the source ids cover get a hash
    (``min(num_prompt_tokens, len(source_hash_ids) * source_block_tokens) //
    block_size`` of them): the scheduler gives the rest request-unique hashes. Two
    prompts that share their first ``k`` source ids therefore share the engine blocks
    that lie entirely inside those ``k`` source blocks and inside both prompts.

    Raises:
        ValueError: if a size is not positive or ``num_prompt_tokens`` is negative.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be > 0 (got {block_size})")
    if source_block_tokens <= 0:
        raise ValueError(
            f"source_block_tokens must be > 0 (got {source_block_tokens}); Mooncake traces use 512"
        )
    if num_prompt_tokens < 0:
        raise ValueError(f"num_prompt_tokens must be >= 0 (got {num_prompt_tokens})")
    covered_tokens = min(num_prompt_tokens, len(source_hash_ids) * source_block_tokens)
    contents: list[int] = []
    for i in range(covered_tokens // block_size):
        first = (i * block_size) // source_block_tokens
        last = ((i + 1) * block_size - 1) // source_block_tokens
        content = _mix64(i)
        for j in range(first, last + 1):
            content = _mix64(content ^ (source_hash_ids[j] & _MASK64))
        contents.append(content)
    return chain_block_hashes(contents)


class BlockPool:
    """A pool of ``num_blocks`` KV blocks of ``block_size`` tokens, with prefix caching.

    Contract (mirrors vLLM v1's ``BlockPool``; the scheduler is the only caller):

    * :meth:`allocate` takes ``n`` blocks from the head of the free queue (least recently
      freed first), evicting their cached hashes, and gives each a ref count of 1; it
      returns ``None`` and changes nothing when fewer than ``n`` blocks are free.
    * :meth:`free` drops one reference from each block, in the order given; a block whose
      count reaches 0 is appended to the tail of the free queue, keeping its hash (it
      stays a prefix-cache candidate). Callers pass a request's blocks *last block
      first*, so that a request's tail blocks are evicted before its head blocks.
    * :meth:`find_cached_prefix` returns the blocks cached under the longest prefix of a
      hash list; :meth:`touch` takes a reference on such hits (a free hit leaves the free
      queue without being evicted).
    * :meth:`cache_block` registers a full, in-use block under its hash. A second block
      with a hash that is already cached is kept as a duplicate (vLLM does not
      de-duplicate, so that block tables stay append-only); lookups return the first.

    Invariants (:meth:`check_invariants`): a block is in the free queue iff its ref count
    is 0; ``num_free`` counts the queue; every cached hash maps to blocks that carry it.

    Data structures, chosen for O(1) operations that move many blocks at C speed (the
    simulator takes and frees blocks on every step): the free queue is a ``list[int]``
    of block ids, ``_queue[_head:]``, so that taking ``n`` blocks is a slice and freeing
    is an ``extend``. A prefix hit that revives a free block from the middle of the
    queue (vLLM's ``FreeKVCacheBlockQueue`` unlinks it from a linked list) leaves its
    entry in place as *stale* instead: ``_stale[b]`` counts the stale entries of block
    ``b`` in the queue and ``_num_stale`` all of them. A block's stale entries always
    come before its live one (it can only be freed again after it was revived), so a
    reader that meets an entry of ``b`` while ``_stale[b] > 0`` skips it and counts one
    off. The consumed head is cut off (and stale entries purged) when it grows large.
    Ref counts and hashes are plain lists indexed by block id; the cache is a ``dict``
    from hash to the first block with that hash, plus a small side table for the rare
    duplicates.
    """

    __slots__ = (
        "_block_hash",
        "_block_size",
        "_cached_block",
        "_duplicates",
        "_enable_caching",
        "_head",
        "_num_blocks",
        "_num_evictions",
        "_num_free",
        "_num_hashed",
        "_num_shared_refs",
        "_num_stale",
        "_queue",
        "_ref_count",
        "_stale",
    )

    def __init__(self, num_blocks: int, block_size: int = 16, *, enable_caching: bool = True):
        """Create a pool whose blocks are all free, in block-id order.

        Args:
            num_blocks: usable KV blocks: (GPU memory × utilisation − weights − activation
                reserve) / (block_size × KV bytes per token), computed by the caller.
            block_size: tokens per block.
            enable_caching: keep full blocks cached by hash (prefix caching).

        Raises:
            ValueError: if ``num_blocks`` or ``block_size`` is not a positive integer.
        """
        if num_blocks <= 0:
            raise ValueError(
                f"num_blocks must be > 0 (got {num_blocks}); the model does not fit in "
                "GPU memory: use more GPUs (tensor parallel), a smaller model or a "
                "smaller KV dtype"
            )
        if block_size <= 0:
            raise ValueError(f"block_size must be > 0 (got {block_size}); vLLM uses 16")
        self._num_blocks = num_blocks
        self._block_size = block_size
        self._enable_caching = enable_caching
        self._ref_count: list[int] = [0] * num_blocks
        self._block_hash: list[int | None] = [None] * num_blocks
        self._queue: list[int] = list(range(num_blocks))
        self._head = 0
        self._stale: list[int] = [0] * num_blocks
        self._num_stale = 0
        self._num_free = num_blocks
        self._cached_block: dict[int, int] = {}
        self._duplicates: dict[int, list[int]] = {}
        self._num_hashed = 0
        self._num_evictions = 0
        self._num_shared_refs = 0

    # ----------------------------------------------------------------- properties

    @property
    def num_blocks(self) -> int:
        """Blocks in the pool."""
        return self._num_blocks

    @property
    def block_size(self) -> int:
        """Tokens per block."""
        return self._block_size

    @property
    def enable_caching(self) -> bool:
        """Whether full blocks are cached by hash."""
        return self._enable_caching

    @property
    def num_free(self) -> int:
        """Blocks with ref count 0, cached or not: what an allocation can take."""
        return self._num_free

    @property
    def num_used(self) -> int:
        """Blocks held by at least one request."""
        return self._num_blocks - self._num_free

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, 0.0 to 1.0 (vLLM's ``kv_cache_usage``)."""
        return (self._num_blocks - self._num_free) / self._num_blocks

    @property
    def num_shared_refs(self) -> int:
        """References beyond a block's first, over all blocks: a block held by ``k``
        requests (a prefix-cache hit on a block in use) counts ``k - 1``. Times the block
        size, the KV tokens that a step's sequences read in blocks another of them also
        reads (:attr:`BatchShape.decode_shared_kv_tokens`)."""
        return self._num_shared_refs

    @property
    def num_cached(self) -> int:
        """Blocks that carry a hash (in use or free), duplicates included."""
        return self._num_hashed

    @property
    def num_evictions(self) -> int:
        """Cached blocks evicted so far to make room for allocations."""
        return self._num_evictions

    def ref_count(self, block_id: int) -> int:
        """Requests holding ``block_id``."""
        return self._ref_count[block_id]

    def block_hash(self, block_id: int) -> int | None:
        """The hash ``block_id`` is cached under, or ``None``."""
        return self._block_hash[block_id]

    def cached_block(self, block_hash: int) -> int | None:
        """The block a lookup of ``block_hash`` returns, or ``None`` on a miss."""
        return self._cached_block.get(block_hash)

    def free_queue(self) -> Iterator[int]:
        """Free block ids in eviction order (next to be allocated first)."""
        return iter(self._live_entries(self._num_free))

    # ------------------------------------------------------------------ free queue

    def _live_entries(self, limit: int) -> list[int]:
        """The first ``limit`` live entries of the free queue, in order (read-only)."""
        queue, head = self._queue, self._head
        if not self._num_stale:
            return queue[head : head + limit]
        skip: dict[int, int] = {}
        stale = self._stale
        live: list[int] = []
        for i in range(head, len(queue)):
            if len(live) >= limit:
                break
            b = queue[i]
            if stale[b] > skip.get(b, 0):
                skip[b] = skip.get(b, 0) + 1
            else:
                live.append(b)
        return live

    def _pop_head(self, num_blocks: int) -> list[int]:
        """Remove the first ``num_blocks`` live entries of the queue and return them."""
        queue, head = self._queue, self._head
        if not self._num_stale:
            taken = queue[head : head + num_blocks]
            head += num_blocks
        else:
            stale = self._stale
            taken = []
            while len(taken) < num_blocks:
                b = queue[head]
                head += 1
                if stale[b]:
                    stale[b] -= 1
                    self._num_stale -= 1
                else:
                    taken.append(b)
        self._head = head
        self._num_free -= num_blocks
        if head > 4096 and head * 2 > len(queue):
            del queue[:head]
            self._head = 0
        return taken

    def _purge_stale(self) -> None:
        """Rebuild the queue from its live entries (when stale ones pile up)."""
        self._queue = self._live_entries(self._num_free)
        self._head = 0
        self._stale = [0] * self._num_blocks
        self._num_stale = 0

    # ------------------------------------------------------------------ operations

    def allocate(self, num_blocks: int) -> list[int] | None:
        """Take ``num_blocks`` blocks from the head of the free queue (ref count 1 each).

        Returns ``None`` without changing anything if fewer are free. A cached block that
        is taken loses its hash (eviction).
        """
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0 (got {num_blocks})")
        if num_blocks > self._num_free:
            return None
        return self.take(num_blocks)

    def take(self, num_blocks: int) -> list[int]:
        """Take the first ``num_blocks`` blocks of the free queue, in queue order; the
        caller checked ``num_free`` (:meth:`allocate` is the checked form).

        The taken blocks are the head of the queue: one slice when no entry is stale.

        Raises:
            RuntimeError: if fewer blocks are free (a caller bug, not an overload outcome).
        """
        if not 0 <= num_blocks <= self._num_free:
            raise RuntimeError(
                f"take({num_blocks}) with {self._num_free} free blocks; check num_free first"
            )
        taken = self._pop_head(num_blocks)
        ref = self._ref_count
        if self._num_hashed:
            hashes = self._block_hash
            for b in taken:
                ref[b] = 1
                if hashes[b] is not None:
                    self._evict(b)
        else:  # nothing is cached, so nothing to evict
            for b in taken:
                ref[b] = 1
        return taken

    def allocate_one(self) -> int:
        """Take the block at the head of the free queue; the caller checked ``num_free``.

        Raises:
            RuntimeError: if no block is free (a caller bug, not an overload outcome).
        """
        if not self._num_free:
            raise RuntimeError("allocate_one() on an empty free queue; check num_free first")
        return self.take(1)[0]

    def free(self, block_ids: Iterable[int], *, distinct: bool = False) -> None:
        """Drop one reference from each block, in order (the first freed is evicted first).

        Blocks whose count reaches 0 are gathered and appended to the queue at once (also
        those freed before a double free is found, so the pool stays consistent).
        ``distinct=True`` promises that no block is listed twice (a request's own blocks):
        then, when every block has exactly one holder (no prefix sharing), the counts are
        read and the blocks queued in bulk.

        Raises:
            ValueError: if a block is already free (a double free).
        """
        ref = self._ref_count
        if distinct and isinstance(block_ids, list) and len(block_ids) > 1:
            for b in block_ids:
                if ref[b] != 1:
                    break
            else:
                for b in block_ids:
                    ref[b] = 0
                self._queue += block_ids
                self._num_free += len(block_ids)
                return
        released: list[int] = []
        try:
            for b in block_ids:
                count = ref[b]
                if count <= 0:
                    raise ValueError(f"block {b} freed while free (ref count {count})")
                ref[b] = count - 1
                if count == 1:
                    released.append(b)
                else:
                    self._num_shared_refs -= 1
        finally:
            self._queue += released
            self._num_free += len(released)

    def touch(self, block_ids: Iterable[int]) -> None:
        """Take a reference on blocks found by :meth:`find_cached_prefix` (prefix hits).

        A hit on a free block removes it from the free queue without evicting it.
        """
        ref = self._ref_count
        for b in block_ids:
            if ref[b] == 0:  # its queue entry goes stale (see the class docstring)
                self._stale[b] += 1
                self._num_stale += 1
                self._num_free -= 1
            else:
                self._num_shared_refs += 1
            ref[b] += 1
        if self._num_stale > self._num_blocks:
            self._purge_stale()

    def find_cached_prefix(self, block_hashes: Sequence[int], max_blocks: int) -> list[int]:
        """Blocks cached under ``block_hashes[0]``, ``[1]``, ... up to the first miss.

        At most ``max_blocks`` blocks (the scheduler caps a hit at ``num_tokens - 1``
        tokens so that the last token is recomputed for its logits). Read-only.
        """
        hits: list[int] = []
        if not self._enable_caching:
            return hits
        cached = self._cached_block
        for block_hash in block_hashes[: max(max_blocks, 0)]:
            b = cached.get(block_hash)
            if b is None:
                break
            hits.append(b)
        return hits

    def cache_block(self, block_id: int, block_hash: int) -> None:
        """Register a full, in-use block under ``block_hash`` (no-op without caching).

        Raises:
            ValueError: if the block is free or already cached.
        """
        if not self._enable_caching:
            return
        if self._ref_count[block_id] <= 0:
            raise ValueError(f"block {block_id} cached while free; cache blocks in use only")
        if self._block_hash[block_id] is not None:
            raise ValueError(f"block {block_id} is already cached")
        self._block_hash[block_id] = block_hash
        self._num_hashed += 1
        first = self._cached_block.setdefault(block_hash, block_id)
        if first != block_id:
            self._duplicates.setdefault(block_hash, []).append(block_id)

    def _evict(self, b: int) -> None:
        """Forget block ``b``'s hash (it is being reused for other content)."""
        block_hash = self._block_hash[b]
        if block_hash is None:
            return
        self._block_hash[b] = None
        self._num_hashed -= 1
        self._num_evictions += 1
        dups = self._duplicates.get(block_hash)
        if self._cached_block[block_hash] == b:
            if dups:
                self._cached_block[block_hash] = dups.pop(0)
                if not dups:
                    del self._duplicates[block_hash]
            else:
                del self._cached_block[block_hash]
        elif dups is not None:
            dups.remove(b)
            if not dups:
                del self._duplicates[block_hash]

    def drop_cached(self) -> int:
        """Forget the hash of every free cached block (a restart with a cold prefix cache;
        blocks in use keep theirs). Returns how many were dropped."""
        dropped = 0
        for b in range(self._num_blocks):
            if self._ref_count[b] == 0 and self._block_hash[b] is not None:
                self._evict(b)
                self._num_evictions -= 1  # a flush is not an eviction for reuse
                dropped += 1
        return dropped

    def free_queue_position(self, block_ids: set[int], limit: int) -> int:
        """Index in the free queue of the first block in ``block_ids``, looking at most
        ``limit`` blocks from the head; ``limit`` if none of them is there.

        The decode-run planner uses this to know how many allocations can happen before
        one of a waiting request's prefix hits would be evicted.
        """
        for position, b in enumerate(self._live_entries(limit)):
            if b in block_ids:
                return position
        return limit

    # ------------------------------------------------------------------ invariants

    def check_invariants(self) -> None:
        """Raise ``RuntimeError`` if the pool's bookkeeping is inconsistent.

        Checks: ref counts are >= 0; the free queue holds exactly the blocks with ref
        count 0, each once live, and ``num_free`` counts them; every other entry is a
        stale one, counted in ``_stale`` and ``_num_stale``; every hash in the cache maps
        to blocks that carry it, and every block with a hash is listed exactly once;
        nothing is cached when caching is off.
        """
        n = self._num_blocks
        ref = self._ref_count
        if any(count < 0 for count in ref):
            raise RuntimeError("a block has a negative ref count")
        shared = sum(count - 1 for count in ref if count > 1)
        if shared != self._num_shared_refs:
            raise RuntimeError(f"num_shared_refs is {self._num_shared_refs} but {shared} counted")
        if not 0 <= self._head <= len(self._queue):
            raise RuntimeError(f"free queue head {self._head} is out of range")
        entries = [0] * n
        for b in self._queue[self._head :]:
            if not 0 <= b < n:
                raise RuntimeError(f"free queue holds {b}, not a block")
            entries[b] += 1
        for b in range(n):
            live = 1 if ref[b] == 0 else 0
            if self._stale[b] != entries[b] - live or self._stale[b] < 0:
                raise RuntimeError(
                    f"block {b} (ref count {ref[b]}) has {entries[b]} queue entries but "
                    f"{self._stale[b]} counted stale"
                )
        if sum(self._stale) != self._num_stale:
            raise RuntimeError(f"num_stale is {self._num_stale} but {sum(self._stale)} counted")
        num_zero = sum(1 for count in ref if count == 0)
        if num_zero != self._num_free:
            raise RuntimeError(
                f"{num_zero} blocks have ref count 0 but num_free is {self._num_free}"
            )
        queue = self._live_entries(self._num_free + 1)
        if len(queue) != self._num_free or any(ref[b] != 0 for b in queue):
            raise RuntimeError(f"the live queue entries are not the {num_zero} free blocks")
        self._check_cache()

    def _check_cache(self) -> None:
        listed: set[int] = set()
        for block_hash, b in self._cached_block.items():
            for block in [b, *self._duplicates.get(block_hash, [])]:
                if self._block_hash[block] != block_hash or block in listed:
                    raise RuntimeError(f"cache entry for block {block} is inconsistent")
                listed.add(block)
        if not set(self._duplicates) <= set(self._cached_block):
            raise RuntimeError("a duplicate list has no primary cache entry")
        hashed = {b for b, h in enumerate(self._block_hash) if h is not None}
        if hashed != listed or len(hashed) != self._num_hashed:
            raise RuntimeError(
                f"{len(hashed)} blocks carry a hash, {len(listed)} are listed in the cache, "
                f"num_cached is {self._num_hashed}"
            )
        if hashed and not self._enable_caching:
            raise RuntimeError("blocks are cached although caching is off")
