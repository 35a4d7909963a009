"""The HTTP boundary both servers (the gateway, the emulator) share: what a hostile client
can do to a connection, answered before (or around) a route's handler.

aiohttp alone answers a malformed request with a plain-text HTTP/1.0 400 that quotes the
offending line, after logging a traceback that quotes it too (``Authorization`` included);
it has no header or body read timeout and no bound on connections; it closes a connection
whose client half-closed after a whole request (cancelling its answer); and it inflates a
``Content-Encoding: gzip`` body without a bound. :class:`BoundaryRunner` serves an app with
a protocol that:

- answers parser errors in the servers' JSON error shape, HTTP/1.1, without echoing the
  request (431 for headers too long or too many) and logs one short line without them;
- closes a connection whose request headers take longer than ``header_timeout_s`` (408),
  and refuses connections beyond ``max_connections`` (503);
- keeps answering a client that half-closed after a whole HTTP/1.1 request: it sends an
  interim ``100 Continue`` and checks that the peer is still there (a client that really
  left answers it with a reset, and its request is cancelled as before);
- leaves bodies compressed, so that :func:`boundary_middleware` refuses any
  ``Content-Encoding`` (415) and reads the body within ``body_timeout_s`` (408).
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import web
from aiohttp.http import HttpVersion11
from aiohttp.http_exceptions import BadHttpMethod, HttpProcessingError, LineTooLong
from aiohttp.typedefs import Middleware
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from headway.core.errors import ConfigError
from headway.http_errors import error_body, error_response, too_large_response

__all__ = ["BoundaryLimits", "BoundaryRunner", "boundary_middleware", "listen"]

log = logging.getLogger("headway.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_TCP_CLOSE_WAIT: Final = 8
"""``tcpi_state`` of a socket whose peer sent FIN and still reads (Linux ``TCP_CLOSE_WAIT``)."""

_LINGER_S: Final = 5.0
"""After answering a request whose body was not read (413, 415), the rest of it is read
and discarded for at most this long, so that the client reads the answer instead of a
reset."""

_PEER_CHECKS_S: Final = (0.002, 0.02, 0.1, 0.5, 2.0)
"""When, after a half-close, the peer's state is read again (its reset to the interim
answer comes within a round trip: on loopback before the write returns, when it is read
first)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BoundaryLimits:
    """Time and connection limits of one server's HTTP boundary."""

    header_timeout_s: float = 10.0
    """A request's headers must arrive within this, from the connection's start or the
    first byte of a later request (slowloris); past it, 408 and the connection closes."""
    body_timeout_s: float = 30.0
    """A request's body must arrive within this after its headers; past it, 408."""
    idle_timeout_s: float = 75.0
    """An idle keep-alive connection closes after this."""
    max_connections: int = 1000
    """Open client connections; one more is answered 503 and closed."""
    max_body_bytes: int = 64 * 1024 * 1024
    """The largest request body read (413 beyond it)."""


def _raw_error(status: int, reason: str, message: str, code: str) -> bytes:
    """A whole HTTP/1.1 error answer in the servers' JSON shape, closing the connection."""
    body = json.dumps(error_body(message, status, kind="invalid_request_error", code=code)).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


def _parser_refusal(exc: BaseException) -> tuple[int, str, str]:
    """Status, message and code for a request aiohttp's parser refused; never the request's
    own bytes (they may hold a key)."""
    text = str(getattr(exc, "message", "") or exc).lower()
    if isinstance(exc, LineTooLong) or "too many headers" in text:
        return (
            431,
            "the request line or headers are too long or too many (at most 8190 bytes a "
            "line, 128 headers); send fewer or shorter headers",
            "request_header_fields_too_large",
        )
    if isinstance(exc, BadHttpMethod):
        return 400, "this is not an HTTP/1.1 request; send one", "bad_request"
    return (
        400,
        "the request is not valid HTTP/1.1 (a malformed request line, header name, header "
        "value or body framing); fix the client's request",
        "bad_request",
    )


