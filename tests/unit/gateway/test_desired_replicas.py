"""The gateway's desired replicas per pool: one pool per route with its own upstreams
(``default`` for the rest), each moved only by its own requests, on the core autoscaler's
decisions; deadline misses and waits counted once per request."""

from __future__ import annotations

from headway.core.gateway_core import Lease, UpstreamState
from headway.core.policy.admission import AdmissionRequest
from headway.core.policy.autoscaler import AutoscalerConfig
from headway.gateway.desired_replicas import DesiredReplicas

CONFIG = AutoscalerConfig(
    kind="predictive",
    evaluation_interval_s=1.0,
    detection_delay_s=0.0,
    startup_delay_s=10.0,
    scale_up_cooldown_s=0.0,
    min_replicas=1,
    max_replicas=8,
)


def _upstreams() -> list[UpstreamState]:
    return [
        UpstreamState(url="http://a0", route="chat"),
        UpstreamState(url="http://a1", route="chat"),
        UpstreamState(url="http://b0"),
    ]


def _lease(route: str | None, deadline_s: float | None = None) -> Lease:
    return Lease(
        tenant="t", band="interactive", cost_tokens=600, blocks=1, revision=None,
        deadline_s=deadline_s, route=route, prompt_tokens=500, expected_output_tokens=100,
    )  # fmt: skip


def test_pools_follow_routes_and_only_their_own_requests_move_them() -> None:
    ups = _upstreams()
    desired = DesiredReplicas(CONFIG, [u.route for u in ups])
    assert desired.desired() == {"chat": 2, "default": 1}
    desired.evaluate(0.0, ups)
    # One second of chat requests that each waited 3 s in the queue and half missed
    # their deadline: chat's pool is under pressure, default's saw nothing.
    for k in range(20):
        lease = _lease("chat", deadline_s=0.5)
        request = AdmissionRequest(
            tenant="t", prompt_tokens=500, p95_output_tokens=100, expected_output_tokens=100
        )
        desired.offered(0.0, request, "chat", lease)
        desired.dispatched(3.0, lease)
        desired.dispatched(3.0, lease)  # a requeued lease is not counted twice
        desired.ended(0.4 if k % 2 else 1.0, lease)
        desired.ended(1.0, lease)
    desired.evaluate(1.0, ups)
    got = desired.desired()
    assert got == {"chat": 2 + CONFIG.max_step, "default": 1}
    # Half of the 20 ended past their deadline (10× the 5% target; 3 s of queue is 3×).
    assert desired.last_reason["chat"].startswith("deadline_miss_ratio at 10.000×")


def test_evaluations_before_the_interval_do_nothing() -> None:
    ups = _upstreams()
    desired = DesiredReplicas(CONFIG, [u.route for u in ups])
    desired.evaluate(0.0, ups)
    before = dict(desired.last_reason)
    lease = _lease(None)
    request = AdmissionRequest(
        tenant="t", prompt_tokens=500, p95_output_tokens=100, expected_output_tokens=100
    )
    desired.offered(0.0, request, None, lease)
    desired.dispatched(5.0, lease)
    desired.evaluate(0.5, ups)
    assert desired.last_reason == before  # the window is still open
    desired.evaluate(1.0, ups)
    assert desired.last_reason["default"].startswith("queue_delay_s at 5.000×")


def test_a_window_without_a_dispatch_reads_its_oldest_waiting_request() -> None:
    """Slots that free together leave windows with no dispatch while the queue grows: the
    oldest queued request's wait is the window's queue delay, not 0."""
    ups = _upstreams()
    desired = DesiredReplicas(CONFIG, [u.route for u in ups])
    desired.evaluate(0.0, ups)
    desired.evaluate(1.0, ups, {"chat": 2.0, None: 0.0})
    # 2 s against the 1 s target; the default pool's lane waited nothing.
    assert desired.last_reason["chat"].startswith("queue_delay_s at 2.000×")
    assert desired.desired() == {"chat": 4, "default": 1}
