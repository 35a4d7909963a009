"""The gateway's admin API: ``GET /admin/state``, ``POST /admin/drain``, ``POST
/admin/reload``, ``GET /admin/degraded`` and ``POST /admin/degraded/{mode}``.

Every admin route needs ``Authorization: Bearer ADMIN_TOKEN`` (the config's
``admin_token``; without one the API is off, 403). Drain stops (or resumes) routing to
one upstream while its in-flight requests finish; reload re-reads the config file and
swaps it in without dropping a request (:meth:`AdminAPI.apply_config`); the degraded
routes read the modes' states and force one on or off, or hand it back to its pressure
thresholds (the core's :meth:`~headway.core.policy.degraded.DegradedModes.force`). The bodies are
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
from headway.gateway.generation import mode_changes
from headway.gateway.guards import error_response
from headway.gateway.request_body import ClientError, bearer

if TYPE_CHECKING:
    from pathlib import Path

    from prometheus_client import Counter

    from headway.core.policy.degraded import Forced
    from headway.gateway.control import Controller
    from headway.gateway.pooled import PoolSource
    from headway.gateway.receipts import ReceiptRunner
    from headway.gateway.shared import SharedBudgets
    from headway.metrics_catalog import Labelled

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
    m_mode_changes: Labelled[Counter]

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

    def _modes_state(self) -> dict[str, dict[str, Any]]:
        """Each degraded mode's state: on, forced (on, off or auto), since_s (seconds in
        its current state; null: never changed), served (requests it changed)."""
        now = self.controller.now()
        out: dict[str, dict[str, Any]] = {}
        for name, state in self.controller.core.modes.states.items():
            changed = state.on or state.since_s > 0.0
            out[name] = {
                "on": state.on,
                "forced": state.forced,
                "since_s": round(now - state.since_s, 3) if changed else None,
                "served": state.served,
                "bands": list(self.config.degraded.modes[name].bands),
            }
        return out

    async def _admin_degraded(self, request: web.Request) -> web.Response:
        """Every degraded mode's state (:meth:`_modes_state`)."""
        refused = self._admin(request)
        if refused is not None:
            return refused
        return web.json_response({"modes": self._modes_state()})

    async def _admin_degraded_set(self, request: web.Request) -> web.Response:
        """``{"state": "on"|"off"|"auto"}``: force the mode on or off until told ``auto``
        (then its thresholds decide); the change is logged and counted."""
        refused = self._admin(request)
        if refused is not None:
            return refused
        name = request.match_info["mode"]
        modes = self.controller.core.modes
        if name not in modes.states:
            declared = ", ".join(sorted(modes.states)) or "(none: declare degraded.modes)"
            return ClientError(
                404, f"no degraded mode {name[:60]!r}; use one of {declared}", param="mode"
            ).response()
        try:
            forced = _degraded_body(await request.read())
        except ClientError as error:
            return error.response()
        modes.force(self.controller.now(), name, forced)
        mode_changes(self.controller, self.m_mode_changes)
        return web.json_response({"mode": name, **self._modes_state()[name]})

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


_DEGRADED_SHAPE: Final = 'send {"state": "on"|"off"|"auto"}'
_FORCED: Final = ("on", "off", "auto")


def _shown(value: object) -> str:
    return msgspec.json.encode(value).decode()[:80]


def _json_object(raw: bytes, fields: set[str], shape: str) -> dict[str, object]:
    """An admin body that must be a JSON object of ``fields`` at most; anything else is a
    400 naming what is wrong and ``shape``, the body to send."""
    try:
        data = msgspec.json.decode(raw) if raw.strip() else None
    except (msgspec.DecodeError, RecursionError):
        raise ClientError(400, f"the body is not JSON; {shape}") from None
    if not isinstance(data, dict):
        raise ClientError(400, f"the body must be a JSON object (got {_shown(data)}); {shape}")
    unknown = sorted(set(data) - fields)
    if unknown:
        raise ClientError(400, f"unknown field `{unknown[0][:40]}`; {shape}", param=unknown[0][:40])
    return data


def _degraded_body(raw: bytes) -> Forced:
    """``/admin/degraded/{mode}``'s body: ``state`` one of on, off, auto; anything else
    is a 400 naming the field, the value and the fix."""
    data = _json_object(raw, {"state"}, _DEGRADED_SHAPE)
    state = data.get("state")
    if state not in _FORCED:
        raise ClientError(
            400,
            f'`state` must be "on", "off" or "auto" (got {_shown(state)}): on or off '
            "forces the mode, auto hands it back to its thresholds",
            param="state",
        )
    return state


_DRAIN_SHAPE: Final = 'send {"upstream": "http://HOST:PORT", "drain": true|false}'


def _drain_body(raw: bytes) -> tuple[str, bool]:
    """``/admin/drain``'s body, strictly typed: ``upstream`` a URL string, ``drain`` a JSON
    boolean (default true); a wrong type or an unknown field is a 400 naming it."""
    data = _json_object(raw, {"upstream", "drain"}, _DRAIN_SHAPE)
    url = data.get("upstream")
    if not isinstance(url, str) or not url.strip():
        raise ClientError(
            400,
            f"`upstream` must be a string, the URL of an upstream (got {_shown(url)}); "
            f"{_DRAIN_SHAPE}",
            param="upstream",
        )
    drain = data.get("drain", True)
    if not isinstance(drain, bool):
        raise ClientError(
            400,
            f"`drain` must be a JSON boolean, true or false (got {_shown(drain)}); {_DRAIN_SHAPE}",
            param="drain",
        )
    return url.rstrip("/"), drain
