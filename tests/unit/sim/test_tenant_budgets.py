"""The default tenant budgets are work-conserving: on a workload the cluster holds without
a gateway (FIFO at >= 95% attainment), `headway-default` refuses nothing for a tenant's
budget and every tenant does at least as well as under FIFO. With hard budgets (the old
default, now `tenant_budgets: hard-shares`) a small bursty tenant was refused its calls
at normal load because its share of the planned capacity was a cap even while the
cluster idled; a flood still meets its budget once another tenant waits."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from headway.core.engine.capacity import steady_step_time_s
from headway.core.workload.compile import compile_workload
from headway.data import load_efficiency_table
from headway.files.workload import parse_workload
from headway.sim.cluster import parse_cluster, step_time_model
from headway.sim.presets import (
    _saturation_calls_per_s,
    planned_capacity_tokens_per_s,
    slo_batch,
    slo_slots,
)
from headway.sim.results import SimResult
from headway.sim.run import simulate_compiled


def _workload(light_rate: float, burst_rate: float, seed: int) -> dict[str, Any]:
    """A dominant light tenant (short answers), a bursty heavy one, a small steady tail."""
    slo = {"ttft_s": 2.0, "tpot_s": 0.2}
    return {
        "name": "tenants",
        "seed": seed,
        "duration_s": 120,
        "classes": {
            "light": {"input_tokens": 200, "output_tokens": 4, "slo": slo},
            "heavy": {"input_tokens": 1500, "output_tokens": 300, "slo": slo},
            "tail": {"input_tokens": 400, "output_tokens": 60, "slo": slo},
        },
        # Shares by request count, as `trace fit` wrote them: the bursty tenant's is small.
        "tenants": {"light": {"share": 0.8}, "bursty": {"share": 0.1}, "tail": {"share": 0.1}},
        "sources": [
            {
                "name": "light",
                "mix": {"light": 1.0},
                "tenants": {"light": 1.0},
                "arrivals": {"process": "poisson", "rate_per_s": light_rate},
            },
            {
                "name": "bursty",
                "mix": {"heavy": 1.0},
                "tenants": {"bursty": 1.0},
                "arrivals": {
                    "process": "on_off",
                    "on_rate_per_s": burst_rate,
                    "on_s": {"dist": "fixed", "value": 5},
                    "off_s": {"dist": "fixed", "value": 20},
                },
            },
            {
                "name": "tail",
                "mix": {"tail": 1.0},
                "tenants": {"tail": 1.0},
                "arrivals": {"process": "poisson", "rate_per_s": 0.5},
            },
        ],
    }


def _cluster(budgets: str | None, slot_headroom: float | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {"replicas": 1, "model": "llama-3-8b", "gpu": "h100-sxm"}
    if budgets is not None:
        data["gateway"] = {"preset": "headway-default", "tenant_budgets": budgets,
                           "tenant_slot_headroom": slot_headroom}  # fmt: skip
    return data


def _run(
    workload: dict[str, Any], budgets: str | None, slot_headroom: float | None = None
) -> SimResult:
    w = compile_workload(parse_workload(workload))
    result, _ = simulate_compiled(w, parse_cluster(_cluster(budgets, slot_headroom)))
    return result


def _by_tenant(result: SimResult) -> dict[str, float]:
    return {g.name: g.slo_attainment or 0.0 for g in result.by_tenant if g.calls}


NEAR_THE_KNEE = pytest.param(80.0, 25.0, 1, id="near-the-knee")
"""FIFO 97.7% here. It failed three ways, each fixed in the core or the preset: strict
SFQ put the bursty tenant's bursts behind the light tenant's stream (92.9% against FIFO's
97.5%, budgets off), so the queues keep arrival order until a call has waited
``fair_after_s`` (half the TTFT objective); full dispatch slots read as contention, so
its budget refused 67 calls, where now a budget borrows from the pool of the budgets'
capacity; and its 125-call bursts overflowed a 64-call tenant queue (84 refused), now as
deep as half the calls the cluster completes within the TTFT objective."""


@pytest.mark.parametrize(
    ("light_rate", "burst_rate", "seed"),
    [(30.0, 8.0, 1), (60.0, 20.0, 2), (70.0, 22.0, 4), NEAR_THE_KNEE],
)
def test_default_budgets_refuse_nothing_where_fifo_holds(
    light_rate: float, burst_rate: float, seed: int
) -> None:
    workload = _workload(light_rate, burst_rate, seed)
    fifo = _run(workload, None)
    assert fifo.slo.attainment >= 0.95, fifo.slo.attainment  # a load the cluster holds
    default = _run(workload, "shares")
    assert default.accounting.balanced
    assert default.accounting.shed == 0, default.accounting.shed_by_reason
    fifo_t, default_t = _by_tenant(fifo), _by_tenant(default)
    for tenant, attainment in fifo_t.items():
        assert default_t[tenant] >= attainment - 0.005, (tenant, default_t, fifo_t)


def test_hard_budgets_refuse_a_bursty_tenant_at_normal_load() -> None:
    """What the old default did where FIFO serves every call: the bursty tenant's share of
    the planned capacity was a cap while the cluster idled."""
    workload = _workload(60.0, 20.0, 2)
    hard = _run(workload, "hard-shares")
    assert hard.accounting.shed_by_reason.get("tenant_token_rate", 0) > 100
    assert _by_tenant(hard)["bursty"] < 0.5


def test_a_flood_still_meets_its_budget_when_others_wait() -> None:
    """Work-conserving is not unbounded: a tenant whose bursts are several times the
    cluster's capacity is refused for its budget once the others are kept waiting, and
    they are served far better than with no budgets at all (not as well as with hard
    ones: the price of lending idle capacity, taken back only once contention shows)."""
    workload = _workload(30.0, 120.0, 5)
    default = _run(workload, "shares")
    unbudgeted = _run(workload, "none")
    assert default.accounting.shed_by_reason.get("tenant_token_rate", 0) > 0
    assert unbudgeted.accounting.shed_by_reason.get("tenant_token_rate", 0) == 0
    protected, exposed = _by_tenant(default), _by_tenant(unbudgeted)
    for tenant in ("light", "tail"):
        assert protected[tenant] >= exposed[tenant] + 0.2, (protected, exposed)


def test_slot_shares_in_the_simulator_are_the_live_gateways() -> None:
    """`tenant_slot_headroom` runs the live gateway's slot shares (one copy,
    core.policy.slot_shares): beside a flood the other tenants are served better than
    with neither budgets nor shares; at normal load they reserve by share, so the small
    bursty tenant waits beside idle slots past its SLO (why the simulator leaves them off
    by default until the reserve follows demand)."""
    flood = _workload(30.0, 120.0, 5)
    shares, bare = _run(flood, "none", slot_headroom=1.0), _run(flood, "none")
    for tenant in ("light", "tail"):
        assert _by_tenant(shares)[tenant] > _by_tenant(bare)[tenant] + 0.2
    normal = _run(_workload(60.0, 20.0, 2), "shares", slot_headroom=1.0)
    assert _by_tenant(normal)["bursty"] < 0.5
    assert _by_tenant(_run(_workload(60.0, 20.0, 2), "shares"))["bursty"] == 1.0


def test_the_budgets_capacity_is_priced_in_the_tokens_they_keep() -> None:
    """Admission charges a call its prompt plus ``max_tokens`` and refunds what it did not
    use, so a bucket pays for the tokens served: the budgets' capacity is priced in those
    (a raised ``max_tokens`` cap neither widens the budgets nor narrows them). Priced at
    the cap, the budgets summed to 1.43× the planned capacity and a flood borrowed past
    it (issue 17)."""
    cluster = parse_cluster(_cluster("shares"))
    step_time = step_time_model(cluster, load_efficiency_table())
    capacities = []
    for max_tokens in (None, 2_000):
        data = _workload(30.0, 8.0, 1)
        for name in data["classes"]:
            data["classes"][name]["max_tokens"] = max_tokens
        w = compile_workload(parse_workload(data))
        capacity = planned_capacity_tokens_per_s(w, cluster, step_time)
        served = float((w.call_input_tokens + w.call_output_tokens).mean())
        factor = w.spec.planning.planning_factor
        calls_per_s = _saturation_calls_per_s(w, cluster, step_time)
        assert capacity == pytest.approx(calls_per_s * factor * served, rel=1e-9)
        capacities.append(capacity)
    assert capacities[0] == pytest.approx(capacities[1], rel=1e-9)


def test_the_budgets_capacity_is_the_batch_the_slo_allows() -> None:
    """An ``e2e_s`` objective bounds the batch a replica may run (its steady step must
    decode the class's p95 output within it), and the budgets' capacity is the
    throughput of that batch, not of saturation: sized at saturation, a 10× flood at the
    knee borrowed the capacity the SLO did not have (issue 17)."""
    cluster = parse_cluster(_cluster("shares"))
    step_time = step_time_model(cluster, load_efficiency_table())
    loose = compile_workload(parse_workload(_workload(30.0, 8.0, 1)))
    data = _workload(30.0, 8.0, 1)
    data["classes"]["heavy"]["slo"] = {"ttft_s": 2.0, "tpot_s": 0.2, "e2e_s": 6.0}
    tight = compile_workload(parse_workload(data))
    assert slo_batch(loose, cluster, step_time) == slo_slots(loose, cluster, step_time)
    batch = slo_batch(tight, cluster, step_time)
    isl = round(float(tight.call_input_tokens.mean()))
    osl = round(float(tight.call_output_tokens.mean()))
    heavy = tight.class_names.index("heavy")
    is_heavy = tight.task_class[tight.call_task] == heavy
    p95 = float(np.percentile(tight.call_output_tokens[is_heavy], 95))
    assert steady_step_time_s(step_time, batch, isl, osl) <= 6.0 / p95
    assert steady_step_time_s(step_time, batch + 1, isl, osl) > 6.0 / p95
    assert batch < slo_slots(tight, cluster, step_time)
    capacity = planned_capacity_tokens_per_s(tight, cluster, step_time)
    assert capacity is not None
    assert capacity < planned_capacity_tokens_per_s(loose, cluster, step_time)
    served = float((tight.call_input_tokens + tight.call_output_tokens).mean())
    factor = tight.spec.planning.planning_factor
    assert capacity < factor * served * _saturation_calls_per_s(tight, cluster, step_time)
