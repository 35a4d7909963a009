"""Asynchronous receipts: a deferrable request past its limits is accepted ``202`` and run
later, its result fetched with ``GET /v1/receipts/{id}``.

The convention is OpenAI's background responses (``background: true``, then
``GET /v1/responses/{id}``): the answer is an object with an ``id`` and a ``status`` of
``queued``, ``in_progress``, ``completed``, ``failed`` (and ``expired`` past the
retention), polled until final; the completed one carries the ordinary completion body in
``response``. It is served at ``/v1/receipts/{id}`` because the body inside is a chat or
text completion, not a Responses object. The batch API fits less: it takes files of
requests, and a shed is one request.

The decision is the core's (:func:`~headway.core.policy.deferral.should_defer`, called on
every shed). :class:`ReceiptDesk` (a mixin of the server) stores the request
(:mod:`~headway.gateway.receipt_store`) and answers; :class:`ReceiptRunner` claims stored
receipts, runs each by offering it to this same gateway over loopback in the
``background`` band (so admission, the band's ``background_max_share``, fairness, the
relay's retries and the tenant's charges apply unchanged: one request path, not two),
renews its claim while it runs, waits and offers again when it is shed, and writes the
result once. Neither logs a prompt or a key; the receipt id is
``secrets.token_urlsafe`` and a tenant finds only its own (404 otherwise, as for an id
that never existed).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import math
import secrets
import sqlite3
import time
from typing import TYPE_CHECKING, Any, Final

import aiohttp
import msgspec
from aiohttp import web
from redis.exceptions import RedisError

from headway.core.lifecycle import Event, advance
from headway.core.policy.deferral import should_defer
from headway.gateway.guards import error_response
from headway.gateway.receipt_store import Claim, Receipt, ReceiptState, ReceiptStore
from headway.gateway.request_body import PRIORITY_HEADER, ClientError, tenant_of

if TYPE_CHECKING:
    from prometheus_client import Counter

    from headway.core.policy.decisions import Shed
    from headway.gateway.config import GatewayFileConfig, ReceiptsConfig
    from headway.gateway.ops import RequestRecord
    from headway.gateway.request_body import ParsedRequest
    from headway.metrics_catalog import Labelled

__all__ = ["RECEIPT_HEADER", "ReceiptDesk", "ReceiptRunner", "receipt_json"]

RECEIPT_HEADER: Final = "x-headway-receipt"
RUN_HEADER: Final = "x-headway-receipt-run"
"""Marks the runner's own call (this process's secret): it is never deferred again."""
_API_STATUS: Final = {"running": "in_progress"}
_log = logging.getLogger("headway.gateway.receipts")
_FAILURES: Final = (sqlite3.Error, RedisError, aiohttp.ClientError, OSError, TimeoutError)
"""What the store or the loopback call may raise: logged, and the claim lapses or the
look for work is tried again (never a crash of the runner)."""


def receipt_json(receipt: Receipt) -> dict[str, Any]:
    """The receipt as the API shows it (OpenAI's background-response vocabulary)."""
    out: dict[str, Any] = {
        "id": receipt.id,
        "object": "receipt",
        "status": _API_STATUS.get(receipt.state, receipt.state),
        "created_at": math.floor(receipt.created_s),
        "expires_at": math.floor(receipt.expires_s),
        "completed_at": None if receipt.finished_s is None else math.floor(receipt.finished_s),
        "attempts": receipt.attempts,
        "status_code": receipt.status,
        "response": None,
        "error": None,
    }
    if receipt.result is not None:
        try:
            body: Any = msgspec.json.decode(receipt.result)
        except msgspec.DecodeError:
            body = {"message": receipt.result.decode("utf-8", "replace")}
        if receipt.state == "completed":
            out["response"] = body
        else:
            out["error"] = body.get("error", body) if isinstance(body, dict) else body
    return out


class ReceiptRunner:
    """Runs this gateway's stored receipts (module docstring)."""

    def __init__(
        self,
        store: ReceiptStore,
        config: ReceiptsConfig,
        instance: str,
        *,
        completed: Labelled[Counter],
        failed: Labelled[Counter],
        expired: Counter,
        reclaimed: Counter,
    ) -> None:
        self.store = store
        self.config = config
        self.instance = instance
        self.secret = secrets.token_urlsafe(32)
        self.depth: dict[str, int] = {"queued": 0, "running": 0}
        """Receipts queued and running in the store, as of the last look (and since)."""
        self.base_url = ""
        self.keys: dict[str, str] = {}
        """Each tenant's API key by name (from the config, never stored with a receipt)."""
        self.paused = False
        self.m_completed, self.m_failed = completed, failed
        self.m_expired, self.m_reclaimed = expired, reclaimed
        self._wake = asyncio.Event()
        self._runs: dict[str, tuple[asyncio.Task[None], str]] = {}
        self._loop: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None

    def is_run(self, headers: Any) -> bool:
        """The request is this runner's own call."""
        sent = str(headers.get(RUN_HEADER, ""))
        return bool(sent) and hmac.compare_digest(sent.encode(), self.secret.encode())

    def set_tenants(self, config: GatewayFileConfig) -> None:
        """The tenants' keys of ``config`` (at start and on reload)."""
        self.keys = {t.name: key for key, t in config.tenants.items()}

    def accepted(self) -> None:
        """A receipt was stored: count it and look for work now."""
        self.depth["queued"] += 1
        self._wake.set()

    async def start(self, base_url: str) -> None:
        self.base_url = base_url
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5.0)
        )
        self._loop = asyncio.create_task(self._work())

    async def stop(self) -> None:
        """Stop claiming, cut the runs short and give their claims back at once."""
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
        runs = list(self._runs.items())
        for task, _ in self._runs.values():
            task.cancel()
        for receipt_id, (task, token) in runs:
            with contextlib.suppress(asyncio.CancelledError):
                await task
            with contextlib.suppress(*_FAILURES):
                await self.store.release(receipt_id, token)
        if self._session is not None:
            await self._session.close()
        await self.store.close()

    async def _work(self) -> None:
        config = self.config
        last_sweep = -math.inf
        while True:
            try:
                now_s = time.time()
                if now_s - last_sweep >= config.poll_s:
                    last_sweep = now_s
                    expired = await self.store.expire(now_s, config.retention_s)
                    if expired:
                        self.m_expired.inc(expired)
                    self.depth = await self.store.depth()
                free = config.max_running - len(self._runs)
                if free > 0 and not self.paused:
                    for claim in await self.store.claim(self.instance, now_s, config.lease_s, free):
                        self._start(claim)
            except _FAILURES:
                _log.exception("receipt store: looking for work failed; retrying")
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), config.poll_s)

    def _start(self, claim: Claim) -> None:
        if claim.reclaimed:
            self.m_reclaimed.inc()
        receipt_id = claim.receipt.id
        task = asyncio.create_task(self._run(claim))
        self._runs[receipt_id] = (task, claim.token)

        def ended(_: asyncio.Task[None]) -> None:
            self._runs.pop(receipt_id, None)
            self._wake.set()  # a run slot is free

        task.add_done_callback(ended)

    async def _run(self, claim: Claim) -> None:
        receipt = claim.receipt
        keeper = asyncio.create_task(self._keep(claim, asyncio.current_task()))
        try:
            status, body = await self._call_until_admitted(receipt)
            state: ReceiptState = "completed" if 200 <= status < 300 else "failed"
            if await self.store.finish(receipt.id, claim.token, state, status, body, time.time()):
                counter = self.m_completed if state == "completed" else self.m_failed
                counter(receipt.tenant).inc()
            else:
                _log.warning("receipt run: its claim was lost before the result; not written")
        except _FAILURES:
            _log.exception("receipt run failed; the claim lapses and the receipt runs again")
        finally:
            keeper.cancel()

    async def _keep(self, claim: Claim, run: asyncio.Task[Any] | None) -> None:
        """Renew the claim every third of the lease; when it is lost, stop the run."""
        lease_s = self.config.lease_s
        while True:
            await asyncio.sleep(lease_s / 3)
            try:
                held = await self.store.renew(claim.receipt.id, claim.token, time.time() + lease_s)
            except _FAILURES:
                _log.exception("receipt store: renewing a claim failed")
                continue
            if not held and run is not None:
                run.cancel()
                return

    async def _call_until_admitted(self, receipt: Receipt) -> tuple[int, bytes]:
        """Offer the receipt's request to this gateway in ``background`` until it is not
        shed; the final status and body."""
        assert self._session is not None
        assert receipt.body is not None
        headers = {
            "Content-Type": "application/json",
            PRIORITY_HEADER: "background",
            RUN_HEADER: self.secret,
            "x-request-id": "receipt-"
            + hashlib.sha256(receipt.id.encode()).hexdigest()[:16]
            + f"-{receipt.attempts}",
        }
        key = self.keys.get(receipt.tenant)
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        while True:
            async with self._session.post(
                self.base_url + receipt.path, data=receipt.body, headers=headers
            ) as resp:
                body = await resp.read()
                shed = "x-headway-shed-reason" in resp.headers and resp.status in (429, 503)
                if not shed:
                    return resp.status, body
                wait_ms = resp.headers.get("x-headway-retry-after-ms", "")
            wait_s = int(wait_ms) / 1000 if wait_ms.isdigit() else self.config.poll_s
            await asyncio.sleep(min(max(wait_s, 0.02), self.config.poll_s))


