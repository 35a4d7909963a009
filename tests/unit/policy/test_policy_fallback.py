"""Fallback: a substitute only when its data policy and quality class match."""

from __future__ import annotations

from headway.core.policy.fallback import (
    FallbackConfig,
    FallbackPolicy,
    FallbackReason,
    NoFallback,
    UseFallback,
)
from headway.core.workload.spec import Route


def _routes(**routes: Route) -> dict[str, Route]:
    return routes


def test_a_matching_fallback_is_chosen() -> None:
    routes = _routes(main=Route(fallback="spare"), spare=Route())
    assert FallbackPolicy().choose(0.0, "main", routes) == UseFallback("spare", 1)


def test_a_different_data_policy_or_quality_class_is_refused() -> None:
    routes = _routes(
        main=Route(fallback="cheap", data_policy="eu-only", quality_class="gold"),
        cheap=Route(data_policy="anywhere", quality_class="gold"),
    )
    decision = FallbackPolicy().choose(0.0, "main", routes)
    assert isinstance(decision, NoFallback)
    assert decision.reason is FallbackReason.DATA_POLICY_MISMATCH
    routes["cheap"] = Route(data_policy="eu-only", quality_class="silver")
    decision = FallbackPolicy().choose(0.0, "main", routes)
    assert isinstance(decision, NoFallback)
    assert decision.reason is FallbackReason.QUALITY_MISMATCH
    assert "silver" in decision.detail


def test_the_chain_is_followed_within_max_hops_and_checked_against_the_origin() -> None:
    routes = _routes(
        a=Route(fallback="b", data_policy="p", quality_class="q"),
        b=Route(fallback="c", data_policy="p", quality_class="q"),
        c=Route(data_policy="p", quality_class="q"),
    )
    health = {"b": 0.0}
    one_hop = FallbackPolicy().choose(0.0, "a", routes, health)
    assert isinstance(one_hop, NoFallback)
    assert one_hop.reason is FallbackReason.UNHEALTHY
    two_hops = FallbackPolicy(FallbackConfig(max_hops=2))
    assert two_hops.choose(0.0, "a", routes, health) == UseFallback("c", 2)
    routes["c"] = Route(data_policy="other", quality_class="q")
    decision = two_hops.choose(0.0, "a", routes, health)
    assert isinstance(decision, NoFallback)
    assert decision.reason is FallbackReason.UNHEALTHY  # the nearest refusal


def test_cycles_missing_routes_and_disabled() -> None:
    loop = _routes(a=Route(fallback="b"), b=Route(fallback="a"))
    policy = FallbackPolicy(FallbackConfig(max_hops=5))
    decision = policy.choose(0.0, "a", loop, {"b": 0.0})
    assert isinstance(decision, NoFallback)
    assert decision.reason is FallbackReason.UNHEALTHY
    assert "already tried" in decision.detail
    decision = policy.choose(0.0, "a", _routes(a=Route(fallback="ghost")))
    assert isinstance(decision, NoFallback)
    assert decision.reason is FallbackReason.UNKNOWN_ROUTE
    decision = policy.choose(0.0, "a", _routes(a=Route()))
    assert isinstance(decision, NoFallback)
    assert decision.reason is FallbackReason.NONE_DECLARED
    off = FallbackPolicy(FallbackConfig(enabled=False))
    decision = off.choose(0.0, "main", _routes(main=Route(fallback="spare"), spare=Route()))
    assert isinstance(decision, NoFallback)
    assert decision.reason is FallbackReason.DISABLED
