"""Deadlines: set once, read as remaining, tightened for sub-calls, passed as a budget."""

from __future__ import annotations

import pytest

from headway.core.policy.deadlines import BUDGET_HEADER, Deadline, DeadlineConfig, DeadlinePolicy


def test_deadline_is_set_once_from_the_budget() -> None:
    deadline = DeadlinePolicy().assign(100.0, 12.0)
    assert deadline == Deadline(112.0)
    assert deadline.remaining_s(105.0) == pytest.approx(7.0)
    assert deadline.remaining_s(130.0) == 0.0
    assert not deadline.expired(111.999)
    assert deadline.expired(112.0)


def test_default_and_clamped_budgets() -> None:
    policy = DeadlinePolicy(DeadlineConfig(default_budget_s=30.0, max_budget_s=60.0))
    assert policy.assign(0.0) == Deadline(30.0)
    assert policy.assign(0.0, 600.0) == Deadline(60.0)
    assert DeadlinePolicy().assign(0.0) is None


def test_a_sub_call_never_outlives_its_parent() -> None:
    parent = Deadline(20.0)
    assert parent.for_call(10.0) == Deadline(20.0)
    assert parent.for_call(10.0, reserve_s=0.5) == Deadline(19.5)
    assert parent.for_call(10.0, budget_s=3.0) == Deadline(13.0)
    assert parent.for_call(10.0, budget_s=30.0) == Deadline(20.0)
    assert parent.for_call(19.9, reserve_s=0.5) == Deadline(19.9)  # never before now


def test_propagate_keeps_the_hop_reserve() -> None:
    policy = DeadlinePolicy(DeadlineConfig(hop_reserve_s=0.25))
    assert policy.propagate(10.0, Deadline(20.0)) == Deadline(19.75)
    assert policy.propagate(10.0, None) is None
    assert policy.propagate(10.0, None, call_budget_s=2.0) == Deadline(12.0)


def test_header_carries_the_remaining_budget_rounded_down() -> None:
    deadline = Deadline(1000.0)
    value = deadline.to_header(987.6543)
    assert value == "12345"
    received = Deadline.from_header(5.0, value)  # another machine's clock
    assert received.deadline_s == pytest.approx(5.0 + 12.345)
    assert received.deadline_s - 5.0 <= deadline.deadline_s - 987.6543
    assert Deadline(1.0).to_header(2.0) == "0"


@pytest.mark.parametrize("bad", ["", "-5", "1.5", "soon"])
def test_a_bad_header_names_itself_and_the_value(bad: str) -> None:
    with pytest.raises(ValueError, match=BUDGET_HEADER) as info:
        Deadline.from_header(0.0, bad)
    assert repr(bad) in str(info.value)
