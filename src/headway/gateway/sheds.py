"""How the gateway answers a shed: the status, the headers and the record's end.

Admission's :class:`~headway.core.policy.decisions.Shed` is a value; this module maps it
to HTTP once, for every place that sheds (at arrival, in the queue, and when a retry
waits in line again): 429 for the queue's and the tenant's limits, 503 for capacity,
deadlines and the engines, 400 for a request no wait can fix; ``Retry-After`` (and its
milliseconds) when the shed names a time (a 429 without one: no turn can be promised,
the client backs off on its own), ``x-headway-shed-reason`` and the retry ticket.
:class:`ShedAnswers` is a mixin of :class:`~headway.gateway.server.GatewayServer` (it
counts the sheds in the server's metrics).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Final

from headway.core.lifecycle import Event, State, advance
from headway.core.policy.decisions import CLIENT_BACKOFF_MEANING, Shed, ShedReason
from headway.gateway.guards import error_response
from headway.gateway.request_body import DEADLINE_HEADER, TICKET_HEADER

if TYPE_CHECKING:
    from aiohttp import web
    from prometheus_client import Counter

    from headway.gateway.ops import RequestRecord
    from headway.metrics_catalog import Labelled

__all__ = ["REASON_HEADER", "ShedAnswers", "status_for"]

REASON_HEADER: Final = "x-headway-shed-reason"

_STATUS: Final[dict[ShedReason, int]] = {
    ShedReason.QUEUE_FULL: 429,
    ShedReason.TENANT_CONCURRENCY: 429,
    ShedReason.TENANT_TOKEN_RATE: 429,
    ShedReason.KV_PROJECTION: 503,
    ShedReason.DEADLINE_UNMEETABLE: 503,
    ShedReason.DOWNSTREAM_UNHEALTHY: 503,
    ShedReason.DRAINING: 503,
    ShedReason.EXPIRED: 503,
    ShedReason.DEGRADED_OPTIONAL: 503,
    ShedReason.TOO_LARGE: 400,
}


def status_for(reason: ShedReason) -> int:
    """HTTP status of a shed: 429 for the queue's and the tenant's limits, 503 for
    capacity, deadlines and the engines, 400 for a request that can never fit (and, in
    :meth:`ShedAnswers._shed_response`, a deadline shorter than the service alone or a
    request larger than its tenant's whole token budget)."""
    return _STATUS[reason]


class ShedAnswers:
    """The answer to a shed, counted (a mixin: the server sets these metrics)."""

    m_shed: Labelled[Counter]
    m_retry_after: Counter
    m_retry_after_s: Counter

    def _shed_response(self, shed: Shed, record: RequestRecord) -> web.Response:
        status = status_for(shed.reason)
        if shed.reason is ShedReason.DEADLINE_UNMEETABLE and shed.retry_after_s is None:
            # Its deadline is shorter than its service alone: no wait can fix it, only a
            # longer deadline or fewer tokens (the core's "impossible" check).
            status = 400
            shed = dataclasses.replace(
                shed, detail=f"{shed.detail}; raise {DEADLINE_HEADER} or lower max_tokens"
            )
        meaning = CLIENT_BACKOFF_MEANING if shed.client_backoff else shed.reason.meaning
        if (
            shed.reason is ShedReason.TENANT_TOKEN_RATE
            and shed.retry_after_s is None
            and not shed.client_backoff
        ):
            status = 400  # larger than the tenant's whole budget: no retry can pass
            meaning = "the request can never fit its tenant's token budget"
        self.m_shed(shed.reason.value, str(status)).inc()
        # Refused at arrival, or (queued) ended by its deadline in the line.
        event = Event.EXPIRE if record.state is State.QUEUED else Event.SHED
        record.state = advance(record.request_id, record.state, event)
        record.admission = "shed"
        record.shed_reason = shed.reason.value
        record.retry_after_s = shed.retry_after_s
        headers = {REASON_HEADER: shed.reason.value}
        if shed.retry_after_s is not None and status != 400:
            headers["Retry-After"] = str(math.ceil(shed.retry_after_s))
            headers["x-headway-retry-after-ms"] = str(math.ceil(shed.retry_after_s * 1000))
            self.m_retry_after.inc()
            self.m_retry_after_s.inc(shed.retry_after_s)
        if shed.ticket is not None:
            headers[TICKET_HEADER] = str(shed.ticket)
        return error_response(
            status,
            f"{shed.reason.value}: {meaning}" + (f" ({shed.detail})" if shed.detail else ""),
            kind="overloaded_error" if status != 400 else "invalid_request_error",
            code=shed.reason.value,
            headers=headers,
        )
