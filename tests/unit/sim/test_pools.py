"""Pools of replicas per route (issue 19, result 3): each route of a workload is served by
its own pool (own model, GPU and engine settings), as seed 000 asks for unlike work. At
3c8fc1a a workload with an agent route and a bulk route ran on one pool, silently; now a
multi-route workload on a one-pool cluster is an error naming the routes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from headway.core.errors import ConfigError
from headway.files.workload import parse_workload
from headway.sim.cluster import ClusterSpec, parse_cluster, with_replicas
from headway.sim.run import simulate


def _workload(**extra: Any) -> Any:
    def cls(route: str, output: int) -> dict[str, Any]:
        return {
            "route": route,
            "input_tokens": {"dist": "lognormal", "mean": 800, "cv": 0.5},
            "output_tokens": {"dist": "lognormal", "mean": output, "cv": 0.5},
            "slo": {"ttft_s": 2.0, "tpot_s": 0.1},
        }

    return parse_workload(
        {
            "name": "two-routes",
            "duration_s": 40,
            "seed": 5,
            "classes": {"agent": cls("agent", 150), "bulk": cls("bulk", 400)},
            "sources": [
                {
                    "name": "users",
                    "arrivals": {"process": "poisson", "rate_per_s": 6},
                    "mix": {"agent": 1, "bulk": 1},
                }
            ],
            "routes": {"agent": {"model": "llama-3-8b"}, "bulk": {"model": "llama-3-8b"}},
            **extra,
        }
    )


POOLS: dict[str, Any] = {
    "replicas": 3,
    "pools": {
        "interactive": {"routes": ["agent"], "replicas": 2},
        "batch": {"routes": ["bulk"], "replicas": 1, "gpu": "a100"},
    },
}


def test_each_route_is_served_by_its_own_pool() -> None:
    spec = _workload()
    result, out, w = simulate(spec, parse_cluster(POOLS))
    route = w.call_route
    served = out.calls.replica >= 0
    agent = route == w.route_names.index("agent")
    assert set(out.calls.replica[served & agent]) == {0, 1}  # both interactive replicas
    assert set(out.calls.replica[served & ~agent]) == {2}  # the batch replica only
    assert result.accounting.balanced and result.completed_calls > 0
    # The batch pool's own GPU (an A100) decodes its calls slower than the H100s.
    tpot = (out.calls.finish_s - out.calls.first_token_s) / np.maximum(
        out.calls.num_output_tokens - 1, 1
    )
    done = out.calls.outcome == 2
    assert np.median(tpot[done & ~agent]) > 1.2 * np.median(tpot[done & agent])


def test_a_multi_route_workload_on_one_pool_is_an_error_naming_the_routes() -> None:
    with pytest.raises(ConfigError, match=r"2 routes \(agent, bulk\).*pools:"):
        simulate(_workload(), ClusterSpec(replicas=3))


def test_a_pool_that_lost_its_replicas_does_not_borrow_another_pools() -> None:
    """The fault takes the highest-numbered replica: the batch pool's only one. Its
    route's later calls fail (no replica serves it) rather than land on the interactive
    pool, which keeps serving its own."""
    cluster = {**POOLS, "faults": [{"kind": "replica_lost", "replicas": 1, "at_s": 5.0}]}
    result, out, w = simulate(_workload(), parse_cluster(cluster))
    agent = w.call_route == w.route_names.index("agent")
    late = out.calls.arrival_s > 6.0
    assert (out.calls.outcome[~agent & late] == 6).all()  # failed
    assert set(out.calls.replica[agent & (out.calls.replica >= 0)]) == {0, 1}
    assert (out.calls.outcome[agent & late] == 2).mean() > 0.9  # completed
    assert result.accounting.balanced


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"replicas": 4}, "pools hold 3 replicas but `replicas` is 4"),
        (
            {"pools": {"a": {"routes": ["agent", "bulk"], "replicas": 1},
                       "b": {"routes": ["bulk"], "replicas": 2}}},
            "route 'bulk' is in `pools.a` and `pools.b`",
        ),
        ({"pools": {"a": {"routes": [], "replicas": 3}}}, "`pools.a.routes` is empty"),
        ({"gateway": {"preset": "headway-default"}}, "not simulated together with"),
    ],
)  # fmt: skip
def test_a_bad_pools_section_is_refused_by_name(change: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_cluster({**POOLS, **change})
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("pools", "fragment"),
    [
        ({"a": {"routes": ["agent"], "replicas": 3}}, "no pool serves the workload's routes bulk"),
        (
            {"a": {"routes": ["agent", "bulk", "chat"], "replicas": 3}},
            "routes the workload does not have: chat",
        ),
    ],
)
def test_pools_and_routes_must_match(pools: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        simulate(_workload(), parse_cluster({"replicas": 3, "pools": pools}))
    assert fragment in str(info.value)


def test_more_replicas_keep_each_pools_share() -> None:
    cluster = parse_cluster(POOLS)
    grown = with_replicas(cluster, 9)
    assert {n: p.replicas for n, p in grown.pools.items()} == {"interactive": 6, "batch": 3}
    assert grown.replicas == 9
    shrunk = with_replicas(cluster, 1)  # each pool keeps one
    assert {n: p.replicas for n, p in shrunk.pools.items()} == {"interactive": 1, "batch": 1}
    assert shrunk.replicas == 2
