"""Requests whose prompt KV arrives by transfer (vLLM's KV connector "external computed
tokens"): the decode side of prefill/decode disaggregation."""

from __future__ import annotations

import pytest

from headway.core.engine.replica import ReplicaModel
from headway.core.engine.scheduler import (
    EngineRequest,
    RequestId,
    RequestStatus,
    SchedulePlan,
    Scheduler,
    SchedulerConfig,
    StepOutputs,
)
from headway.core.engine.steptime import AffineStepTime


def _step(sched: Scheduler) -> tuple[SchedulePlan, StepOutputs]:
    plan = sched.schedule()
    outputs = sched.update_after_step(plan)
    sched.check_invariants()
    return plan, outputs


def _decode_side(rid: str, prompt: int, output: int) -> EngineRequest:
    """What the simulator adds to a decode replica: the prompt and the first token known,
    the prompt's KV transferred, ``output - 1`` tokens still to generate."""
    return EngineRequest(
        rid,
        num_prompt_tokens=prompt + 1,
        max_output_tokens=output - 1,
        num_external_computed_tokens=prompt,
    )


def test_external_tokens_get_blocks_and_no_prefill_compute() -> None:
    sched = Scheduler(SchedulerConfig(block_size=16), 64)
    req = _decode_side("a", 100, 5)
    sched.add_request(req, 0.0)
    plan, outputs = _step(sched)
    assert plan.admitted_ids == ("a",)
    assert plan.num_scheduled_tokens == {"a": 1}  # only the first token's KV is computed
    assert plan.batch.num_prefill_tokens == 1
    assert plan.batch.prefill_attention_pairs > 0  # it attends to the transferred KV
    assert outputs.tokens == {"a": 1}
    assert len(req.block_ids) == -(-101 // 16)  # blocks for all 101 known tokens
    assert req.num_cached_prompt_tokens == 0  # nothing came from the prefix cache
    assert sched.num_prefix_hit_tokens == 0
    emitted = 1
    while sched.has_unfinished_requests:
        plan, outputs = _step(sched)
        assert plan.batch.num_prefill_tokens == 0 and plan.batch.num_decode_seqs == 1
        emitted += outputs.tokens.get("a", 0)
    assert emitted == 4
    assert req.status is RequestStatus.FINISHED
    assert sched.pool.num_used == 0


def test_zero_external_tokens_changes_nothing() -> None:
    def run(external: bool) -> list[dict[RequestId, int]]:
        sched = Scheduler(SchedulerConfig(block_size=16, max_num_batched_tokens=256), 64)
        for i in range(3):
            if external:
                req = EngineRequest(
                    i, num_prompt_tokens=300, max_output_tokens=7, num_external_computed_tokens=0
                )
            else:
                req = EngineRequest(i, num_prompt_tokens=300, max_output_tokens=7)
            sched.add_request(req, 0.0)
        plans: list[dict[RequestId, int]] = []
        while sched.has_unfinished_requests:
            plans.append(dict(_step(sched)[0].num_scheduled_tokens))
        return plans

    assert run(True) == run(False)


def test_external_tokens_are_validated() -> None:
    with pytest.raises(ValueError, match="num_external_computed_tokens"):
        EngineRequest(
            "x", num_prompt_tokens=10, max_output_tokens=2, num_external_computed_tokens=10
        )
    with pytest.raises(ValueError, match="num_external_computed_tokens"):
        EngineRequest(
            "x", num_prompt_tokens=10, max_output_tokens=2, num_external_computed_tokens=-1
        )


def test_admission_waits_until_the_external_blocks_fit() -> None:
    sched = Scheduler(SchedulerConfig(block_size=16, enable_prefix_caching=False), 8)
    sched.add_request(EngineRequest("big", num_prompt_tokens=64, max_output_tokens=40), 0.0)
    _step(sched)  # big holds 4 blocks (64 prompt tokens + its first token soon)
    sched.add_request(_decode_side("ext", 64, 3), 0.0)  # needs 5 blocks
    plan, _ = _step(sched)
    assert "ext" not in plan.admitted_ids  # 4 free, 5 needed: it waits (head of line)
    assert sched.get_request("ext") is not None
    ext = sched.get_request("ext")
    assert ext is not None and ext.block_ids == [] and ext.num_computed_tokens == 0
    while sched.get_request("big") is not None:
        _step(sched)
    plan, _ = _step(sched)
    assert plan.admitted_ids == ("ext",) and plan.num_scheduled_tokens == {"ext": 1}


def test_preempted_request_recomputes_its_whole_prompt() -> None:
    sched = Scheduler(SchedulerConfig(block_size=16, enable_prefix_caching=False), 9)
    sched.add_request(_decode_side("a", 63, 60), 0.0)  # 64 known tokens: 4 blocks
    sched.add_request(_decode_side("b", 63, 60), 0.0)
    b = sched.get_request("b")
    assert b is not None
    plan, _ = _step(sched)
    assert plan.num_scheduled_tokens == {"a": 1, "b": 1}
    preempted = False
    while not preempted:
        plan, _ = _step(sched)
        preempted = "b" in plan.preempted_ids
    assert b.status is RequestStatus.PREEMPTED and b.num_computed_tokens == 0
    assert b.block_ids == []
    tokens_known = b.num_tokens
    while "b" not in plan.admitted_ids:
        plan, _ = _step(sched)
    # Resumed: the transferred KV is gone; every known token is recomputed locally.
    assert plan.num_scheduled_tokens["b"] == tokens_known
    while sched.has_unfinished_requests:
        _step(sched)
    assert b.num_output_tokens == 59
    assert b.status.value == "finished"


def test_replica_steps_and_skips_a_decode_side_request() -> None:
    step_time = AffineStepTime(
        overhead_s=0.003, per_prefill_token_s=4e-5, per_prefill_pair_s=1e-9,
        per_decode_seq_s=5e-5, per_decode_kv_token_s=3e-8,
    )  # fmt: skip
    replica = ReplicaModel(SchedulerConfig(), 1000, step_time)
    replica.add_request(_decode_side("a", 2000, 50), 0.0)
    first = replica.step(0.0)
    assert first.batch.num_prefill_tokens == 1 and first.tokens == {"a": 1}
    assert replica.max_identical_decode_steps() == 48  # then only decode steps
    run = replica.advance_decode_steps(first.end_s, 48)
    assert run.finished_ids == ("a",)
    replica.check_invariants()
