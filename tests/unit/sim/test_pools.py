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


def _fallback_workload(bulk: dict[str, Any]) -> Any:
    routes = {"agent": {"model": "llama-3-8b"}, "bulk": {"model": "llama-3-8b", **bulk}}
    return _workload(routes=routes)


def test_a_lost_pools_route_falls_back_to_the_route_it_declares() -> None:
    """The batch pool loses its only replica at 5 s; route bulk declares ``fallback:
    agent`` with the same data policy and quality class, so the core ``FallbackPolicy``
    (the live gateway's) sends its later calls to the interactive pool, which serves
    them; they are counted as fallen back, and a segment of the tails."""
    cluster = {**POOLS, "faults": [{"kind": "replica_lost", "replicas": 1, "at_s": 5.0}]}
    result, out, w = simulate(_fallback_workload({"fallback": "agent"}), parse_cluster(cluster))
    bulk = w.call_route == w.route_names.index("bulk")
    late = out.calls.arrival_s > 6.0
    assert (out.calls.outcome[bulk & late] == 2).mean() > 0.9  # completed, not failed
    assert set(out.calls.replica[bulk & late & (out.calls.replica >= 0)]) <= {0, 1}
    assert out.calls.fell_back[bulk & late].mean() > 0.9
    assert not out.calls.fell_back[~bulk].any()
    assert not out.calls.fell_back[bulk & (out.calls.arrival_s < 4.0)].any()
    assert result.accounting.balanced
    assert result.fallback_calls == int(out.calls.fell_back.sum()) > 0
    segments = {(s.dimension, s.name) for s in result.segments}
    assert ("fallback", "fell back") in segments


@pytest.mark.parametrize(
    ("bulk", "cluster_extra"),
    [
        ({"fallback": "agent", "data_policy": "restricted"}, {}),
        ({"fallback": "agent", "quality_class": "frontier"}, {}),
        ({"fallback": "agent"}, {"fallback": {"enabled": False}}),
    ],
)
def test_no_fallback_unless_the_substitute_keeps_the_routes_meaning(
    bulk: dict[str, Any], cluster_extra: dict[str, Any]
) -> None:
    """Seed 000: a substitute only when its data policy and evaluated quality satisfy the
    route's requirements (and only when fallback is on): else the calls fail."""
    cluster = {
        **POOLS,
        "faults": [{"kind": "replica_lost", "replicas": 1, "at_s": 5.0}],
        **cluster_extra,
    }
    _, out, w = simulate(_fallback_workload(bulk), parse_cluster(cluster))
    bulk_calls = w.call_route == w.route_names.index("bulk")
    late = out.calls.arrival_s > 6.0
    assert (out.calls.outcome[bulk_calls & late] == 6).all()  # failed
    assert not out.calls.fell_back.any()


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
        (
            {"pools": {"a": {"routes": ["agent", "bulk"], "replicas": 3,
                             "shares": {"bulk": 0.2}}}},
            "`pools.a.shares` needs the gateway that holds them",
        ),
        (
            {"gateway": {"preset": "headway-default"},
             "pools": {"a": {"routes": ["agent"], "replicas": 3, "shares": {"bulk": 0.2}}}},
            "`pools.a.shares` names 'bulk', which is not in its routes",
        ),
        (
            {"gateway": {"preset": "headway-default"},
             "pools": {"a": {"routes": ["agent", "bulk"], "replicas": 3,
                             "shares": {"agent": 0.8, "bulk": 0.4}}}},
            "`pools.a.shares` add up to 1.2",
        ),
        (
            {"gateway": {"preset": "headway-default"},
             "pools": {"a": {"routes": ["agent", "bulk"], "replicas": 3,
                             "shares": {"bulk": 0}}}},
            "`pools.a.shares.bulk` must be in (0, 1]",
        ),
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


def test_pools_behind_the_gateway_keep_each_route_on_its_own_replicas() -> None:
    """``headway-default`` in front of pools: the core's upstreams serve their pool's
    routes only (its lanes one per route), as without a gateway."""
    cluster = {**POOLS, "gateway": {"preset": "headway-default"}}
    result, out, w = simulate(_workload(), parse_cluster(cluster))
    agent = w.call_route == w.route_names.index("agent")
    served = out.calls.replica >= 0
    assert set(out.calls.replica[served & agent]) == {0, 1}
    assert set(out.calls.replica[served & ~agent]) == {2}
    assert result.accounting.balanced and result.accounting.gateway == "headway-default"
    assert result.completed_calls > 0.9 * result.calls


