"""The autoscaler adds replicas after its detection and start-up delays and drains them
again; tool calls through a downstream service queue for its connections."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from headway.core.workload.compile import CompiledWorkload, compile_workload
from headway.files.workload import parse_workload
from headway.sim.cluster import parse_cluster
from headway.sim.results import SimResult
from headway.sim.run import simulate_compiled
from headway.sim.simulator import OUTCOMES, SimOutcome

_AUTOSCALER = {
    "signal": "queue_delay_s",
    "target": 0.5,
    "evaluation_interval_s": 5.0,
    "detection_delay_s": 10.0,
    "startup_delay_s": 20.0,
    "min_replicas": 1,
    "max_replicas": 4,
    "scale_up_cooldown_s": 10.0,
    "scale_down_cooldown_s": 20.0,
}


def _scaled(autoscaler: dict[str, Any] | None) -> tuple[CompiledWorkload, SimResult, SimOutcome]:
    data = {
        "name": "surge",
        "duration_s": 180,
        "classes": {"chat": {"input_tokens": 512, "output_tokens": 128}},
        "sources": [
            {
                "name": "s",
                "arrivals": {
                    "process": "schedule",
                    "repeat": False,
                    "steps": [
                        {"duration_s": 30, "rate_per_s": 5},
                        {"duration_s": 90, "rate_per_s": 30},
                        {"duration_s": 60, "rate_per_s": 2},
                    ],
                },
            }
        ],
    }
    cluster: dict[str, Any] = {
        "replicas": 1,
        "model": "llama-2-7b",
        "gpu": "a100",
        "num_kv_blocks": 4000,
        "engine": {"max_num_seqs": 64},
    }
    if autoscaler is not None:
        cluster["autoscaler"] = autoscaler
    w = compile_workload(parse_workload(data), seed=2)
    result, out = simulate_compiled(w, parse_cluster(cluster))
    return w, result, out


def test_the_autoscaler_adds_replicas_after_its_delays_and_removes_them_later() -> None:
    _, fixed, fixed_out = _scaled(None)
    _, scaled, out = _scaled(_AUTOSCALER)
    assert scaled.accounting.balanced
    assert fixed.engine.replicas_max == 1 < scaled.engine.replicas_max <= 4
    c = out.calls
    helped = c.replica >= 1
    # New replicas serve only after detection (>= 10 s into the surge at 30 s) and
    # start-up (20 s): nothing is dispatched to them before 60 s.
    assert helped.any() and c.dispatch_s[helped].min() >= 30 + 10 + 20 - 1e-9

    # The surge is served sooner with them.
    def e2e(o: SimOutcome) -> float:
        return float(np.nanmean(o.calls.finish_s - o.calls.arrival_s))

    assert e2e(out) < 0.5 * e2e(fixed_out)
    # Billing counts every replica from its start to its removal, not the whole run.
    assert fixed.engine.replica_hours == pytest.approx(fixed_out.end_s / 3600)
    assert fixed.engine.replica_hours < scaled.engine.replica_hours
    assert scaled.engine.replica_hours < scaled.engine.replicas_max * out.end_s / 3600


def _agents(
    service: dict[str, Any], rate_per_s: float = 4.0, retries: dict[str, Any] | None = None
) -> tuple[SimResult, SimOutcome]:
    data = {
        "name": "agents",
        "duration_s": 60,
        "classes": {
            "agent": {
                "calls": 3,
                "tools_per_call": 1,
                "tool_service": "db",
                "input_tokens": 256,
                "output_tokens": 32,
            }
        },
        "services": {"db": service},
        "clients": {"retries": retries or {"max_attempts": 1}},
        "sources": [{"name": "s", "arrivals": {"process": "poisson", "rate_per_s": rate_per_s}}],
    }
    cluster = {"replicas": 2, "model": "llama-2-7b", "gpu": "a100", "num_kv_blocks": 4000}
    w = compile_workload(parse_workload(data), seed=4)
    return simulate_compiled(w, parse_cluster(cluster))


def test_tool_calls_wait_for_the_services_connections() -> None:
    roomy, roomy_out = _agents({"servers": 64, "service_time_s": 0.5})
    tight, tight_out = _agents({"servers": 2, "service_time_s": 0.5})
    assert roomy.accounting.balanced and tight.accounting.balanced
    assert roomy.slo.tasks_completed == tight.slo.tasks_completed == roomy_out.task_finish_s.size
    # Two connections at 0.5 s each carry 4 tool calls/s; 4 tasks/s make 8: the queue
    # grows, and the same tasks (same arrivals) finish later and later.
    later = tight_out.task_finish_s - roomy_out.task_finish_s
    assert (later >= -1e-9).mean() > 0.95
    assert later[-20:].mean() > 10.0 > later[:20].mean()


def test_a_tool_call_that_times_out_ends_its_task() -> None:
    result, out = _agents({"servers": 1, "service_time_s": 0.5, "timeout_s": 2.0})
    assert result.accounting.balanced
    assert result.engine.tool_failures > 0
    failed_tasks = np.isnan(out.task_finish_s)
    assert failed_tasks.sum() == result.engine.tool_failures
    # The calls after a failed tool call are never offered.
    not_offered = out.calls.outcome == OUTCOMES.index("not_offered")
    assert not_offered.sum() > 0


def test_agents_retry_timed_out_tool_calls_and_the_retries_pile_onto_the_pool() -> None:
    service = {"servers": 1, "service_time_s": 0.5, "timeout_s": 2.0}
    once, _once_out = _agents(service)
    retried, retried_out = _agents(
        service, retries={"max_attempts": 3, "backoff_base_s": 0.1, "budget_ratio": None}
    )
    assert once.engine.tool_retries == 0 and retried.engine.tool_retries > 0
    # Every failure is retried or ends its task.
    ended = int(np.isnan(retried_out.task_finish_s).sum())
    assert retried.engine.tool_failures == retried.engine.tool_retries + ended
    # The abandoned calls keep the connection busy: retrying makes more calls time out.
    assert retried.engine.tool_failures > once.engine.tool_failures
    assert retried.accounting.balanced


@pytest.mark.parametrize(
    ("signal", "target"), [("kv_occupancy", 0.5), ("admitted_tokens_per_replica", 3000.0)]
)
def test_the_other_signals_scale_the_pool_too(signal: str, target: float) -> None:
    _, result, _ = _scaled({**_AUTOSCALER, "signal": signal, "target": target})
    assert result.accounting.balanced and result.engine.replicas_max > 1


@pytest.mark.parametrize(
    "service",
    [
        {"servers": 64, "service_time_s": 0.5},
        {"servers": 3, "service_time_s": 0.5},
        {"servers": 1, "service_time_s": 0.5, "timeout_s": 2.0},  # abandoned, wasted work
    ],
)
def test_littles_law_holds_at_the_downstream_boundary(service: dict[str, Any]) -> None:
    """Issue 19, result 1: the services' own live count of tool calls (waiting or
    served) against λW from every tool call's record, over the sampled window."""
    result, _ = _agents(service)
    tools = [b for b in result.little_boundaries if b.boundary.startswith("downstream")]
    assert len(tools) == 1 and tools[0].mean_in_system > 0.5, tools
    assert tools[0].relative_mismatch < 0.01, tools[0]


