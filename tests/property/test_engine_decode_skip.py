"""Skipping runs of identical decode steps in closed form equals stepping one by one.

Two drivers replay the same random workload (arrivals, aborts) against two replicas: one
calls ``step()`` every time, the other jumps with ``advance_decode_steps()`` whenever the
replica says identical decode steps are safe (bounded by the next event). Every token's
timestamp must agree to a relative 1e-9, and both replicas must end in the same state.

So must every KV block's: a record of each request's blocks kept from what the steps
(``allocated``, ``preempted_ids``) and the runs (``block_steps``) report, and nothing
else, holds after every step what the request holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from engine_configs import CONFIGS, RequestShapes
from headway.core.engine.replica import ReplicaModel
from headway.core.engine.scheduler import EngineRequest, SchedulerConfig
from headway.core.engine.steptime import AffineStepTime

STEP_TIME = AffineStepTime(
    overhead_s=0.003,
    per_prefill_token_s=0.00004,
    per_prefill_pair_s=1e-9,
    per_decode_seq_s=0.00007,
    per_decode_kv_token_s=3e-7,
    shared_kv_read_ratio=0.13,  # runs over shared prefixes keep their shared reads
)


@dataclass(frozen=True)
class Event:
    time_s: float
    kind: str  # "add" or "abort"
    request_id: str
    prompt: int = 0
    output: int = 0
    priority: int = 0
    hashes: tuple[int, ...] = ()


@dataclass
class Trace:
    token_times: dict[str, list[float]] = field(default_factory=dict)
    block_times: dict[str, list[float]] = field(default_factory=dict)
    """Per request: when each of its blocks was given (a step's start), as reported."""
    held: dict[str, int] = field(default_factory=dict)
    """Per live request: the blocks it holds, as the reports say."""
    skipped_steps: int = 0

    def check_blocks(self, replica: ReplicaModel) -> None:
        """The reports' count of every live request's blocks is the engine's."""
        scheduler = replica.scheduler
        for r in (*scheduler.running, *scheduler.waiting()):
            assert self.held.get(str(r.request_id), 0) == len(r.block_ids), r


def make_workload(
    seed: int, config: SchedulerConfig, num_blocks: int
) -> tuple[list[Event], SchedulerConfig]:
    rng = np.random.default_rng(seed)
    shapes = RequestShapes(rng, config, num_blocks)
    events: list[Event] = []
    t = 0.0
    for i in range(int(rng.integers(20, 45))):
        t += float(rng.exponential(0.05))
        prompt, output, hashes = shapes.draw()
        rid = f"r{i}"
        priority = int(rng.integers(0, 4))
        events.append(Event(t, "add", rid, prompt, output, priority, hashes))
        if rng.random() < 0.1:
            events.append(Event(t + float(rng.exponential(0.3)), "abort", rid))
    events.sort(key=lambda e: e.time_s)
    return events, config


def replay(
    events: list[Event], config: SchedulerConfig, num_blocks: int, skip: bool
) -> tuple[Trace, ReplicaModel]:
    replica = ReplicaModel(config, num_blocks, STEP_TIME)
    trace = Trace()
    now, i = 0.0, 0
    while i < len(events) or replica.has_work:
        if not replica.has_work:
            now = max(now, events[i].time_s)
        while i < len(events) and events[i].time_s <= now:
            event = events[i]
            i += 1
            if event.kind == "abort":
                replica.abort(event.request_id)
                trace.held.pop(event.request_id, None)  # all given back at once
                continue
            req = EngineRequest(
                event.request_id,
                num_prompt_tokens=event.prompt,
                max_output_tokens=event.output,
                priority=event.priority,
                block_hashes=event.hashes,
            )
            replica.add_request(req, now)
            trace.token_times[event.request_id] = []
            trace.block_times[event.request_id] = []
        if skip:
            n = replica.max_identical_decode_steps()
            if n and i < len(events):
                n = replica.decode_steps_starting_before(now, events[i].time_s, n)
            if n:
                run = replica.advance_decode_steps(now, n)
                for rid in run.request_ids:
                    trace.token_times[rid].extend(run.step_end_s(k) for k in range(1, n + 1))
                bs = config.block_size
                sums = run.block_starts_s(bs)
                for (k, ids), (count, starts_s) in zip(run.block_steps, sums, strict=True):
                    starts = [run.step_end_s(x - 1) for x in range(k, n + 1, bs)]
                    assert count == len(starts)
                    assert starts_s == pytest.approx(sum(starts), rel=1e-12)
                    for rid in ids:
                        trace.block_times[str(rid)].extend(starts)
                        trace.held[str(rid)] += len(starts)
                for rid in run.finished_ids:
                    del trace.held[str(rid)]
                trace.check_blocks(replica)
                trace.skipped_steps += n
                now = run.end_s
                replica.check_invariants()
                continue
        result = replica.step(now)
        for rid, count in result.tokens.items():
            trace.token_times[rid].extend([result.end_s] * count)
        for rid in result.preempted_ids:
            trace.held[str(rid)] = 0
        for rid, blocks in result.allocated.items():
            given = blocks - trace.held.get(str(rid), 0)
            assert given > 0, (rid, blocks)
            trace.block_times[str(rid)].extend([now] * given)
            trace.held[str(rid)] = blocks
        for rid in result.finished_ids:
            del trace.held[str(rid)]
        trace.check_blocks(replica)
        now = result.end_s
    replica.check_invariants()
    return trace, replica


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("config", "num_blocks"), CONFIGS)
def test_skipping_decode_runs_gives_the_same_token_and_block_times(
    config: SchedulerConfig, num_blocks: int, seed: int
) -> None:
    events, config = make_workload(seed, config, num_blocks)
    stepped, stepped_replica = replay(events, config, num_blocks, skip=False)
    skipped, skipped_replica = replay(events, config, num_blocks, skip=True)
    assert skipped.skipped_steps > 0, "the workload never exercised the closed form"
    assert stepped.token_times.keys() == skipped.token_times.keys()
    for rid, times in stepped.token_times.items():
        other = skipped.token_times[rid]
        assert len(other) == len(times), rid
        np.testing.assert_allclose(other, times, rtol=1e-9, atol=0.0, err_msg=rid)
    for rid, times in stepped.block_times.items():
        other = skipped.block_times[rid]
        assert len(other) == len(times), rid
        np.testing.assert_allclose(other, times, rtol=1e-9, atol=0.0, err_msg=rid)
    a, b = stepped_replica.snapshot(), skipped_replica.snapshot()
    assert (a.num_steps, a.num_preemptions, a.num_finished, a.num_aborted) == (
        b.num_steps,
        b.num_preemptions,
        b.num_finished,
        b.num_aborted,
    )
    assert (a.num_cached_blocks, a.num_prefix_hit_tokens) == (
        b.num_cached_blocks,
        b.num_prefix_hit_tokens,
    )
    pool_a, pool_b = stepped_replica.scheduler.pool, skipped_replica.scheduler.pool
    assert list(pool_a.free_queue()) == list(pool_b.free_queue())
    assert [pool_a.block_hash(x) for x in range(num_blocks)] == [
        pool_b.block_hash(x) for x in range(num_blocks)
    ]