def test_a_route_falls_back_through_the_gateway_core() -> None:
    """Behind the gateway the fallback is the core's own choice (``offer_on_route``, the
    live gateway's path): the lost pool's route goes to its declared fallback."""
    cluster = {
        **POOLS,
        "gateway": {"preset": "headway-default"},
        "faults": [{"kind": "replica_lost", "replicas": 1, "at_s": 5.0}],
    }
    result, out, w = simulate(_fallback_workload({"fallback": "agent"}), parse_cluster(cluster))
    bulk = w.call_route == w.route_names.index("bulk")
    late = out.calls.arrival_s > 6.0
    assert (out.calls.outcome[bulk & late] == 2).mean() > 0.9
    assert out.calls.fell_back[bulk & late].all()
    assert result.fallback_calls > 0 and result.accounting.balanced


def _shared_pool_workload() -> Any:
    """An interactive route beside a bulk flood (3k-token prompts, 600-token outputs,
    40/s: far past two H100s) on one pool."""

    def cls(route: str, prompt: int, output: int, ttft_s: float) -> dict[str, Any]:
        return {
            "route": route,
            "input_tokens": {"dist": "lognormal", "mean": prompt, "cv": 0.3},
            "output_tokens": {"dist": "lognormal", "mean": output, "cv": 0.3},
            "slo": {"ttft_s": ttft_s, "tpot_s": 0.1},
        }

    return parse_workload(
        {
            "name": "shared-pool",
            "duration_s": 60,
            "seed": 3,
            "classes": {"agent": cls("agent", 600, 100, 1.0), "bulk": cls("bulk", 3000, 600, 30.0)},
            "sources": [
                {
                    "name": "users",
                    "arrivals": {"process": "poisson", "rate_per_s": 3},
                    "mix": {"agent": 1},
                },
                {
                    "name": "batch",
                    "arrivals": {"process": "poisson", "rate_per_s": 40},
                    "mix": {"bulk": 1},
                },
            ],
            "routes": {"agent": {"model": "llama-3-8b"}, "bulk": {"model": "llama-3-8b"}},
        }
    )


def _most_in_engines(out: Any, rows: Any) -> int:
    """The most of ``rows``' calls inside the engines at once."""
    start = out.calls.dispatch_s[rows]
    start = start[np.isfinite(start)]
    end = out.calls.finish_s[rows]
    end = np.where(np.isfinite(end), end, np.inf)[np.isfinite(out.calls.dispatch_s[rows])]
    times = np.concatenate([start, end])
    steps = np.concatenate([np.ones(start.size), -np.ones(end.size)])
    order = np.lexsort((steps, times))  # an end before a start at the same instant
    return int(np.cumsum(steps[order]).max())


def test_a_strict_share_of_a_shared_pool_holds_a_bulk_flood_to_it() -> None:
    """Seed 000: background work "in a separate or strictly controlled share". On one pool
    serving both routes, a bulk share of 0.2 holds the flood's dispatched calls within
    20% of the pool's slots, and the interactive route, which the flood held at 86% of
    its SLO, meets it for at least 97% of its calls."""

    def run(shares: dict[str, float]) -> tuple[Any, Any, Any]:
        pool = {"routes": ["agent", "bulk"], "replicas": 2, "shares": shares}
        cluster = {"replicas": 2, "gateway": {"preset": "headway-default"}, "pools": {"p": pool}}
        return simulate(_shared_pool_workload(), parse_cluster(cluster))

    free, free_out, w = run({})
    held, held_out, _ = run({"agent": 0.8, "bulk": 0.2})
    bulk = w.call_route == w.route_names.index("bulk")
    slots = 2 * parse_cluster({"replicas": 1}).engine.max_num_seqs  # the SLO allows them all
    assert _most_in_engines(held_out, bulk) <= int(0.2 * slots) < _most_in_engines(free_out, bulk)
    attainment = {g.name: g.slo_attainment for g in free.by_class}
    held_attainment = {g.name: g.slo_attainment for g in held.by_class}
    assert attainment["agent"] < 0.9 <= 0.97 <= held_attainment["agent"]
    assert held.accounting.balanced
