"""The gateway's admin API: ``GET /admin/state``, ``POST /admin/drain``, ``POST
/admin/reload``.

Every admin route needs ``Authorization: Bearer ADMIN_TOKEN`` (the config's
``admin_token``; without one the API is off, 403). Drain stops (or resumes) routing to
one upstream while its in-flight requests finish; reload re-reads the config file and
swaps it in without dropping a request (:meth:`AdminAPI.apply_config`). The bodies are
strictly typed: a wrong type or an unknown field is a 400 naming it. :class:`AdminAPI`
is a mixin of :class:`~headway.gateway.server.GatewayServer`.
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING, Any, Final

import msgspec
from aiohttp import web

from headway.core.errors import ConfigError
from headway.core.policy.deadlines import DeadlineConfig, DeadlinePolicy
from headway.gateway.config import GatewayFileConfig, load_config
from headway.gateway.control import UpstreamState
from headway.gateway.guards import error_response
from headway.gateway.request_body import ClientError, bearer

if TYPE_CHECKING:
    from pathlib import Path

    from headway.gateway.control import Controller
    from headway.gateway.pooled import PoolSource
    from headway.gateway.receipts import ReceiptRunner
    from headway.gateway.shared import SharedBudgets

__all__ = ["AdminAPI"]


class AdminAPI:
    """The admin routes and live reconfiguration (a mixin: the server sets these)."""

    config: GatewayFileConfig
    config_path: Path | None
    controller: Controller
    pool: PoolSource | None
    shared: SharedBudgets | None
    receipts: ReceiptRunner | None
    deadlines: DeadlinePolicy

    def _admin(self, request: web.Request) -> web.Response | None:
        token = self.config.admin_token
        if token is None:
            return error_response(
                403, "the admin API is off: set admin_token in the config",
                code="forbidden",
            )  # fmt: skip
        if not hmac.compare_digest((bearer(request) or "").encode(), token.encode()):
            return error_response(
                401, "wrong or missing admin token: send `Authorization: Bearer ADMIN_TOKEN`",
                code="invalid_api_key",
            )  # fmt: skip
        return None

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
            {"upstreams": ups, "running": ctl.running, "queued": ctl.core.queued_requests()}
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
        places. ``preset``, ``access_log``, ``autoscaler``, adding or removing ``pool``, and
        shared (Redis) budgets need a restart (reported in ``needs_restart``)."""
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
            name
            for name in ("preset", "access_log", "autoscaler")
            if getattr(old, name) != getattr(new, name)
        ]
        if (old.pool is None) != (new.pool is None):
            restart.append("pool")
        if self.shared is not None and old.admission_config() != new.admission_config():
            restart.append("shared tenant budgets")
        if ctl.desired is not None and ctl.desired.pools_of(new) != ctl.desired.pools_of(old):
            restart.append("autoscaler pools")
        if old.receipts != new.receipts:
            restart.append("receipts")
        if self.receipts is not None:
            self.receipts.set_tenants(new)  # a receipt runs as its tenant's current key
        self.config = new
        ctl.reconfigure(new)
        self.deadlines = DeadlinePolicy(
            DeadlineConfig(default_budget_s=new.default_deadline_s, max_budget_s=new.max_deadline_s)
        )
        ctl.pump()
        return {"reloaded": True, "added_upstreams": added, "needs_restart": restart}


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
