"""The relay: a request's attempts at its upstreams, and the answer back to the client.

:meth:`UpstreamRelay._relay` sends the body to the lease's upstream and retries on
another (the core's retry policy and budget) while nothing has reached the client: a
refused connection or a connection broken under the answer ejects the upstream for
``eject_s``; when every other upstream is busy the request waits in line again.
:meth:`UpstreamRelay._answer` relays a whole answer, or a stream as its bytes arrive,
keeping the last two chunks to read ``usage`` at the end (:func:`stream_usage`). Its
methods are a mixin of :class:`~headway.gateway.server.GatewayServer`: they use the
server's config, controller, upstream sessions and metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from typing import TYPE_CHECKING, Final

import aiohttp
import msgspec
from aiohttp import web

from headway.core.lifecycle import Event, advance
from headway.core.policy.charges import Phase
from headway.core.policy.deadlines import BUDGET_HEADER, Deadline
from headway.core.policy.decisions import Shed
from headway.core.policy.retries import AttemptOutcome, FailureKind, GiveUp
from headway.gateway.guards import error_response
from headway.gateway.sheds import ShedAnswers
from headway.http_errors import error_body

if TYPE_CHECKING:
    import numpy as np
    from prometheus_client import Counter, Histogram

    from headway.gateway.config import GatewayFileConfig
    from headway.gateway.control import Controller, Lease, UpstreamState
    from headway.gateway.ops import RequestRecord
    from headway.gateway.request_body import ParsedRequest
    from headway.metrics_catalog import Labelled

__all__ = ["STREAM", "UpstreamRelay", "stream_usage"]

log = logging.getLogger("headway.gateway")

STREAM: Final = web.RequestKey("stream", web.StreamResponse)
"""The stream under way to the client: a cancel at the deadline ends it, not a new one."""


class _Usage(msgspec.Struct):
    completion_tokens: int = 0
    prompt_tokens: int = 0


class _WithUsage(msgspec.Struct):
    usage: _Usage | None = None


_USAGE = msgspec.json.Decoder(_WithUsage)


_UPSTREAM_FAILED: Final = msgspec.json.encode(
    error_body(
        "the upstream failed before answering and no retry was possible",
        502, kind="upstream_error", code="upstream_error",
    )
)  # fmt: skip


class _Unanswered(Exception):
    """The upstream failed before anything reached the client (a retry may follow)."""


_DONE = b"data: [DONE]"
"""The last event of an OpenAI stream."""


def stream_usage(tail: bytes) -> int | None:
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


_STOPPED_AT_DEADLINE = re.compile(rb'"code":\s*"deadline_exceeded"')
"""How an engine that honours ``x-headway-budget-ms`` (the emulator, a headway gateway)
says it stopped the request at its deadline (:func:`headway.http_errors.deadline_exceeded`)."""


def stopped_at_deadline(status: int, data: bytes) -> bool:
    """Whether an upstream's answer (a whole body, or a stream's tail ended without
    ``[DONE]``) is its own deadline stop."""
    return status in (200, 504) and _STOPPED_AT_DEADLINE.search(data) is not None


class UpstreamRelay(ShedAnswers):
    """Attempts at the upstreams and the answer relayed (a mixin: the server sets these)."""

    config: GatewayFileConfig
    controller: Controller
    rng: np.random.Generator
    sessions: dict[str, aiohttp.ClientSession]
    m_ttft: Labelled[Histogram]
    m_upstream_errors: Labelled[Counter]
    m_cancelled: Labelled[Counter]
    m_retries: Counter
    m_route_backs: Labelled[Counter]

    def _attempt_ended(
        self, upstream: UpstreamState, *, error: bool, first_byte_s: float | None = None
    ) -> None:
        """Tell the core how an attempt on ``upstream`` went (its release's health), and
        log and count the releases that routes back or returns (never silently)."""
        for change in self.controller.observe_attempt(
            upstream, error=error, first_byte_s=first_byte_s
        ):
            if change.routed_back:
                self.m_route_backs(change.revision).inc()
                log.warning("%s; unpinned calls go to the other releases", change.detail)
            else:
                log.info("%s", change.detail)

    def _session(self, upstream: UpstreamState) -> aiohttp.ClientSession:
        """The upstream's pooled client session (made on first use; closed by ``stop``)."""
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

    async def _relay(
        self,
        request: web.Request,
        parsed: ParsedRequest,
        lease: Lease,
        path: str,
        record: RequestRecord,
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
                    if stopped_at_deadline(resp.status, error_body):
                        # The engine stopped it at the budget the gateway sent: the end
                        # of the gateway's own cancel at the deadline, counted as one
                        # (no retry: the deadline has passed; not the engine's error).
                        record.deadline_cancelled = True
                        self._attempt_ended(upstream, error=False)
                        stopped = web.Response(body=error_body, status=resp.status)
                        stopped.headers["Content-Type"] = "application/json"
                        return stopped, None, False
                    last = (resp.status, error_body, resp.headers.get("Content-Type"))
                else:
                    try:
                        answer = await self._answer(request, parsed, lease, resp, record)
                        upstream.answered()
                        first_byte_s = (
                            None
                            if record.first_byte_s is None
                            else record.first_byte_s - record.attempt_started_s
                        )
                        self._attempt_ended(upstream, error=False, first_byte_s=first_byte_s)
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
            # An overload refusal (429, 503) says nothing of the release's health.
            if failure is not FailureKind.REFUSED:
                self._attempt_ended(upstream, error=True)
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
        parsed: ParsedRequest,
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
        request[STREAM] = out  # a cancel at the deadline ends this stream, not a new one
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
                    record.tokens_out = stream_usage(tail)
                    record.relayed = True
                await out.write(chunk)
            if not record.relayed:  # an upstream that ends its stream without [DONE]
                if stopped_at_deadline(resp.status, tail):
                    record.deadline_cancelled = True  # the engine stopped it at its budget
                    await out.write_eof()
                    return out, None, False
                record.tokens_out = stream_usage(tail)
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
            self._attempt_ended(upstream, error=True)
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
