"""ReplicaModel: step timing, results, snapshots and the decode-skip API."""

from __future__ import annotations

from typing import Any

import pytest

from headway.core.engine.replica import ReplicaModel, decode_run_duration_s
from headway.core.engine.scheduler import EngineRequest, SchedulerConfig
from headway.core.engine.steptime import AffineStepTime, BatchShape

STEP_TIME = AffineStepTime(
    overhead_s=0.01,
    per_prefill_token_s=0.001,
    per_prefill_pair_s=0.0,
    per_decode_seq_s=0.002,
    per_decode_kv_token_s=0.0001,
)


def make_replica(num_blocks: int = 64, **config: Any) -> ReplicaModel:
    return ReplicaModel(SchedulerConfig(**config), num_blocks, STEP_TIME)


def make_request(rid: str, prompt: int, output: int) -> EngineRequest:
    return EngineRequest(rid, num_prompt_tokens=prompt, max_output_tokens=output)


def test_step_times_come_from_the_step_time_model() -> None:
    replica = make_replica()
    replica.add_request(make_request("a", 100, 3), 0.0)
    first = replica.step(0.0)
    assert first.batch == BatchShape(
        num_prefill_tokens=100, prefill_attention_pairs=100 * 101 // 2, num_prefill_seqs=1
    )
    assert first.duration_s == pytest.approx(0.01 + 0.1)
    assert first.end_s == pytest.approx(0.11)
    assert first.tokens == {"a": 1}
    second = replica.step(first.end_s)
    assert second.batch == BatchShape(num_decode_seqs=1, decode_kv_tokens=100)
    assert second.duration_s == pytest.approx(0.01 + 0.002 + 0.01)
    third = replica.step(second.end_s)
    assert third.finished_ids == ("a",)
    assert not replica.has_work


def test_each_prefilling_request_costs_its_per_request_time() -> None:
    """A calibrated profile's per-request cost (what a lone request's TTFT holds beyond
    its tokens) is charged to the steps that prefill it, in the core that the simulator
    and the emulator share."""
    per_request = AffineStepTime(overhead_s=0.01, per_prefill_token_s=0.001,
                                 per_decode_seq_s=0.002, per_decode_kv_token_s=0.0,
                                 per_prefill_seq_s=0.4)  # fmt: skip
    replica = ReplicaModel(SchedulerConfig(), 64, per_request)
    replica.add_request(make_request("a", 100, 3), 0.0)
    replica.add_request(make_request("b", 50, 3), 0.0)
    first = replica.step(0.0)
    assert first.batch.num_prefill_seqs == 2
    assert first.duration_s == pytest.approx(0.01 + 0.15 + 2 * 0.4)
    decode = replica.step(first.end_s)  # decoding requests pay nothing per request
    assert decode.duration_s == pytest.approx(0.01 + 2 * 0.002)


def test_an_idle_step_is_empty_and_takes_no_time() -> None:
    replica = make_replica()
    result = replica.step(5.0)
    assert result.is_empty
    assert result.duration_s == 0.0
    assert result.end_s == 5.0


def test_a_step_cannot_start_before_the_previous_one_ends() -> None:
    replica = make_replica()
    replica.add_request(make_request("a", 100, 3), 0.0)
    result = replica.step(0.0)
    with pytest.raises(ValueError, match="previous step ends"):
        replica.step(result.end_s / 2)
    with pytest.raises(ValueError, match="previous step ends"):
        replica.step(float("nan"))


def test_snapshot_reports_load_and_kv_state() -> None:
    replica = make_replica(num_blocks=16, max_num_seqs=1, max_num_batched_tokens=64)
    replica.add_request(make_request("a", 100, 5), 0.0)
    replica.add_request(make_request("b", 30, 5), 0.0)
    replica.step(0.0)  # a computes 64 of 100
    snap = replica.snapshot()
    assert (snap.num_running, snap.num_waiting) == (1, 1)
    assert snap.num_free_blocks == 16 - 4
    assert snap.kv_usage == pytest.approx(4 / 16)
    assert snap.num_pending_prefill_tokens == (100 - 64) + 30
    assert snap.num_steps == 1
    assert replica.abort("a")
    assert replica.snapshot().num_aborted == 1
    assert replica.kv_usage == 0.0


