"""Injected faults: replicas lost (at any step, during prefill, during decode), prefix
caches flushed, steps slowed down; and Little's law at every boundary."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from headway.core.workload.compile import CompiledWorkload, compile_workload
from headway.files.workload import parse_workload
from headway.sim.cluster import parse_cluster
from headway.sim.results import SimResult
from headway.sim.run import simulate_compiled
from headway.sim.simulator import OUTCOMES, SimOptions, SimOutcome
from headway.trace.readers import read_trace
from shared_data import TRACES, require_shared


def _simulate(
    *,
    faults: list[dict[str, Any]],
    rate_per_s: float = 20.0,
    replicas: int = 3,
    retries: dict[str, Any] | None = None,
    gateway: str = "fifo-unbounded",
    skip_decode: bool = True,
    prefix: bool = False,
) -> tuple[CompiledWorkload, SimResult, SimOutcome]:
    chat: dict[str, Any] = {"input_tokens": 512, "output_tokens": 128}
    data: dict[str, Any] = {
        "name": "faults",
        "duration_s": 30,
        "classes": {"chat": chat},
        "sources": [{"name": "s", "arrivals": {"process": "poisson", "rate_per_s": rate_per_s}}],
        "clients": {"retries": retries or {"max_attempts": 1}},
    }
    cluster = {
        "replicas": replicas,
        "model": "llama-2-7b",
        "gpu": "a100",
        "num_kv_blocks": 4000,
        "engine": {"max_num_seqs": 64, "enable_prefix_caching": prefix},
        "router": "round_robin",
        "gateway": {"preset": gateway},
        "faults": faults,
    }
    w = compile_workload(parse_workload(data), seed=3)
    options = SimOptions(skip_decode=skip_decode, check_invariants=not skip_decode)
    result, out = simulate_compiled(w, parse_cluster(cluster), options)
    return w, result, out


def test_a_lost_replica_fails_its_calls_and_takes_no_more() -> None:
    at_s = 10.0
    _w, result, out = _simulate(faults=[{"kind": "replica_lost", "at_s": at_s}])
    c = out.calls
    acc = result.accounting
    assert acc.balanced
    failed = c.outcome == OUTCOMES.index("failed")
    # The calls on the lost replica (the highest-numbered) failed at the moment of loss.
    assert failed.sum() == result.engine.calls_lost_with_replicas > 0
    assert (c.replica[failed] == 2).all()
    np.testing.assert_allclose(c.finish_s[failed], at_s)
    # Nothing is dispatched to it afterwards; the others served everything else.
    later = c.dispatch_s >= at_s
    assert later.any() and not (c.replica[later] == 2).any()
    assert (c.outcome[~failed] == OUTCOMES.index("completed")).all()
    assert result.engine.replica_hours == pytest.approx((2 * out.end_s + at_s) / 3600)


def test_clients_retry_the_calls_of_a_lost_replica_on_the_others() -> None:
    retries = {"max_attempts": 3, "backoff_base_s": 0.1, "budget_ratio": None}
    fault = {"kind": "replica_lost", "at_s": 10.0, "phase": "prefill"}
    _, result, out = _simulate(faults=[fault], retries=retries, gateway="headway-default")
    c = out.calls
    assert result.accounting.balanced
    lost = result.engine.calls_lost_with_replicas
    retried = c.attempts >= 2
    failed = c.outcome == OUTCOMES.index("failed")
    # Every lost attempt was either retried or, its stream having started, failed.
    assert retried.sum() + failed.sum() == lost > 0
    assert retried.any() and failed.any()
    assert (c.first_token_s[failed] <= c.finish_s[failed]).all()
    # A retried call is served by a replica that is still up.
    served = retried & (c.outcome == OUTCOMES.index("completed"))
    assert served.sum() == retried.sum() and (c.replica[served] != 2).all()


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_a_loss_can_strike_during_prefill_or_during_decode(phase: str) -> None:
    at_s = 10.0
    _, result, out = _simulate(faults=[{"kind": "replica_lost", "at_s": at_s, "phase": phase}])
    c = out.calls
    failed = c.outcome == OUTCOMES.index("failed")
    assert result.accounting.balanced and failed.any()
    lost_at = float(c.finish_s[failed][0])
    assert lost_at >= at_s
    np.testing.assert_allclose(c.finish_s[failed], lost_at)
    # During prefill, a request was still waiting for its first token; during decode,
    # every request on the replica had one.
    no_token = ~(c.first_token_s[failed] <= lost_at)
    if phase == "prefill":
        assert no_token.any()
    else:
        assert not no_token.any()


def test_a_slowdown_stretches_the_steps_in_its_window_and_skip_equals_step() -> None:
    fault = {"kind": "slowdown", "at_s": 10.0, "until_s": 20.0, "factor": 3.0}
    _, _calm, calm_out = _simulate(faults=[], rate_per_s=8.0)
    _, _slow, slow_out = _simulate(faults=[fault], rate_per_s=8.0)
    c, k = slow_out.calls, calm_out.calls
    inside = (c.dispatch_s > 11.0) & (c.finish_s < 19.0)
    before = c.finish_s < 10.0
    tpot_slow = (c.finish_s - c.first_token_s)[inside].mean()
    tpot_calm = (k.finish_s - k.first_token_s)[inside].mean()
    assert tpot_slow > 2.5 * tpot_calm
    np.testing.assert_array_equal(c.finish_s[before], k.finish_s[before])
    _, _, stepped = _simulate(faults=[fault], rate_per_s=8.0, skip_decode=False)
    np.testing.assert_allclose(stepped.calls.finish_s, c.finish_s, rtol=1e-9)
    np.testing.assert_allclose(stepped.calls.first_token_s, c.first_token_s, rtol=1e-9)


def test_cache_flushes_keep_a_prefix_replay_balanced_and_deterministic() -> None:
    # Mooncake's shared prefixes arrive together (its 3 s ticks), so most hits are on
    # blocks in use, which a flush keeps; test_engine_replica checks that a flushed
    # free block serves no hit.
    trace = read_trace(require_shared(TRACES / "mooncake_fast25_synthetic_trace.jsonl.gz"))
    data = {
        "name": "mooncake",
        "duration_s": 30,
        "classes": {"chat": {}},
        "sources": [
            {
                "name": "trace",
                "arrivals": {
                    "process": "trace",
                    "path": "t",
                    "window": {"start_s": 0, "end_s": 30},
                },
            }
        ],
    }
    w = compile_workload(parse_workload(data), traces={"t": trace})
    flushes = [{"kind": "cache_flush", "at_s": t} for t in (5.0, 15.0, 25.0)]
    cluster = parse_cluster({"replicas": 2, "router": "prefix_affinity", "faults": flushes})
    first, _ = simulate_compiled(w, cluster)
    again, _ = simulate_compiled(w, cluster)
    assert first.accounting.balanced and first.completed_calls == w.num_calls
    assert first == again


def test_littles_law_holds_at_every_boundary() -> None:
    _, result, _ = _simulate(faults=[], rate_per_s=20.0, gateway="headway-default")
    names = [b.boundary.split(" ")[0] for b in result.little_boundaries]
    assert names == ["tasks", "gateway", "replicas", "KV"]
    for boundary in result.little_boundaries:
        assert boundary.mean_in_system > 0
        assert boundary.relative_mismatch < 0.05, boundary
