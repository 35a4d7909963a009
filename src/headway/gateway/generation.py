"""The generation path: ``POST /v1/completions`` and ``POST /v1/chat/completions``.

Per request: read the body (at most ``MAX_BODY_BYTES``), parse it
(:func:`~headway.gateway.request_body.parse_request`), salt it per tenant, offer it to
admission (prompt tokens estimated as body bytes / ``prompt_bytes_per_token``), take a
fallback route when the core allows one (a shed of a deferrable band becomes a receipt,
:mod:`~headway.gateway.receipts`), wait in line or go at once, and relay
(:class:`~headway.gateway.relay.UpstreamRelay`) under the request's deadline. Before the
offer, the core's degraded mode of the request's band, when on, caps its output and trims
its prompt (the body rewritten, :mod:`~headway.gateway.degrade_body`; the answer carries
``x-headway-degraded``) or sheds it when it is marked optional. Every
outcome ends in ``finally``: the lifecycle's last event, the tenant's charge for what an
engine did, the completion and goodput counters, the span and the access-log line.
:class:`Generation` is a mixin of :class:`~headway.gateway.server.GatewayServer`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from typing import TYPE_CHECKING, Final

from aiohttp import web

from headway.core.lifecycle import Event, State, advance
from headway.core.policy.admission import AdmissionRequest
from headway.core.policy.charges import Phase, unseen_output_tokens
from headway.core.policy.deadlines import Deadline
from headway.core.policy.decisions import Shed
from headway.gateway.degrade_body import degraded_body
from headway.gateway.guards import MAX_BODY_BYTES, CacheSalts, salted_body, too_large_response
from headway.gateway.ops import RequestRecord, finish, next_request_id
from headway.gateway.receipts import ReceiptDesk
from headway.gateway.relay import STREAM, UpstreamRelay
from headway.gateway.request_body import DEADLINE_HEADER, ClientError, parse_request, with_model
from headway.http_errors import deadline_exceeded

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer
    from prometheus_client import Counter, Histogram

    from headway.core.policy.deadlines import DeadlinePolicy
    from headway.gateway.control import Controller
    from headway.metrics_catalog import Labelled

__all__ = ["DEGRADED_HEADER", "ROUTE_HEADER", "Generation", "echo_request_id", "mode_changes"]

log = logging.getLogger("headway.gateway")

ROUTE_HEADER: Final = "x-headway-route"
DEGRADED_HEADER: Final = "x-headway-degraded"
"""On every answer a degraded mode changed: the mode and what changed
(:meth:`~headway.core.policy.degraded.Degradation.header`)."""
_DEGRADED: Final = web.RequestKey("degraded", str)
_REQUEST_ID: Final = web.RequestKey("request_id", str)
_ROUTE: Final = web.RequestKey("route", str)
_OFFERED_AT: Final = web.RequestKey("offered_at", float)
"""When the request was offered (parsed, counted): its time in the system starts."""


class Generation(UpstreamRelay, ReceiptDesk):
    """The generate routes (a mixin: the server sets these, and the relay's)."""

    salts: CacheSalts
    deadlines: DeadlinePolicy
    tracer: Tracer | None
    in_system: int
    m_offered: Labelled[Counter]
    m_admitted: Labelled[Counter]
    m_fallbacks: Labelled[Counter]
    m_queue_wait: Labelled[Histogram]
    m_deadline_cancels: Labelled[Counter]
    m_failed: Labelled[Counter]
    m_completed: Labelled[Counter]
    m_tokens: Labelled[Counter]
    m_good: Labelled[Counter]
    m_client_errors: Labelled[Counter]
    m_degraded: Labelled[Counter]
    m_mode_changes: Labelled[Counter]
    m_duration: Histogram

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completion", "/v1/completions")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat", "/v1/chat/completions")

    async def _generate(self, request: web.Request, kind: str, path: str) -> web.StreamResponse:
        given = request.headers.get("x-request-id", "")
        ok_id = 0 < len(given) <= 128 and given.isprintable()
        record = RequestRecord(given if ok_id else next_request_id(), path, time.monotonic())
        request[_REQUEST_ID] = record.request_id
        try:
            response = await self._generate_recorded(request, kind, path, record)
            record.status = response.status
            return response
        except asyncio.CancelledError:
            record.cancelled = True
            record.status = 499
            raise
        finally:
            if record.status == 0:
                record.status = 500
            offered_at = request.get(_OFFERED_AT)
            if offered_at is not None:  # it was offered: it ends here, whatever the outcome
                self.in_system -= 1
                self.m_duration.observe(time.monotonic() - offered_at)
            finish(record, self.tracer)

    async def _generate_recorded(
        self, request: web.Request, kind: str, path: str, record: RequestRecord
    ) -> web.StreamResponse:
        length = request.content_length
        try:
            if length is not None and length > MAX_BODY_BYTES:
                raise web.HTTPRequestEntityTooLarge(MAX_BODY_BYTES, length)
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:  # announced, chunked, or longer than announced
            self.m_client_errors("413").inc()
            return too_large_response()
        try:
            parsed = parse_request(self.config, self.controller, self.deadlines, request, raw, kind)
        except ClientError as error:
            self.m_client_errors(str(error.status)).inc()
            return error.response()
        body = parsed.body
        ctl = self.controller
        self.m_offered(parsed.tenant_name).inc()
        self.in_system += 1
        request[_OFFERED_AT] = time.monotonic()
        record.tenant = parsed.tenant_name
        record.band = parsed.band
        record.model = body.model
        record.stream = body.stream is True
        if self.config.log_content:
            record.prompt = raw
            record.completion = []
        max_tokens = body.max_tokens if body.max_tokens is not None else body.max_completion_tokens
        admission = AdmissionRequest(
            tenant=parsed.tenant_name,
            prompt_tokens=math.ceil(len(raw) / self.config.prompt_bytes_per_token),
            p95_output_tokens=self.config.p95_output_tokens,
            max_tokens=max_tokens,
            priority=parsed.band,
            deadline_s=parsed.deadline_s,
            deadline_renews_on_retry=True,  # a retry sends its own x-headway-deadline-ms
            ticket=parsed.ticket,
        )
        ctl.retries.record_request(ctl.now())
        degraded, how = ctl.degrade(admission, optional=parsed.optional)
        mode_changes(ctl, self.m_mode_changes)
        if isinstance(degraded, Shed):  # never silently: the answer, log and metrics say
            assert how is not None
            request[_DEGRADED] = record.degraded = how.header()
            self.m_degraded(parsed.band, how.mode, "optional_shed").inc()
            deferred = await self._deferred_response(degraded, parsed, raw, path, record, request)
            return deferred or self._shed_response(degraded, record)
        if how is not None:
            asked = how
            parsed.raw, how = degraded_body(
                parsed.raw, how, kind=kind, bytes_per_token=self.config.prompt_bytes_per_token
            )
            if asked.context_tokens is not None and how.context_tokens is None:
                # The rule could not shorten it: admission weighs the prompt as sent.
                degraded = dataclasses.replace(degraded, prompt_tokens=admission.prompt_tokens)
            admission = degraded
        if how is not None and (how.max_tokens is not None or how.context_tokens is not None):
            request[_DEGRADED] = record.degraded = how.header()
            if how.max_tokens is not None:
                self.m_degraded(parsed.band, how.mode, "max_tokens").inc()
            if how.context_tokens is not None:
                self.m_degraded(parsed.band, how.mode, "context").inc()
        if parsed.tenant is not None and self.config.tenant_cache_salt:
            if self.salts.configured != self.config.cache_salt_key:  # a reload changed it
                self.salts = CacheSalts(self.config.cache_salt_key)
            parsed.raw = salted_body(parsed.raw, self.salts.salt(parsed.tenant_name))
        record.tokens_in = admission.prompt_tokens
        route = body.model if body.model in self.config.routes else None
        chosen, got = ctl.offer_on_route(admission, route, revision=parsed.revision)
        if route is not None and chosen is not None and chosen != route:  # a fallback
            parsed = dataclasses.replace(parsed, raw=with_model(parsed.raw, chosen))
            request[_ROUTE] = chosen
            self.m_fallbacks(route, chosen).inc()
            route = chosen
        if isinstance(got, Shed):
            deferred = await self._deferred_response(got, parsed, raw, path, record, request)
            return deferred or self._shed_response(got, record)
        lease = got
        completion_tokens: int | None = None
        completed = False
        stage = "queued"
        try:
            if lease.upstream is None:
                self.m_admitted("enqueue", parsed.band).inc()
                record.admission = "enqueue"
                record.state = advance(record.request_id, record.state, Event.ENQUEUE)
                queued_at = time.monotonic()
                outcome = await ctl.ready(lease)
                if isinstance(outcome, Shed):
                    return self._shed_response(outcome, record)
                record.state = advance(record.request_id, record.state, Event.DISPATCH)
                record.dispatched_s = time.monotonic()
                waited_s = record.dispatched_s - queued_at
                self.m_queue_wait(parsed.tenant_name).observe(waited_s)
            else:
                self.m_admitted("admit", parsed.band).inc()
                record.admission = "admit"
                record.state = advance(record.request_id, record.state, Event.ADMIT)
                record.dispatched_s = time.monotonic()
                self.m_queue_wait(parsed.tenant_name).observe(0.0)
            stage = "in_flight"
            deadline = None if parsed.deadline_s is None else Deadline(parsed.deadline_s)
            left_s = None if deadline is None else deadline.remaining_s(ctl.now())
            try:
                async with asyncio.timeout(left_s):
                    response, completion_tokens, completed = await self._relay(
                        request, parsed, lease, path, record
                    )
                if record.deadline_cancelled:  # the engine stopped it at the budget sent
                    self.m_deadline_cancels("stream" if body.stream else "whole").inc()
            except TimeoutError:
                # Its deadline passed in flight: leaving the timeout closed the upstream
                # call, so the engine aborts the sequence and frees its blocks (seed 003:
                # "if deadline_expires: cancel scheduler state and release blocks").
                self.m_deadline_cancels("stream" if body.stream else "whole").inc()
                record.deadline_cancelled = True
                return await self._deadline_response(request)
            return response
        except asyncio.CancelledError:
            if record.relayed:  # it left with the whole answer, before the closing chunk
                completed, completion_tokens = True, record.tokens_out
            else:
                self.m_cancelled(stage, "stream" if body.stream else "whole").inc()
                record.cancelled = True
            raise
        finally:
            # The core's charging rule: the tenant pays for what an engine did for it.
            phase: Phase = lease.phase
            output: int | None = lease.output_events
            if completed:
                phase, output = Phase.COMPLETED, completion_tokens
            elif phase is Phase.PREFILL and not body.stream:
                phase = Phase.DECODE  # its output, if any, was never seen
                output = unseen_output_tokens(
                    ctl.now() - (record.attempt_started_s or ctl.now()),
                    ctl.tpot_s(),
                    admission.planned_output_tokens,
                )
            record.tokens_out = completion_tokens
            if record.state in (State.QUEUED, State.DISPATCHED):  # it ends here
                if completed:
                    event = Event.FINISH
                elif record.cancelled:
                    event = Event.CANCEL
                elif record.deadline_cancelled:
                    event = Event.DEADLINE
                else:
                    event = Event.FAIL
                    self.m_failed(parsed.tenant_name).inc()
                record.state = advance(record.request_id, record.state, event)
            if completed:
                self.m_completed(parsed.tenant_name).inc()
                if completion_tokens is not None:
                    self.m_tokens(parsed.tenant_name).inc(completion_tokens)
                if parsed.deadline_s is None or ctl.now() <= parsed.deadline_s:
                    self.m_good(parsed.tenant_name).inc()
            ctl.end(lease, phase, output)

    async def _deadline_response(self, request: web.Request) -> web.StreamResponse:
        """The answer of a request cancelled at its deadline: a 504, or, on a stream
        already under way, a last error event and its end."""
        message = (
            f"deadline_exceeded: the {DEADLINE_HEADER} budget ran out while an engine served "
            "the request; it was cancelled there"
        )
        return await deadline_exceeded(request.get(STREAM), message)


def mode_changes(controller: Controller, changes: Labelled[Counter]) -> None:
    """Log and count the degraded modes the core turned on or off since the last call
    (after each degrade and each admin action: a mode never changes silently)."""
    for change in controller.core.modes.changes():
        to = "on" if change.on else "off"
        changes(change.mode, to).inc()
        # WARNING both ways: a host that configured no logging still sees it (stderr).
        log.warning("degraded mode %r turned %s (%s)", change.mode, to, change.cause)


async def echo_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """Every answer to a generate request carries its ``x-request-id`` (the client's, or
    the one the gateway gave it; the upstream gets the same), to find it in logs and spans,
    ``x-headway-route`` when a fallback route served it and ``x-headway-degraded`` when a
    degraded mode changed it."""
    request_id = request.get(_REQUEST_ID)
    if request_id is not None:
        response.headers["x-request-id"] = request_id
    route = request.get(_ROUTE)
    if route is not None:
        response.headers[ROUTE_HEADER] = route
    degraded = request.get(_DEGRADED)
    if degraded is not None:
        response.headers[DEGRADED_HEADER] = degraded
