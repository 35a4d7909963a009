"""Replaying a Mooncake trace feeds its prefix-block ids to the engine's prefix cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from headway.core.workload.compile import compile_workload
from headway.files.workload import parse_workload
from headway.sim.cluster import ClusterSpec
from headway.sim.run import simulate_compiled
from headway.sim.simulator import SimOptions
from headway.trace.readers import read_trace
from shared_data import TRACES, require_shared


def _mooncake() -> Path:
    return require_shared(TRACES / "mooncake_fast25_synthetic_trace.jsonl.gz")


def _workload(lengths: str = "trace") -> dict[str, object]:
    return {
        "name": "mooncake-synthetic",
        "duration_s": 120,
        "classes": {"chat": {"slo": {"ttft_s": 5.0}}},
        "sources": [
            {
                "name": "trace",
                "arrivals": {"process": "trace", "path": "t", "lengths": lengths,
                             "window": {"start_s": 0, "end_s": 120}},
            }
        ],
    }  # fmt: skip


def test_trace_prefixes_hit_the_cache_and_skipping_still_equals_stepping() -> None:
    trace = read_trace(_mooncake())
    w = compile_workload(parse_workload(_workload()), traces={"t": trace})
    assert (w.call_prefix_row >= 0).all() and len(w.prefix_hash_ids) == len(trace)
    cluster = ClusterSpec(replicas=2, model="llama-3-8b", gpu="h100", router="prefix_affinity")
    fast, fast_out = simulate_compiled(w, cluster)
    slow, slow_out = simulate_compiled(w, cluster, SimOptions(skip_decode=False))
    # The whole trace reuses 65% of its prompt tokens with an infinite cache; its first two
    # minutes, where most prefixes appear for the first time, on two real pools (overloaded:
    # 67 preemptions, evictions) share little between requests, 0.56% of the tokens at
    # first admission (1.3% on eight replicas, none preempted), but some (without the ids
    # nothing is ever shared: see below). A preempted request's recompute that finds its
    # own blocks is not counted, as in vLLM's counters: counted in, this read 10%+.
    assert fast.engine.prefix_hit_ratio is not None and fast.engine.prefix_hit_ratio > 0.0
    assert fast.engine.prefix_hit_ratio == slow.engine.prefix_hit_ratio
    np.testing.assert_allclose(fast_out.calls.first_token_s, slow_out.calls.first_token_s,
                               rtol=1e-9)  # fmt: skip


def test_class_lengths_carry_no_prefix_ids() -> None:
    trace = read_trace(_mooncake())
    w = compile_workload(parse_workload(_workload("class")), traces={"t": trace})
    assert (w.call_prefix_row == -1).all()
    result, _ = simulate_compiled(w, ClusterSpec(replicas=1))
    assert result.engine.prefix_hit_ratio == 0.0