def test_decode_run_limit_is_the_shortest_remaining_output() -> None:
    replica = make_replica()
    replica.add_request(make_request("a", 100, 50), 0.0)
    replica.add_request(make_request("b", 40, 30), 0.0)
    assert replica.max_identical_decode_steps() == 0  # both still have to prefill
    end = replica.step(0.0).end_s
    assert replica.max_identical_decode_steps() == 29
    run = replica.advance_decode_steps(end, 29)
    assert run.finished_ids == ("b",)
    assert run.tokens == {"a": 29, "b": 29}
    assert replica.num_running == 1


def test_decode_run_stops_before_the_step_that_would_preempt() -> None:
    replica = make_replica(num_blocks=6, enable_prefix_caching=False)
    replica.add_request(make_request("a", 16, 60), 0.0)
    replica.add_request(make_request("b", 16, 60), 0.0)
    end = replica.step(0.0).end_s  # one block each, 4 free
    # Steps 1..16 need one more block each, 17..32 another: 4 blocks; step 33 needs 2 more.
    assert replica.max_identical_decode_steps() == 32
    run = replica.advance_decode_steps(end, 32)
    assert replica.scheduler.pool.num_free == 0
    result = replica.step(run.end_s)
    assert result.preempted_ids == ("b",)


def test_a_waiting_request_that_fits_ends_the_decode_run() -> None:
    replica = make_replica(num_blocks=8)
    replica.add_request(make_request("a", 16, 40), 0.0)
    end = replica.step(0.0).end_s
    replica.add_request(make_request("c", 16, 4), end)
    assert replica.max_identical_decode_steps() == 0
    assert replica.step(end).admitted_ids == ("c",)


def test_a_waiting_request_that_cannot_fit_does_not_end_the_decode_run() -> None:
    replica = make_replica(num_blocks=8)
    replica.add_request(make_request("a", 64, 40), 0.0)  # 4 blocks, grows to 7
    end = replica.step(0.0).end_s
    replica.add_request(make_request("c", 80, 4), end)  # 5 blocks > 4 free
    assert replica.max_identical_decode_steps() == 39


def test_advance_beyond_the_limit_is_rejected() -> None:
    replica = make_replica()
    replica.add_request(make_request("a", 10, 5), 0.0)
    end = replica.step(0.0).end_s
    with pytest.raises(ValueError, match=r"num_steps must be in 1\.\.4"):
        replica.advance_decode_steps(end, 5)
    with pytest.raises(ValueError, match="previous step ends"):
        replica.advance_decode_steps(0.0, 1)


def test_decode_run_matches_stepping_one_by_one() -> None:
    stepped, skipped = make_replica(), make_replica()
    for replica in (stepped, skipped):
        replica.add_request(make_request("a", 100, 40), 0.0)
        replica.add_request(make_request("b", 37, 25), 0.0)
    end = stepped.step(0.0).end_s
    assert skipped.step(0.0).end_s == end
    ends = []
    for _ in range(24):
        ends.append(result := stepped.step(end))
        end = result.end_s
    run = skipped.advance_decode_steps(ends[0].start_s, 24)
    for k, result in enumerate(ends, start=1):
        assert run.step_end_s(k) == pytest.approx(result.end_s, rel=1e-12)
    assert run.finished_ids == ends[-1].finished_ids == ("b",)
    assert list(stepped.scheduler.pool.free_queue()) == list(skipped.scheduler.pool.free_queue())


def test_decode_steps_starting_before_an_arrival() -> None:
    replica = make_replica()
    replica.add_request(make_request("a", 100, 40), 0.0)
    end = replica.step(0.0).end_s
    base_s, per_kv_s = STEP_TIME.decode_step_affine(1)
    start_of_step_6 = end + decode_run_duration_s(5, 1, 100, base_s, per_kv_s)
    assert replica.decode_steps_starting_before(end, start_of_step_6) == 5
    assert replica.decode_steps_starting_before(end, start_of_step_6 + 1e-9) == 6
    assert replica.decode_steps_starting_before(end, end) == 0
    assert replica.decode_steps_starting_before(end, 1e9) == 39
    assert replica.decode_steps_starting_before(end, 1e9, max_steps=3) == 3


