"""Degraded modes in the simulator (issue 20, deliverable 1): the live gateway's core
decision (``gateway.degraded``) caps the output of the mode's band while the line waits,
sheds optional calls, and the bad-day matrix shows what the mode buys."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from headway.core.engine.steptime import AffineStepTime
from headway.core.policy.degraded import DegradedConfig
from headway.files.workload import parse_workload
from headway.sim.baddays.cell import MODES_OFF
from headway.sim.baddays.matrix import run_bad_days
from headway.sim.cluster import ClusterSpec
from headway.sim.gateway import GatewayConfig
from headway.sim.outcome import OUTCOMES
from headway.sim.run import simulate

PROFILE = AffineStepTime(
    overhead_s=0.005, per_prefill_token_s=6e-05, per_prefill_pair_s=2e-09,
    per_decode_seq_s=0.00025, per_decode_kv_token_s=3e-07,
)  # fmt: skip
CAP = 64


def _workload(*, optional_rate_per_s: float = 0.0) -> Any:
    classes: dict[str, Any] = {
        "answer": {
            "input_tokens": {"dist": "lognormal", "mean": 800, "cv": 0.5, "max": 4000},
            "output_tokens": {"dist": "lognormal", "mean": 200, "cv": 0.5, "max": 500},
            "slo": {"e2e_s": 6.0},
        },
        "suggest": {"input_tokens": 400, "output_tokens": 100, "optional": True},
    }
    burst = {"start_s": 15, "duration_s": 15, "multiplier": 3.0}
    sources: list[dict[str, Any]] = [
        {"name": "users", "mix": {"answer": 1},
         "arrivals": {"process": "poisson", "rate_per_s": 4, "bursts": [burst]}},
    ]  # fmt: skip
    if optional_rate_per_s:
        arrivals = {"process": "poisson", "rate_per_s": optional_rate_per_s}
        sources.append({"name": "prefetch", "mix": {"suggest": 1}, "arrivals": arrivals})
    spec = {"name": "burst", "duration_s": 45, "seed": 5, "classes": classes, "sources": sources}
    return parse_workload(spec, "<degraded>")


def _cluster(degraded: dict[str, Any] | None) -> ClusterSpec:
    gateway = GatewayConfig(
        preset="headway-default",
        slots_per_replica=16,
        tenant_budgets="none",
        degraded=None if degraded is None else msgspec.convert(degraded, DegradedConfig),
    )
    return ClusterSpec(step_time="profile", profile=PROFILE, gateway=gateway)


BRIEF = {
    "bands": ["interactive"],
    "max_tokens": CAP,
    "shed_optional": True,
    "enter": {"queue_delay_s": 0.5},
    "leave": {"queue_delay_s": 0.1},
    "min_on_s": 5.0,
}


def test_a_mode_raises_goodput_through_a_burst_and_caps_only_while_on() -> None:
    spec = _workload()
    off, _, _ = simulate(spec, _cluster(None))
    on, out, _ = simulate(spec, _cluster({"modes": {"brief": BRIEF}}))
    assert off.degraded_calls == 0
    assert on.degraded_calls > 0
    assert on.slo.goodput_per_s > off.slo.goodput_per_s * 1.05
    calls = out.calls
    done = calls.outcome == OUTCOMES.index("completed")
    degraded = calls.degraded & done
    assert (calls.num_output_tokens[degraded] <= CAP).all()
    # The mode is on mostly through the burst (15-30 s); before it, the line is short.
    before = calls.arrival_s < 12.0
    during = (calls.arrival_s >= 15.0) & (calls.arrival_s < 30.0)
    assert calls.degraded[during].mean() > 3 * calls.degraded[before].mean()
    assert (calls.num_output_tokens[done & ~calls.degraded] > CAP).any()


def test_optional_calls_are_shed_while_the_mode_is_on() -> None:
    spec = _workload(optional_rate_per_s=2.0)
    result, out, _ = simulate(spec, _cluster({"modes": {"brief": BRIEF}}))
    shed = result.accounting.shed_by_reason.get("degraded_optional", 0)
    assert shed > 0
    assert out.calls.degraded.sum() >= shed
    without, _, _ = simulate(spec, _cluster(None))
    assert "degraded_optional" not in without.accounting.shed_by_reason


def test_the_matrix_runs_the_modes_off_beside_headway_default() -> None:
    spec = _workload()
    matrix = run_bad_days(
        spec, _cluster({"modes": {"brief": BRIEF}}), presets=["headway-default"],
        scenarios=["baseline"],
    )  # fmt: skip
    assert [c.preset for c in matrix.cells] == ["headway-default", MODES_OFF]
    on, off = matrix.cells
    assert on.degraded_calls > 0 and off.degraded_calls == 0
    assert on.goodput_per_s > off.goodput_per_s
    assert np.isfinite(on.goodput_per_s)
