"""Lazy decoding (counters kept as offsets from the scheduler's clock) changes nothing.

Two schedulers run the same random operations in lock step: one with lazy decoding from
one (or three) running requests on, the other with lazy decoding turned off (every
decoding request visited each step, as before it existed). Steps, decode runs of random
lengths, arrivals and aborts (also between ``schedule()`` and ``update_after_step()``)
must give the same plans and outputs, and after every operation every request (finished
and aborted ones too) must read the same counters, blocks and hashes, and both pools must
be identical.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine_configs import CONFIGS, RequestShapes
from headway.core.engine.scheduler import EngineRequest, Scheduler, SchedulerConfig


def eager(config: SchedulerConfig, num_blocks: int) -> Scheduler:
    scheduler = Scheduler(config, num_blocks)
    scheduler.lazy_decoding = False
    return scheduler


def request_state(r: EngineRequest) -> tuple[object, ...]:
    return (
        r.request_id,
        r.status,
        r.num_computed_tokens,
        r.num_output_tokens,
        r.is_decoding,
        list(r.block_ids),
        r._num_cached_blocks,
        list(r.block_hashes),
        r.num_preemptions,
    )


def state(s: Scheduler, requests: list[EngineRequest]) -> tuple[object, ...]:
    pool = s.pool
    blocks = range(pool.num_blocks)
    return (
        [request_state(r) for r in requests],
        [r.request_id for r in s.running],
        [r.request_id for r in s.waiting()],
        list(pool.free_queue()),
        [pool.ref_count(b) for b in blocks],
        [pool.block_hash(b) for b in blocks],
        (s.num_finished, s.num_aborted, s.num_preemptions, s.num_prefix_hit_tokens),
    )


def plan_record(s: Scheduler) -> tuple[object, ...]:
    plan = s.schedule()
    return plan, (
        list(plan.num_scheduled_tokens.items()),
        plan.preempted_ids,
        plan.admitted_ids,
        plan.batch,
        dict(plan.allocated),
    )


@pytest.mark.parametrize(("seed", "min_lazy"), [(0, 1), (1, 1), (2, 3)])
@pytest.mark.parametrize(("config", "num_blocks"), CONFIGS)
def test_lazy_decoding_reads_and_acts_like_visiting_each_request(
    config: SchedulerConfig, num_blocks: int, seed: int, min_lazy: int
) -> None:
    rng = np.random.default_rng(seed)
    shapes = RequestShapes(rng, config, num_blocks)
    lazy, plain = Scheduler(config, num_blocks), eager(config, num_blocks)
    lazy._min_lazy = min_lazy  # lazy from this many running requests (the default is 8)
    made: tuple[list[EngineRequest], list[EngineRequest]] = ([], [])
    num_lazy_steps = 0
    for _ in range(1500):
        if rng.random() < 0.08 and len(made[0]) < 60:
            prompt, output, hashes = shapes.draw()
            priority = int(rng.integers(0, 4))
            rid = f"r{len(made[0])}"
            for s, bucket in zip((lazy, plain), made, strict=True):
                req = EngineRequest(
                    rid,
                    num_prompt_tokens=prompt,
                    max_output_tokens=output,
                    priority=priority,
                    block_hashes=hashes,
                )
                s.add_request(req, 0.0)
                bucket.append(req)
        if made[0] and rng.random() < 0.02:
            rid = made[0][int(rng.integers(0, len(made[0])))].request_id
            assert lazy.abort(rid) == plain.abort(rid)
        limit = lazy.decode_run_limit()
        assert limit == plain.decode_run_limit()
        assert lazy.decode_run_kv_tokens() == plain.decode_run_kv_tokens()
        if limit and rng.random() < 0.5:
            n = int(rng.integers(1, limit + 1))
            a, b = lazy.apply_decode_steps(n), plain.apply_decode_steps(n)
            assert a == b
        elif lazy.has_unfinished_requests:
            plan_a, record_a = plan_record(lazy)
            plan_b, record_b = plan_record(plain)
            assert record_a == record_b
            num_lazy_steps += lazy._pending is not None
            if lazy.num_running and rng.random() < 0.1:  # abort inside the step
                rid = lazy.running[int(rng.integers(0, lazy.num_running))].request_id
                assert lazy.abort(rid) and plain.abort(rid)
            out_a, out_b = lazy.update_after_step(plan_a), plain.update_after_step(plan_b)
            assert list(out_a.tokens.items()) == list(out_b.tokens.items())
            assert out_a.finished_ids == out_b.finished_ids
        assert state(lazy, made[0]) == state(plain, made[1])
        lazy.check_invariants()
        plain.check_invariants()
    assert num_lazy_steps > 0, "the workload never decoded lazily"
