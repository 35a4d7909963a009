"""Deterministic output tokens and fault knobs (the Prometheus text: test_metrics_catalog)."""

from __future__ import annotations

import math

import pytest

from headway.core.errors import ConfigError
from headway.emulate.faults import FaultState, FaultUpdate, parse_fault_flag
from headway.emulate.tokens import OutputTokens, fingerprint


def test_fingerprint_depends_on_revision_and_prompt_only() -> None:
    a = fingerprint("r1", "ping", 8, 128256)
    assert a == fingerprint("r1", "ping", 8, 128256)
    assert a != fingerprint("r2", "ping", 8, 128256)
    assert a != fingerprint("r1", "pong", 8, 128256)
    assert len(a.split()) == 8


def test_sampled_tokens_depend_on_the_seed() -> None:
    one = OutputTokens("r1", ("text", "x"), 1, 1000).ids(20)
    assert one == OutputTokens("r1", ("text", "x"), 1, 1000).ids(20)
    assert one != OutputTokens("r1", ("text", "x"), 2, 1000).ids(20)
    assert all(0 <= t < 1000 for t in one)


def test_fault_flags_parse_and_reject_with_the_fix() -> None:
    assert parse_fault_flag("slowdown_factor=3").slowdown_factor == 3.0
    assert parse_fault_flag("stall=true").stall is True
    with pytest.raises(ConfigError, match="NAME one of"):
        parse_fault_flag("explode=1")
    with pytest.raises(ConfigError, match="number or true/false"):
        parse_fault_flag("delay_s=soon")
    with pytest.raises(ConfigError, match="> 0"):
        parse_fault_flag("slowdown_factor=0")
    assert parse_fault_flag("budget_fraction=0.5").budget_fraction == 0.5
    with pytest.raises(ConfigError, match=r"budget_fraction.*\(0, 1\]"):
        parse_fault_flag("budget_fraction=1.5")


def test_fault_state_applies_durations_from_now() -> None:
    state = FaultState()
    state.apply(FaultUpdate(stall_s=2.0, delay_s=0.5, crash_after_s=10.0), now=100.0)
    assert state.is_stalled(101.0) and not state.is_stalled(102.5)
    assert state.view(101.0)["stall_s"] == pytest.approx(1.0)
    assert state.view(101.0)["crash_after_s"] == pytest.approx(9.0)
    state.apply(FaultUpdate(stall=True), now=103.0)
    assert state.stalled_until == math.inf and state.view(103.0)["stall"] is True
    state.apply(FaultUpdate(stall=False), now=104.0)
    assert not state.is_stalled(104.0)
