"""The engine's fast paths give exactly what the general ones give.

The simulator's speed rests on shortcuts inside the engine: the free queue of the KV pool
as a list with stale entries, a step in which every running request decodes scheduled in
one pass, decode-run sums kept between calls, decode-run block allocation by slices, and a
closed-form first guess for ``decode_steps_starting_before``. Each is checked here against
a plain reference: a list-based free queue, the general scheduling loop, a bisection.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from engine_configs import CONFIGS, RequestShapes
from headway.core.engine.kv import BlockPool
from headway.core.engine.replica import (
    ReplicaModel,
    StepResult,
    decode_run_duration_s,
    steps_starting_before,
)
from headway.core.engine.scheduler import EngineRequest, SchedulerConfig
from headway.core.engine.steptime import AffineStepTime

STEP_TIME = AffineStepTime(
    overhead_s=0.003,
    per_prefill_token_s=0.00004,
    per_prefill_pair_s=1e-9,
    per_decode_seq_s=0.00007,
    per_decode_kv_token_s=3e-7,
)

# ----------------------------------------------------------------------------- KV pool


class ReferencePool:
    """The free queue as a plain list (``list.remove`` for a revived block) with ref
    counts and a hash cache of primaries and duplicates: slow and obviously right."""

    def __init__(self, num_blocks: int) -> None:
        self.queue = list(range(num_blocks))
        self.ref = [0] * num_blocks
        self.hash: list[int | None] = [None] * num_blocks
        self.cached: dict[int, list[int]] = {}  # hash -> [primary, duplicates...]

    def take(self, n: int) -> list[int]:
        taken, self.queue = self.queue[:n], self.queue[n:]
        for b in taken:
            self.ref[b] = 1
            h = self.hash[b]
            if h is not None:
                self.hash[b] = None
                self.cached[h].remove(b)
                if not self.cached[h]:
                    del self.cached[h]
        return taken

    def free(self, blocks: list[int]) -> None:
        for b in blocks:
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.queue.append(b)

    def touch(self, blocks: list[int]) -> None:
        for b in blocks:
            if self.ref[b] == 0:
                self.queue.remove(b)
            self.ref[b] += 1

    def cache(self, b: int, h: int) -> None:
        self.hash[b] = h
        self.cached.setdefault(h, []).append(b)


def assert_same_pool(pool: BlockPool, ref: ReferencePool) -> None:
    pool.check_invariants()
    assert list(pool.free_queue()) == ref.queue
    assert pool.num_free == len(ref.queue)
    assert [pool.ref_count(b) for b in range(pool.num_blocks)] == ref.ref
    assert [pool.block_hash(b) for b in range(pool.num_blocks)] == ref.hash
    for h, blocks in ref.cached.items():
        assert pool.cached_block(h) == blocks[0]


@pytest.mark.parametrize("seed", range(12))
def test_block_pool_follows_a_plain_free_queue(seed: int) -> None:
    rng = np.random.default_rng(seed)
    num_blocks = int(rng.choice([6, 12, 40]))
    pool, ref = BlockPool(num_blocks, block_size=4), ReferencePool(num_blocks)
    held: dict[int, list[int]] = {}
    next_hash = 0
    for _ in range(400):
        op = rng.integers(0, 5)
        owner = int(rng.integers(0, 6))
        if op == 0:  # take
            n = int(rng.integers(0, 5))
            got = pool.allocate(n)
            if n > pool.num_free + len(got or []):
                assert got is None
            if got is not None:
                assert got == ref.take(n)
                held.setdefault(owner, []).extend(got)
        elif op == 1:  # free an owner's blocks, last first, as the scheduler does
            blocks = held.pop(owner, [])[::-1]
            distinct = len(set(blocks)) == len(blocks)
            pool.free(blocks, distinct=distinct)
            ref.free(blocks)
        elif op == 2:  # cache some of an owner's blocks (duplicates happen)
            for b in held.get(owner, []):
                if pool.block_hash(b) is None and rng.random() < 0.7:
                    next_hash += 1
                    pool.cache_block(b, next_hash % 5)
                    ref.cache(b, next_hash % 5)
        else:  # prefix hits: revive cached blocks, free ones included
            hashes = rng.integers(0, 5, size=int(rng.integers(1, 4))).tolist()
            hits = pool.find_cached_prefix(hashes, len(hashes))
            pool.touch(hits)
            ref.touch(hits)
            held.setdefault(owner, []).extend(hits)
        assert_same_pool(pool, ref)


def test_revived_blocks_leave_stale_entries_that_are_purged() -> None:
    pool, ref = BlockPool(4, block_size=4), ReferencePool(4)
    blocks = pool.take(4)
    ref.take(4)
    for i, b in enumerate(blocks):
        pool.cache_block(b, 100 + i)
        ref.cache(b, 100 + i)
    pool.free(blocks[::-1], distinct=True)
    ref.free(blocks[::-1])
    for _ in range(10):  # revive and free again: more stale entries than blocks
        hits = pool.find_cached_prefix([100, 101], 2)
        pool.touch(hits)
        ref.touch(hits)
        assert_same_pool(pool, ref)
        pool.free(hits[::-1])
        ref.free(hits[::-1])
        assert_same_pool(pool, ref)
    assert pool.take(3) == ref.take(3)
    assert_same_pool(pool, ref)


def test_a_long_queue_is_cut_at_its_head() -> None:
    pool, ref = BlockPool(9000, block_size=4), ReferencePool(9000)
    for n in (5000, 3000, 4000, 2500):
        got = pool.take(n)
        assert got == ref.take(n)
        pool.free(got[::-1], distinct=True)
        ref.free(got[::-1])
        assert_same_pool(pool, ref)


def test_a_double_free_is_caught_even_when_freeing_in_bulk() -> None:
    pool = BlockPool(8, block_size=4)
    a, b = pool.take(2)
    pool.free([a, b], distinct=True)
    with pytest.raises(ValueError, match="freed while free"):
        pool.free([b, a], distinct=True)


# ------------------------------------------------------------------- scheduling paths


@dataclass(frozen=True)
class Arrival:
    time_s: float
    request_id: str
    prompt: int
    output: int
    priority: int
    hashes: tuple[int, ...]
    abort_s: float | None


def make_arrivals(seed: int, config: SchedulerConfig, num_blocks: int) -> list[Arrival]:
    rng = np.random.default_rng(seed)
    shapes = RequestShapes(rng, config, num_blocks)
    arrivals, t = [], 0.0
    for i in range(int(rng.integers(20, 45))):
        t += float(rng.exponential(0.05))
        prompt, output, hashes = shapes.draw()
        abort_s = t + float(rng.exponential(0.3)) if rng.random() < 0.1 else None
        arrivals.append(
            Arrival(t, f"r{i}", prompt, output, int(rng.integers(0, 4)), hashes, abort_s)
        )
    return arrivals


def replay(
    arrivals: list[Arrival], config: SchedulerConfig, num_blocks: int, *, fast: bool, skip: bool
) -> tuple[list[tuple[object, ...]], ReplicaModel]:
    """Drive a replica through the arrivals (and aborts); returns every step's and run's
    outcome. ``fast=False`` turns the all-decoding scheduling pass off."""
    replica = ReplicaModel(config, num_blocks, STEP_TIME)
    if not fast:
        replica.scheduler.decoding_pass = False
    events = sorted(
        [(a.time_s, 0, a) for a in arrivals]
        + [(a.abort_s, 1, a) for a in arrivals if a.abort_s is not None],
        key=lambda e: (e[0], e[1]),
    )
    log: list[tuple[object, ...]] = []
    now, i = 0.0, 0
    while i < len(events) or replica.has_work:
        if not replica.has_work:
            now = max(now, events[i][0])
        while i < len(events) and events[i][0] <= now:
            _, kind, a = events[i]
            i += 1
            if kind == 1:
                replica.abort(a.request_id)
                continue
            req = EngineRequest(
                a.request_id,
                num_prompt_tokens=a.prompt,
                max_output_tokens=a.output,
                priority=a.priority,
                block_hashes=a.hashes,
            )
            replica.add_request(req, now)
        n = replica.max_identical_decode_steps() if skip else 0
        if n and i < len(events):
            n = replica.decode_steps_starting_before(now, events[i][0], n)
        if n:
            run = replica.advance_decode_steps(now, n)
            log.append(("run", run.request_ids, run.finished_ids, run.end_s))
            now = run.end_s
        else:
            result = replica.step(now)
            log.append(step_record(result))
            now = result.end_s
        replica.check_invariants()
    return log, replica


def step_record(result: StepResult) -> tuple[object, ...]:
    return (
        "step",
        result.start_s,
        result.end_s,
        list(result.num_scheduled_tokens.items()),
        list(result.tokens.items()),
        result.finished_ids,
        result.preempted_ids,
        result.admitted_ids,
        result.batch,
    )


def pool_state(replica: ReplicaModel) -> tuple[object, ...]:
    pool = replica.scheduler.pool
    blocks = range(pool.num_blocks)
    return (
        list(pool.free_queue()),
        [pool.ref_count(b) for b in blocks],
        [pool.block_hash(b) for b in blocks],
        pool.num_evictions,
    )


@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(("config", "num_blocks"), CONFIGS)
def test_decoding_pass_schedules_like_the_general_loop(
    config: SchedulerConfig, num_blocks: int, seed: int, skip: bool
) -> None:
    arrivals = make_arrivals(seed, config, num_blocks)
    general, general_replica = replay(arrivals, config, num_blocks, fast=False, skip=skip)
    fast, fast_replica = replay(arrivals, config, num_blocks, fast=True, skip=skip)
    assert fast == general  # bit for bit: same steps, same times
    assert pool_state(fast_replica) == pool_state(general_replica)
    assert fast_replica.num_preemptions == general_replica.num_preemptions


# --------------------------------------------------------- steps before an arrival


def bisect_steps_before(
    now: float, until_s: float, limit: int, shape: tuple[int, int, float, float]
) -> int:
    """The largest k in 1..limit whose step starts before until_s (step 1 starts at now)."""
    num_seqs, kv, base, per_kv = shape
    lo, hi = 1, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if now + decode_run_duration_s(mid - 1, num_seqs, kv, base, per_kv) < until_s:
            lo = mid
        else:
            hi = mid - 1
    return lo


@pytest.mark.parametrize("seed", range(5))
def test_steps_before_an_arrival_agree_with_a_bisection(seed: int) -> None:
    rng = np.random.default_rng(seed)
    replica = ReplicaModel(SchedulerConfig(), 1000, STEP_TIME)
    for _ in range(400):
        shape = (
            int(rng.integers(1, 300)),
            int(rng.integers(0, 10**7)),
            float(rng.choice([0.0, rng.uniform(1e-4, 0.05)])),
            float(rng.choice([0.0, rng.uniform(1e-10, 1e-6)])),
        )
        if shape[2] == 0.0 and shape[3] == 0.0:
            continue  # a step must take time
        now = float(rng.uniform(0, 1e4))
        limit = int(rng.integers(1, 5000))
        horizon = now + decode_run_duration_s(limit, *shape)
        until_s = float(rng.uniform(now, horizon * 1.1 + 1e-3)) if rng.random() < 0.9 else (
            now + decode_run_duration_s(int(rng.integers(0, limit)), *shape)
        )  # fmt: skip
        if until_s > now:
            got = steps_starting_before(now, until_s, limit, *shape)
            assert got == bisect_steps_before(now, until_s, limit, shape)
        else:
            assert replica.decode_steps_starting_before(now, until_s, limit) == 0