def _peer_still_reads(transport: asyncio.BaseTransport) -> bool:
    """Whether the peer of a half-closed connection still reads: its socket is in
    CLOSE_WAIT (a peer that closed entirely answers data with a reset). False where the
    state cannot be read."""
    sock = transport.get_extra_info("socket")
    tcp_info = getattr(socket, "TCP_INFO", None)
    if sock is None or tcp_info is None:
        return False
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, tcp_info, 8)
    except OSError:
        return False
    return bool(info) and info[0] == _TCP_CLOSE_WAIT


class _Protocol(RequestHandler):
    """aiohttp's request handler with the boundary's limits (see the module)."""

    __slots__ = ("_header_timer", "_latest", "_limits", "_refused")

    def __init__(self, manager: web.Server, *, limits: BoundaryLimits, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._limits = limits
        self._header_timer: asyncio.TimerHandle | None = None
        self._latest: BaseRequest | None = None
        """The last request taken off the parser's queue (its handler may not run yet)."""
        self._refused = False
        """Answered by the boundary itself (503, 408): the rest is discarded."""
        factory = self._request_factory
        assert factory is not None

        def make(*args: Any) -> BaseRequest:
            self._latest = request = factory(*args)
            return request

        self._request_factory = make

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        manager = self._manager
        if manager is not None and len(manager.connections) > self._limits.max_connections:
            self._refuse(
                503, "Service Unavailable",
                f"the server holds its limit of {self._limits.max_connections} connections; "
                "retry later or reuse a connection", "too_many_connections",
            )  # fmt: skip
            return
        self._arm_header_timer()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._cancel_header_timer()
        self._latest = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        count = self._request_count
        super().data_received(data)
        if self._request_count != count:
            self._cancel_header_timer()  # a request's headers are all in
        elif data and self._waiter is not None and not self._waiter.done():
            self._arm_header_timer()  # the first bytes of the next request

    def eof_received(self) -> bool | None:  # type: ignore[override]  # asyncio allows True
        """Keep answering a client that half-closed after a whole HTTP/1.1 request whose
        answer has not started; otherwise close (and cancel the handler) as aiohttp does."""
        transport = self.transport
        if transport is None or self._refused or not self._answer_pending():
            return None
        self.close()  # no keep-alive after this answer: the client sends nothing more
        transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # RFC 9110: clients read 1xx
        if not _peer_still_reads(transport):
            # On loopback the reset of a peer that left is in before the write returns:
            # close now, as for any FIN, so its call is cancelled without delay.
            return None
        self._loop.call_later(_PEER_CHECKS_S[0], self._check_peer, 0)
        return True

    def _answer_pending(self) -> bool:
        """A whole HTTP/1.1 request is being handled (or waits to be) and nothing of its
        answer was written."""
        if self._messages:
            message, payload = self._messages[-1]  # parsed, not taken yet
            version = getattr(message, "version", None)
            return version is not None and version >= HttpVersion11 and payload.is_eof()
        request = self._latest
        return (
            request is not None
            and request.version >= HttpVersion11
            and request.writer.output_size == 0
            and request.content.is_eof()
        )

    def _check_peer(self, index: int) -> None:
        transport = self.transport
        if transport is None or not self._answer_pending():
            return  # gone, or its answer started (a write to a peer that left fails)
        if not _peer_still_reads(transport):
            transport.abort()  # it left: connection_lost cancels its handler
            return
        if index + 1 < len(_PEER_CHECKS_S):
            delay_s = _PEER_CHECKS_S[index + 1] - _PEER_CHECKS_S[index]
            self._loop.call_later(delay_s, self._check_peer, index + 1)

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """A parser's refusal: one short log line and a JSON answer without the request's
        bytes. Other errors (a handler's bug: 500) as aiohttp does, but in JSON."""
        if request.writer.output_size > 0 or not isinstance(exc, HttpProcessingError):
            if status >= 500 and request.writer.output_size == 0:
                self.log_exception("a handler failed (%s %s)", request.method, request.path,
                                   exc_info=exc)  # fmt: skip
                response = error_response(status, "the server failed; this is a bug",
                                          code="internal_error")  # fmt: skip
                response.force_close()
                return response
            return super().handle_error(request, status, exc, message)
        status, text, code = _parser_refusal(exc)
        log.warning("refused a malformed request from %s: %d %s", request.remote, status, code)
        # The parser's stand-in request is HTTP/1.0; the answer is HTTP/1.1 (the status
        # line follows the request's version, which aiohttp reads from these).
        request._version = HttpVersion11
        request._cache.pop("version", None)
        response = error_response(status, text, code=code)
        response.force_close()
        return response

    def _refuse(self, status: int, reason: str, message: str, code: str) -> None:
        """Answer and end the connection: our side closes after the answer, what the client
        still sends is discarded, and the socket closes when it does (at most
        :data:`_LINGER_S` later). Closing at once would reset the connection, and a
        reset can discard the answer before the client reads it."""
        transport = self.transport
        if transport is None:
            return
        self._refused = True
        self._cancel_header_timer()
        transport.write(_raw_error(status, reason, message, code))
        if transport.can_write_eof():
            transport.write_eof()
        self._loop.call_later(_LINGER_S, self.force_close)

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self._loop.call_later(
                self._limits.header_timeout_s, self._header_timeout
            )

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        self._header_timer = None
        waiting = self._waiter is not None and not self._waiter.done() and not self._messages
        if waiting and not self._force_close:
            self._refuse(
                408, "Request Timeout",
                f"the request's headers did not arrive within {self._limits.header_timeout_s:g} "
                "s; send them at once", "request_timeout",
            )  # fmt: skip


class _Server(web.Server):
    """aiohttp's connection factory, making :class:`_Protocol` connections."""

    def __init__(self, base: web.Server, limits: BoundaryLimits) -> None:
        super().__init__(
            base.request_handler, request_factory=base.request_factory,
            handler_cancellation=base.handler_cancellation, **base._kwargs,
        )  # fmt: skip
        self.limits = limits

    def __call__(self) -> RequestHandler:
        return _Protocol(self, loop=self._loop, limits=self.limits, **self._kwargs)


class BoundaryRunner(web.AppRunner):
    """An ``AppRunner`` whose connections keep :class:`BoundaryLimits` (bodies are not
    inflated: :func:`boundary_middleware` refuses encoded ones)."""

    def __init__(self, app: web.Application, limits: BoundaryLimits, **kwargs: Any) -> None:
        super().__init__(
            app, auto_decompress=False, keepalive_timeout=limits.idle_timeout_s,
            lingering_time=min(limits.body_timeout_s, _LINGER_S), **kwargs,
        )  # fmt: skip
        self.limits = limits

    async def _make_server(self) -> web.Server:
        return _Server(await super()._make_server(), self.limits)


def boundary_middleware(limits: BoundaryLimits, who: str) -> Middleware:
    """Refuse an encoded body (415) and read every body within ``body_timeout_s`` (408)
    and ``max_body_bytes`` (413) before the handler runs (its ``request.read()`` then
    returns the bytes read)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            response = error_response(
                415,
                f"Content-Encoding {encoding[:40]!r} is not accepted: this {who} reads "
                "uncompressed bodies only; send the JSON body without Content-Encoding",
                param="Content-Encoding",
                code="unsupported_media_type",
            )  # the unread body is discarded still compressed (aiohttp's lingering read)
            return response
        if request.body_exists:
            length = request.content_length
            if length is not None and length > limits.max_body_bytes:
                return too_large_response(limits.max_body_bytes, who)
            try:
                async with asyncio.timeout(limits.body_timeout_s):
                    await request.read()
            except TimeoutError:
                response = error_response(
                    408,
                    f"the request body did not arrive within {limits.body_timeout_s:g} s; "
                    "send it at once",
                    code="request_timeout",
                )
                response.force_close()
                await response.prepare(request)
                await response.write_eof()
                request.protocol.force_close()  # no lingering read of the rest
                return response
            except web.HTTPRequestEntityTooLarge:
                return too_large_response(limits.max_body_bytes, who)
        return await handler(request)

    return middleware


async def listen(site: web.TCPSite, host: str, port: int, flag: str = "--port") -> None:
    """``site.start()``; an address in use (or not available) is a ``ConfigError``: one
    line naming it and the fix (exit code 2), not a traceback."""
    try:
        await site.start()
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"{flag} {port}: {host}:{port} is already in use; stop what listens there, "
                f"or choose another port ({flag} 0 takes a free one)",
                path=flag,
            ) from None
        raise ConfigError(
            f"cannot listen on {host}:{port}: {error.strerror or error}; check --host and {flag}",
            path=flag,
        ) from None
