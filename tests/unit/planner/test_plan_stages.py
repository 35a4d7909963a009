"""The simulated plan's stages on a small workload: knee, replicas, bursts, determinism."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import msgspec
import numpy as np
import pytest

from headway.core.workload.spec import WorkloadSpec
from headway.executors import LocalExecutor
from headway.files.jsonout import to_json
from headway.planner.analytic import plan_analytic
from headway.planner.plan import ClusterChoice, Plan, build_plan, default_cluster
from headway.planner.points import Replay, Series
from headway.planner.simulated import (
    PlanSettings,
    PointRunner,
    check_bursts,
    knee_of_seed,
    search_replicas,
)
from headway.sim.cluster import ClusterSpec

T = TypeVar("T")

SMALL: dict[str, Any] = {
    "name": "small",
    "duration_s": 120,
    "seed": 5,
    "classes": {
        "chat": {
            "input_tokens": {"dist": "lognormal", "mean": 1500, "cv": 0.8, "max": 8000},
            "output_tokens": {"dist": "lognormal", "mean": 250, "cv": 0.8, "max": 2000},
            "slo": {"ttft_s": 0.5, "tpot_s": 0.04, "attainment_target": 0.9},
        }
    },
    "sources": [
        {
            "name": "users",
            "arrivals": {
                "process": "poisson",
                "rate_per_s": 6,
                "bursts": [{"start_s": 60, "duration_s": 10, "rate_per_s": 30}],
            },
            "peak_rate_per_s": 20,
            "capacity_per_s": 20,
        }
    ],
    "routes": {"chat": {"model": "llama-3-8b", "replica": {"output_tokens_per_s": 2000}}},
    "planning": {"failures_tolerated": 1},
}
SETTINGS = PlanSettings(seeds=2, steady_duration_s=20)


def _spec(**changes: Any) -> WorkloadSpec:
    return msgspec.convert({**SMALL, **changes}, WorkloadSpec)


def _runner(spec: WorkloadSpec) -> PointRunner:
    return PointRunner(spec, ClusterSpec(), SETTINGS, LocalExecutor(1))


def test_knee_search_agrees_with_a_dense_sweep() -> None:
    """The bracketing search's knee is within one step of a dense sweep's (same seed)."""
    runner = _runner(_spec())
    step = 0.05
    knee = knee_of_seed(runner, 1, seed=5).knee
    assert knee.found
    dense = runner.steady([(1, round(f, 4), 5) for f in np.arange(step, 1.5 + 1e-9, step)])
    target = knee.target
    # The dense knee: the last factor before the first one that misses the target.
    first_miss = next(p.sweep.load_factor for p in dense if p.sweep.slo_attainment < target)
    dense_knee = max(p.sweep.load_factor for p in dense if p.sweep.load_factor < first_miss)
    assert abs(knee.load_factor - dense_knee) <= step + 1e-9
    assert knee.load_factor < knee.upper_load_factor


def test_replica_search_finds_the_smallest_count_and_adds_failover() -> None:
    search = search_replicas(_runner(_spec()))
    assert search.holding_peak is not None and search.recommended is not None
    assert search.recommended == search.holding_peak + 1  # failures_tolerated: 1
    by_count = {p.replicas: p.sweep.slo_attainment for p in search.trials}
    assert by_count[search.holding_peak] >= search.target
    assert search.holding_peak == 1 or by_count[search.holding_peak - 1] < search.target
    assert search.attainment_failures_lost == by_count[search.holding_peak]
    assert search.recommended in by_count  # the curve reaches the planned count


def _series(times: list[float], in_system: list[int]) -> Series:
    return Series(
        time_s=times, queued_calls=[0] * len(times), in_system_calls=in_system,
        running=in_system, kv_usage=[0.1] * len(times),
    )  # fmt: skip


def test_burst_check_measures_backlog_and_drain() -> None:
    """A synthetic run: 10 calls in the system, 70 at the end of the burst, back at 84 s."""
    spec = _spec()
    analytic = plan_analytic(spec)
    assert len(analytic.bursts) == 1  # 30/s against 20/s for 10 s from 60 s
    times = [float(t) for t in range(121)]
    load = [10] * 121
    for t in range(60, 71):
        load[t] = 10 + 6 * (t - 60)
    for t in range(71, 85):
        load[t] = 70 - 4 * (t - 70)
    run = Replay(
        replicas=2, seed=5, duration_s=120, offered_tasks=700, tasks_met_deadline=690,
        slo_attainment=0.98, task_attainment=0.98, goodput_per_s=5.7,
        series=_series(times, load), tails=[], shed_calls=0, amplification=1.0,
    )  # fmt: skip
    (check,) = check_bursts(spec, analytic, run, None)
    assert check.fluid_backlog_tasks == pytest.approx(100)
    assert check.baseline_calls == 10 and check.peak_calls == 70
    assert check.measured_backlog_tasks == pytest.approx(60)
    # back within 20% (+2) of 10 calls, i.e. <= 14, at 84 s: 14 s after the overload ends
    assert check.measured_drain_s == pytest.approx(14)


class _InterruptAfter:
    """A local executor that raises KeyboardInterrupt on its ``n``-th batch."""

    def __init__(self, n: int) -> None:
        self.inner, self.left, self.workers = LocalExecutor(1), n, 1

    def map(
        self,
        fn: Callable[..., T],
        calls: Sequence[tuple[Any, ...]],
        *,
        on_done: Callable[[int, T], None] | None = None,
    ) -> list[T]:
        self.left -= 1
        if self.left == 0:
            raise KeyboardInterrupt
        return self.inner.map(fn, calls, on_done=on_done)

    def close(self) -> None:
        self.inner.close()


def test_interrupted_plan_keeps_finished_stages() -> None:
    spec = _spec()
    counting = _InterruptAfter(-1)  # never interrupts; counts the replica search's batches
    search_replicas(PointRunner(spec, ClusterSpec(), SETTINGS, counting))
    first_knee_batch = -counting.left
    plan = build_plan(
        spec, default_cluster(spec), _InterruptAfter(first_knee_batch), settings=SETTINGS
    )
    assert not plan.complete and plan.interrupted is not None
    assert "knee" in plan.interrupted
    assert plan.simulated is not None and plan.simulated.replica_search is not None
    assert plan.simulated.replay is None
    assert any("Stopped during" in line for line in plan.summary)


def _without_time(text: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(text)
    data.pop("created_at")
    return data


@pytest.fixture(scope="module")
def small_plan() -> Plan:
    spec = _spec()
    return build_plan(spec, default_cluster(spec), LocalExecutor(1), settings=SETTINGS)


def test_same_seed_gives_the_same_plan_json(small_plan: Plan) -> None:
    spec = _spec()
    again = build_plan(spec, default_cluster(spec), LocalExecutor(1), settings=SETTINGS)
    assert _without_time(to_json(again)) == _without_time(to_json(small_plan))


def test_full_plan_on_a_small_workload(small_plan: Plan) -> None:
    plan = small_plan
    sim = plan.simulated
    assert plan.complete and sim is not None and sim.knee is not None
    assert sim.knee.tasks_per_s_low <= sim.knee.tasks_per_s <= sim.knee.tasks_per_s_high
    assert [s.seed for s in sim.knee.seeds] == [5, 6]
    assert sim.replay is not None and sim.bursts
    assert sim.cost is not None and sim.cost.cost_per_successful_task is None  # no price
    assert {t.segment for t in sim.replay.tails} == {"tenant", "class", "input tokens"}
    assert [c for c in plan.comparison if c.differs and not c.reasons] == []
    search = sim.replica_search
    assert search is not None
    # The route declares a measured 2,000 output tokens/s per replica and the simulation
    # is an uncalibrated roofline: the measurement leads, the simulation says what it is.
    sizing = plan.analytic.periods[-1].routes[0].sizing
    assert sizing is not None
    assert (plan.answer.basis, plan.answer.route) == ("measured", "chat")
    assert plan.answer.replicas == sizing.replicas_with_failover
    assert plan.summary[0].startswith(
        f"{sizing.replicas_with_failover} replicas hold the peak of 20 tasks/s with one lost"
    )
    assert "2,000 output tokens/s per replica measured in routes.chat.replica" in plan.summary[0]
    assert plan.summary[1].startswith("Uncalibrated, the simulation (a roofline of Llama-3-8B")
    assert f"finds that {search.recommended} replicas of Llama-3-8B" in plan.summary[1]
    # The bad-day matrix on the planned cluster: its preset and headway-default.
    assert plan.bad_days is not None
    assert plan.bad_days.cluster_replicas == search.recommended
    assert plan.bad_days.presets == ["fifo-unbounded", "headway-default"]
    assert len(plan.bad_days.cells) == 2 * len(plan.bad_days.scenarios)
    assert all(cell.balanced for cell in plan.bad_days.cells)


def test_default_cluster_uses_the_route_model_or_explains() -> None:
    assert default_cluster(_spec()).spec == ClusterSpec(model="llama-3-8b", gpu="h100")
    routes = {"chat": {"model": "my-own-model"}}
    choice = default_cluster(_spec(routes=routes))
    assert choice.spec is None and "my-own-model" in choice.source and "--cluster" in choice.source
    plan = build_plan(_spec(routes=routes), choice, LocalExecutor(1), settings=SETTINGS)
    assert plan.simulated is None and plan.skipped == choice.source
    assert any("Not simulated" in line for line in plan.summary) or plan.summary


def test_analytic_only_skips_simulation() -> None:
    spec = _spec()
    choice = ClusterChoice(spec=ClusterSpec(), source="test")
    plan = build_plan(spec, choice, None, analytic_only=True)
    assert plan.simulated is None and plan.comparison == [] and plan.complete


def test_the_cost_comparison_prices_the_same_run_on_both_sides() -> None:
    """Issue 16, defect 16: the "analytic and simulated" cost row set the busy period's
    own cost per task (at its smaller count) against the whole replayed run (-65%)."""
    replica = {"output_tokens_per_s": 2000, "price_per_hour": 4.0}
    routes = {"chat": {"model": "llama-3-8b", "replica": replica}}
    plan = build_plan(_spec(routes=routes), default_cluster(_spec()), LocalExecutor(1),
                      settings=SETTINGS)  # fmt: skip
    sim = plan.simulated
    assert sim is not None and sim.cost is not None and sim.replay is not None
    row = next(c for c in plan.comparison if c.figure.startswith("cost per task"))
    sizing = plan.analytic.periods[-1].routes[0].sizing
    assert sizing is not None
    whole_run = (
        sizing.replicas_with_failover * 4.0 * sim.cost.run_s / 3600 / sim.replay.offered_tasks
    )
    assert row.analytic == pytest.approx(whole_run)
    assert row.simulated == sim.cost.cost_per_successful_task
    assert row.analytic != plan.analytic.periods[0].cost_per_task


def test_the_burst_headline_counts_in_the_tables_unit(small_plan: Plan) -> None:
    """Issue 16, defect 17: the headline said "200 calls above normal" where the burst
    table said 167 tasks; both count tasks."""
    sim = small_plan.simulated
    assert sim is not None and sim.bursts
    b = max(sim.bursts, key=lambda x: x.fluid_backlog_tasks)
    line = next(s for s in small_plan.summary if " burst to " in s)
    assert f"{b.measured_backlog_tasks:.0f} tasks above normal at worst" in line, line


def test_a_one_pool_plan_carries_no_pool_keys(small_plan: Plan) -> None:
    """Issue 19, deliverable 3: the per-pool keys are left out of a one-pool plan, so its
    JSON is what it was before plans sized pools."""
    data = json.loads(to_json(small_plan))
    assert "pools" not in data["simulated"] and "pools" not in data["answer"]
    assert "pool_replicas" not in data["simulated"]["knee"]
    points = data["simulated"]["replica_search"]["trials"] + data["simulated"]["sweep"]
    assert all("pool_replicas" not in p and "route_attainment" not in p for p in points)
