"""Every offered call ends in exactly one terminal state, under both gateway presets.

A property test over small random workloads (branches, joins, priorities, tenants,
per-call and per-task deadlines, tool calls through a downstream service, client
timeouts, retries and duplicates) on small clusters, with replicas lost and slowed down,
whose queues and slots are tight enough that calls are admitted, queued, shed, timed
out, cancelled and failed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import event, given, settings
from hypothesis import strategies as st

from headway.core.engine.replica import ReplicaModel
from headway.core.engine.scheduler import SchedulerConfig
from headway.core.engine.steptime import AffineStepTime
from headway.core.policy.admission import AdmissionConfig
from headway.core.policy.queues import BandConfig, QueueConfig
from headway.core.policy.routing import Router
from headway.core.workload.compile import compile_workload
from headway.files.workload import parse_workload
from headway.sim.faults import Fault, ReplicaLost, Slowdown
from headway.sim.gateway import GatewayConfig, SimGateway
from headway.sim.results import build_result
from headway.sim.simulator import OUTCOMES, SimOptions, Simulator

_STEP = AffineStepTime(
    overhead_s=0.003,
    per_prefill_token_s=4e-5,
    per_prefill_pair_s=1e-9,
    per_decode_seq_s=5e-5,
    per_decode_kv_token_s=3e-8,
)
_CODE = {name: i for i, name in enumerate(OUTCOMES)}


@st.composite
def _classes(draw: st.DrawFn) -> dict[str, Any]:
    classes: dict[str, Any] = {}
    for k in range(draw(st.integers(1, 3))):
        slo: dict[str, float] = {}
        if draw(st.booleans()):
            slo["e2e_s"] = draw(st.floats(0.2, 5.0))
        if draw(st.booleans()):
            slo["task_deadline_s"] = draw(st.floats(0.5, 10.0))
        classes[f"c{k}"] = {
            "calls": draw(st.integers(1, 3)),
            "parallel_branches": draw(st.integers(1, 3)),
            "branch_join": draw(st.sampled_from(["all", "first"])),
            "priority": draw(st.sampled_from(["critical", "interactive", "background"])),
            "input_tokens": draw(st.integers(16, 1500)),
            "output_tokens": {"dist": "gamma", "mean": draw(st.integers(4, 200)), "cv": 1.0},
            "slo": slo,
        }
        if draw(st.booleans()):
            classes[f"c{k}"] |= {"tools_per_call": 1, "tool_service": "db"}
    return classes


@settings(max_examples=40, deadline=None)
@given(
    classes=_classes(),
    rate_per_s=st.floats(2.0, 60.0),
    replicas=st.integers(1, 2),
    max_num_seqs=st.integers(4, 12),
    max_queued=st.integers(0, 8),
    check_deadlines=st.booleans(),
    preset=st.sampled_from(["fifo-unbounded", "headway-default"]),
    max_attempts=st.integers(1, 3),
    patience_s=st.none() | st.floats(0.05, 3.0),
    timeout_s=st.none() | st.floats(0.1, 3.0),
    duplicate_after_s=st.none() | st.floats(0.2, 3.0),
    lose_at_s=st.none() | st.floats(0.5, 7.0),
    slow=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_every_offered_call_ends_in_exactly_one_terminal_state(
    classes: dict[str, Any],
    rate_per_s: float,
    replicas: int,
    max_num_seqs: int,
    max_queued: int,
    check_deadlines: bool,
    preset: str,
    max_attempts: int,
    patience_s: float | None,
    timeout_s: float | None,
    duplicate_after_s: float | None,
    lose_at_s: float | None,
    slow: bool,
    seed: int,
) -> None:
    data = {
        "name": "prop",
        "duration_s": 8,
        "classes": classes,
        "tenants": {"a": {"share": 2}, "b": {"share": 1}},
        "clients": {
            "retries": {
                "max_attempts": max_attempts,
                "backoff_base_s": 0.1,
                "timeout_s": timeout_s,
            },
            "patience_s": patience_s,
            "duplicate_after_s": duplicate_after_s,
            "duplicate_probability": 0.5,
        },
        "services": {"db": {"servers": 2, "service_time_s": 0.2, "timeout_s": 1.0}},
        "sources": [
            {
                "name": "s",
                "arrivals": {"process": "poisson", "rate_per_s": rate_per_s},
                "mix": dict.fromkeys(classes, 1.0),
            }
        ],
    }
    w = compile_workload(parse_workload(data), seed=seed)
    engine = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=2048)
    models = [ReplicaModel(engine, 800, _STEP) for _ in range(replicas)]
    gateway = None
    if preset == "headway-default":
        band = BandConfig(max_queued_requests=max_queued, max_wait_s=1.0)
        config = GatewayConfig(
            preset="headway-default",
            admission=AdmissionConfig(check_deadlines=check_deadlines),
            queues=QueueConfig(critical=band, interactive=band, background=band),
        )
        gateway = SimGateway(
            config, num_replicas=replicas, max_num_seqs=max_num_seqs, block_size=16
        )
    faults: list[Fault] = []
    if lose_at_s is not None and replicas == 2:
        faults.append(ReplicaLost(at_s=lose_at_s, phase="any"))
    if slow:
        faults.append(Slowdown(at_s=2.0, until_s=5.0, factor=3.0))
    out = Simulator(
        w,
        models,
        Router(kind="least_outstanding_requests"),
        SimOptions(),
        gateway,
        faults=faults,
    ).run()
    c = out.calls
    result = build_result(w, out, replicas)
    acc = result.accounting

    # The counts balance, and each call is in exactly one state.
    assert acc.balanced
    assert acc.offered_calls + acc.not_offered_calls == acc.calls == w.num_calls
    terminal = [acc.completed, acc.shed, acc.cancelled, acc.timed_out, acc.failed]
    assert sum(terminal) == acc.offered_calls
    assert not (c.outcome == _CODE["in_flight"]).any()
    assert sum(acc.shed_by_reason.values()) == acc.shed
    if not any(isinstance(f, ReplicaLost) for f in faults):
        assert acc.failed == 0  # every call here fits a replica
    else:
        assert acc.failed <= result.engine.calls_lost_with_replicas
    for state in ("shed", "cancelled", "timed_out", "failed", "not_offered_calls",
                  "cancelled_by_patience", "duplicates_sent", "duplicates_coalesced"):  # fmt: skip
        if getattr(acc, state):
            event(f"{preset}: some {state}")

    # Each state agrees with the records.
    offered = c.outcome != _CODE["not_offered"]
    assert np.isfinite(c.arrival_s[offered]).all()
    assert np.isnan(c.arrival_s[~offered]).all()
    completed = c.outcome == _CODE["completed"]
    assert np.isfinite(c.finish_s[completed]).all() and not c.cancelled[completed].any()
    assert (c.replica[completed] >= 0).all()
    assert (c.cancelled == (c.outcome == _CODE["cancelled"])).all()
    shed_or_expired = c.outcome == _CODE["shed"]
    assert (c.replica[shed_or_expired] == -1).all()
    assert np.isnan(c.first_token_s[shed_or_expired]).all()
    timed_out = c.outcome == _CODE["timed_out"]  # at the gateway, or the client's timeout
    # A first token before it timed out: only the gateway cancels a call that far (its
    # deadline passed in flight), in a replica; a client's timeout waits for no token.
    answered = timed_out & (c.first_token_s <= c.finish_s)
    assert not answered.any() or preset == "headway-default"
    assert (c.replica[answered] >= 0).all()
    if answered.any():
        event(f"{preset}: cancelled in flight at its deadline")
    shed = c.outcome == _CODE["shed"]
    assert ((c.shed_reason >= 0) == shed).all()
    if acc.attempts > acc.offered_calls:
        event(f"{preset}: some retries")

    # Attempts: at least one per offered call, at most max_attempts; none otherwise.
    assert (c.attempts[offered] >= 1).all() and (c.attempts[offered] <= max_attempts).all()
    assert (c.attempts[~offered] == 0).all()
    assert acc.attempts == int(c.attempts.sum()) and acc.amplification >= 1.0
    sent = acc.attempts + acc.duplicates_sent
    assert acc.amplification == (sent / acc.offered_calls if acc.offered_calls else 1.0)
    if duplicate_after_s is None:
        assert acc.duplicates_sent == acc.duplicates_coalesced == 0
    if preset == "headway-default":
        assert acc.duplicates_sent == 0
    assert acc.cancelled_by_patience <= acc.cancelled
    if patience_s is None:
        assert acc.cancelled_by_patience == 0
    if preset == "fifo-unbounded":
        assert acc.shed == 0
        if timeout_s is None and not faults:
            assert acc.attempts == acc.offered_calls and acc.timed_out == 0
    else:
        assert gateway is not None
        # The gateway's own books are empty at the end: nothing queued, running or held.
        gateway.core.queues.check_invariants()
        assert len(gateway.core.queues) == 0
        assert set(gateway.core.running.values()) == {0}
        assert set(gateway.core.in_flight.values()) <= {0}

    # SLO attainment keeps shed, timed-out, cancelled and unoffered calls in its
    # denominator; only completed calls can meet it. Losing branches are out of both (a
    # `first` step's answer counts once, through its winner), and never met it.
    assert result.slo.offered_calls == w.num_calls
    assert result.slo.met <= acc.completed
    lost = out.calls.lost_race
    assert result.slo.losing_branches == int(lost.sum())
    assert (lost <= (out.calls.outcome != OUTCOMES.index("not_offered"))).all()
    judged = w.num_calls - result.slo.losing_branches
    if judged:
        assert result.slo.attainment == result.slo.met / judged


def test_skipping_decode_runs_equals_stepping_behind_the_gateway() -> None:
    """The gateway materializes a replica before reading its free KV blocks (and a
    patience cancellation before aborting), so jumping over decode runs gives the same
    admissions, sheds, retries, cancellations and timings as stepping."""
    classes = {
        "chat": {
            "input_tokens": {"dist": "lognormal", "mean": 400, "cv": 1.0, "max": 1500},
            "output_tokens": {"dist": "gamma", "mean": 120, "cv": 1.0},
            "slo": {"e2e_s": 3.0},
        },
        "agent": {"calls": 2, "parallel_branches": 2, "branch_join": "first",
                  "priority": "background", "input_tokens": 300, "output_tokens": 60},
    }  # fmt: skip
    data = {
        "name": "skip",
        "duration_s": 20,
        "classes": classes,
        "clients": {"retries": {"max_attempts": 2}, "patience_s": 3.0},  # retries and cancels
        "sources": [{"name": "s", "arrivals": {"process": "poisson", "rate_per_s": 40},
                     "mix": {"chat": 3, "agent": 1}}],
    }  # fmt: skip
    w = compile_workload(parse_workload(data), seed=5)
    runs = []
    for skip in (True, False):
        engine = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=2048)
        models = [ReplicaModel(engine, 1200, _STEP) for _ in range(2)]
        gateway = SimGateway(
            GatewayConfig(preset="headway-default"), num_replicas=2, max_num_seqs=16, block_size=16
        )
        options = SimOptions(skip_decode=skip, check_invariants=not skip)
        runs.append(Simulator(w, models, Router(kind="kv_aware"), options, gateway).run())
    skipped, stepped = runs
    assert skipped.num_skipped_steps > 0
    assert (skipped.calls.outcome == stepped.calls.outcome).all()
    assert (skipped.calls.outcome == _CODE["shed"]).any()
    assert skipped.cancelled_by_patience == stepped.cancelled_by_patience > 0
    assert (skipped.calls.attempts == stepped.calls.attempts).all()
    assert skipped.calls.attempts.max() == 2
    for column in ("arrival_s", "dispatch_s", "first_token_s", "finish_s", "retry_after_s"):
        a, b = getattr(skipped.calls, column), getattr(stepped.calls, column)
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9, equal_nan=True)
