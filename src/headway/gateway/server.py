"""The gateway's HTTP server (aiohttp) and relay.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (streaming or not),
``GET /v1/models``, ``GET /health``, ``GET /metrics``, ``GET /openapi.json``, and the
admin API (``POST /admin/drain``, ``POST /admin/reload``, ``GET /admin/state``; bearer
``admin_token``).

Hot path per request: find the tenant from the bearer key (a dict lookup); decode only
``model``, ``stream``, ``max_tokens`` and the presence of ``messages``/``prompt`` with a
typed msgspec struct (the rest of the body is relayed as received); estimate prompt tokens
as body bytes / ``prompt_bytes_per_token``; admission; relay. Stream bytes are written to
the client as they arrive; the gateway keeps the last two chunks to read ``usage`` at
the end. A client that disconnects cancels the handler (``handler_cancellation``): a
queued request leaves the line, an in-flight one has its upstream connection closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import logging
import math
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import aiohttp
import msgspec
import numpy as np
from aiohttp import web

from headway.core.errors import ConfigError, config_error
from headway.core.lifecycle import Event, State, advance
from headway.core.policy.admission import AdmissionRequest
from headway.core.policy.charges import Phase, unseen_output_tokens
from headway.core.policy.deadlines import (
    BUDGET_HEADER,
    Deadline,
    DeadlineConfig,
    DeadlinePolicy,
)
from headway.core.policy.decisions import Shed, ShedReason
from headway.core.policy.queues import BANDS, Band
from headway.core.policy.retries import AttemptOutcome, FailureKind, GiveUp
from headway.gateway.config import GatewayFileConfig, TenantConfig, load_config
from headway.gateway.control import Controller, Lease, UpstreamState
from headway.gateway.guards import (
    MAX_BODY_BYTES,
    CacheSalts,
    error_response,
    openai_shaped_errors,
    parse_whole,
    salted_body,
    too_large_response,
)
from headway.gateway.openapi import openapi_document
from headway.gateway.ops import AccessLog, RequestRecord, finish, next_request_id, tracer
from headway.gateway.pooled import PoolSource
from headway.http_boundary import BoundaryLimits, BoundaryRunner, boundary_middleware, listen
from headway.http_errors import deadline_exceeded, error_body
from headway.metrics_catalog import CONTENT_TYPE as METRICS_CONTENT_TYPE
from headway.metrics_catalog import Metrics, gateway_specs

if TYPE_CHECKING:
    from headway.gateway.shared import SharedBudgets

__all__ = ["GatewayServer", "status_for"]

log = logging.getLogger("headway.gateway")

PRIORITY_HEADER: Final = "x-headway-priority"
DEADLINE_HEADER: Final = "x-headway-deadline-ms"
TICKET_HEADER: Final = "x-headway-retry-ticket"
REASON_HEADER: Final = "x-headway-shed-reason"
ANONYMOUS: Final = "anonymous"
_REQUEST_ID: Final = web.RequestKey("request_id", str)
_ROUTE: Final = web.RequestKey("route", str)
_OFFERED_AT: Final = web.RequestKey("offered_at", float)
"""When the request was offered (parsed, counted): its time in the system starts."""
_STREAM: Final = web.RequestKey("stream", web.StreamResponse)
REVISION_HEADER: Final = "x-headway-revision"
ROUTE_HEADER: Final = "x-headway-route"

_STATUS: Final[dict[ShedReason, int]] = {
    ShedReason.QUEUE_FULL: 429,
    ShedReason.TENANT_CONCURRENCY: 429,
    ShedReason.TENANT_TOKEN_RATE: 429,
    ShedReason.KV_PROJECTION: 503,
    ShedReason.DEADLINE_UNMEETABLE: 503,
    ShedReason.DOWNSTREAM_UNHEALTHY: 503,
    ShedReason.DRAINING: 503,
    ShedReason.EXPIRED: 503,
    ShedReason.TOO_LARGE: 400,
}


def status_for(reason: ShedReason) -> int:
    """HTTP status of a shed: 429 for the queue's and the tenant's limits, 503 for
    capacity, deadlines and the engines, 400 for a request that can never fit (and, in
    :meth:`GatewayServer._shed_response`, a deadline shorter than the service alone or a
    request larger than its tenant's whole token budget)."""
    return _STATUS[reason]


class _Body(msgspec.Struct, kw_only=True):
    """What the gateway reads of a request body (unknown fields are relayed untouched)."""

    model: str
    stream: bool | None = False
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    messages: msgspec.Raw = msgspec.Raw(b"")
    prompt: msgspec.Raw = msgspec.Raw(b"")
    cache_salt: msgspec.Raw = msgspec.Raw(b"")


class _Usage(msgspec.Struct):
    completion_tokens: int = 0
    prompt_tokens: int = 0


class _WithUsage(msgspec.Struct):
    usage: _Usage | None = None


_BODY = msgspec.json.Decoder(_Body)
_USAGE = msgspec.json.Decoder(_WithUsage)


_UPSTREAM_FAILED: Final = msgspec.json.encode(
    error_body(
        "the upstream failed before answering and no retry was possible",
        502, kind="upstream_error", code="upstream_error",
    )
)  # fmt: skip


class _Unanswered(Exception):
    """The upstream failed before anything reached the client (a retry may follow)."""


class ClientError(Exception):
    """A client's mistake: answered 4xx with an OpenAI-shaped body."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.code = code

    def response(self) -> web.Response:
        return error_response(self.status, str(self), param=self.param, code=self.code)


@dataclass(slots=True)
class _Parsed:
    tenant: TenantConfig | None
    tenant_name: str
    body: _Body
    raw: bytes
    band: Band
    deadline_s: float | None
    ticket: int | None
    revision: str | None = None


class GatewayServer:
    """One gateway: the app, its controller, upstream sessions and metrics."""

    def __init__(
        self,
        config: GatewayFileConfig,
        *,
        config_path: Path | None = None,
        redis_url: str | None = None,
    ) -> None:
        self.config = config
        self.config_path = config_path
        self.shared = _shared_budgets(config, redis_url) if redis_url else None
        self.controller = Controller(config, budgets=self.shared)
        self.pool: PoolSource | None = None
        if config.pool is not None:
            self.pool = PoolSource(config, self.controller.pump)
            self.controller.source = self.pool
        self.deadlines = DeadlinePolicy(
            DeadlineConfig(
                default_budget_s=config.default_deadline_s, max_budget_s=config.max_deadline_s
            )
        )
        self.rng = np.random.default_rng()
        self.sessions: dict[str, aiohttp.ClientSession] = {}
        self.runner: BoundaryRunner | None = None
        self.port = 0
        self.host = "127.0.0.1"
        self.tracer = tracer()
        """Where ``gateway.request`` spans go (the global provider's; settable)."""
        self.access = AccessLog(config.access_log) if config.access_log else None
        self._setup_metrics()
        self.salts = CacheSalts(config.cache_salt_key)
        self.limits = BoundaryLimits(
            header_timeout_s=config.header_timeout_s, body_timeout_s=config.body_timeout_s,
            idle_timeout_s=config.idle_timeout_s, max_connections=config.max_connections,
            max_body_bytes=MAX_BODY_BYTES,
        )  # fmt: skip
        app = web.Application(
            client_max_size=MAX_BODY_BYTES,
            middlewares=[openai_shaped_errors, boundary_middleware(self.limits, "gateway")],
        )
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/openapi.json", self._openapi)
        app.router.add_post("/admin/drain", self._admin_drain)
        app.router.add_post("/admin/reload", self._admin_reload)
        app.router.add_get("/admin/state", self._admin_state)
        app.on_response_prepare.append(_echo_request_id)
        self.app = app

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The base URL it listens on."""
        return f"http://{self.host}:{self.port}"

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen; return the URL."""
        self.runner = BoundaryRunner(
            self.app, self.limits, access_log=None, handler_cancellation=True,
            shutdown_timeout=2.0,
        )  # fmt: skip
        await self.runner.setup()
        if self.access is not None:
            self.access.start()
        if self.pool is not None:
            await self.pool.start()
        if self.shared is not None:
            await self.shared.start()
        site = web.TCPSite(self.runner, host, port, backlog=4096)
        await listen(site, host, port)
        server = site._server
        assert server is not None
        sockets = getattr(server, "sockets", None) or []
        self.host = host
        self.port = sockets[0].getsockname()[1] if sockets else port
        return self.url

    async def drain(self, timeout_s: float | None = None) -> bool:
        """Stop taking work (``/health`` 503, new requests refused ``draining``) and wait
        until queued and in-flight requests have finished, at most ``timeout_s``
        (default ``shutdown_timeout_s``). True when nothing was left."""
        ctl = self.controller
        ctl.draining = True
        limit_s = self.config.shutdown_timeout_s if timeout_s is None else timeout_s
        end = time.monotonic() + limit_s
        while len(ctl.queues) or any(ctl.in_flight.values()):
            if time.monotonic() >= end:
                return False
            await asyncio.sleep(0.05)
        return True

    async def stop(self) -> None:
        """Stop listening, finish in flight (up to the shutdown timeout), close sessions."""
        if self.runner is not None:
            await self.runner.cleanup()
        if self.pool is not None:
            await self.pool.stop()
        if self.shared is not None:
            await self.shared.stop()
        for session in self.sessions.values():
            await session.close()
        if self.access is not None:
            self.access.stop()

    def _session(self, upstream: UpstreamState) -> aiohttp.ClientSession:
        session = self.sessions.get(upstream.url)
        if session is None:
            connector = aiohttp.TCPConnector(
                limit=upstream.slots + 8, limit_per_host=0, keepalive_timeout=30.0,
                enable_cleanup_closed=False,
            )  # fmt: skip
            timeout = aiohttp.ClientTimeout(total=None, connect=self.config.connect_timeout_s)
            headers = {"Authorization": f"Bearer {upstream.api_key}"} if upstream.api_key else {}
            session = aiohttp.ClientSession(
                connector=connector, timeout=timeout, headers=headers, auto_decompress=False,
                skip_auto_headers=("User-Agent",),
            )  # fmt: skip
            self.sessions[upstream.url] = session
        return session

    # -- metrics ---------------------------------------------------------------------------

    def _setup_metrics(self) -> None:
        """This gateway's registry (:mod:`headway.metrics_catalog`) and its readers."""
        shared = self.shared
        metrics = self.metrics = Metrics(
            gateway_specs(pool=self.pool is not None, shared_budgets=shared is not None)
        )
        self.m_offered = metrics.counter_series("headway_gateway_requests_offered_total")
        self.m_admitted = metrics.counter_series("headway_gateway_admissions_total")
        self.m_shed = metrics.counter_series("headway_gateway_sheds_total")
        self.m_retry_after = metrics.counter("headway_gateway_retry_after_issued_total")
        self.m_retry_after_s = metrics.counter("headway_gateway_retry_after_seconds_total")
        self.m_cancelled = metrics.counter_series("headway_gateway_cancellations_total")
        self.m_failed = metrics.counter_series("headway_gateway_requests_failed_total")
        self.m_deadline_cancels = metrics.counter_series("headway_gateway_deadline_cancels_total")
        self.m_retries = metrics.counter("headway_gateway_upstream_retries_total")
        self.m_fallbacks = metrics.counter_series("headway_gateway_fallbacks_total")
        self.m_upstream_errors = metrics.counter_series("headway_gateway_upstream_errors_total")
        self.m_completed = metrics.counter_series("headway_gateway_completed_total")
        self.m_duration = metrics.histogram("headway_gateway_request_duration_seconds")
        self.in_system = 0
        """Requests offered and not yet ended (``headway_gateway_requests_in_system``)."""
        self.m_good = metrics.counter_series("headway_gateway_goodput_requests_total")
        self.m_tokens = metrics.counter_series("headway_gateway_completion_tokens_total")
        self.m_client_errors = metrics.counter_series("headway_gateway_client_errors_total")
        self.m_ttft = metrics.histogram_series("headway_gateway_upstream_ttft_seconds")
        self.m_queue_wait = metrics.histogram_series("headway_gateway_queue_wait_seconds")
        ctl = self.controller

        def depth_band() -> list[tuple[tuple[str, ...], float]]:
            bands, _ = ctl.queued_by(ctl.now())
            return [((b,), float(n)) for b, n in bands.items()]

        def depth_tenant() -> list[tuple[tuple[str, ...], float]]:
            _, tenants = ctl.queued_by(ctl.now())
            return [((t,), float(n)) for t, n in tenants.items()]

        def budget_left() -> float:
            _, retries, allowed = ctl.retries.budget(ctl.now())
            return max(allowed - retries, 0.0)

        def outstanding() -> list[tuple[tuple[str, ...], float]]:
            return [((u.url,), float(u.outstanding_requests)) for u in ctl.source.upstreams()]

        def ready() -> list[tuple[tuple[str, ...], float]]:
            now = ctl.now()
            return [((u.url,), float(u.ready_at(now))) for u in ctl.source.upstreams()]

        read, value = metrics.read, metrics.read_value
        read("headway_gateway_queue_depth_requests", depth_band)
        read("headway_gateway_tenant_queue_depth_requests", depth_tenant)
        read("headway_gateway_tenant_dispatched_requests",
             lambda: [((t,), float(n)) for t, n in ctl.dispatched_by.items()])  # fmt: skip
        value("headway_gateway_slot_share_holds", lambda: float(ctl.capped))
        value("headway_gateway_requests_in_system", lambda: float(self.in_system))
        value("headway_gateway_retry_budget_left", budget_left)
        value("headway_gateway_tpot_seconds", lambda: ctl.tpot_s() or 0.0)
        read("headway_gateway_upstream_outstanding_requests", outstanding)
        value("headway_gateway_tickets_outstanding",
              lambda: float(ctl.admission.tickets_outstanding))  # fmt: skip
        if shared is not None:
            value("headway_gateway_shared_budgets_healthy",
                  lambda: 1.0 if shared.healthy else 0.0)  # fmt: skip
            value("headway_gateway_shared_budgets_round_trips",
                  lambda: float(shared.round_trips))  # fmt: skip
        if self.pool is None:
            read("headway_gateway_upstream_ready", ready)
        else:
            for name, series in self.pool.pool.metric_series().items():
                read(name, series)

    # -- request parsing -------------------------------------------------------------------

    def _tenant(self, request: web.Request) -> tuple[TenantConfig | None, str]:
        tenants = self.config.tenants
        auth = request.headers.get("Authorization", "")
        if not tenants:
            return None, ANONYMOUS
        key = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        tenant = tenants.get(key) if key else None  # no key never finds a tenant
        if tenant is None:
            raise ClientError(
                401,
                "Incorrect or missing API key: send `Authorization: Bearer KEY` with a key "
                "from the gateway's tenants",
                code="invalid_api_key",
            )
        return tenant, tenant.name

    def _parse(self, request: web.Request, raw: bytes, kind: str) -> _Parsed:
        tenant, name = self._tenant(request)
        try:
            body = _BODY.decode(raw)
        except msgspec.ValidationError as error:
            text = str(error)
            param = text.split("`$.", 1)[1].split("`", 1)[0] if "`$." in text else None
            if param is None and text.startswith("Object missing required field `"):
                param = text.split("`", 2)[1]
            where = f"`{param}`: " if param else ""
            raise ClientError(
                400, f"invalid request body: {where}{text}; fix that field", param=param
            ) from None
        except msgspec.DecodeError as error:
            hint = "; lone UTF-16 surrogates (\\ud800-\\udfff) are refused" if b"\\u" in raw else ""
            raise ClientError(400, f"the request body is not JSON: {error}{hint}") from None
        except RecursionError:
            raise ClientError(400, "the request body is nested too deeply to read") from None
        if body.cache_salt and self.config.tenants and self.config.tenant_cache_salt:
            raise ClientError(
                400,
                "`cache_salt` is set by the gateway for each tenant; remove it from the body",
                param="cache_salt",
                code="invalid_value",
            )
        needed = "messages" if kind == "chat" else "prompt"
        if not getattr(body, needed) or bytes(getattr(body, needed)) == b"null":
            raise ClientError(400, f"`{needed}` is required", param=needed)
        for field_name in ("max_tokens", "max_completion_tokens"):
            value = getattr(body, field_name)
            if value is not None and value < 1:
                raise ClientError(
                    400,
                    f"`{field_name}` must be an integer >= 1 (got {value}); or omit it",
                    param=field_name,
                )
        if self.config.models and body.model not in self.config.models:
            raise ClientError(
                404,
                f"The model `{body.model}` does not exist; use one of "
                f"{', '.join(self.config.models)}",
                param="model",
                code="model_not_found",
            )
        headers = request.headers
        band: Band = tenant.default_priority if tenant else "interactive"
        asked = headers.get(PRIORITY_HEADER)
        if asked is not None:
            if asked not in BANDS:
                raise ClientError(
                    400, f"{PRIORITY_HEADER} must be one of {', '.join(BANDS)} (got {asked!r})",
                    param=PRIORITY_HEADER,
                )  # fmt: skip
            band = asked
        if tenant is not None and BANDS.index(band) < BANDS.index(tenant.max_priority):
            band = tenant.max_priority
        now = self.controller.now()
        budget_s: float | None = None
        deadline_text = headers.get(DEADLINE_HEADER)
        if deadline_text is not None:
            budget_ms = parse_whole(deadline_text)
            if budget_ms == 0:
                raise ClientError(
                    400,
                    f"{DEADLINE_HEADER} 0 leaves no time to serve anything; send the client's "
                    "remaining budget in whole milliseconds >= 1, or omit it",
                    param=DEADLINE_HEADER,
                )
            if budget_ms is None:
                raise ClientError(
                    400,
                    f"{DEADLINE_HEADER} must be whole milliseconds >= 0, at most 18 digits "
                    f"(got {deadline_text[:40]!r})",
                    param=DEADLINE_HEADER,
                )
            budget_s = budget_ms / 1000.0
        deadline = self.deadlines.assign(now, budget_s)
        ticket_text = headers.get(TICKET_HEADER)
        ticket = parse_whole(ticket_text) if ticket_text else None  # garbage: no ticket
        revision = headers.get(REVISION_HEADER)
        if revision is not None:
            known = {u.revision for u in self.controller.source.upstreams() if u.revision}
            if revision not in known:
                raise ClientError(
                    400,
                    f"{REVISION_HEADER}: no upstream serves revision {revision[:64]!r}; "
                    f"use one of {', '.join(sorted(known)) or '(none declared)'} or omit it",
                    param=REVISION_HEADER,
                )
        return _Parsed(
            tenant, name, body, raw, band, None if deadline is None else deadline.deadline_s,
            ticket, revision,
        )  # fmt: skip

    # -- generation ------------------------------------------------------------------------

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completion", "/v1/completions")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat", "/v1/chat/completions")

    def _shed_response(self, shed: Shed, record: RequestRecord) -> web.Response:
        status = status_for(shed.reason)
        if shed.reason is ShedReason.DEADLINE_UNMEETABLE and shed.retry_after_s is None:
            # Its deadline is shorter than its service alone: no wait can fix it, only a
            # longer deadline or fewer tokens (the core's "impossible" check).
            status = 400
            shed = dataclasses.replace(
                shed, detail=f"{shed.detail}; raise {DEADLINE_HEADER} or lower max_tokens"
            )
        meaning = shed.reason.meaning
        if shed.reason is ShedReason.TENANT_TOKEN_RATE and shed.retry_after_s is None:
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
            parsed = self._parse(request, raw, kind)
        except ClientError as error:
            self.m_client_errors(str(error.status)).inc()
            return error.response()
        if parsed.tenant is not None and self.config.tenant_cache_salt:
            if self.salts.configured != self.config.cache_salt_key:  # a reload changed it
                self.salts = CacheSalts(self.config.cache_salt_key)
            parsed.raw = salted_body(raw, self.salts.salt(parsed.tenant_name))
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
        record.tokens_in = admission.prompt_tokens
        route = body.model if body.model in self.config.routes else None
        no_fallback = None
        if route is not None:
            chosen, no_fallback = ctl.choose_route(route)
            if chosen != route:  # the core fallback policy allowed a substitute
                parsed = dataclasses.replace(parsed, raw=_with_model(parsed.raw, chosen))
                request[_ROUTE] = chosen
                self.m_fallbacks(route, chosen).inc()
                route = chosen
        got = ctl.offer(admission, revision=parsed.revision, route=route)
        if isinstance(got, Shed):
            if no_fallback is not None and got.reason is ShedReason.DOWNSTREAM_UNHEALTHY:
                got = dataclasses.replace(
                    got, detail=f"{got.detail}; no fallback: {no_fallback.detail}"
                )
            return self._shed_response(got, record)
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
        return await deadline_exceeded(request.get(_STREAM), message)

    async def _relay(
        self, request: web.Request, parsed: _Parsed, lease: Lease, path: str, record: RequestRecord
    ) -> tuple[web.StreamResponse, int | None, bool]:
        """Send to the lease's upstream, retrying on another before the first byte."""
        ctl = self.controller
        attempt = 1
        while True:
            upstream = lease.upstream
            assert upstream is not None
            record.attempt_started_s = time.monotonic()
            record.upstream = upstream.url
            record.revision = upstream.revision
            failure = FailureKind.CONNECT_ERROR
            last: tuple[int, bytes, str | None] = (502, b"", None)
            upstream_retry_after: float | None = None
            lease.phase = Phase.PREFILL  # a client that leaves now pays for its prompt
            try:
                headers = {"Content-Type": "application/json", "X-Request-Id": record.request_id}
                if parsed.deadline_s is not None:
                    # The budget left travels, not the time (the clocks share no origin):
                    # an engine that honours it stops at the deadline by itself.
                    headers[BUDGET_HEADER] = Deadline(parsed.deadline_s).to_header(ctl.now())
                resp = await self._session(upstream).post(
                    upstream.url + path, data=parsed.raw, headers=headers
                )
            except (TimeoutError, aiohttp.ClientError, OSError):
                failure = FailureKind.CONNECT_ERROR
            else:
                if resp.status >= 500 or resp.status == 429:
                    failure = (
                        FailureKind.REFUSED
                        if resp.status in (429, 503)
                        else FailureKind.UPSTREAM_ERROR
                    )
                    text = resp.headers.get("Retry-After", "")
                    upstream_retry_after = float(text) if text.isdigit() else None
                    error_body = await resp.read()
                    resp.release()
                    last = (resp.status, error_body, resp.headers.get("Content-Type"))
                else:
                    try:
                        answer = await self._answer(request, parsed, lease, resp, record)
                        upstream.answered()
                        return answer
                    except _Unanswered:
                        failure = FailureKind.UPSTREAM_ERROR  # nothing reached the client yet
                        last = (502, _UPSTREAM_FAILED, "application/json")
                        # The connection broke under the answer (a dying engine accepts
                        # connections for seconds while its memory is freed): no more
                        # calls go there until it is back, as after a refused connect.
                        upstream.eject(time.monotonic(), self.config.eject_s)
                    finally:
                        resp.close()
            lease.phase = Phase.UNSENT  # the engine failed it before any output
            self.m_upstream_errors(upstream.url).inc()
            if failure is FailureKind.CONNECT_ERROR:
                upstream.eject(time.monotonic(), self.config.eject_s)
            decision = ctl.retries.next_attempt(
                ctl.now(),
                attempt,
                AttemptOutcome(kind=failure, deadline_s=parsed.deadline_s),
                upstream_retry_after if failure is FailureKind.REFUSED else None,
                self.rng,
            )
            moved = None if isinstance(decision, GiveUp) else ctl.reroute(lease)
            ejected = not upstream.ready_at(ctl.now())
            if moved is None and not isinstance(decision, GiveUp) and ejected and ctl.total_slots():
                # Its upstream is out (it failed under the call) and every other one is
                # busy: wait in line for the next free slot rather than fail a call
                # that nothing has reached the client for.
                ctl.requeue(lease)
                record.state = advance(record.request_id, record.state, Event.REQUEUE)
                self.m_retries.inc()
                record.retries += 1
                outcome = await ctl.ready(lease)
                if isinstance(outcome, Shed):
                    return self._shed_response(outcome, record), None, False
                record.state = advance(record.request_id, record.state, Event.DISPATCH)
                attempt += 1
                continue
            if moved is None:
                if failure is FailureKind.CONNECT_ERROR:
                    why = f" ({decision.reason.value})" if isinstance(decision, GiveUp) else ""
                    error = error_response(
                        502,
                        "downstream_unhealthy: the upstream could not be reached and no "
                        f"retry was possible{why}",
                        kind="upstream_error",
                        code="downstream_unhealthy",
                    )
                    return error, None, False
                status, data, ctype = last
                out = web.Response(body=data, status=status, content_type=None)
                if ctype:
                    out.headers["Content-Type"] = ctype
                return out, None, False
            assert not isinstance(decision, GiveUp)
            self.m_retries.inc()
            record.retries += 1
            if decision.delay_s > 0:
                await asyncio.sleep(decision.delay_s)
            attempt += 1

    async def _answer(
        self,
        request: web.Request,
        parsed: _Parsed,
        lease: Lease,
        resp: aiohttp.ClientResponse,
        record: RequestRecord,
    ) -> tuple[web.StreamResponse, int | None, bool]:
        upstream = lease.upstream
        assert upstream is not None
        started = record.attempt_started_s or 0.0
        kept = record.completion
        ok = 200 <= resp.status < 300
        ctype = resp.headers.get("Content-Type", "application/json")
        if not parsed.body.stream or not ok or not ctype.startswith("text/event-stream"):
            try:
                data = await resp.read()
            except (aiohttp.ClientError, OSError) as error:
                raise _Unanswered from error
            record.first_byte_s = now = time.monotonic()
            self.m_ttft(upstream.url).observe(now - started)
            if kept is not None:
                kept.append(data)
            if not ok:
                lease.phase = Phase.UNSENT  # the engine refused it: nothing to charge
            whole = web.Response(body=data, status=resp.status)
            whole.headers["Content-Type"] = ctype
            tokens = None
            if ok:
                with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
                    usage = _USAGE.decode(data).usage
                    tokens = None if usage is None else usage.completion_tokens
                    if usage is not None and usage.prompt_tokens:
                        record.tokens_in = usage.prompt_tokens
                if tokens is not None:
                    self.controller.observe_whole(record.tokens_in or 0, tokens, now - started)
            return whole, tokens, ok
        out = web.StreamResponse(status=resp.status)
        out.headers["Content-Type"] = ctype
        out.headers["Cache-Control"] = "no-cache"
        await out.prepare(request)
        request[_STREAM] = out  # a cancel at the deadline ends this stream, not a new one
        first = True
        tail = b""
        try:
            async for chunk in resp.content.iter_any():
                if first:
                    record.first_byte_s = now = time.monotonic()
                    self.m_ttft(upstream.url).observe(now - started)
                    first = False
                    lease.phase = Phase.DECODE
                lease.output_events += chunk.count(b"data:")  # about one token each
                record.chunks += 1
                if kept is not None:
                    kept.append(chunk)
                tail = tail[-2048:] + chunk if len(chunk) < 4096 else chunk[-4096:]
                if _DONE in tail[-(len(chunk) + len(_DONE)) :]:
                    # The answer's last event: a client that reads it may leave at once.
                    record.tokens_out = _stream_usage(tail)
                    record.relayed = True
                await out.write(chunk)
            if not record.relayed:  # an upstream that ends its stream without [DONE]
                record.tokens_out = _stream_usage(tail)
                record.relayed = True
            await out.write_eof()
        except ConnectionResetError:  # the client went away between two events
            if not record.relayed:
                self.m_cancelled("in_flight", "stream").inc()
                record.cancelled = True
                return out, None, False
        except (aiohttp.ClientError, OSError) as error:
            # The upstream failed mid-stream: the client has part of an answer, so no
            # retry (it would duplicate it); its connection ends without [DONE].
            log.warning("upstream %s failed mid-stream: %s", upstream.url, error)
            self.m_upstream_errors(upstream.url).inc()
            return out, None, False
        tokens = record.tokens_out
        if tokens is not None and record.first_byte_s is not None:
            self.controller.observe_stream(
                record.tokens_in or 0,
                tokens,
                record.first_byte_s - started,
                time.monotonic() - started,
            )
        return out, tokens, True

    # -- other routes ----------------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.StreamResponse:
        try:
            self._tenant(request)
        except ClientError as error:
            return error.response()
        if self.config.models:
            data = [{"id": m, "object": "model", "owned_by": "headway"} for m in self.config.models]
            return web.json_response({"object": "list", "data": data})
        for upstream in self.controller.source.upstreams():
            if not upstream.ready_at(time.monotonic()):
                continue
            try:
                async with self._session(upstream).get(upstream.url + "/v1/models") as resp:
                    return web.Response(
                        body=await resp.read(), status=resp.status, content_type="application/json"
                    )
            except (aiohttp.ClientError, OSError):
                continue
        return error_response(
            503, "no upstream is reachable", kind="upstream_error", code="downstream_unhealthy"
        )

    async def _health(self, request: web.Request) -> web.Response:
        now = self.controller.now()
        ready = sum(1 for u in self.controller.source.upstreams() if u.ready_at(now))
        status = "draining" if self.controller.draining else "ok" if ready else "unavailable"
        return web.json_response(
            {"status": status, "ready_upstreams": ready}, status=200 if status == "ok" else 503
        )

    async def _metrics(self, request: web.Request) -> web.Response:
        key = _bearer(request)
        if key is not None and key in self.config.tenants:
            return error_response(
                403, "/metrics is not for tenants: their API keys are refused here",
                code="forbidden",
            )  # fmt: skip
        config = self.config
        tokens = [t for t in (config.metrics_token, config.admin_token) if t is not None]
        if not config.metrics_public:
            if not tokens:
                return error_response(
                    403, "/metrics is private (it names every tenant): set metrics_token in "
                    "the config and send it as `Authorization: Bearer TOKEN`, or set "
                    "metrics_public: true", code="forbidden",
                )  # fmt: skip
            sent = (key or "").encode()
            if not any(hmac.compare_digest(sent, t.encode()) for t in tokens):
                return error_response(
                    401, "wrong or missing metrics token: send `Authorization: Bearer "
                    "METRICS_TOKEN` (or the admin token)", code="invalid_api_key",
                )  # fmt: skip
        return web.Response(
            body=self.metrics.render(), headers={"Content-Type": METRICS_CONTENT_TYPE}
        )

    # -- admin -----------------------------------------------------------------------------

    def _admin(self, request: web.Request) -> web.Response | None:
        token = self.config.admin_token
        if token is None:
            return error_response(
                403, "the admin API is off: set admin_token in the config",
                code="forbidden",
            )  # fmt: skip
        if not hmac.compare_digest((_bearer(request) or "").encode(), token.encode()):
            return error_response(
                401, "wrong or missing admin token: send `Authorization: Bearer ADMIN_TOKEN`",
                code="invalid_api_key",
            )  # fmt: skip
        return None

    async def _openapi(self, request: web.Request) -> web.Response:
        return web.json_response(openapi_document(self.config.models))

    async def _admin_state(self, request: web.Request) -> web.Response:
        refused = self._admin(request)
        if refused is not None:
            return refused
        ctl = self.controller
        now = ctl.now()
        ups = [
            {"url": u.url, "revision": u.revision, "ready": u.ready_at(now),
             "draining": u.draining, "outstanding_requests": u.outstanding_requests,
             "slots": u.slots}
            for u in ctl.source.upstreams()
        ]  # fmt: skip
        return web.json_response(
            {"upstreams": ups, "running": ctl.running, "queued": len(ctl.queues)}
        )

    async def _admin_drain(self, request: web.Request) -> web.Response:
        """``{"upstream": URL, "drain": true}``: stop (or resume) routing to it; its
        in-flight requests finish."""
        refused = self._admin(request)
        if refused is not None:
            return refused
        try:
            url, drain = _drain_body(await request.read())
        except ClientError as error:
            return error.response()
        for upstream in self.controller.source.upstreams():
            if upstream.url == url:
                upstream.draining = drain
                self.controller.pump()
                return web.json_response(
                    {"upstream": url, "draining": drain,
                     "outstanding_requests": upstream.outstanding_requests}
                )  # fmt: skip
        known = ", ".join(u.url for u in self.controller.source.upstreams())
        return ClientError(
            404, f"no upstream {url[:200]!r}; use one of {known}", param="upstream"
        ).response()

    async def _admin_reload(self, request: web.Request) -> web.Response:
        """Re-read the config file: tenants, models, admin token, upstreams and the
        admission, queue and retry settings take effect at once (a removed upstream is
        drained: its in-flight requests finish); queued and in-flight requests keep their
        places. ``preset``, ``access_log``, adding or removing ``pool``, and shared (Redis)
        budgets need a restart (reported in ``needs_restart``)."""
        refused = self._admin(request)
        if refused is not None:
            return refused
        if self.config_path is None:
            return ClientError(409, "the gateway was not started from a config file").response()
        try:
            new = load_config(self.config_path)
        except ConfigError as error:
            return ClientError(400, str(error), code="invalid_config").response()
        if self.pool is not None:
            try:
                await self.pool.reconfigure(new)
            except ConfigError as error:
                return ClientError(400, str(error), code="invalid_config").response()
        return web.json_response(self.apply_config(new))

    def apply_config(self, new: GatewayFileConfig) -> dict[str, Any]:
        """Swap in ``new`` without dropping requests (see :meth:`_admin_reload`)."""
        old = self.config
        ctl = self.controller
        ups = ctl.source.upstreams()
        by_url = {u.url: u for u in ups}
        wanted = {u.url.rstrip("/") for u in new.upstreams}
        added: list[str] = []
        for upstream in ups if self.pool is None else ():
            if upstream.url not in wanted:
                upstream.draining = True
        for up in new.upstreams if self.pool is None else ():
            url = up.url.rstrip("/")
            if url in by_url:
                state = by_url[url]
                state.slots = up.slots or new.slots_per_upstream
                state.revision = up.revision
                state.route = up.route
                state.draining = False
            elif isinstance(ups, list):
                ups.append(
                    UpstreamState(
                        url=url, revision=up.revision, route=up.route,
                        slots=up.slots or new.slots_per_upstream,
                        total_kv_blocks=new.kv_blocks_per_upstream, api_key=up.api_key,
                    )
                )  # fmt: skip
                added.append(url)
        restart = [
            name for name in ("preset", "access_log") if getattr(old, name) != getattr(new, name)
        ]
        if (old.pool is None) != (new.pool is None):
            restart.append("pool")
        if self.shared is not None and old.admission_config() != new.admission_config():
            restart.append("shared tenant budgets")
        self.config = new
        ctl.reconfigure(new)
        self.deadlines = DeadlinePolicy(
            DeadlineConfig(default_budget_s=new.default_deadline_s, max_budget_s=new.max_deadline_s)
        )
        ctl.pump()
        return {"reloaded": True, "added_upstreams": added, "needs_restart": restart}


async def _echo_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """Every answer to a generate request carries its ``x-request-id`` (the client's, or
    the one the gateway gave it; the upstream gets the same), to find it in logs and spans,
    and ``x-headway-route`` when a fallback route served it."""
    request_id = request.get(_REQUEST_ID)
    if request_id is not None:
        response.headers["x-request-id"] = request_id
    route = request.get(_ROUTE)
    if route is not None:
        response.headers[ROUTE_HEADER] = route


_DRAIN_SHAPE: Final = 'send {"upstream": "http://HOST:PORT", "drain": true|false}'


def _drain_body(raw: bytes) -> tuple[str, bool]:
    """``/admin/drain``'s body, strictly typed: ``upstream`` a URL string, ``drain`` a JSON
    boolean (default true); a wrong type or an unknown field is a 400 naming it."""

    def shown(value: object) -> str:
        return msgspec.json.encode(value).decode()[:80]

    try:
        data = msgspec.json.decode(raw) if raw.strip() else None
    except (msgspec.DecodeError, RecursionError):
        raise ClientError(400, f"the body is not JSON; {_DRAIN_SHAPE}") from None
    if not isinstance(data, dict):
        raise ClientError(
            400, f"the body must be a JSON object (got {shown(data)}); {_DRAIN_SHAPE}"
        )
    unknown = sorted(set(data) - {"upstream", "drain"})
    if unknown:
        raise ClientError(
            400, f"unknown field `{unknown[0][:40]}`; {_DRAIN_SHAPE}", param=unknown[0][:40]
        )
    url = data.get("upstream")
    if not isinstance(url, str) or not url.strip():
        raise ClientError(
            400,
            f"`upstream` must be a string, the URL of an upstream (got {shown(url)}); "
            f"{_DRAIN_SHAPE}",
            param="upstream",
        )
    drain = data.get("drain", True)
    if not isinstance(drain, bool):
        raise ClientError(
            400,
            f"`drain` must be a JSON boolean, true or false (got {shown(drain)}); {_DRAIN_SHAPE}",
            param="drain",
        )
    return url.rstrip("/"), drain


def _with_model(raw: bytes, model: str) -> bytes:
    """The body with its ``model`` replaced (a fallback route; the rare path re-encodes)."""
    data = msgspec.json.decode(raw)
    data["model"] = model
    return msgspec.json.encode(data)


def _shared_budgets(config: GatewayFileConfig, redis_url: str) -> SharedBudgets:
    """The Redis-shared tenant budgets of ``--redis URL``."""
    from headway.gateway.shared import SharedBudgets, SharedBudgetsConfig

    try:
        shared_config = msgspec.convert(
            {**(config.shared or {}), "redis_url": redis_url}, SharedBudgetsConfig
        )
    except msgspec.ValidationError as error:
        raise config_error(error, "gateway config: shared") from None
    instance = f"{socket.gethostname()}:{os.getpid()}"
    return SharedBudgets(shared_config, config.admission_config().tenants, instance)


def _bearer(request: web.Request) -> str | None:
    """The key of ``Authorization: Bearer KEY``, else None."""
    auth = request.headers.get("Authorization", "")
    return auth[7:].strip() if auth[:7].lower() == "bearer " else None


_DONE = b"data: [DONE]"
"""The last event of an OpenAI stream."""


def _stream_usage(tail: bytes) -> int | None:
    """Completion tokens from the ``usage`` event at the end of a stream, when sent."""
    at = tail.rfind(b'"usage":{')
    if at < 0:
        return None
    start = tail.rfind(b"data: ", 0, at)
    end = tail.find(b"\n", at)
    if start < 0 or end < 0:
        return None
    with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
        usage = _USAGE.decode(tail[start + 6 : end]).usage
        return None if usage is None else usage.completion_tokens
    return None
