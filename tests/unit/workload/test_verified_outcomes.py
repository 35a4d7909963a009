"""Verified outcomes (issue 19, deliverable 5; seed 002's third number): a task class may
declare verification calls and an acceptance probability; a rejected outcome runs the
task again, up to ``max_task_attempts``; only an accepted outcome within the deadline is
verified-outcome goodput. Before, "verified" was only "within deadline"."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import pytest

from headway.core.errors import WorkloadError
from headway.core.workload.compile import compile_workload
from headway.files.workload import parse_workload
from headway.planner.analytic import plan_analytic
from headway.sim.cluster import ClusterSpec
from headway.sim.run import simulate


def _spec(**cls: Any) -> Any:
    return parse_workload(
        {
            "name": "verified",
            "duration_s": 60,
            "seed": 11,
            "classes": {
                "agent": {
                    "calls": 2,
                    "input_tokens": 400,
                    "output_tokens": 60,
                    "slo": {"ttft_s": 2.0, "tpot_s": 0.1, "task_deadline_s": 30.0},
                    **cls,
                }
            },
            "sources": [{"name": "u", "arrivals": {"process": "poisson", "rate_per_s": 4}}],
        }
    )


def test_rejected_outcomes_run_the_task_again_and_verification_adds_calls() -> None:
    spec = _spec(verification_calls=1, acceptance_probability=0.5, max_task_attempts=3)
    w = compile_workload(spec)
    steps = w.task_num_steps
    attempts = steps // 3  # 2 calls + 1 verification per attempt
    assert (steps % 3 == 0).all() and set(attempts.tolist()) <= {1, 2, 3}
    assert attempts.mean() == pytest.approx(spec.classes["agent"].expected_attempts, rel=0.15)
    assert spec.classes["agent"].expected_attempts == pytest.approx(1 + 0.5 + 0.25)
    # Accepted unless all three attempts were rejected (1/8); a rejected task ran all 3.
    assert w.task_accepted.mean() == pytest.approx(7 / 8, abs=0.08)
    assert (attempts[~w.task_accepted] == 3).all()
    again = compile_workload(spec)  # seeded: the same draws
    assert (again.task_accepted == w.task_accepted).all()


def test_verified_goodput_counts_only_accepted_outcomes_within_the_deadline() -> None:
    cluster = msgspec.convert({"replicas": 1, "model": "llama-3-8b", "gpu": "h100"}, ClusterSpec)
    plain, _, _ = simulate(_spec(), cluster)
    judged, _, w = simulate(_spec(acceptance_probability=0.6, max_task_attempts=1), cluster)
    assert plain.slo.tasks_verified == plain.slo.tasks_met_deadline  # all accepted
    assert judged.slo.tasks_verified < judged.slo.tasks_met_deadline
    share = judged.slo.tasks_verified / judged.slo.tasks_met_deadline
    assert share == pytest.approx(float(w.task_accepted.mean()), abs=0.05)
    assert judged.slo.verified_goodput_per_s < plain.slo.verified_goodput_per_s


def test_the_analytic_plan_counts_verification_and_retried_attempts() -> None:
    base = plan_analytic(_spec()).periods[0].routes[0].calls_per_s
    more = (
        plan_analytic(_spec(verification_calls=1, acceptance_probability=0.5, max_task_attempts=2))
        .periods[0]
        .routes[0]
        .calls_per_s
    )
    assert more == pytest.approx(base * (3 / 2) * 1.5, rel=1e-6)


@pytest.mark.parametrize(
    ("cls", "fragment"),
    [
        ({"acceptance_probability": 0.0}, "`acceptance_probability` must be in (0, 1]"),
        ({"max_task_attempts": 0}, "`max_task_attempts` must be between 1 and 10"),
        ({"verification_calls": -1}, "`verification_calls` must be between 0 and 16"),
    ],
)
def test_bad_acceptance_settings_are_refused_by_name(cls: dict[str, Any], fragment: str) -> None:
    with pytest.raises(WorkloadError) as info:
        _spec(**cls)
    assert fragment in str(info.value)


def test_tasks_accepted_are_all_when_no_class_judges_outcomes() -> None:
    w = compile_workload(_spec())
    assert w.task_accepted.all() and np.array_equal(w.task_num_steps, np.full(w.num_tasks, 2))
