"""Tails segmented the way seed 002 lists them (issue 19, deliverable 4): every dimension
in the result, the ranked segments worst first, and each cut taken from the records."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from headway.core.metrics import LatencySummary
from headway.core.trace_data import TraceData
from headway.core.workload.compile import compile_workload
from headway.files.workload import parse_workload
from headway.sim.cluster import parse_cluster
from headway.sim.results import Latencies, Segment, SimResult
from headway.sim.run import simulate_compiled
from headway.sim.segments import (
    COLD_WINDOW_S,
    cold_calls,
    hit_classes,
    is_ranked,
    time_bucket_width_s,
    worst_first,
)
from headway.sim.simulator import OUTCOMES, SimOutcome

SMALL_ENGINE = {"model": "llama-2-7b", "gpu": "a100", "router": "round_robin"}


def _run(
    data: dict[str, Any], cluster: dict[str, Any], traces: dict[str, TraceData] | None = None
) -> tuple[SimResult, SimOutcome]:
    w = compile_workload(parse_workload(data), seed=5, traces=traces)
    return simulate_compiled(w, parse_cluster({**SMALL_ENGINE, **cluster}))


def _segments(result: SimResult, dimension: str) -> dict[str, Segment]:
    return {s.name: s for s in result.segments if s.dimension == dimension}


def _workload(**extra: Any) -> dict[str, Any]:
    return {
        "name": "segments",
        "duration_s": 60,
        "classes": {"chat": {"input_tokens": 512, "output_tokens": 128, "slo": {"ttft_s": 1.0}}},
        "sources": [{"name": "s", "arrivals": {"process": "poisson", "rate_per_s": 4}}],
        **extra,
    }


def test_a_burst_makes_its_arrival_buckets_the_worst() -> None:
    data = _workload()
    data["sources"][0]["arrivals"]["bursts"] = [{"start_s": 30, "duration_s": 10, "rate_per_s": 60}]
    result, out = _run(data, {"replicas": 1, "num_kv_blocks": 3000})
    assert time_bucket_width_s(60) == 5.0
    buckets = _segments(result, "arrival time")
    assert len(buckets) >= 12
    # Every call is in exactly one bucket, by its arrival.
    assert sum(s.calls for s in buckets.values()) == result.calls
    ranked = [s for s in result.segments if s.ranked]
    worst_time = next(s for s in ranked if s.dimension == "arrival time")
    start_s = float(worst_time.name.split("-")[0])
    assert 30 <= start_s < 45, worst_time.name  # the burst, or the backlog it left
    before = [s for name, s in buckets.items() if float(name.split("-")[0]) < 25]
    assert worst_time.slo_attainment is not None
    assert all(
        s.slo_attainment is not None and s.slo_attainment > worst_time.slo_attainment + 0.2
        for s in before
    )
    c = out.calls
    in_bucket = (c.arrival_s >= start_s) & (c.arrival_s < start_s + 5)
    assert worst_time.calls == int(in_bucket.sum())


def test_preempted_calls_have_their_own_worse_tail() -> None:
    data = _workload()
    data["classes"]["chat"].update(input_tokens=1024, output_tokens=512)
    data["sources"][0]["arrivals"]["rate_per_s"] = 6
    result, out = _run(data, {"replicas": 1, "num_kv_blocks": 500})
    c = out.calls
    preempted = np.isfinite(c.admitted_s) & (c.num_preemptions > 0)
    assert preempted.sum() >= 20, "the pool was meant to be small enough to preempt"
    seg = _segments(result, "preemption")
    assert seg["preempted"].calls == int(preempted.sum())
    assert seg["never preempted"].calls == int((np.isfinite(c.admitted_s) & ~preempted).sum())
    worse, better = seg["preempted"].latencies.e2e, seg["never preempted"].latencies.e2e
    assert worse.p99_s is not None and better.p99_s is not None
    assert worse.p50_s is not None and better.p50_s is not None
    assert worse.p50_s > better.p50_s


def test_output_length_buckets_follow_the_workload_lengths() -> None:
    data = _workload()
    data["classes"] = {
        "short": {"input_tokens": 256, "output_tokens": 32, "slo": {"e2e_s": 5.0}},
        "long": {"input_tokens": 256, "output_tokens": 1500, "slo": {"e2e_s": 5.0}},
    }
    data["sources"][0]["mix"] = {"short": 0.5, "long": 0.5}
    result, _ = _run(data, {"replicas": 1, "num_kv_blocks": 3000})
    out_seg = _segments(result, "output tokens")
    classes = {g.name: g for g in result.by_class}
    assert set(out_seg) == {"0-128", "512-2048"}
    assert out_seg["0-128"].calls == classes["short"].calls
    assert out_seg["512-2048"].calls == classes["long"].calls
    long_p99, short_p99 = (
        out_seg["512-2048"].latencies.e2e.p99_s,
        out_seg["0-128"].latencies.e2e.p99_s,
    )
    assert long_p99 is not None and short_p99 is not None and long_p99 > short_p99
    # The long outputs miss their e2e bound, the short meet it: the long bucket ranks first
    # of the two.
    order = [s.name for s in result.segments if s.dimension == "output tokens"]
    assert order == ["512-2048", "0-128"]


def _shared_prefix_trace() -> TraceData:
    """Twelve requests of 4 blocks of 16 tokens (+1 token) a second apart: the first four
    share nothing, the next four repeat request 0's blocks (a full hit once it was seen),
    the last four share request 1's first two blocks only (a partial hit)."""
    hashes = [[10 * i + k for k in range(4)] for i in range(4)]
    hashes += [hashes[0]] * 4
    hashes += [[*hashes[1][:2], 100 + i, 200 + i] for i in range(4)]
    n = len(hashes)
    return TraceData(
        name="prefixes",
        kind="mooncake",
        arrival_s=np.arange(n, dtype=np.float64),
        input_tokens=np.full(n, 65),
        output_tokens=np.full(n, 8),
        hash_ids=tuple(np.array(h) for h in hashes),
        hash_block_tokens=16,
    )


