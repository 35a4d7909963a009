"""Stateful property tests of the KV block pool and the replica (scheduler + pool).

Every rule is followed by ``check_invariants()``; the machines also keep a simple model
of what must hold (blocks conserved, tokens emitted never exceed a request's output,
finished requests emitted exactly their output) and compare after each rule.
"""

from __future__ import annotations

from collections.abc import Mapping

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from headway.core.engine.kv import BlockPool, chain_block_hashes
from headway.core.engine.replica import ReplicaModel
from headway.core.engine.scheduler import EngineRequest, SchedulerConfig
from headway.core.engine.steptime import AffineStepTime

MACHINE_SETTINGS = settings(
    max_examples=40,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class BlockPoolMachine(RuleBasedStateMachine):
    """Requests allocate, cache, share (prefix hits) and free blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(num_blocks=12, block_size=4)
        self.held: dict[int, list[int]] = {}
        self.next_hash = 0

    @rule(owner=st.integers(0, 5), n=st.integers(0, 5))
    def allocate(self, owner: int, n: int) -> None:
        before = self.pool.num_free
        got = self.pool.allocate(n)
        if got is None:
            assert before < n
            assert self.pool.num_free == before
        else:
            assert len(got) == n
            assert self.pool.num_free == before - n
            self.held.setdefault(owner, []).extend(got)

    @rule(owner=st.integers(0, 5))
    def free(self, owner: int) -> None:
        blocks = self.held.pop(owner, [])
        self.pool.free(reversed(blocks))

    @rule(owner=st.integers(0, 5))
    def cache_unhashed(self, owner: int) -> None:
        for b in self.held.get(owner, []):
            if self.pool.block_hash(b) is None:
                self.next_hash += 1
                self.pool.cache_block(b, self.next_hash % 7)  # duplicates happen

    @rule(owner=st.integers(0, 5), hashes=st.lists(st.integers(0, 7), max_size=4))
    def hit_prefix(self, owner: int, hashes: list[int]) -> None:
        hits = self.pool.find_cached_prefix(hashes, max_blocks=len(hashes))
        for block_hash, b in zip(hashes, hits, strict=False):
            assert self.pool.block_hash(b) == block_hash
        self.pool.touch(hits)
        self.held.setdefault(owner, []).extend(hits)

    @invariant()
    def blocks_are_conserved(self) -> None:
        self.pool.check_invariants()
        refs: dict[int, int] = {}
        for blocks in self.held.values():
            for b in blocks:
                refs[b] = refs.get(b, 0) + 1
        for b in range(self.pool.num_blocks):
            assert self.pool.ref_count(b) == refs.get(b, 0)
        assert self.pool.num_free == self.pool.num_blocks - len(refs)


TestBlockPool = BlockPoolMachine.TestCase
TestBlockPool.settings = MACHINE_SETTINGS


PREFIX_GROUPS = [chain_block_hashes([g * 100 + i for i in range(8)]) for g in range(3)]


class ReplicaMachine(RuleBasedStateMachine):
    """Requests arrive, are aborted, and the replica steps or skips decode runs."""

    def __init__(self) -> None:
        super().__init__()
        self.replica: ReplicaModel
        self.now = 0.0
        self.serial = 0
        self.max_output: dict[str, int] = {}
        self.emitted: dict[str, int] = {}
        self.finished: set[str] = set()
        self.aborted: set[str] = set()

    @initialize(
        num_blocks=st.integers(6, 40),
        block_size=st.sampled_from([2, 4, 16]),
        max_num_seqs=st.integers(1, 6),
        budget=st.integers(8, 96),
        policy=st.sampled_from(["fcfs", "priority"]),
        chunked=st.booleans(),
        caching=st.booleans(),
        watermark=st.sampled_from([0.0, 0.1]),
        reserve_full_isl=st.booleans(),
    )
    def setup(
        self,
        num_blocks: int,
        block_size: int,
        max_num_seqs: int,
        budget: int,
        policy: str,
        chunked: bool,
        caching: bool,
        watermark: float,
        reserve_full_isl: bool,
    ) -> None:
        config = SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max(budget, max_num_seqs),
            block_size=block_size,
            enable_chunked_prefill=chunked,
            enable_prefix_caching=caching,
            policy="priority" if policy == "priority" else "fcfs",
            watermark=watermark,
            reserve_full_isl=reserve_full_isl,
        )
        self.replica = ReplicaModel(config, num_blocks, AffineStepTime())

    @rule(
        prompt=st.integers(1, 80),
        output=st.integers(1, 40),
        priority=st.integers(0, 3),
        group=st.sampled_from([None, 0, 1, 2]),
    )
    def add(self, prompt: int, output: int, priority: int, group: int | None) -> None:
        cfg = self.replica.config
        bs = cfg.block_size
        capacity = self.replica.scheduler.pool.num_blocks * bs
        if not cfg.enable_chunked_prefill:
            capacity = min(capacity, cfg.max_num_batched_tokens)
        prompt = min(prompt, capacity)
        output = max(1, min(output, capacity - prompt + 1))
        hashes = [] if group is None else PREFIX_GROUPS[group][: min(prompt // bs, 8)]
        self.serial += 1
        rid = f"r{self.serial}"
        req = EngineRequest(
            rid,
            num_prompt_tokens=prompt,
            max_output_tokens=output,
            priority=priority,
            block_hashes=hashes,
        )
        self.replica.add_request(req, self.now)
        self.max_output[rid] = output
        self.emitted[rid] = 0

    @precondition(lambda self: bool(self.live()))
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.live())))
        assert self.replica.abort(rid)
        self.aborted.add(rid)

    @rule()
    def step(self) -> None:
        result = self.replica.step(self.now)
        assert result.start_s == self.now
        self.now = result.end_s
        self.record(result.tokens, result.finished_ids)
        assert result.batch.num_tokens <= self.replica.config.max_num_batched_tokens
        if result.is_empty and self.replica.has_work:
            # Only under the priority policy can the first running request preempt itself
            # and end the step with nothing scheduled (vLLM v0.11 does the same).
            assert result.preempted_ids, "a replica with work must make progress"

    @rule(data=st.data())
    def skip_decode_run(self, data: st.DataObject) -> None:
        limit = self.replica.max_identical_decode_steps()
        if limit == 0:
            return
        n = data.draw(st.integers(1, limit))
        run = self.replica.advance_decode_steps(self.now, n)
        assert run.end_s >= self.now
        self.now = run.end_s
        self.record(run.tokens, run.finished_ids)

    def live(self) -> set[str]:
        return set(self.max_output) - self.finished - self.aborted

    def record(self, tokens: Mapping[str, int], finished: tuple[str, ...]) -> None:
        for rid, n in tokens.items():
            assert rid in self.live(), f"{rid} emitted after it ended"
            self.emitted[rid] += n
        for rid in finished:
            assert self.emitted[rid] == self.max_output[rid], rid
            self.finished.add(rid)

    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "replica"):
            return
        self.replica.check_invariants()
        for rid, n in self.emitted.items():
            assert n <= self.max_output[rid]
        snap = self.replica.snapshot()
        assert snap.num_running + snap.num_waiting == len(self.live())
        assert snap.num_finished == len(self.finished)
        assert snap.num_aborted == len(self.aborted)


TestReplica = ReplicaMachine.TestCase
TestReplica.settings = MACHINE_SETTINGS
