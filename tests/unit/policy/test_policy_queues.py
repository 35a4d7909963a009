"""The queues: fairness by tokens, strict priority, the critical reserve, the background
cap, ageing, expiry, bounds and measured drain rates."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from headway.core.policy.decisions import ShedReason
from headway.core.policy.queues import BandConfig, PriorityQueues, QueueConfig, Queued

ROOMY = {"max_queued_requests": 100_000}


def _config(**fields: object) -> QueueConfig:
    base: dict[str, object] = {
        "critical": BandConfig(**ROOMY),  # type: ignore[arg-type]
        "interactive": BandConfig(**ROOMY),  # type: ignore[arg-type]
        "background": BandConfig(**ROOMY),  # type: ignore[arg-type]
        "max_queued_per_tenant": 100_000,
        "fair_after_s": 0.0,  # strict SFQ: these tests pop at once, before anyone waits
    }
    base.update(fields)
    return QueueConfig(**base)  # type: ignore[arg-type]


class Dispatcher:
    """Pops from the queues while tracking running requests per band, like a driver."""

    def __init__(self, queues: PriorityQueues[str], total_slots: int) -> None:
        self.queues = queues
        self.total_slots = total_slots
        self.running: Counter[str] = Counter()

    def pop(self, now: float) -> Queued[str] | None:
        got = self.queues.try_pop(now, total_slots=self.total_slots, running=self.running)
        if got is not None:
            self.running[got.band] += 1
        return got

    def drain(self, now: float) -> list[Queued[str]]:
        out = []
        while (got := self.pop(now)) is not None:
            out.append(got)
        return out

    def finish(self, got: Queued[str]) -> None:
        self.running[got.band] -= 1


def _pop_free(queues: PriorityQueues[str], now: float) -> Queued[str] | None:
    return queues.try_pop(now, total_slots=1000, running={})


# -------------------------------------------------------------------------- fairness


def test_wfq_serves_tokens_in_proportion_to_weights() -> None:
    """Weights 1:3, random request sizes, both tenants always backlogged: over many pops
    the tokens served are within 5% of 1:3."""
    rng = np.random.default_rng(7)
    queues = PriorityQueues[str](_config(tenant_weights={"light": 1.0, "heavy": 3.0}))
    served: Counter[str] = Counter()
    t = 0.0
    for tenant in ("light", "heavy"):
        for _ in range(50):
            queues.push(
                t,
                tenant,
                band="interactive",
                tenant=tenant,
                cost_tokens=int(rng.integers(50, 2000)),
            )
    for _ in range(4000):
        t += 0.01
        got = _pop_free(queues, t)
        assert got is not None
        served[got.tenant] += got.cost_tokens
        # keep the tenant backlogged: replace what was served
        queues.push(
            t,
            got.tenant,
            band="interactive",
            tenant=got.tenant,
            cost_tokens=int(rng.integers(50, 2000)),
        )
    ratio = served["heavy"] / served["light"]
    assert ratio == pytest.approx(3.0, rel=0.05)


def test_wfq_is_by_tokens_not_by_requests() -> None:
    queues = PriorityQueues[str](_config())
    t = 0.0
    for _ in range(500):
        queues.push(t, "s", band="interactive", tenant="short", cost_tokens=100)
    for _ in range(100):
        queues.push(t, "l", band="interactive", tenant="long", cost_tokens=1000)
    popped = Counter(got.tenant for got in (_pop_free(queues, t) for _ in range(220)) if got)
    assert popped["short"] == pytest.approx(10 * popped["long"], abs=11)


def test_a_newly_active_tenant_gets_no_credit_for_its_idle_time() -> None:
    queues = PriorityQueues[str](_config())
    for _ in range(100):
        queues.push(0.0, "a", band="interactive", tenant="a", cost_tokens=100)
    for _ in range(50):
        _pop_free(queues, 1.0)
    for _ in range(100):
        queues.push(1.0, "b", band="interactive", tenant="b", cost_tokens=100)
    popped = Counter(got.tenant for got in (_pop_free(queues, 2.0) for _ in range(40)) if got)
    assert popped["a"] == pytest.approx(20, abs=1)  # alternates, b does not take 40 in a row


def test_fifo_within_a_tenant() -> None:
    queues = PriorityQueues[str](_config())
    for i in range(5):
        queues.push(float(i), f"r{i}", band="interactive", tenant="a", cost_tokens=10 * (5 - i))
    assert [_pop_free(queues, 9.0).item for _ in range(5)] == [f"r{i}" for i in range(5)]  # type: ignore[union-attr]


def _burst_then_light(fair_after_s: float) -> tuple[PriorityQueues[str], Dispatcher]:
    queues = PriorityQueues[str](_config(fair_after_s=fair_after_s))
    for i in range(4):
        queues.push(0.0, f"burst-{i}", band="interactive", tenant="bursty", cost_tokens=1000)
    queues.push(0.1, "light-0", band="interactive", tenant="light", cost_tokens=10)
    return queues, Dispatcher(queues, total_slots=2)


def test_a_band_keeps_arrival_order_until_its_oldest_request_has_waited() -> None:
    """While nobody has waited ``fair_after_s`` the band is FIFO across tenants: a burst
    the engines hold is not put behind a steady stream that arrived after it (issue 17:
    reordering it cost the bursty tenant attainment FIFO kept). Once the oldest request
    has waited that long, SFQ orders the band, and the tags that FIFO advanced put the
    tenant that took most last."""
    _, fifo = _burst_then_light(0.5)
    assert [g.item for g in fifo.drain(0.2)] == ["burst-0", "burst-1"]  # waits < 0.5 s
    fifo.running.clear()  # both finished
    assert [g.item for g in fifo.drain(0.6)] == ["light-0", "burst-2"]  # burst-2 waited 0.6 s
    _, fair = _burst_then_light(0.0)
    assert [g.item for g in fair.drain(0.2)] == ["burst-0", "light-0"]  # strict SFQ


def test_fair_after_s_must_be_a_non_negative_number() -> None:
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="fair_after_s"):
            QueueConfig(fair_after_s=bad)


# -------------------------------------------------------------------------- bands and slots


def test_strict_priority_serves_critical_first() -> None:
    queues = PriorityQueues[str](_config())
    queues.push(0.0, "bg", band="background", tenant="t", cost_tokens=1)
    queues.push(0.0, "int", band="interactive", tenant="t", cost_tokens=1)
    queues.push(0.0, "crit", band="critical", tenant="t", cost_tokens=1)
    assert [_pop_free(queues, 1.0).item for _ in range(3)] == ["crit", "int", "bg"]  # type: ignore[union-attr]
    assert _pop_free(queues, 1.0) is None


def test_reserved_slots_stay_available_to_critical() -> None:
    queues = PriorityQueues[str](_config(critical_reserved_slots=2))
    dispatcher = Dispatcher(queues, total_slots=6)
    for _ in range(10):
        queues.push(0.0, "i", band="interactive", tenant="t", cost_tokens=1)
    assert len(dispatcher.drain(0.0)) == 4  # 6 slots less 2 reserved
    assert queues.free_slots("interactive", total_slots=6, running=dispatcher.running) == 0
    queues.push(0.0, "c1", band="critical", tenant="t", cost_tokens=1)
    queues.push(0.0, "c2", band="critical", tenant="t", cost_tokens=1)
    queues.push(0.0, "c3", band="critical", tenant="t", cost_tokens=1)
    assert [g.item for g in dispatcher.drain(0.0)] == ["c1", "c2"]
    # when an interactive request finishes, its slot goes back to interactive, not beyond
    dispatcher.finish(
        Queued(
            item="i", band="interactive", tenant="t", cost_tokens=1, enqueued_s=0.0, deadline_s=None
        )
    )
    assert [g.item for g in dispatcher.drain(0.0)] == ["c3"]  # critical first when it waits


def test_background_never_exceeds_its_share() -> None:
    queues = PriorityQueues[str](_config(background_max_share=0.25, critical_reserved_slots=0))
    dispatcher = Dispatcher(queues, total_slots=8)
    for _ in range(10):
        queues.push(0.0, "b", band="background", tenant="t", cost_tokens=1)
    assert len(dispatcher.drain(0.0)) == 2  # 25% of 8, although 6 slots stay free
    queues.push(0.0, "i", band="interactive", tenant="t", cost_tokens=1)
    assert [g.item for g in dispatcher.drain(0.0)] == ["i"]


def test_free_slots_by_band_applies_the_reserve_and_the_cap() -> None:
    queues = PriorityQueues[str](_config(critical_reserved_slots=2, background_max_share=0.25))
    running = {"critical": 1, "interactive": 3, "background": 1}
    assert queues.free_slots_by_band(total_slots=8, running=running) == {
        "critical": 3,  # any free slot
        "interactive": 2,  # 8 - 2 reserved - 4 non-critical running
        "background": 1,  # cap 2, one running
    }
    assert queues.free_slots_by_band(total_slots=8, running={"interactive": 6}) == {
        "critical": 2,
        "interactive": 0,
        "background": 0,
    }


def test_a_small_positive_share_still_gets_one_slot_and_zero_gets_none() -> None:
    assert _config(background_max_share=0.01).background_cap_slots(8) == 1
    assert _config(background_max_share=0.0).background_cap_slots(8) == 0


def test_a_reserve_as_large_as_the_slots_is_a_config_error() -> None:
    queues = PriorityQueues[str](_config(critical_reserved_slots=4))
    with pytest.raises(ValueError, match="critical_reserved_slots"):
        queues.try_pop(0.0, total_slots=4, running={})


# -------------------------------------------------------------------------- ageing


def _stream(max_wait_s: float | None, seconds: float) -> float | None:
    """A constant stream of interactive work, one background request waiting from t=0:
    when is it dispatched (None: never within ``seconds``)?"""
    queues = PriorityQueues[str](
        _config(background=BandConfig(max_queued_requests=10, max_wait_s=max_wait_s))
    )
    queues.push(0.0, "old", band="background", tenant="batch", cost_tokens=1)
    t = 0.0
    while t < seconds:
        t = round(t + 0.5, 6)
        queues.push(t, "new", band="interactive", tenant="user", cost_tokens=1)
        queues.push(t, "new", band="interactive", tenant="user", cost_tokens=1)
        got = queues.try_pop(t, total_slots=4, running={})  # one slot per tick
        assert got is not None
        if got.item == "old":
            return t
    return None


def test_ageing_lets_an_old_background_request_through_a_constant_stream() -> None:
    assert _stream(max_wait_s=None, seconds=120.0) is None  # strict priority starves it
    assert _stream(max_wait_s=30.0, seconds=120.0) == 30.0


def test_an_aged_request_still_respects_its_band_cap() -> None:
    queues = PriorityQueues[str](
        _config(
            background=BandConfig(max_queued_requests=10, max_wait_s=1.0),
            background_max_share=0.25,
            critical_reserved_slots=0,
        )
    )
    queues.push(0.0, "old", band="background", tenant="b", cost_tokens=1)
    queues.push(50.0, "new", band="interactive", tenant="i", cost_tokens=1)
    got = queues.try_pop(50.0, total_slots=4, running={"background": 1})
    assert got is not None
    assert got.item == "new"


# -------------------------------------------------------------------------- expiry


def test_expiry_removes_exactly_the_requests_past_their_deadline() -> None:
    queues = PriorityQueues[str](_config())
    deadlines = {"a": 5.0, "b": 10.0, "c": None, "d": 10.0 + 1e-9, "e": 2.0}
    for name, deadline in deadlines.items():
        queues.push(0.0, name, band="interactive", tenant=name, cost_tokens=1, deadline_s=deadline)
    assert [q.item for q in queues.expire(10.0)] == ["e", "a", "b"]
    assert len(queues) == 2
    assert sorted(g.item for g in (_pop_free(queues, 10.0), _pop_free(queues, 10.0)) if g) == [
        "c",
        "d",
    ]
    stats = queues.statistics(10.0)
    assert (stats.pushed, stats.dispatched, stats.expired) == (5, 2, 3)


def test_try_pop_never_returns_an_expired_request_and_expire_reports_it() -> None:
    queues = PriorityQueues[str](_config())
    queues.push(0.0, "late", band="interactive", tenant="a", cost_tokens=1, deadline_s=1.0)
    queues.push(0.0, "fine", band="interactive", tenant="a", cost_tokens=1)
    got = _pop_free(queues, 1.0)
    assert got is not None
    assert got.item == "fine"
    assert [q.item for q in queues.expire(1.0)] == ["late"]
    assert queues.expire(2.0) == []
    queues.check_invariants()


def test_expired_requests_do_not_charge_their_tenant() -> None:
    queues = PriorityQueues[str](_config())
    for _ in range(10):
        queues.push(0.0, "x", band="interactive", tenant="a", cost_tokens=1000, deadline_s=1.0)
    queues.push(0.0, "b", band="interactive", tenant="b", cost_tokens=100)
    queues.push(0.0, "b", band="interactive", tenant="b", cost_tokens=100)
    queues.expire(1.0)
    queues.push(1.0, "a", band="interactive", tenant="a", cost_tokens=100)
    # a has no debt from its expired requests: it is served before b's second request
    assert [_pop_free(queues, 1.0).tenant for _ in range(3)] == ["b", "a", "b"]  # type: ignore[union-attr]


# -------------------------------------------------------------------------- bounds and rates


def test_a_full_band_sheds_with_retry_after_from_the_measured_drain() -> None:
    queues = PriorityQueues[str](_config(interactive=BandConfig(max_queued_requests=20)))
    for i in range(20):
        assert queues.push(0.0, f"r{i}", band="interactive", tenant="a", cost_tokens=1) is None
    for k in range(1, 21):  # 2 per second for 10 s, refilled
        _pop_free(queues, k * 0.5)
        queues.push(k * 0.5, "refill", band="interactive", tenant="a", cost_tokens=1)
    stats = queues.statistics(10.0).bands["interactive"]
    assert stats.drain_requests_per_s == pytest.approx(2.0)
    shed = queues.push(10.0, "one more", band="interactive", tenant="a", cost_tokens=1)
    assert shed is not None
    assert shed.reason is ShedReason.QUEUE_FULL
    assert shed.retry_after_s == pytest.approx(20 / 2.0)


def test_the_tenant_bound_sheds_before_the_band_is_full() -> None:
    queues = PriorityQueues[str](_config(max_queued_per_tenant=3))
    for _ in range(3):
        assert queues.push(0.0, "a", band="interactive", tenant="a", cost_tokens=1) is None
    shed = queues.push(0.0, "a", band="background", tenant="a", cost_tokens=1)
    assert shed is not None
    assert shed.reason is ShedReason.QUEUE_FULL
    assert queues.push(0.0, "b", band="interactive", tenant="b", cost_tokens=1) is None
    assert queues.statistics(0.0).rejected == 1


def test_a_request_already_past_its_deadline_is_not_queued() -> None:
    queues = PriorityQueues[str](_config())
    shed = queues.push(5.0, "x", band="interactive", tenant="a", cost_tokens=1, deadline_s=5.0)
    assert shed is not None
    assert shed.reason is ShedReason.DEADLINE_UNMEETABLE
    assert shed.retry_after_s is None


def test_statistics_per_tenant_and_band() -> None:
    queues = PriorityQueues[str](_config())
    queues.push(0.0, "x", band="interactive", tenant="a", cost_tokens=300)
    queues.push(1.0, "y", band="background", tenant="a", cost_tokens=200)
    stats = queues.statistics(4.0)
    assert stats.tenants["a"].queued_requests == 2
    assert stats.tenants["a"].queued_tokens == 500
    assert stats.tenants["a"].oldest_wait_s == pytest.approx(4.0)
    assert stats.bands["background"].oldest_wait_s == pytest.approx(3.0)
    assert stats.queued_requests == 2


def test_time_going_backwards_and_unknown_bands_are_errors() -> None:
    queues = PriorityQueues[str](_config())
    queues.push(5.0, "x", band="interactive", tenant="a", cost_tokens=1)
    with pytest.raises(ValueError, match="backwards"):
        queues.try_pop(4.0, total_slots=1, running={})
    with pytest.raises(ValueError, match="unknown queue band"):
        queues.push(6.0, "x", band="urgent", tenant="a", cost_tokens=1)


def test_token_aware_dispatch_holds_the_chosen_request_without_overtaking() -> None:
    """`fits` refusing the request the order picks dispatches nothing: a small request
    behind a large one does not overtake it, and the large one goes first once it fits."""
    queues: PriorityQueues[str] = PriorityQueues(_config())
    queues.push(0.0, "large", band="interactive", tenant="a", cost_tokens=5000)
    queues.push(0.1, "small", band="interactive", tenant="a", cost_tokens=10)
    asked: list[str] = []

    def refuse_large(q: Queued[str]) -> bool:
        asked.append(q.item)
        return q.item != "large"

    assert queues.try_pop(1.0, total_slots=10, running={}, fits=refuse_large) is None
    assert asked == ["large"]
    assert queues.statistics(1.0).queued_requests == 2
    first = queues.try_pop(2.0, total_slots=10, running={}, fits=lambda q: True)
    second = queues.try_pop(2.0, total_slots=10, running={}, fits=lambda q: True)
    assert (first and first.item, second and second.item) == ("large", "small")


def test_an_ineligible_tenant_is_passed_over_without_losing_its_place() -> None:
    """`eligible` (per-tenant slot caps): a tenant it rejects does not block the others,
    even when it is the fair order's pick, and keeps its place (FIFO, tags) for later."""
    queues: PriorityQueues[str] = PriorityQueues(_config())
    for i in range(3):
        queues.push(0.0, f"heavy{i}", band="interactive", tenant="heavy", cost_tokens=10)
    queues.push(0.5, "light0", band="interactive", tenant="light", cost_tokens=10)
    queues.push(0.6, "light1", band="interactive", tenant="light", cost_tokens=10)
    # Without a cap the fair order picks heavy first (equal tags, earlier push).
    first = _pop_free(queues, 1.0)
    assert first is not None and first.item == "heavy0"

    def not_heavy(tenant: str) -> bool:
        return tenant != "heavy"

    got = [queues.try_pop(1.0, total_slots=1000, running={}, eligible=not_heavy) for _ in range(3)]
    assert [g and g.item for g in got] == ["light0", "light1", None]
    assert queues.statistics(1.0).tenants["heavy"].queued_requests == 2
    rest = [_pop_free(queues, 2.0) for _ in range(3)]
    assert [g and g.item for g in rest] == ["heavy1", "heavy2", None]


def test_an_ineligible_tenant_is_passed_over_by_ageing_too() -> None:
    """The aged (oldest) pick also skips a rejected tenant: the eligible one's old request
    competes one band up, ahead of fresh interactive work."""
    queues = PriorityQueues[str](
        _config(background=BandConfig(max_queued_requests=10, max_wait_s=1.0))
    )
    queues.push(0.0, "capped-old", band="background", tenant="capped", cost_tokens=1)
    queues.push(0.5, "free-old", band="background", tenant="free", cost_tokens=1)
    queues.push(10.0, "fresh", band="interactive", tenant="user", cost_tokens=1)
    got = queues.try_pop(
        10.0, total_slots=100, running={}, eligible=lambda tenant: tenant != "capped"
    )
    assert got is not None and got.item == "free-old"