def test_prefix_cache_hit_classes_come_from_the_engine() -> None:
    data = {
        "name": "prefixes",
        "duration_s": 20,
        "classes": {"chat": {}},
        "sources": [{"name": "t", "arrivals": {"process": "trace", "path": "t"}}],
    }
    result, out = _run(data, {"replicas": 1}, traces={"t": _shared_prefix_trace()})
    cached = out.calls.cached_prompt_tokens
    # The engine reuses at most the 4 full blocks (64 tokens) of a 65-token prompt.
    np.testing.assert_array_equal(cached[:4], 0)
    np.testing.assert_array_equal(cached[4:8], 64)
    np.testing.assert_array_equal(cached[8:], 32)
    seg = _segments(result, "prefix cache")
    assert {name: s.calls for name, s in seg.items()} == {"none": 4, "partial": 4, "full": 4}
    assert hit_classes(cached, np.full(12, 65), 16).tolist() == [0] * 4 + [2] * 4 + [1] * 4


def test_prefix_caching_off_puts_every_call_in_none() -> None:
    data = {
        "name": "prefixes",
        "duration_s": 20,
        "classes": {"chat": {}},
        "sources": [{"name": "t", "arrivals": {"process": "trace", "path": "t"}}],
    }
    cluster = {"replicas": 1, "engine": {"enable_prefix_caching": False}}
    result, _ = _run(data, cluster, traces={"t": _shared_prefix_trace()})
    seg = _segments(result, "prefix cache")
    assert list(seg) == ["none"] and not seg["none"].ranked  # the only value: not ranked


def test_a_cache_flush_makes_replicas_cold_again() -> None:
    data = _workload()
    data["duration_s"] = 120
    cluster = {"replicas": 2, "num_kv_blocks": 3000,
               "faults": [{"kind": "cache_flush", "at_s": 60.0}]}  # fmt: skip
    result, out = _run(data, cluster)
    c = out.calls
    admitted = c.admitted_s
    expected = (admitted <= COLD_WINDOW_S) | ((admitted >= 60.0) & (admitted <= 60 + COLD_WINDOW_S))
    np.testing.assert_array_equal(cold_calls(c.replica, admitted, out.cache_emptied), expected)
    seg = _segments(result, "replica")
    assert seg["cold"].calls == int(expected.sum())
    assert seg["warm"].calls == int((np.isfinite(admitted) & ~expected).sum())


