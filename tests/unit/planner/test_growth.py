"""The growth what-if (issue 19, deliverable 6; seed 000 "Change the traffic requirement"):
utilisation resource by resource, the growth at which each saturates, the first to do
so, and what the plan needs at the asked growth."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from headway.core.engine.capacity import steady_step_time_s
from headway.core.errors import WorkloadError
from headway.core.workload.compile import compile_workload
from headway.data import load_efficiency_table
from headway.files.workload import load_workload, parse_workload
from headway.planner.analytic import plan_analytic
from headway.planner.growth import Growth, plan_growth, tool_calls_per_task
from headway.sim.cluster import ClusterSpec, step_time_model

ROOT = Path(__file__).resolve().parents[3]

BASE: dict[str, Any] = {
    "name": "growth",
    "duration_s": 200,
    "classes": {
        "ask": {
            "calls": 2,
            "tools_per_call": 1,
            "tool_service": "orders-db",
            "input_tokens": 1000,
            "output_tokens": 200,
            "route": "chat",
        }
    },
    "sources": [{"name": "users", "arrivals": {"process": "poisson", "rate_per_s": 5}}],
    "routes": {"chat": {"model": "llama-3-8b", "replica": {"output_tokens_per_s": 1000}}},
    "services": {"orders-db": {"servers": 4, "service_time_s": 0.5}},
    "planning": {"planning_factor": 0.7},
}


def _growth(data: dict[str, Any], factor: float, cluster: ClusterSpec | None) -> Growth:
    spec = parse_workload(data)
    return plan_growth(spec, plan_analytic(spec), cluster, factor)


def _resource(growth: Growth, name: str) -> Any:
    found = [r for r in growth.resources if f"{r.resource} ({r.owner})" == name]
    assert len(found) == 1, [f"{r.resource} ({r.owner})" for r in growth.resources]
    return found[0]


def test_the_reference_assistant_saturates_decode_first() -> None:
    """Seed 000's arithmetic: 4,800 output tokens/s on 6 replicas of 1,200 measured is
    2/3 utilised, so decode saturates at 1.5× (its 70% headroom ends at 1.05×); tenfold
    traffic needs ceil(48,000 / 840) replicas, one more with one lost."""
    spec = load_workload(ROOT / "examples" / "reference-assistant.yaml").spec
    analytic = plan_analytic(spec)
    growth = plan_growth(spec, analytic, ClusterSpec(model="llama-3-8b", gpu="h100"), 10)
    peak = analytic.periods[-1].routes[0]
    assert peak.sizing is not None
    measured = 1200.0
    decode = _resource(growth, "decode (route assistant)")
    assert decode.utilization == pytest.approx(peak.output_tokens_per_s / (6 * measured))
    assert growth.binding == "decode (route assistant)"
    assert growth.binding_growth == pytest.approx(6 * measured / peak.output_tokens_per_s)
    assert decode.headroom_ends_at_growth == pytest.approx(0.7 * growth.binding_growth)
    assert growth.resources[0] is decode
    saturating = [r.saturates_at_growth for r in growth.resources]
    assert all(s is not None for s in saturating)
    assert saturating == sorted(saturating)  # type: ignore[type-var]
    assert {r.resource for r in growth.resources} == {"decode", "prefill compute", "KV memory"}
    need = growth.routes[0]
    assert need.replicas_now == peak.sizing.replicas
    assert need.replicas == math.ceil(10 * peak.output_tokens_per_s / (measured * 0.7))
    assert need.replicas_with_failover == need.replicas + spec.planning.failures_tolerated
    assert growth.fixed_limits_exceeded == []
    assert any("no fixed external limit" in n for n in growth.notes)


def test_a_downstream_pool_saturates_before_the_gpus() -> None:
    """5 tasks/s × 1 tool call each on 3 connections held 0.5 s (6 calls/s): the pool is
    at 83% and saturates at 1.2×, before decode (2,000 of 3 × 1,000 tokens/s, 1.5×);
    more replicas do not raise it, so at 3× it is a limit replicas cannot fix."""
    data = copy.deepcopy(BASE)
    data["services"]["orders-db"]["servers"] = 3
    growth = _growth(data, 3, None)
    pool = _resource(growth, "connection pool (service orders-db)")
    assert pool.fixed and pool.capacity == pytest.approx(3 / 0.5)
    assert pool.demand == pytest.approx(5 * 1.0)
    assert growth.binding == "connection pool (service orders-db)"
    assert growth.binding_growth == pytest.approx(6 / 5)
    decode = _resource(growth, "decode (route chat)")
    assert not decode.fixed and decode.saturates_at_growth > growth.binding_growth
    assert growth.fixed_limits_exceeded == ["connection pool (service orders-db)"]
    assert growth.routes[0].replicas == math.ceil(3 * 2000 / (1000 * 0.7))
    # Four times the per-replica capacity: the GPUs move, the pool does not.
    faster = copy.deepcopy(data)
    faster["routes"]["chat"]["replica"]["output_tokens_per_s"] = 4000
    again = _growth(faster, 3, None)
    assert _resource(again, "connection pool (service orders-db)") == pool
    assert again.routes[0].replicas < growth.routes[0].replicas


def test_a_rate_limit_and_an_unused_service_are_reported() -> None:
    data = copy.deepcopy(BASE)
    data["services"]["orders-db"]["rate_limit_per_s"] = 6
    data["services"]["cache"] = {"servers": 2, "service_time_s": 0.01}
    growth = _growth(data, 2, None)
    limit = _resource(growth, "rate limit (service orders-db)")
    assert limit.fixed and limit.saturates_at_growth == pytest.approx(6 / 5)
    assert growth.binding == "rate limit (service orders-db)"
    idle = _resource(growth, "connection pool (service cache)")
    assert idle.utilization == 0 and idle.saturates_at_growth is None
    assert growth.resources[-1] is idle  # never saturates: last
    assert growth.fixed_limits_exceeded == [
        "rate limit (service orders-db)",
        "connection pool (service orders-db)",
    ]


def test_tool_calls_per_task_match_what_compiling_draws() -> None:
    data = copy.deepcopy(BASE)
    data["classes"]["ask"].update(calls=3, tools_per_call=1.5, verification_calls=1)
    spec = parse_workload(data)
    compiled = compile_workload(spec)
    per_task = np.asarray(compiled.call_tool_count).sum() / compiled.num_tasks
    assert per_task == pytest.approx(tool_calls_per_task(spec, "ask"), rel=0.05)


def test_kv_memory_binds_first_with_long_prompts_and_a_small_cache() -> None:
    """8,000-token prompts on a 4,000-block cache (64,000 tokens, under 8 sequences)
    saturate KV memory before decode (measured 3,000 tokens/s) or prefill compute;
    tokens held obey Little's law on the cluster's step time: B sequences decode
    B / step(B) tokens/s."""
    data = copy.deepcopy(BASE)
    data["classes"]["ask"].update(input_tokens=8000, tools_per_call=0)
    del data["classes"]["ask"]["tool_service"]
    data["services"] = {}
    data["sources"][0]["arrivals"]["rate_per_s"] = 0.5
    data["routes"]["chat"]["replica"]["output_tokens_per_s"] = 3000
    cluster = ClusterSpec(model="llama-3-8b", gpu="h100", num_kv_blocks=4000)
    growth = _growth(data, 4, cluster)
    kv = _resource(growth, "KV memory (route chat)")
    assert growth.binding == "KV memory (route chat)"
    assert kv.capacity == 4000 * cluster.engine.block_size
    per_seq = 8000 + 200 / 2 + cluster.engine.block_size / 2
    batch = kv.demand / per_seq
    step = step_time_model(cluster, load_efficiency_table())
    rate = 200.0  # 0.5 tasks/s × 2 calls × 200 tokens on one replica
    assert growth.routes[0].replicas_now == 1
    lo, hi = math.floor(batch), math.ceil(batch)
    assert lo / steady_step_time_s(step, max(lo, 1), 8000, 200) <= rate * 1.0001
    assert hi / steady_step_time_s(step, hi, 8000, 200) >= rate * 0.9999
    full = 4000 * cluster.engine.block_size / per_seq
    kv_rate = full / steady_step_time_s(step, round(full), 8000, 200)
    assert kv.saturates_at_growth == pytest.approx(kv_rate / rate, rel=0.1)
    assert growth.routes[0].limited_by == "KV memory"
    assert growth.routes[0].replicas > 1


def test_a_route_quota_is_a_fixed_limit() -> None:
    data = copy.deepcopy(BASE)
    data["services"] = {}
    del data["classes"]["ask"]["tool_service"]
    data["routes"]["chat"].update(quota_requests_per_s=12.5, quota_tokens_per_s=60000)
    growth = _growth(data, 2, None)
    requests = _resource(growth, "request quota (route chat)")
    tokens = _resource(growth, "token quota (route chat)")
    assert requests.fixed and requests.demand == pytest.approx(10)
    assert requests.saturates_at_growth == pytest.approx(1.25)
    assert tokens.demand == pytest.approx(10 * 1200)
    assert tokens.saturates_at_growth == pytest.approx(5)
    assert growth.binding == "request quota (route chat)"
    assert growth.fixed_limits_exceeded == ["request quota (route chat)"]


@pytest.mark.parametrize(
    ("key", "value"), [("quota_requests_per_s", 0), ("quota_tokens_per_s", -5)]
)
def test_a_bad_quota_names_the_field_and_value(key: str, value: float) -> None:
    data = copy.deepcopy(BASE)
    data["routes"]["chat"][key] = value
    with pytest.raises(WorkloadError) as caught:
        parse_workload(data)
    text = str(caught.value)
    assert "$.routes.chat" in text and f"`{key}` must be a finite number > 0" in text
    assert f"(got {float(value)})" in text


@pytest.mark.parametrize("factor", [0.0, -1.0, math.inf, math.nan])
def test_plan_growth_refuses_a_factor_that_is_not_one(factor: float) -> None:
    spec = parse_workload(BASE)
    with pytest.raises(ValueError, match="not a growth factor"):
        plan_growth(spec, plan_analytic(spec), None, factor)


def test_without_a_cluster_kv_memory_is_named_as_missing() -> None:
    growth = _growth(BASE, 2, None)
    assert all(r.resource != "KV memory" for r in growth.resources)
    assert any("KV memory needs a model and a GPU" in n for n in growth.notes)
