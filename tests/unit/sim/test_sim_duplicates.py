"""Duplicate submissions (seed 000): clients still waiting send the same call again.

Without a gateway the copy is new work for the replicas; the gateway recognises it by its
idempotency key and attaches it to the call in flight."""

from __future__ import annotations

from typing import Any

from headway.core.workload.compile import CompiledWorkload, compile_workload
from headway.files.workload import parse_workload
from headway.sim.cluster import parse_cluster
from headway.sim.results import SimResult
from headway.sim.run import simulate_compiled
from headway.sim.simulator import OUTCOMES, SimOutcome

_CAPACITY_PER_S = 14.0


def _simulate(
    clients: dict[str, Any],
    gateway: str,
    rate_per_s: float = 1.3 * _CAPACITY_PER_S,
    replicas: int = 1,
) -> tuple[CompiledWorkload, SimResult, SimOutcome]:
    data = {
        "name": "dups",
        "duration_s": 40,
        "classes": {"chat": {"input_tokens": 512, "output_tokens": 128}},
        "sources": [{"name": "s", "arrivals": {"process": "poisson", "rate_per_s": rate_per_s}}],
        "clients": clients,
    }
    cluster = {
        "replicas": replicas,
        "model": "llama-2-7b",
        "router": "round_robin",
        "gpu": "a100",
        "num_kv_blocks": 7424,
        "engine": {"max_num_seqs": 128, "enable_chunked_prefill": False},
        "gateway": {"preset": gateway},
    }
    w = compile_workload(parse_workload(data), seed=9)
    result, out = simulate_compiled(w, parse_cluster(cluster))
    return w, result, out


_IMPATIENT = {"duplicate_after_s": 4.0, "duplicate_probability": 0.5}


def test_duplicates_reach_the_replicas_without_a_gateway_and_slow_everyone() -> None:
    w, calm, _calm_out = _simulate({}, "fifo-unbounded")
    _, dup, dup_out = _simulate(_IMPATIENT, "fifo-unbounded")
    acc = dup.accounting
    assert acc.balanced and acc.offered_calls == w.num_calls == dup_out.calls.outcome.size
    assert acc.duplicates_sent > 0 and acc.duplicates_coalesced == 0
    assert acc.amplification == (acc.attempts + acc.duplicates_sent) / acc.offered_calls > 1.0
    assert acc.duplicate_output_tokens > 0  # the copies that did not answer were computed
    # The extra work makes the queue longer for every call.
    assert dup.latencies.e2e.mean_s > calm.latencies.e2e.mean_s
    assert dup.latencies.e2e.p90_s > calm.latencies.e2e.p90_s
    assert (dup_out.calls.outcome == OUTCOMES.index("completed")).all()
    assert calm.accounting.duplicates_sent == 0


def test_a_call_answered_by_its_duplicate_shows_the_duplicates_timings() -> None:
    # Long prompts block short ones on one replica (no chunked prefill); a short call's
    # copy, routed to the replica with fewer tokens outstanding, may answer first.
    data = {
        "name": "dups",
        "duration_s": 60,
        "classes": {
            "big": {"input_tokens": 6000, "output_tokens": 1500},
            "chat": {"input_tokens": 300, "output_tokens": 100},
        },
        "sources": [
            {
                "name": "s",
                "arrivals": {"process": "poisson", "rate_per_s": 4.0},
                "mix": {"big": 1, "chat": 3},
            }
        ],
        "clients": {"duplicate_after_s": 3.0, "duplicate_probability": 1.0},
    }
    cluster = {
        "replicas": 2,
        "model": "llama-2-7b",
        "gpu": "a100",
        "num_kv_blocks": 7424,
        "engine": {"max_num_seqs": 128, "enable_chunked_prefill": False},
        "router": "least_outstanding_tokens",
    }
    w = compile_workload(parse_workload(data), seed=9)
    result, out = simulate_compiled(w, parse_cluster(cluster))
    c = out.calls
    assert result.accounting.balanced and result.accounting.duplicates_sent > 0
    # The user saw the copy sent at arrival + 3 s: its dispatch and first token.
    by_copy = c.dispatch_s >= c.arrival_s + 3.0
    assert by_copy.any()
    assert (c.first_token_s[by_copy] > c.dispatch_s[by_copy]).all()
    assert (c.outcome[by_copy] == OUTCOMES.index("completed")).all()
    # The original kept running (nobody cancelled it): wasted output tokens.
    assert result.accounting.duplicate_output_tokens > 0


def test_the_gateway_coalesces_duplicates() -> None:
    _, result, _ = _simulate(_IMPATIENT, "headway-default", rate_per_s=2 * _CAPACITY_PER_S)
    acc = result.accounting
    assert acc.balanced
    assert acc.duplicates_coalesced > 0 and acc.duplicates_sent == 0
    assert acc.duplicate_output_tokens == 0
