"""Degraded modes (core): entered and left on declared pressure with hysteresis, or by the
admin API, and what a mode changes of one request (seed 002, items 4-5)."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from headway.core.gateway_core import CoreSettings, GatewayCore, StaticUpstreams, UpstreamState
from headway.core.policy._checks import PolicyConfigError
from headway.core.policy.admission import AdmissionConfig, AdmissionRequest
from headway.core.policy.decisions import Shed, ShedReason
from headway.core.policy.degraded import (
    DegradedConfig,
    DegradedMode,
    DegradedModes,
    Pressure,
    PressureReading,
)
from headway.core.policy.queues import QueueConfig

BRIEF = DegradedMode(
    bands=["background"],
    max_tokens=64,
    context_tokens=1000,
    shed_optional=True,
    enter=Pressure(queue_delay_s=1.0),
    leave=Pressure(queue_delay_s=0.2),
    min_on_s=5.0,
)


def _modes(mode: DegradedMode = BRIEF) -> DegradedModes:
    return DegradedModes(DegradedConfig(modes={"brief": mode}))


def _at(delay_s: float, utilization: float = 0.5) -> PressureReading:
    return PressureReading(queue_delay_s=delay_s, slot_utilization=utilization)


def test_a_mode_enters_on_its_threshold_and_leaves_only_below_the_lower_one_after_its_dwell() -> (
    None
):
    modes = _modes()
    modes.update(0.0, _at(0.9))
    assert not modes.states["brief"].on
    modes.update(1.0, _at(1.0))
    assert modes.states["brief"].on
    [change] = modes.changes()
    assert change.on and change.at_s == 1.0 and "queue_delay_s" in change.cause
    modes.update(2.0, _at(0.1))  # below leave, but within min_on_s
    assert modes.states["brief"].on
    modes.update(7.0, _at(0.5))  # past the dwell, but between the thresholds
    assert modes.states["brief"].on
    modes.update(8.0, _at(0.2))
    assert not modes.states["brief"].on
    [change] = modes.changes()
    assert not change.on and "<= 0.2" in change.cause


@given(st.lists(st.floats(0, 3), min_size=1, max_size=60))
def test_the_mode_never_flaps_faster_than_its_dwell(delays: list[float]) -> None:
    modes = _modes()
    for i, delay in enumerate(delays):
        modes.update(float(i) * 0.5, _at(delay))
    changes = modes.changes()
    for on, off in zip(changes[::2], changes[1::2], strict=False):
        assert on.on and not off.on
        assert off.at_s - on.at_s >= BRIEF.min_on_s


def test_the_admin_api_forces_a_mode_and_hands_it_back() -> None:
    modes = _modes()
    modes.force(0.0, "brief", "on")
    modes.update(1.0, _at(0.0))
    assert modes.states["brief"].on  # forced: the thresholds do not decide
    modes.force(2.0, "brief", "off")
    modes.update(3.0, _at(5.0))
    assert not modes.states["brief"].on
    modes.force(4.0, "brief", "auto")
    modes.update(5.0, _at(5.0))
    assert modes.states["brief"].on
    assert [(c.on, c.cause.split(":")[0]) for c in modes.changes()] == [
        (True, "admin"), (False, "admin"), (True, "pressure"),
    ]  # fmt: skip
    with pytest.raises(KeyError):
        modes.force(6.0, "nonesuch", "on")


def test_what_a_mode_changes_of_one_request() -> None:
    modes = _modes()
    assert (
        modes.degrade(0.0, "background", max_tokens=500, prompt_tokens=2000, optional=False) is None
    )
    modes.force(0.0, "brief", "on")
    got = modes.degrade(0.0, "background", max_tokens=500, prompt_tokens=2000, optional=False)
    assert got is not None
    assert (got.max_tokens, got.context_tokens) == (64, 1000)
    assert got.header() == "brief; max_tokens=64 (asked 500); context_tokens=1000 (oldest_turns)"
    # Its own lower cap and a short prompt stand: nothing changes, nothing is counted.
    assert modes.degrade(0.0, "background", max_tokens=32, prompt_tokens=10, optional=False) is None
    # No max_tokens sent: the cap is imposed.
    imposed = modes.degrade(0.0, "background", max_tokens=None, prompt_tokens=10, optional=False)
    assert imposed is not None and imposed.max_tokens == 64 and "asked none" in imposed.header()
    shed = modes.degrade(0.0, "background", max_tokens=8, prompt_tokens=10, optional=True)
    assert shed is not None and shed.shed and shed.retry_after_s >= 1.0
    # Another band is untouched.
    assert (
        modes.degrade(0.0, "interactive", max_tokens=500, prompt_tokens=9e9, optional=True) is None
    )
    assert modes.states["brief"].served == 3


def _core(*, slots: int) -> GatewayCore:
    """A core with the mode ``brief`` over one upstream of ``slots``."""
    settings = CoreSettings(
        admission=AdmissionConfig(),
        queues=QueueConfig(),
        degraded=DegradedConfig(modes={"brief": BRIEF}),
    )
    return GatewayCore(settings, StaticUpstreams([UpstreamState(url="u", slots=slots)]))


def test_the_core_offers_the_degraded_request_and_sheds_optional_ones() -> None:
    core = _core(slots=4)
    request = AdmissionRequest(
        tenant="t", prompt_tokens=3000, p95_output_tokens=400, max_tokens=400,
        expected_output_tokens=300, priority="background",
    )  # fmt: skip
    same, none = core.degrade(0.0, request)
    assert same is request and none is None  # no pressure: the mode is off
    core.modes.force(0.0, "brief", "on")
    changed, got = core.degrade(0.0, request)
    assert isinstance(changed, AdmissionRequest) and got is not None
    assert (changed.max_tokens, changed.p95_output_tokens) == (64, 64)
    assert (changed.expected_output_tokens, changed.prompt_tokens) == (64, 1000)
    shed, _ = core.degrade(0.0, request, optional=True)
    assert isinstance(shed, Shed) and shed.reason is ShedReason.DEGRADED_OPTIONAL
    assert shed.retry_after_s is not None


def test_the_core_enters_a_mode_when_its_queue_waits() -> None:
    core = _core(slots=1)
    request = AdmissionRequest(
        tenant="t", prompt_tokens=100, p95_output_tokens=400, max_tokens=400, priority="background"
    )
    for _ in range(3):  # one dispatched, two queued
        changed, _ = core.degrade(0.0, request)
        assert isinstance(changed, AdmissionRequest)
        core.offer(0.0, changed)
    assert core.pressure(0.5).queue_delay_s == pytest.approx(0.5)
    assert core.pressure(0.5).slot_utilization == 1.0
    _, got = core.degrade(1.5, request)
    assert got is not None and got.max_tokens == 64
    assert [c.on for c in core.modes.changes()] == [True]


@pytest.mark.parametrize(
    ("mode", "field"),
    [
        ({"bands": ["background"]}, "max_tokens"),
        ({"bands": ["nonesuch"], "max_tokens": 5}, "bands"),
        ({"bands": ["background"], "max_tokens": 0}, "max_tokens"),
        ({"bands": ["background"], "max_tokens": 5, "enter": {}}, "enter"),
        (
            {"bands": ["background"], "max_tokens": 5, "enter": {"queue_delay_s": 1},
             "leave": {"queue_delay_s": 2}},
            "leave.queue_delay_s",
        ),
    ],
)  # fmt: skip
def test_a_bad_mode_names_the_field_and_the_fix(mode: dict[str, object], field: str) -> None:
    with pytest.raises((PolicyConfigError, msgspec.ValidationError)) as raised:
        msgspec.convert({"modes": {"brief": mode}}, DegradedConfig)
    assert field in str(raised.value)


def test_one_mode_per_band() -> None:
    with pytest.raises(msgspec.ValidationError, match="already has mode"):
        msgspec.convert(
            {"modes": {"a": {"bands": ["background"], "max_tokens": 5},
                       "b": {"bands": ["background"], "max_tokens": 9}}},
            DegradedConfig,
        )  # fmt: skip