def test_an_autoscaled_replica_is_cold_from_when_it_became_ready() -> None:
    emptied = np.array([[0.0, 0.0], [1.0, 100.0]])
    replica = np.array([0, 1, 1, 0, -1])
    admitted = np.array([10.0, 110.0, 140.0, 140.0, np.nan])
    assert cold_calls(replica, admitted, emptied).tolist() == [True, True, False, False, False]


def test_every_dimension_is_in_the_result_and_each_cut_covers_its_calls() -> None:
    data = _workload(tenants={"a": {"share": 0.5}, "b": {"share": 0.5}})
    result, out = _run(data, {"replicas": 1, "num_kv_blocks": 3000})
    dims = {s.dimension for s in result.segments}
    assert dims == {
        "input tokens", "output tokens", "route", "prefix cache", "replica", "preemption",
        "retry", "priority", "tenant", "class", "outcome", "arrival time",
    }  # fmt: skip
    admitted = int(np.isfinite(out.calls.admitted_s).sum())
    for dim, total in (("input tokens", result.calls), ("tenant", result.calls),
                       ("prefix cache", admitted), ("replica", admitted),
                       ("preemption", admitted)):  # fmt: skip
        assert sum(s.calls for s in _segments(result, dim).values()) == total, dim
    # One route, one class, one priority: the only value says nothing, so it is not ranked.
    for dim in ("route", "class", "priority"):
        (only,) = _segments(result, dim).values()
        assert only.calls == result.calls and not only.ranked, dim
    assert all(s.ranked for s in _segments(result, "tenant").values())


def _segment(name: str, attainment: float | None, e2e_p99_s: float | None, *,
             calls: int = 100, ranked: bool = True) -> Segment:  # fmt: skip
    def summary(p99: float | None) -> LatencySummary:
        return LatencySummary(count=calls, mean_s=p99, p50_s=p99, p90_s=p99, p99_s=p99, max_s=p99)

    lat = Latencies(
        ttft=summary(e2e_p99_s), tpot=summary(None), e2e=summary(e2e_p99_s), queue=summary(None)
    )
    return Segment(dimension="d", name=name, calls=calls, share=0.1, completed=calls,
                   slo_attainment=attainment, latencies=lat, ranked=ranked)  # fmt: skip


def test_worst_first_orders_by_attainment_then_p99_and_puts_the_unranked_last() -> None:
    segments = [
        _segment("good", 0.99, 1.0),
        _segment("noise", 0.0, 90.0, calls=3, ranked=False),
        _segment("bad slow", 0.5, 30.0),
        _segment("bad fast", 0.5, 10.0),
        _segment("nothing completed", 0.0, None),
        _segment("worse", 0.2, 5.0),
    ]
    order = [s.name for s in worst_first(segments)]
    assert order == ["nothing completed", "worse", "bad slow", "bad fast", "good", "noise"]


@pytest.mark.parametrize(
    ("dimension", "name", "calls", "total", "attainment", "alone", "ranked"),
    [
        ("tenant", "a", 500, 1000, 0.9, False, True),
        ("tenant", "a", 19, 1000, 0.9, False, False),  # too few calls
        ("tenant", "a", 30, 5000, 0.9, False, False),  # under 1% of them
        ("tenant", "a", 1000, 1000, 0.9, False, False),  # the whole run
        ("route", "r", 500, 1000, 0.9, True, False),  # the only value of its dimension
        ("outcome", "shed", 500, 1000, 0.0, False, False),  # never meets the SLO
        ("outcome", OUTCOMES[2], 500, 1000, 0.9, False, True),
        ("tenant", "a", 500, 1000, None, False, False),  # none to judge
    ],
)
def test_which_segments_are_ranked(
    dimension: str, name: str, calls: int, total: int, attainment: float | None, alone: bool,
    ranked: bool,
) -> None:  # fmt: skip
    assert is_ranked(dimension, name, calls, total, attainment, alone) is ranked


def test_time_buckets_stay_few_and_round() -> None:
    assert time_bucket_width_s(600) == 30.0
    assert time_bucket_width_s(3600) == 300.0
    assert time_bucket_width_s(10) == 1.0
    for horizon_s in (7.0, 60.0, 599.0, 86400.0):
        assert horizon_s / time_bucket_width_s(horizon_s) <= 20
