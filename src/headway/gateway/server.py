"""The gateway's HTTP server (aiohttp): the app, its routes, lifecycle and metrics.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (streaming or not),
``GET /v1/models``, ``GET /v1/receipts/{id}`` (:mod:`~headway.gateway.receipts`),
``GET /health``, ``GET /metrics``, ``GET /openapi.json``, and the
admin API (``POST /admin/drain``, ``POST /admin/reload``, ``GET /admin/state``,
``GET /admin/degraded``, ``POST /admin/degraded/{mode}``; bearer ``admin_token``).

Hot path per request: find the tenant from the bearer key (a dict lookup); decode only
``model``, ``stream``, ``max_tokens`` and the presence of ``messages``/``prompt`` with a
typed msgspec struct (the rest of the body is relayed as received); estimate prompt tokens
as body bytes / ``prompt_bytes_per_token``; admission; relay. Stream bytes are written to
the client as they arrive; the gateway keeps the last two chunks to read ``usage`` at
the end. A client that disconnects cancels the handler (``handler_cancellation``): a
queued request leaves the line, an in-flight one has its upstream connection closed.

:class:`GatewayServer` keeps the app, its lifecycle, its metrics and the read-only
routes here; the rest is by concern: :mod:`~headway.gateway.request_body` (what a
request says, its 4xx), :mod:`~headway.gateway.generation` (the generate routes),
:mod:`~headway.gateway.relay` (attempts at the upstreams, the answer relayed),
:mod:`~headway.gateway.sheds` (a shed as HTTP) and :mod:`~headway.gateway.admin`.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
import msgspec
import numpy as np
from aiohttp import web

from headway.core.errors import config_error
from headway.core.policy.deadlines import DeadlineConfig, DeadlinePolicy
from headway.gateway.admin import AdminAPI
from headway.gateway.config import GatewayFileConfig
from headway.gateway.control import Controller
from headway.gateway.generation import Generation, echo_request_id
from headway.gateway.guards import MAX_BODY_BYTES, CacheSalts, error_response, openai_shaped_errors
from headway.gateway.openapi import openapi_document
from headway.gateway.ops import AccessLog, tracer
from headway.gateway.pooled import PoolSource
from headway.gateway.receipt_store import SQLiteReceipts
from headway.gateway.receipts import ReceiptRunner
from headway.gateway.request_body import ClientError, bearer, tenant_of
from headway.http_boundary import BoundaryLimits, BoundaryRunner, boundary_middleware, listen
from headway.metrics_catalog import CONTENT_TYPE as METRICS_CONTENT_TYPE
from headway.metrics_catalog import DESIRED_REPLICAS_METRIC, Metrics, gateway_specs

if TYPE_CHECKING:
    from headway.gateway.config import ReceiptsConfig
    from headway.gateway.receipt_store import ReceiptStore
    from headway.gateway.shared import SharedBudgets

__all__ = ["GatewayServer"]


class GatewayServer(AdminAPI, Generation):
    """One gateway: the app, its controller, upstream sessions and metrics (the generate
    routes, the relay and the admin API come from its mixins)."""

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
        self.redis_url = redis_url
        self.receipts: ReceiptRunner | None = None
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
        self._scaling: asyncio.Task[None] | None = None
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
        app.router.add_get("/v1/receipts/{receipt_id}", self._receipt_get)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/openapi.json", self._openapi)
        app.router.add_post("/admin/drain", self._admin_drain)
        app.router.add_post("/admin/reload", self._admin_reload)
        app.router.add_get("/admin/state", self._admin_state)
        app.router.add_get("/admin/degraded", self._admin_degraded)
        app.router.add_post("/admin/degraded/{mode}", self._admin_degraded_set)
        app.on_response_prepare.append(echo_request_id)
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
        if self.controller.desired is not None:
            self._scaling = asyncio.get_running_loop().create_task(self._evaluate_replicas())
        site = web.TCPSite(self.runner, host, port, backlog=4096)
        await listen(site, host, port)
        server = site._server
        assert server is not None
        sockets = getattr(server, "sockets", None) or []
        self.host = host
        self.port = sockets[0].getsockname()[1] if sockets else port
        if self.receipts is not None:
            loopback = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
            self.receipts.set_tenants(self.config)
            await self.receipts.start(f"http://{loopback}:{self.port}")
        return self.url

    async def drain(self, timeout_s: float | None = None) -> bool:
        """Stop taking work (``/health`` 503, new requests refused ``draining``) and wait
        until queued and in-flight requests have finished, at most ``timeout_s``
        (default ``shutdown_timeout_s``). True when nothing was left."""
        ctl = self.controller
        ctl.draining = True
        if self.receipts is not None:
            self.receipts.paused = True  # claim nothing more; what runs finishes
        limit_s = self.config.shutdown_timeout_s if timeout_s is None else timeout_s
        end = time.monotonic() + limit_s
        while ctl.core.queued_requests() or any(ctl.in_flight.values()):
            if time.monotonic() >= end:
                return False
            await asyncio.sleep(0.05)
        return True

    async def _evaluate_replicas(self) -> None:
        """Every evaluation interval, the desired replicas per pool (``autoscaler:``)."""
        ctl = self.controller
        desired = ctl.desired
        assert desired is not None
        while True:
            now = ctl.now()
            desired.evaluate(now, ctl.source.upstreams(), ctl.core.oldest_wait_by_route(now))
            await asyncio.sleep(desired.config.evaluation_interval_s)

    async def stop(self) -> None:
        """Stop listening, finish in flight (up to the shutdown timeout), close sessions."""
        if self._scaling is not None:
            self._scaling.cancel()
            self._scaling = None
        if self.receipts is not None:
            await self.receipts.stop()  # its claims go back to the store at once
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

    # -- metrics ---------------------------------------------------------------------------

    def _setup_metrics(self) -> None:
        """This gateway's registry (:mod:`headway.metrics_catalog`) and its readers."""
        shared = self.shared
        metrics = self.metrics = Metrics(
            gateway_specs(
                pool=self.pool is not None,
                shared_budgets=shared is not None,
                autoscaler=self.controller.desired is not None,
                receipts=self.config.receipts is not None,
            )
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
        self.m_route_backs = metrics.counter_series("headway_gateway_release_route_backs_total")
        self.m_degraded = metrics.counter_series("headway_gateway_degraded_requests_total")
        self.m_mode_changes = metrics.counter_series("headway_gateway_degraded_mode_changes_total")
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

        def routed_back() -> list[tuple[tuple[str, ...], float]]:
            releases = ctl.core.releases
            avoided = releases.avoided(ctl.now())
            return [((r,), float(r in avoided)) for r in releases.known()]

        def modes_on() -> list[tuple[tuple[str, ...], float]]:
            return [((m,), float(st.on)) for m, st in ctl.core.modes.states.items()]

        read, value = metrics.read, metrics.read_value
        read("headway_gateway_release_routed_back", routed_back)
        read("headway_gateway_degraded_mode_active", modes_on)
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
        desired = ctl.desired
        if desired is not None:
            read(DESIRED_REPLICAS_METRIC,
                 lambda: [((p,), float(n)) for p, n in desired.desired().items()])  # fmt: skip
        if self.config.receipts is not None:
            self._setup_receipts(self.config.receipts)
        if self.pool is None:
            read("headway_gateway_upstream_ready", ready)
        else:
            for name, series in self.pool.pool.metric_series().items():
                read(name, series)

    def _setup_receipts(self, config: ReceiptsConfig) -> None:
        """The receipt store (SQLite, or the ``--redis`` one), its runner and metrics."""
        metrics = self.metrics
        store: ReceiptStore
        if self.redis_url is not None:
            from headway.gateway.receipt_redis import RedisReceipts

            store = RedisReceipts(self.redis_url)
        else:
            store = SQLiteReceipts(Path(config.path))
        self.m_receipts_accepted = metrics.counter_series("headway_gateway_receipts_accepted_total")
        runner = self.receipts = ReceiptRunner(
            store, config, f"{socket.gethostname()}:{os.getpid()}",
            completed=metrics.counter_series("headway_gateway_receipts_completed_total"),
            failed=metrics.counter_series("headway_gateway_receipts_failed_total"),
            expired=metrics.counter("headway_gateway_receipts_expired_total"),
            reclaimed=metrics.counter("headway_gateway_receipts_reclaimed_total"),
        )  # fmt: skip
        metrics.read("headway_gateway_receipts_depth",
                     lambda: [((s,), float(n)) for s, n in runner.depth.items()])  # fmt: skip

    # -- read-only routes ------------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.StreamResponse:
        try:
            tenant_of(self.config, request)
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
        key = bearer(request)
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

    async def _openapi(self, request: web.Request) -> web.Response:
        return web.json_response(openapi_document(self.config.models))


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
