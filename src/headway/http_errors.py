"""OpenAI-shaped error answers for headway's HTTP servers (the emulator and the gateway).

Every error gets one shape, ``{"error": {"message", "type", "param", "code"}}``, built by
:func:`error_body` alone (JSON answers, SSE error events, raw boundary answers, aiohttp's
own 404, 405 and 413), so a client (and the real ``openai`` package) reads every refusal
the same way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable

import msgspec
from aiohttp import web
from aiohttp.typedefs import Middleware

__all__ = [
    "deadline_exceeded",
    "error_body",
    "error_event",
    "error_response",
    "openai_shaped_errors",
    "too_large_response",
]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_body(
    message: str,
    status: int,
    *,
    kind: str | None = None,
    param: str | None = None,
    code: str | None = None,
) -> dict[str, dict[str, str | None]]:
    """The one error body: ``kind`` defaults by status (``invalid_request_error`` below
    500, ``server_error`` from 500)."""
    kind = kind or ("invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_event(message: str, *, kind: str, code: str) -> bytes:
    """The error as a stream's last SSE event (a stream already under way cannot change
    its status)."""
    return (
        b"data: " + msgspec.json.encode(error_body(message, 500, kind=kind, code=code)) + (b"\n\n")
    )


async def deadline_exceeded(stream: web.StreamResponse | None, message: str) -> web.StreamResponse:
    """The answer of a request stopped at its deadline: a 504 ``deadline_exceeded``, or,
    when its stream (``stream``) is already under way, that error as its last event."""
    if stream is None:
        return error_response(504, message, kind="timeout", code="deadline_exceeded")
    with contextlib.suppress(ConnectionResetError, RuntimeError):
        await stream.write(error_event(message, kind="timeout", code="deadline_exceeded"))
        await stream.write_eof()
    return stream


def error_response(
    status: int,
    message: str,
    *,
    kind: str | None = None,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    """An OpenAI-shaped error answer (``kind`` defaults by status: ``invalid_request_error``
    below 500, ``server_error`` from 500)."""
    body = error_body(message, status, kind=kind, param=param, code=code)
    return web.json_response(body, status=status, headers=headers)


def too_large_response(limit_bytes: int, who: str) -> web.Response:
    """413 for a body over ``limit_bytes``; the connection closes (the rest of the body is
    never read)."""
    response = error_response(
        413,
        f"the request body is larger than the {limit_bytes} bytes this {who} reads; "
        "send a shorter prompt",
        code="request_too_large",
    )
    response.force_close()
    return response


def openai_shaped_errors(routes: str, limit_bytes: int, who: str) -> Middleware:
    """A middleware that answers aiohttp's own 4xx (no route, wrong method, body too
    large) in OpenAI's shape; ``routes`` is named in a 404."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as error:
            if error.status < 400:
                raise
            headers: dict[str, str] = {}
            if isinstance(error, web.HTTPMethodNotAllowed):
                allowed = ", ".join(sorted(error.allowed_methods))
                message = f"{request.method} is not allowed on {request.path}; use {allowed}"
                headers["Allow"] = allowed
            elif isinstance(error, web.HTTPNotFound):
                message = f"no route {request.method} {request.path}; this {who} serves {routes}"
            elif isinstance(error, web.HTTPRequestEntityTooLarge):
                return too_large_response(limit_bytes, who)
            else:
                message = f"{error.reason}: {error.text or ''}".strip()
            code = error.reason.lower().replace(" ", "_")
            return error_response(error.status, message, code=code, headers=headers)

    return middleware
