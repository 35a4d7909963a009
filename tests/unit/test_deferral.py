"""The core's deferral decision: a shed of a deferrable band becomes a receipt only when
a wait can fix it, the request is not a stream, and the deferred backlog has room; the
gateway config refuses a bad ``receipts`` section naming the field."""

from __future__ import annotations

import pytest

from headway.core.errors import ConfigError
from headway.core.policy.decisions import Shed, ShedReason
from headway.core.policy.deferral import DeferralConfig, should_defer
from headway.gateway.config import parse_config

CONFIG = DeferralConfig(deferrable=["background"], max_queued=3)
FULL = Shed(ShedReason.QUEUE_FULL, retry_after_s=2.0)


def test_a_shed_a_wait_can_fix_is_deferred_for_a_deferrable_band() -> None:
    assert should_defer(FULL, "background", stream=False, queued=0, config=CONFIG)
    for reason in (ShedReason.TENANT_CONCURRENCY, ShedReason.KV_PROJECTION,
                   ShedReason.DOWNSTREAM_UNHEALTHY, ShedReason.TENANT_TOKEN_RATE):  # fmt: skip
        shed = Shed(reason, retry_after_s=1.0)
        assert should_defer(shed, "background", stream=False, queued=2, config=CONFIG)


@pytest.mark.parametrize(
    ("shed", "band", "stream", "queued"),
    [
        (FULL, "interactive", False, 0),  # not a deferrable band
        (FULL, "background", True, 0),  # a stream is answered as it runs
        (FULL, "background", False, 3),  # the backlog is full: the shed stands
        (Shed(ShedReason.TOO_LARGE, retry_after_s=None), "background", False, 0),
        (Shed(ShedReason.DEADLINE_UNMEETABLE, retry_after_s=None), "background", False, 0),
        (Shed(ShedReason.DRAINING, retry_after_s=0.0), "background", False, 0),
        (Shed(ShedReason.EXPIRED, retry_after_s=1.0), "background", False, 0),
        # A tenant with no budget turn left: its excess would fill the shared backlog.
        (
            Shed(ShedReason.TENANT_TOKEN_RATE, retry_after_s=None, client_backoff=True),
            "background",
            False,
            0,
        ),
    ],
)
def test_no_deferral_when_it_cannot_help(shed: Shed, band: str, stream: bool, queued: int) -> None:
    assert not should_defer(shed, band, stream=stream, queued=queued, config=CONFIG)  # type: ignore[arg-type]


def test_nothing_is_deferred_by_default() -> None:
    assert not should_defer(FULL, "background", stream=False, queued=0, config=DeferralConfig())


@pytest.mark.parametrize(
    ("receipts", "named"),
    [
        ({"deferrable": ["bulk"]}, "deferrable"),
        ({"retention_s": 0}, "retention_s"),
        ({"max_queued": 0}, "max_queued"),
        ({"lease_s": -1}, "lease_s"),
        ({"max_running": 0}, "max_running"),
        ({"store": "x"}, "store"),
    ],
)
def test_a_bad_receipts_section_names_the_field(receipts: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        parse_config({"upstreams": [{"url": "http://127.0.0.1:1"}], "receipts": receipts})