class ReceiptDesk:
    """Deferral and the receipts route (a mixin: the server sets these)."""

    config: GatewayFileConfig
    receipts: ReceiptRunner | None
    m_receipts_accepted: Labelled[Counter]
    m_client_errors: Labelled[Counter]

    async def _deferred_response(
        self, shed: Shed, parsed: ParsedRequest, raw: bytes, path: str, record: RequestRecord,
        request: web.Request,
    ) -> web.Response | None:  # fmt: skip
        """The ``202`` of a shed the core defers (the receipt stored), else None (the shed
        stands, also when the store cannot take it)."""
        runner = self.receipts
        if runner is None or runner.is_run(request.headers):
            return None
        stream = parsed.body.stream is True
        queued = runner.depth["queued"] + runner.depth["running"]
        if not should_defer(shed, parsed.band, stream=stream, queued=queued, config=runner.config):
            return None
        now_s = time.time()
        receipt = Receipt(
            id="rcpt_" + secrets.token_urlsafe(24), tenant=parsed.tenant_name, path=path,
            body=raw, state="queued", created_s=now_s,
            expires_s=now_s + runner.config.retention_s,
        )  # fmt: skip
        try:
            await runner.store.submit(receipt)
        except _FAILURES:
            _log.exception("receipt store: storing a receipt failed; the shed stands")
            return None
        runner.accepted()
        self.m_receipts_accepted(parsed.tenant_name, shed.reason.value).inc()
        record.state = advance(record.request_id, record.state, Event.SHED)
        record.admission = "deferred"
        record.shed_reason = shed.reason.value
        poll_s = max(1, math.ceil(shed.retry_after_s or 1.0))
        return web.json_response(
            receipt_json(receipt),
            status=202,
            headers={
                "Location": f"/v1/receipts/{receipt.id}",
                "Retry-After": str(poll_s),
                RECEIPT_HEADER: receipt.id,
                "x-headway-deferred-reason": shed.reason.value,
            },
        )

    async def _receipt_get(self, request: web.Request) -> web.Response:
        try:
            _, tenant = tenant_of(self.config, request)
        except ClientError as error:
            self.m_client_errors(str(error.status)).inc()
            return error.response()
        runner = self.receipts
        receipt_id = request.match_info.get("receipt_id", "")
        receipt = None
        if runner is not None and receipt_id.startswith("rcpt_") and len(receipt_id) <= 64:
            receipt = await runner.store.get(receipt_id)
        if receipt is None or receipt.tenant != tenant:  # another tenant's reads as none
            return error_response(
                404,
                "no receipt with this id for this API key (it never existed, belongs to "
                "another tenant, or passed its retention)"
                + ("" if runner is not None else "; receipts are not enabled (config `receipts`)"),
                param="receipt_id",
                code="receipt_not_found",
            )
        return web.json_response(receipt_json(receipt))
