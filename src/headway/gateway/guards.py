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
from typing import Final

from aiohttp import web

from headway.http_errors import error_response
from headway.http_errors import openai_shaped_errors as _shaped
from headway.http_errors import too_large_response as _too_large

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


def too_large_response() -> web.Response:
    """413 for a body over :data:`MAX_BODY_BYTES`, unread."""
    return _too_large(MAX_BODY_BYTES, "gateway")


openai_shaped_errors: Final = _shaped(ROUTES, MAX_BODY_BYTES, "gateway")
"""aiohttp's own 4xx in OpenAI's shape (:func:`headway.http_errors.openai_shaped_errors`)."""


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
