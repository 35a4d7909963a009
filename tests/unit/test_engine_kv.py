"""The KV block pool: allocation order, ref counts, prefix caching and LRU eviction."""

from __future__ import annotations

import pytest

from headway.core.engine.kv import (
    BlockPool,
    chain_block_hashes,
    chain_hash,
    expand_block_hashes,
)


def test_allocate_takes_from_head_and_free_appends_in_given_order() -> None:
    pool = BlockPool(5, 16)
    assert pool.allocate(3) == [0, 1, 2]
    assert pool.num_free == 2
    pool.free([2, 0, 1])
    assert list(pool.free_queue()) == [3, 4, 2, 0, 1]
    assert pool.num_free == 5
    pool.check_invariants()


def test_allocation_that_does_not_fit_changes_nothing() -> None:
    pool = BlockPool(4, 16)
    pool.allocate(3)
    assert pool.allocate(2) is None
    assert pool.num_free == 1
    assert list(pool.free_queue()) == [3]


def test_usage_is_the_fraction_of_blocks_in_use() -> None:
    pool = BlockPool(8, 16)
    held = pool.allocate(2)
    assert held is not None
    assert pool.usage == pytest.approx(0.25)
    pool.free(held)
    assert pool.usage == 0.0


def test_double_free_is_rejected() -> None:
    pool = BlockPool(2, 16)
    (block,) = pool.allocate(1) or []
    pool.free([block])
    with pytest.raises(ValueError, match="freed while free"):
        pool.free([block])


def test_shared_block_is_free_only_after_last_reference() -> None:
    pool = BlockPool(3, 16)
    (block,) = pool.allocate(1) or []
    pool.cache_block(block, 111)
    pool.touch([block])  # a second request hits it
    assert pool.ref_count(block) == 2
    pool.free([block])
    assert pool.num_free == 2
    pool.free([block])
    assert pool.num_free == 3
    assert pool.cached_block(111) == block  # freed but still cached
    pool.check_invariants()


def test_shared_refs_count_every_holder_of_a_block_but_the_first() -> None:
    pool = BlockPool(4, 16)
    blocks = pool.allocate(2) or []
    for b, h in zip(blocks, (1, 2), strict=True):
        pool.cache_block(b, h)
    assert pool.num_shared_refs == 0
    pool.touch(blocks)  # a second request hits both
    pool.touch(blocks[:1])  # a third hits the first
    assert pool.num_shared_refs == 3
    pool.check_invariants()
    pool.free(blocks, distinct=True)  # the first request finishes
    assert pool.num_shared_refs == 1
    pool.free(blocks[:1])
    pool.free(blocks)
    assert (pool.num_shared_refs, pool.num_free) == (0, 4)
    pool.touch(blocks)  # hits on free cached blocks: one holder each
    assert pool.num_shared_refs == 0
    pool.check_invariants()


def test_least_recently_freed_cached_block_is_evicted_first() -> None:
    pool = BlockPool(3, 16)
    a, b, c = pool.allocate(3) or []
    for block, block_hash in ((a, 10), (b, 20), (c, 30)):
        pool.cache_block(block, block_hash)
    pool.free([b])
    pool.free([a])
    pool.free([c])
    assert pool.allocate(1) == [b]
    assert pool.cached_block(20) is None
    assert pool.cached_block(10) == a
    assert pool.cached_block(30) == c
    assert pool.num_evictions == 1
    assert pool.allocate(1) == [a]
    assert pool.cached_block(10) is None
    pool.check_invariants()


def test_prefix_hit_revives_a_free_cached_block_without_evicting_it() -> None:
    pool = BlockPool(4, 16)
    a, b = pool.allocate(2) or []
    pool.cache_block(a, 1)
    pool.cache_block(b, 2)
    pool.free([b, a])
    hits = pool.find_cached_prefix([1, 2, 3], max_blocks=10)
    assert hits == [a, b]
    pool.touch(hits)
    assert pool.num_free == 2
    assert pool.cached_block(1) == a
    assert list(pool.free_queue()) == [2, 3]
    pool.check_invariants()


def test_prefix_lookup_stops_at_the_first_miss_and_at_max_blocks() -> None:
    pool = BlockPool(4, 16)
    blocks = pool.allocate(3) or []
    for block, block_hash in zip(blocks, (1, 2, 4), strict=True):
        pool.cache_block(block, block_hash)
    assert pool.find_cached_prefix([1, 2, 3, 4], max_blocks=10) == blocks[:2]
    assert pool.find_cached_prefix([1, 2, 4], max_blocks=1) == blocks[:1]
    assert pool.find_cached_prefix([9, 1], max_blocks=10) == []


def test_duplicate_hash_is_found_after_the_first_copy_is_evicted() -> None:
    pool = BlockPool(3, 16)
    first, second = pool.allocate(2) or []
    pool.cache_block(first, 7)
    pool.cache_block(second, 7)
    assert pool.cached_block(7) == first
    assert pool.num_cached == 2
    pool.free([first, second])
    assert pool.allocate(2) == [2, first]  # evicts the first copy only
    assert pool.cached_block(7) == second
    pool.check_invariants()