def test_sequences_on_one_cached_prefix_read_it_at_the_shared_cost() -> None:
    """Four requests on one cached 48-token prefix decode together: the step counts the
    three later holders' 48 tokens each as shared, the calibrated cost of a shared read
    applies to them, and a closed-form run of such steps takes what stepping does."""
    shared = AffineStepTime(overhead_s=0.01, per_decode_seq_s=0.002,
                            per_decode_kv_token_s=0.0001,
                            shared_kv_read_ratio=0.1)  # fmt: skip
    replicas = [ReplicaModel(SchedulerConfig(enable_prefix_caching=True), 64, shared)
                for _ in range(2)]  # fmt: skip
    prefix = [21, 22, 23]  # 3 blocks of 16
    for replica in replicas:
        now = _serve(replica, "warm", [*prefix, 24], 0.0)
        for n in range(4):
            replica.add_request(EngineRequest(f"r{n}", num_prompt_tokens=64,
                                              max_output_tokens=12,
                                              block_hashes=[*prefix, 100 + n]), now)  # fmt: skip
        while not replica.scheduler.running or any(
            not r.is_decoding for r in replica.scheduler.running
        ):
            now = replica.step(now).end_s
    stepped, skipped = replicas
    first = stepped.step(now)
    batch = first.batch
    assert (batch.num_decode_seqs, batch.decode_shared_kv_tokens) == (4, 3 * 48)
    assert first.duration_s == pytest.approx(
        0.01 + 4 * 0.002 + 0.0001 * (batch.decode_kv_tokens - 144) + 0.00001 * 144
    )
    n = skipped.max_identical_decode_steps()
    assert n >= 3
    end = skipped.advance_decode_steps(now, n).end_s
    t = first.end_s
    for _ in range(n - 1):
        t = stepped.step(t).end_s
    assert end == pytest.approx(t, rel=1e-12)


def test_without_a_shared_cost_shared_reads_cost_what_others_do() -> None:
    batch = BatchShape(num_decode_seqs=4, decode_kv_tokens=400, decode_shared_kv_tokens=144)
    plain = BatchShape(num_decode_seqs=4, decode_kv_tokens=400)
    assert STEP_TIME.step_time_s(batch) == STEP_TIME.step_time_s(plain)
    with pytest.raises(ValueError, match="shared_kv_read_ratio"):
        AffineStepTime(shared_kv_read_ratio=-0.1)


def _serve(replica: ReplicaModel, rid: str, hashes: list[int], now: float) -> float:
    replica.add_request(
        EngineRequest(rid, num_prompt_tokens=64, max_output_tokens=2, block_hashes=hashes), now
    )
    while replica.has_work:
        now = replica.step(now).end_s
    return now


@pytest.mark.parametrize("flush", [False, True])
def test_a_flushed_prefix_cache_serves_no_hits(flush: bool) -> None:
    replica = make_replica(enable_prefix_caching=True)
    hashes = [11, 12, 13, 14]  # 4 blocks of 16 tokens: the whole 64-token prompt
    end = _serve(replica, "a", hashes, 0.0)
    if flush:
        assert replica.scheduler.pool.drop_cached() > 0
    _serve(replica, "b", hashes, end)
    hits = replica.scheduler.num_prefix_hit_tokens
    assert (hits == 0) if flush else (hits >= 48)


def test_a_time_scale_stretches_steps_and_decode_runs_alike() -> None:
    plain, slow = make_replica(), make_replica()
    slow.set_time_scale(2.5)
    for replica in (plain, slow):
        replica.add_request(make_request("a", 100, 20), 0.0)
    first_plain, first_slow = plain.step(0.0), slow.step(0.0)
    assert first_slow.duration_s == pytest.approx(2.5 * first_plain.duration_s)
    n = plain.max_identical_decode_steps()
    assert n == slow.max_identical_decode_steps() >= 2
    run_plain = plain.advance_decode_steps(first_plain.end_s, n)
    run_slow = slow.advance_decode_steps(first_slow.end_s, n)
    assert run_slow.duration_s == pytest.approx(2.5 * run_plain.duration_s)
    with pytest.raises(ValueError, match="time scale"):
        slow.set_time_scale(0.0)
