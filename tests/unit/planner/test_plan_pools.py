"""The plan sizes each pool (issue 19, deliverable 3): a cluster of pools gets one count
per pool, each judged by its own routes' attainment, and a disaggregated cluster gets a
prefill and a decode count. At 62be028 both plans were skipped ("the plan's replica
search sizes one pool")."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from rich.console import Console

from headway.core.errors import ConfigError
from headway.core.workload.spec import WorkloadSpec
from headway.executors import LocalExecutor
from headway.files.jsonout import to_builtins
from headway.planner.plan import ClusterChoice, Plan, build_plan, default_cluster
from headway.planner.render import render_plan_terminal
from headway.planner.simulated import PlanSettings, PoolsSearch
from headway.report.html import render_plan_html
from headway.sim.cluster import ClusterSpec, parse_cluster
from headway.sim.sweep import routes_held_attainment

TARGET = 0.9


def _class(route: str | None, input_tokens: int, ttft_s: float) -> dict[str, Any]:
    return {
        **({"route": route} if route else {}),
        "input_tokens": {"dist": "lognormal", "mean": input_tokens, "cv": 0.5, "max": 8000},
        "output_tokens": {"dist": "lognormal", "mean": 250, "cv": 0.5, "max": 2000},
        "slo": {"ttft_s": ttft_s, "tpot_s": 0.04, "attainment_target": TARGET},
    }


def _source(name: str, rate_per_s: float, cls: str) -> dict[str, Any]:
    return {"name": name, "arrivals": {"process": "poisson", "rate_per_s": rate_per_s},
            "mix": {cls: 1}}  # fmt: skip


TWO_ROUTES: dict[str, Any] = {
    "name": "agent-and-bulk",
    "duration_s": 60,
    "seed": 3,
    "classes": {"agent": _class("agent", 1000, 0.5), "bulk": _class("bulk", 1000, 0.5)},
    # The agent route carries eight times the bulk route's calls.
    "sources": [_source("agents", 64, "agent"), _source("batch", 8, "bulk")],
    "routes": {"agent": {"model": "llama-3-8b"}, "bulk": {"model": "llama-3-8b"}},
    "planning": {"failures_tolerated": 1},
}
POOLS: dict[str, Any] = {
    "replicas": 2,
    "pools": {"agent": {"routes": ["agent"], "replicas": 1},
              "bulk": {"routes": ["bulk"], "replicas": 1}},
}  # fmt: skip
ONE_ROUTE: dict[str, Any] = {
    "name": "long-prompts",
    "duration_s": 60,
    "seed": 3,
    "classes": {"chat": _class(None, 3000, 0.5)},
    "sources": [_source("users", 30, "chat")],
    "routes": {"chat": {"model": "llama-3-8b"}},
    "planning": {"failures_tolerated": 1},
}
DISAGGREGATED: dict[str, Any] = {"replicas": 2, "disaggregation": {"prefill_replicas": 1}}
SETTINGS = PlanSettings(seeds=1, steady_duration_s=20, max_replicas=8)


def _spec(data: dict[str, Any]) -> WorkloadSpec:
    return msgspec.convert(data, WorkloadSpec)


def _plan(workload: dict[str, Any], cluster: dict[str, Any], stages: tuple[str, ...]) -> Plan:
    choice = ClusterChoice(spec=parse_cluster(cluster), source="test")
    settings = msgspec.structs.replace(SETTINGS, stages=stages)
    return build_plan(_spec(workload), choice, LocalExecutor(1), settings=settings)


@pytest.fixture(scope="module")
def pools_plan() -> Plan:
    return _plan(TWO_ROUTES, POOLS, ("replicas", "knee", "bursts"))


@pytest.fixture(scope="module")
def disaggregated_plan() -> Plan:
    return _plan(ONE_ROUTE, DISAGGREGATED, ("replicas",))


def _pools(plan: Plan) -> PoolsSearch:
    assert plan.skipped is None and plan.simulated is not None
    assert plan.simulated.pools is not None
    return plan.simulated.pools


def _trial(plan: Plan, **counts: int) -> Any:
    assert plan.simulated is not None and plan.simulated.replica_search is not None
    return next(t for t in plan.simulated.replica_search.trials if t.pool_replicas == counts)


def test_each_pool_gets_its_own_count_and_each_holds_its_target(pools_plan: Plan) -> None:
    pools = _pools(pools_plan)
    agent, bulk = pools.pools
    assert (agent.name, bulk.name) == ("agent", "bulk") and pools.holds
    assert agent.holding_peak is not None and bulk.holding_peak is not None
    assert agent.holding_peak > bulk.holding_peak  # the heavy route needs more
    held = _trial(pools_plan, agent=agent.holding_peak, bulk=bulk.holding_peak)
    assert held.route_attainment["agent"] >= TARGET and held.route_attainment["bulk"] >= TARGET
    # One agent replica fewer misses the agent route's target: the count is the smallest.
    fewer = _trial(pools_plan, agent=agent.holding_peak - 1, bulk=bulk.holding_peak)
    assert fewer.route_attainment["agent"] < TARGET
    assert agent.attainment_one_fewer == fewer.route_attainment["agent"]
    assert bulk.holding_peak == 1 or (bulk.attainment_one_fewer or 1.0) < TARGET
    # A replica lost in each pool: failures_tolerated added to every pool.
    assert (agent.recommended, bulk.recommended) == (agent.holding_peak + 1, bulk.holding_peak + 1)


def test_the_answer_and_summary_name_each_pools_count(pools_plan: Plan) -> None:
    agent, bulk = _pools(pools_plan).pools
    answer = pools_plan.answer
    assert answer.basis == "uncalibrated" and answer.route is None
    assert [(a.pool, a.replicas, a.holding_peak) for a in answer.pools] == [
        ("agent", agent.recommended, agent.holding_peak),
        ("bulk", bulk.recommended, bulk.holding_peak),
    ]
    assert answer.replicas == (agent.recommended or 0) + (bulk.recommended or 0)
    words = (
        f"pool agent: {agent.holding_peak} replicas ({agent.recommended} with one lost); "
        f"pool bulk: {bulk.holding_peak} ({bulk.recommended})"
    )
    assert pools_plan.summary[0].startswith(f"Uncalibrated simulation: {words}")
    assert "with one lost in each pool" in pools_plan.summary[0]


def test_the_knee_and_replay_run_on_the_planned_pools(pools_plan: Plan) -> None:
    agent, bulk = _pools(pools_plan).pools
    sim = pools_plan.simulated
    assert sim is not None and sim.knee is not None and sim.replay is not None
    planned = {"agent": agent.recommended, "bulk": bulk.recommended}
    assert sim.knee.pool_replicas == planned
    assert sim.knee.replicas == sim.replay.replicas == sum(p or 0 for p in planned.values())
    assert all(p.pool_replicas == planned for p in sim.sweep)
    assert any(line.startswith("The knee of ") and "(agent " in line for line in pools_plan.summary)


def test_the_json_terminal_and_report_carry_the_pools(pools_plan: Plan) -> None:
    data = to_builtins(pools_plan)
    assert [p["name"] for p in data["simulated"]["pools"]["pools"]] == ["agent", "bulk"]
    assert [p["pool"] for p in data["answer"]["pools"]] == ["agent", "bulk"]
    page = render_plan_html(data)
    section = page[page.index("id='pools'") : page.index("<h2>", page.index("id='pools'"))]
    assert "<b>agent</b>" in section and "<b>bulk</b>" in section
    assert 'data-plot="pools"' in section
    console = Console(width=120, record=True)
    render_plan_terminal(pools_plan, console)
    text = console.export_text()
    agent, bulk = _pools(pools_plan).pools
    assert "Replicas per pool at the peak" in text
    assert f"agent {agent.recommended} · bulk {bulk.recommended} ◀" in text


def test_a_disaggregated_cluster_gets_prefill_and_decode_counts(disaggregated_plan: Plan) -> None:
    pools = _pools(disaggregated_plan)
    assert pools.kind == "disaggregation" and pools.holds
    prefill, decode = pools.pools
    assert (prefill.name, decode.name) == ("prefill", "decode")
    p, d = prefill.holding_peak, decode.holding_peak
    assert p is not None and d is not None
    assert _trial(disaggregated_plan, prefill=p, decode=d).sweep.slo_attainment >= TARGET
    # One fewer of either misses: the pair is the smallest in each count.
    for name, fewer in (("prefill", (p - 1, d)), ("decode", (p, d - 1))):
        if min(fewer) >= 1:
            point = _trial(disaggregated_plan, prefill=fewer[0], decode=fewer[1])
            assert point.sweep.slo_attainment < TARGET, name
    assert (prefill.recommended, decode.recommended) == (p + 1, d + 1)
    answer = disaggregated_plan.answer
    assert [(a.pool, a.replicas) for a in answer.pools] == [("prefill", p + 1), ("decode", d + 1)]
    assert disaggregated_plan.summary[0].startswith(
        f"Uncalibrated simulation: prefill: {p} replica"
    )
    assert f"decode: {d} ({d + 1})" in disaggregated_plan.summary[0]
    page = render_plan_html(to_builtins(disaggregated_plan))
    assert f"<b>prefill</b>: {p} replica" in page and f"<b>decode</b>: {d} ({d + 1})" in page


def test_a_multi_route_workload_on_one_pool_is_an_error_and_the_default_has_pools() -> None:
    spec = _spec(TWO_ROUTES)
    one_pool = ClusterChoice(spec=ClusterSpec(replicas=2), source="test")
    with pytest.raises(ConfigError, match=r"2 routes \(agent, bulk\)"):
        build_plan(spec, one_pool, LocalExecutor(1), settings=SETTINGS)
    default = default_cluster(spec).spec
    assert default is not None
    assert {n: p.routes for n, p in default.pools.items()} == {"agent": ["agent"], "bulk": ["bulk"]}


def test_the_bad_day_matrix_runs_what_the_simulator_runs_on_pools() -> None:
    from headway.planner.plan import _runnable_cells
    from headway.sim.baddays import DEFAULT_SCENARIOS

    presets = ["fifo-unbounded", "headway-default"]
    kept, scenarios = _runnable_cells(
        _spec(TWO_ROUTES), parse_cluster(POOLS), presets, list(DEFAULT_SCENARIOS)
    )
    assert kept == presets  # pools run behind the gateway too
    assert "autoscaler" not in scenarios and "replica-lost-decode" in scenarios
    kept, scenarios = _runnable_cells(
        _spec(ONE_ROUTE), parse_cluster(DISAGGREGATED), presets, list(DEFAULT_SCENARIOS)
    )
    assert kept == ["fifo-unbounded"] and "cache-cold" not in scenarios
    assert {"baseline", "long-prompts"} <= set(scenarios)


def test_routes_held_attainment_is_the_worst_routes_margin() -> None:
    wants = {"agent": 0.99, "bulk": 0.9}
    # The bulk route at 0.92 holds its 0.9 though under the agent route's 0.99.
    assert routes_held_attainment({"agent": 0.995, "bulk": 0.92}, wants, {}, {}, 0.99) >= 0.99
    held = routes_held_attainment({"agent": 0.995, "bulk": 0.88}, wants, {}, {}, 0.99)
    assert held == pytest.approx(0.99 - 0.02)
    tenants = routes_held_attainment(
        {"agent": 1.0, "bulk": 1.0}, wants, {"t": 0.5}, {"t": 0.8}, 0.99
    )
    assert tenants == pytest.approx(0.99 - 0.3)