def test_without_caching_nothing_is_cached_or_found() -> None:
    pool = BlockPool(2, 16, enable_caching=False)
    (block,) = pool.allocate(1) or []
    pool.cache_block(block, 5)
    assert pool.block_hash(block) is None
    assert pool.find_cached_prefix([5], max_blocks=1) == []


def test_caching_a_free_or_cached_block_is_rejected() -> None:
    pool = BlockPool(2, 16)
    with pytest.raises(ValueError, match="while free"):
        pool.cache_block(0, 1)
    (block,) = pool.allocate(1) or []
    pool.cache_block(block, 1)
    with pytest.raises(ValueError, match="already cached"):
        pool.cache_block(block, 2)


def test_free_queue_position_finds_the_first_listed_block() -> None:
    pool = BlockPool(6, 16)
    pool.allocate(6)
    pool.free([4, 1, 5, 0])
    assert pool.free_queue_position({5, 0}, limit=10) == 2
    assert pool.free_queue_position({0}, limit=2) == 2  # not within the first two
    assert pool.free_queue_position({2}, limit=10) == 10


def test_check_invariants_detects_a_corrupted_ref_count() -> None:
    pool = BlockPool(3, 16)
    pool.allocate(1)
    pool._ref_count[2] = 1  # corrupt: block 2 is in the free queue
    with pytest.raises(RuntimeError, match="ref count"):
        pool.check_invariants()


def test_check_invariants_detects_a_stale_cache_entry() -> None:
    pool = BlockPool(3, 16)
    (block,) = pool.allocate(1) or []
    pool.cache_block(block, 9)
    pool._block_hash[block] = None  # corrupt: the map still lists it
    with pytest.raises(RuntimeError, match="inconsistent"):
        pool.check_invariants()


def test_pool_sizes_must_be_positive() -> None:
    with pytest.raises(ValueError, match="num_blocks must be > 0"):
        BlockPool(0, 16)
    with pytest.raises(ValueError, match="block_size must be > 0"):
        BlockPool(4, 0)


def test_chain_hash_depends_on_the_whole_prefix() -> None:
    a = chain_block_hashes([1, 2, 3])
    b = chain_block_hashes([9, 2, 3])
    assert a[0] != b[0]
    assert a[1] != b[1]  # same content, different prefix
    assert chain_block_hashes([1, 2, 4])[:2] == a[:2]
    assert a[0] == chain_hash(None, 1)
    assert a[1] == chain_hash(a[0], 2)


def test_expanded_hashes_are_shared_exactly_over_shared_source_blocks() -> None:
    bs, src = 16, 512
    a = expand_block_hashes([7, 9, 4], 3 * src, block_size=bs, source_block_tokens=src)
    b = expand_block_hashes([7, 9, 5], 3 * src, block_size=bs, source_block_tokens=src)
    c = expand_block_hashes([8, 9, 4], 3 * src, block_size=bs, source_block_tokens=src)
    assert len(a) == 3 * src // bs
    per_source = src // bs
    assert a[: 2 * per_source] == b[: 2 * per_source]
    assert a[2 * per_source] != b[2 * per_source]
    assert not set(a) & set(c)  # a different first block changes every hash after it


def test_expanded_hashes_cover_only_full_blocks_inside_prompt_and_ids() -> None:
    # A 1000-token prompt with two 512-token ids: 62 full blocks of 16 tokens.
    assert len(expand_block_hashes([1, 2], 1000, block_size=16)) == 62
    # Ids cover only the first 512 tokens of a 1000-token prompt.
    assert len(expand_block_hashes([1], 1000, block_size=16)) == 32
    # Engine blocks that straddle two source blocks depend on both ids.
    x = expand_block_hashes([1, 2], 1024, block_size=48, source_block_tokens=512)
    y = expand_block_hashes([1, 3], 1024, block_size=48, source_block_tokens=512)
    assert x[:10] == y[:10]  # blocks 0..9 end at token 480 < 512
    assert x[10] != y[10]  # block 10 covers tokens 480..527


def test_expand_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="source_block_tokens"):
        expand_block_hashes([1], 10, block_size=16, source_block_tokens=0)
    with pytest.raises(ValueError, match="block_size"):
        expand_block_hashes([1], 10, block_size=0)


def test_drop_cached_forgets_free_cached_blocks_and_keeps_blocks_in_use() -> None:
    pool = BlockPool(8, block_size=4)
    held = pool.allocate(2)
    free = pool.allocate(2)
    assert held is not None and free is not None
    for i, b in enumerate([*held, *free]):
        pool.cache_block(b, 100 + i)
    pool.free(free)
    assert pool.num_cached == 4
    assert pool.drop_cached() == 2
    assert pool.num_cached == 2 and pool.cached_block(100) == held[0]
    assert pool.cached_block(102) is None and pool.num_evictions == 0
    pool.check_invariants()