def test_a_queue_that_dispatches_rarely_still_reads_as_delay() -> None:
    """One sequence at a time, each ~3 s: most 1 s windows admit nothing while calls pile
    up. The oldest waiting call's wait counts as the window's queue delay, so the breach
    lasts past the detection delay and the pool grows (the mean of the admitted alone read
    0 in those windows, reset the breach, and the pool stayed at one replica)."""
    data = {
        "name": "rare",
        "duration_s": 60,
        "classes": {"chat": {"input_tokens": 256, "output_tokens": 256}},
        "sources": [{"name": "s", "arrivals": {"process": "poisson", "rate_per_s": 2}}],
    }
    cluster = {
        "replicas": 1,
        "model": "llama-2-7b",
        "gpu": "a100",
        "num_kv_blocks": 4000,
        "engine": {"max_num_seqs": 1},
        "autoscaler": {
            **_AUTOSCALER,
            "evaluation_interval_s": 1.0,
            "detection_delay_s": 3.0,
            "startup_delay_s": 5.0,
            "scale_up_cooldown_s": 0.0,
        },
    }
    w = compile_workload(parse_workload(data), seed=3)
    result, _ = simulate_compiled(w, parse_cluster(cluster))
    assert result.accounting.balanced and result.engine.replicas_max > 1
