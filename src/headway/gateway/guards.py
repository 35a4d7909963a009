"""Client-input guards of the gateway: OpenAI-shaped HTTP errors, the body size limit,
header numbers and per-tenant cache salts.

Kept out of the relay so that every answer to a client mistake has one shape,
``{"error": {"message", "type", "param", "code"}}``, including aiohttp's own 404/405/413,
and so that no header a client controls can raise past the handler (a 5xx).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Awaitable, Callable
from typing import Final

from aiohttp import web

__all__ = [
    "MAX_BODY_BYTES",
    "CacheSalts",
    "error_response",
    "openai_shaped_errors",
    "parse_whole",
    "salted_body",
]

MAX_BODY_BYTES: Final = 64 * 1024 * 1024
"""The largest request body the gateway reads (413 beyond it; refused unread when the
``Content-Length`` says so)."""

MAX_HEADER_DIGITS: Final = 18
"""Longest decimal number read from a header (well inside int64 and float precision)."""

ROUTES: Final = (
    "POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health, "
    "GET /metrics, GET /openapi.json, /admin/..."
)


def error_response(
    status: int,
    message: str,
    *,
    kind: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    """An OpenAI-shaped error answer."""
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return web.json_response(body, status=status, headers=headers)


def too_large_response() -> web.Response:
    """413 for a body over :data:`MAX_BODY_BYTES`; the connection closes (the rest of the
    body is never read)."""
    response = error_response(
        413,
        f"the request body is larger than the {MAX_BODY_BYTES} bytes this gateway reads; "
        "send a shorter prompt",
        code="request_too_large",
    )
    response.force_close()
    return response


@web.middleware
async def openai_shaped_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Answer aiohttp's own 4xx (no route, wrong method, body too large) in OpenAI's shape."""
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
            message = f"no route {request.method} {request.path}; this gateway serves {ROUTES}"
        elif isinstance(error, web.HTTPRequestEntityTooLarge):
            return too_large_response()
        else:
            message = f"{error.reason}: {error.text or ''}".strip()
        code = error.reason.lower().replace(" ", "_")
        return error_response(error.status, message, code=code, headers=headers)


def parse_whole(text: str) -> int | None:
    """A header's non-negative whole number (ASCII digits, at most
    :data:`MAX_HEADER_DIGITS`), else None. ``str.isdigit`` alone admits ``²`` and
    numbers too long for ``int()``."""
    text = text.strip()
    if not text or len(text) > MAX_HEADER_DIGITS or not (text.isascii() and text.isdigit()):
        return None
    return int(text)


class CacheSalts:
    """Per-tenant ``cache_salt`` values: hex HMAC-SHA256 of the tenant's name under a key.

    vLLM mixes ``cache_salt`` into the hash of a prompt's first KV block, so prompts with
    different salts never share prefix-cache blocks: one tenant cannot learn by timing
    whether another sent a prompt. The key is ``key`` (stable across restarts and
    instances) or a random one per process.
    """

    def __init__(self, key: str | None = None) -> None:
        self.configured = key
        """The configured key (None: the random one), to notice a reloaded config."""
        self._key = key.encode() if key is not None else secrets.token_bytes(32)
        self._salts: dict[str, bytes] = {}

    def salt(self, tenant: str) -> bytes:
        """The salt of ``tenant`` (hex ASCII), computed once."""
        salt = self._salts.get(tenant)
        if salt is None:
            digest = hmac.new(self._key, tenant.encode(), hashlib.sha256).hexdigest()
            salt = self._salts[tenant] = digest.encode()
        return salt


def salted_body(raw: bytes, salt: bytes) -> bytes:
    """``raw`` (a JSON object with at least one member) with ``"cache_salt": salt`` as its
    first member: one byte insertion after the opening ``{``."""
    at = raw.index(b"{") + 1
    return raw[:at] + b'"cache_salt":"' + salt + b'",' + raw[at:]
