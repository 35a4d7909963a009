"""The batch scheduler: token budget, admission, preemption, prefix caching, policies."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from headway.core.engine.kv import chain_block_hashes
from headway.core.engine.request import create_request_queue
from headway.core.engine.scheduler import (
    EngineRequest,
    RequestStatus,
    SchedulePlan,
    Scheduler,
    SchedulerConfig,
    StepOutputs,
)
from headway.core.engine.steptime import prefill_pairs
from headway.core.errors import ConfigError


def make_scheduler(num_blocks: int = 64, **config: Any) -> Scheduler:
    return Scheduler(SchedulerConfig(**config), num_blocks)


def make_request(
    rid: str, prompt: int, output: int, *, priority: int = 0, hashes: list[int] | None = None
) -> EngineRequest:
    return EngineRequest(
        rid,
        num_prompt_tokens=prompt,
        max_output_tokens=output,
        priority=priority,
        block_hashes=hashes or (),
    )


def run_step(sched: Scheduler) -> tuple[SchedulePlan, StepOutputs]:
    plan = sched.schedule()
    outputs = sched.update_after_step(plan)
    sched.check_invariants()
    return plan, outputs


def run_until_idle(sched: Scheduler, max_steps: int = 10_000) -> dict[str, int]:
    emitted: dict[str, int] = {}
    for _ in range(max_steps):
        if not sched.has_unfinished_requests:
            return emitted
        _, outputs = run_step(sched)
        for rid, n in outputs.tokens.items():
            emitted[rid] = emitted.get(rid, 0) + n
    raise AssertionError("the scheduler did not drain")


# ------------------------------------------------------------------ configuration


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_num_seqs", 0),
        ("max_num_batched_tokens", 100),  # < max_num_seqs (256)
        ("block_size", 0),
        ("policy", "lifo"),
        ("long_prefill_token_threshold", -1),
        ("watermark", 1.0),
    ],
)
def test_invalid_config_names_field_value_and_fix(field: str, value: Any) -> None:
    with pytest.raises(ConfigError) as caught:
        SchedulerConfig(**{field: value})
    message = str(caught.value)
    assert f"scheduler.{field}" in message
    assert repr(value) in message
    assert caught.value.path == f"$.{field}"


def test_threshold_requires_chunked_prefill() -> None:
    with pytest.raises(ConfigError, match="enable_chunked_prefill"):
        SchedulerConfig(enable_chunked_prefill=False, long_prefill_token_threshold=64)


def test_unknown_policy_has_no_queue() -> None:
    with pytest.raises(ValueError, match="unknown scheduling policy 'lifo'"):
        create_request_queue("lifo")


def test_unknown_config_keys_are_rejected() -> None:
    with pytest.raises(msgspec.ValidationError, match="max_num_seq"):
        msgspec.convert({"max_num_seq": 4}, SchedulerConfig)
    decoded = msgspec.convert({"max_num_seqs": 4, "policy": "priority"}, SchedulerConfig)
    assert decoded.max_num_seqs == 4


# ------------------------------------------------------------------ the step rule


def test_chunked_prefill_splits_a_long_prompt_under_the_budget() -> None:
    sched = make_scheduler(max_num_batched_tokens=64, max_num_seqs=4)
    sched.add_request(make_request("r", 150, 2), 0.0)
    plans = [run_step(sched) for _ in range(4)]
    assert [dict(p.num_scheduled_tokens) for p, _ in plans] == [
        {"r": 64},
        {"r": 64},
        {"r": 22},
        {"r": 1},
    ]
    assert [dict(o.tokens) for _, o in plans] == [{}, {}, {"r": 1}, {"r": 1}]
    assert plans[1][0].batch.prefill_attention_pairs == prefill_pairs(64, 64)
    assert plans[3][0].batch.num_decode_seqs == 1
    assert plans[3][0].batch.decode_kv_tokens == 150
    assert plans[3][1].finished_ids == ("r",)


def test_running_requests_are_scheduled_before_waiting_ones() -> None:
    sched = make_scheduler(max_num_batched_tokens=32, max_num_seqs=4)
    sched.add_request(make_request("a", 10, 5), 0.0)
    run_step(sched)
    sched.add_request(make_request("b", 100, 5), 1.0)
    plan, _ = run_step(sched)
    assert list(plan.num_scheduled_tokens.items()) == [("a", 1), ("b", 31)]
    assert plan.admitted_ids == ("b",)


def test_long_prefill_threshold_caps_each_chunk() -> None:
    sched = make_scheduler(long_prefill_token_threshold=32)
    sched.add_request(make_request("r", 100, 1), 0.0)
    chunks = [run_step(sched)[0].num_scheduled_tokens["r"] for _ in range(4)]
    assert chunks == [32, 32, 32, 4]


def test_max_num_seqs_limits_the_running_set() -> None:
    sched = make_scheduler(max_num_seqs=2, max_num_batched_tokens=64)
    for rid in "abc":
        sched.add_request(make_request(rid, 8, 4), 0.0)
    plan, _ = run_step(sched)
    assert list(plan.num_scheduled_tokens) == ["a", "b"]
    assert sched.num_running == 2
    assert sched.num_waiting == 1


def test_first_token_comes_with_the_last_prefill_chunk_and_output_is_exact() -> None:
    sched = make_scheduler(max_num_batched_tokens=40, max_num_seqs=4)
    sched.add_request(make_request("r", 70, 5), 0.0)
    first, _ = run_step(sched)
    second, out2 = run_step(sched)
    assert first.num_scheduled_tokens["r"] == 40
    assert second.num_scheduled_tokens["r"] == 30
    assert out2.tokens == {"r": 1}
    emitted = run_until_idle(sched)
    assert emitted == {"r": 4}  # 1 with the prefill + 4 decodes = 5
    assert sched.num_finished == 1


def test_without_chunked_prefill_a_prompt_too_big_for_the_budget_left_is_skipped() -> None:
    sched = make_scheduler(enable_chunked_prefill=False, max_num_batched_tokens=128, max_num_seqs=8)
    sched.add_request(make_request("a", 100, 3), 0.0)
    sched.add_request(make_request("b", 120, 3), 0.0)
    sched.add_request(make_request("c", 20, 3), 0.0)
    plan, _ = run_step(sched)
    assert dict(plan.num_scheduled_tokens) == {"a": 100, "c": 20}
    assert [r.request_id for r in sched.waiting()] == ["b"]
    plan, _ = run_step(sched)
    assert dict(plan.num_scheduled_tokens) == {"a": 1, "c": 1, "b": 120}


# ------------------------------------------------------------------ admission gate


def test_a_request_whose_blocks_do_not_fit_waits() -> None:
    sched = make_scheduler(num_blocks=10)
    sched.add_request(make_request("a", 120, 3), 0.0)  # 8 blocks
    sched.add_request(make_request("b", 64, 2), 0.0)  # 4 blocks, only 2 left
    plans = [run_step(sched)[0] for _ in range(4)]
    assert [list(p.num_scheduled_tokens) for p in plans] == [["a"], ["a"], ["a"], ["b"]]
    assert plans[3].num_scheduled_tokens["b"] == 64
    assert sched.pool.num_free == 10 - 4  # a's blocks came back


def test_watermark_applies_only_when_others_run() -> None:
    sched = make_scheduler(num_blocks=100, watermark=0.1, max_num_batched_tokens=4096)
    sched.add_request(make_request("a", 16 * 80, 2), 0.0)  # 80 blocks
    sched.add_request(make_request("b", 16 * 12, 2), 0.0)  # 12 + 10 > 20 free
    plan, _ = run_step(sched)
    assert list(plan.num_scheduled_tokens) == ["a"]

    no_watermark = make_scheduler(num_blocks=100, max_num_batched_tokens=4096)
    no_watermark.add_request(make_request("a", 16 * 80, 2), 0.0)
    no_watermark.add_request(make_request("b", 16 * 12, 2), 0.0)
    assert list(run_step(no_watermark)[0].num_scheduled_tokens) == ["a", "b"]

    alone = make_scheduler(num_blocks=15, watermark=0.5)  # 7 blocks of watermark
    alone.add_request(make_request("b", 16 * 12, 2), 0.0)  # 12 + 7 > 15, but alone
    assert list(run_step(alone)[0].num_scheduled_tokens) == ["b"]


@pytest.mark.parametrize(("reserve", "admitted"), [(False, ["a", "b"]), (True, ["a"])])
def test_reserve_full_isl_gates_on_the_whole_prompt(reserve: bool, admitted: list[str]) -> None:
    sched = make_scheduler(
        num_blocks=18, max_num_batched_tokens=64, max_num_seqs=4, reserve_full_isl=reserve
    )
    sched.add_request(make_request("a", 48, 10), 0.0)  # 3 blocks
    sched.add_request(make_request("b", 256, 2), 0.0)  # first chunk 16 tokens, 16 blocks in all
    plan, _ = run_step(sched)
    assert list(plan.num_scheduled_tokens) == admitted


# ------------------------------------------------------------------ preemption


def test_decode_that_needs_a_block_preempts_the_newest_request_which_recomputes() -> None:
    sched = make_scheduler(num_blocks=4, enable_prefix_caching=False)
    sched.add_request(make_request("a", 16, 40), 0.0)
    sched.add_request(make_request("b", 16, 40), 0.0)
    b = sched.get_request("b")
    assert b is not None
    for _ in range(100):
        plan, _ = run_step(sched)
        if plan.preempted_ids:
            break
    assert plan.preempted_ids == ("b",)
    assert list(plan.num_scheduled_tokens) == ["a"]
    assert b.status is RequestStatus.PREEMPTED
    assert b.num_computed_tokens == 0
    assert b.block_ids == []
    assert b.num_preemptions == 1
    assert sched.pool.num_free == 1  # a holds 3 of 4 blocks
    tokens_known = b.num_tokens
    emitted = {"a": 0, "b": b.num_output_tokens}
    while sched.has_unfinished_requests:
        plan, outputs = run_step(sched)
        if "b" in plan.admitted_ids:
            assert plan.num_scheduled_tokens["b"] == tokens_known  # recompute all of it
            assert outputs.tokens.get("b") == 1
        for rid, n in outputs.tokens.items():
            emitted[rid] += n
    assert emitted["b"] == 40
    assert sched.num_preemptions == 1


def test_preempted_request_reuses_its_own_cached_blocks() -> None:
    sched = make_scheduler(num_blocks=4)
    sched.add_request(make_request("a", 16, 20), 0.0)
    sched.add_request(make_request("b", 16, 40), 0.0)
    b = sched.get_request("b")
    assert b is not None
    emitted = 0
    while not (step := run_step(sched))[0].preempted_ids:
        emitted += step[1].tokens.get("b", 0)
    assert sched.num_prefix_hit_tokens == 0
    while True:
        plan, outputs = run_step(sched)
        if "b" in plan.admitted_ids:
            break
    # b's first block (16 tokens) survived in the cache; its second was evicted. The hit
    # counts apart from first admissions', as in vLLM's counters (a recompute's own
    # blocks are not a prefix shared between requests).
    assert sched.num_prefix_hit_tokens == 0
    assert sched.num_preempted_hit_tokens == 16
    assert sched.num_preempted_queried_tokens == b.num_tokens - 1  # before its new token
    assert sched.num_prefix_queried_tokens == 32  # a and b, first admitted with 16 each
    assert plan.num_scheduled_tokens["b"] == (b.num_tokens - 1) - 16  # before its new token
    emitted += outputs.tokens["b"] + run_until_idle(sched)["b"]
    assert emitted == 40
    assert b.status is RequestStatus.FINISHED


def test_priority_policy_preempts_the_least_important_even_if_older() -> None:
    sched = make_scheduler(num_blocks=4, enable_prefix_caching=False, policy="priority")
    sched.add_request(make_request("low", 16, 40, priority=5), 0.0)
    sched.add_request(make_request("high", 16, 40, priority=0), 1.0)
    while not (plan := run_step(sched)[0]).preempted_ids:
        pass
    assert plan.preempted_ids == ("low",)
    finished: list[str] = []
    while sched.has_unfinished_requests:
        finished.extend(run_step(sched)[1].finished_ids)
    assert finished == ["high", "low"]


@pytest.mark.parametrize(
    ("policy", "order"), [("fcfs", ["low", "high", "mid"]), ("priority", ["high", "mid", "low"])]
)
def test_waiting_order_follows_the_policy(policy: str, order: list[str]) -> None:
    sched = make_scheduler(max_num_seqs=1, max_num_batched_tokens=64, policy=policy)
    for t, (rid, prio) in enumerate((("low", 3), ("high", 0), ("mid", 1))):
        sched.add_request(make_request(rid, 8, 1, priority=prio), float(t))
    admitted = [rid for _ in range(3) for rid in run_step(sched)[0].admitted_ids]
    assert admitted == order


# ------------------------------------------------------------------ prefix caching


def test_prefix_cache_hit_reduces_the_tokens_to_compute() -> None:
    sched = make_scheduler(num_blocks=32)
    shared = chain_block_hashes([1, 2, 3, 4, 5])
    sched.add_request(make_request("a", 64, 1, hashes=shared[:4]), 0.0)
    run_step(sched)  # a computes 64 tokens and finishes; its blocks stay cached
    sched.add_request(make_request("b", 80, 1, hashes=shared), 1.0)
    plan, _ = run_step(sched)
    assert plan.num_scheduled_tokens == {"b": 16}
    assert plan.batch.prefill_attention_pairs == prefill_pairs(16, 64)
    assert sched.num_prefix_hit_tokens == 64


def test_a_full_hit_still_recomputes_the_last_block() -> None:
    sched = make_scheduler(num_blocks=32)
    shared = chain_block_hashes([1, 2, 3, 4])
    sched.add_request(make_request("a", 64, 1, hashes=shared), 0.0)
    run_step(sched)
    sched.add_request(make_request("c", 64, 2, hashes=shared), 1.0)
    plan, _ = run_step(sched)
    c = sched.get_request("c")
    assert c is not None
    assert c.num_cached_prompt_tokens == 48  # capped at (64 - 1) // 16 blocks
    assert plan.num_scheduled_tokens == {"c": 16}


def test_freed_request_blocks_are_evicted_tail_first() -> None:
    sched = make_scheduler(num_blocks=8)
    hashes = chain_block_hashes([1, 2, 3])
    sched.add_request(make_request("a", 48, 1, hashes=hashes), 0.0)
    run_step(sched)  # a held blocks 0, 1, 2 and freed them last-first
    sched.add_request(make_request("d", 96, 1), 1.0)  # 6 blocks: 5 never used + 1 of a's
    run_step(sched)
    assert sched.pool.cached_block(hashes[2]) is None
    assert sched.pool.cached_block(hashes[0]) == 0
    assert sched.pool.cached_block(hashes[1]) == 1


def test_requests_without_hashes_never_share_blocks() -> None:
    sched = make_scheduler(num_blocks=32)
    sched.add_request(make_request("a", 64, 1), 0.0)
    run_step(sched)
    sched.add_request(make_request("b", 64, 1), 1.0)
    plan, _ = run_step(sched)
    assert plan.num_scheduled_tokens == {"b": 64}


# ------------------------------------------------------------------ requests


def test_abort_frees_blocks_at_once_and_removes_waiting_requests() -> None:
    sched = make_scheduler(num_blocks=8, max_num_seqs=1)
    sched.add_request(make_request("a", 40, 10), 0.0)
    sched.add_request(make_request("b", 8, 2), 0.0)
    run_step(sched)
    assert sched.pool.num_free == 5
    assert sched.abort("a")
    assert sched.pool.num_free == 8
    assert sched.abort("b")
    assert not sched.abort("b")
    assert not sched.has_unfinished_requests
    assert run_step(sched)[0].is_empty
    assert sched.num_aborted == 2


def test_a_request_aborted_after_schedule_emits_nothing() -> None:
    sched = make_scheduler()
    sched.add_request(make_request("a", 10, 3), 0.0)
    plan = sched.schedule()
    sched.abort("a")
    assert sched.update_after_step(plan).tokens == {}
    sched.check_invariants()


@pytest.mark.parametrize(
    ("prompt", "hashes", "config", "match"),
    [
        (16 * 9, [], {}, "needs 10 KV blocks"),  # 9 blocks of prompt + 1 output, pool of 9
        (16, [1, 2], {}, "carries 2 block hashes"),
        (
            120,
            [],
            {"enable_chunked_prefill": False, "max_num_batched_tokens": 64, "max_num_seqs": 8},
            "chunked prefill is off",
        ),
    ],
)
def test_requests_that_could_never_run_are_rejected(
    prompt: int, hashes: list[int], config: dict[str, Any], match: str
) -> None:
    sched = make_scheduler(num_blocks=9, **config)
    with pytest.raises(ValueError, match=match):
        sched.add_request(make_request("x", prompt, 2, hashes=hashes), 0.0)
    assert not sched.has_unfinished_requests


def test_duplicate_and_reused_requests_are_rejected() -> None:
    sched = make_scheduler()
    req = make_request("a", 8, 1)
    sched.add_request(req, 0.0)
    with pytest.raises(ValueError, match="already in this replica"):
        sched.add_request(make_request("a", 8, 1), 0.0)
    run_until_idle(sched)
    with pytest.raises(ValueError, match="already added"):
        sched.add_request(req, 1.0)


def test_request_lengths_must_be_positive() -> None:
    with pytest.raises(ValueError, match="num_prompt_tokens must be >= 1"):
        make_request("a", 0, 1)
    with pytest.raises(ValueError, match="max_output_tokens must be >= 1"):
        make_request("a", 1, 0)
