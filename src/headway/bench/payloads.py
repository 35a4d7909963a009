"""The target endpoint and the bytes of each request (HTTP/1.1, OpenAI-compatible JSON).

A call of ``n`` input tokens gets a prompt of about ``n`` tokens: a tag unique to the run
and the call (so no two prompts share a prefix block, and a prefix cache cannot make a
synthetic benchmark look faster than the real traffic), then filler words that are one
token each in common BPE vocabularies. The server's ``usage.prompt_tokens`` says what it
really counted. ``max_tokens`` is the call's output tokens; ``ignore_eos`` (vLLM, SGLang)
asks the engine to produce exactly that many.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

import msgspec

from headway.core.errors import ConfigError

Endpoint = Literal["chat", "completions"]

_FILLER_WORDS = (
    " the", " and", " for", " you", " not", " are", " but", " can",
    " all", " one", " had", " was", " her", " his", " out", " day",
)  # fmt: skip
_WORD_BYTES = 4
"""Every filler word is four bytes, so ``n`` words are a slice of ``4 n`` bytes."""

_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


@dataclass(frozen=True, slots=True)
class Target:
    """Where requests go: scheme, host, port and the path prefix before ``/v1``."""

    url: str
    host: str
    port: int
    tls: bool
    prefix: str

    def ssl_context(self) -> ssl.SSLContext | None:
        """A default TLS context for ``https`` targets."""
        return ssl.create_default_context() if self.tls else None

    def path(self, endpoint: Endpoint) -> str:
        """The request path of ``endpoint``."""
        return self.prefix + _PATHS[endpoint]


def parse_target(url: str) -> Target:
    """``http(s)://host[:port][/prefix][/v1]`` as a :class:`Target`."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"--target must be an http(s) URL such as http://127.0.0.1:8000 (got {url!r})"
        )
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ConfigError(f"--target has a bad port (got {url!r})") from None
    prefix = parts.path.rstrip("/")
    if prefix.endswith("/v1"):
        prefix = prefix[:-3]
    return Target(url, parts.hostname, port, parts.scheme == "https", prefix)


@dataclass(slots=True)
class RequestEncoder:
    """Builds the request bytes of a call (a few microseconds each, no JSON encoder)."""

    target: Target
    model: str
    endpoint: Endpoint = "chat"
    stream: bool = True
    ignore_eos: bool = True
    api_key: str | None = None
    run_tag: str = field(default_factory=lambda: os.urandom(4).hex())
    _filler: bytes = b""
    _head: bytes = b""
    _body: bytes = b""

    def __post_init__(self) -> None:
        model = msgspec.json.encode(self.model).replace(b"%", b"%%")
        auth = f"Authorization: Bearer {self.api_key}\r\n" if self.api_key else ""
        auth = auth.replace("%", "%%")
        host = self.target.host
        if (self.target.port, self.target.tls) not in ((80, False), (443, True)):
            host = f"{host}:{self.target.port}"
        self._head = (
            f"POST {self.target.path(self.endpoint)} HTTP/1.1\r\nHost: {host}\r\n"
            f"Content-Type: application/json\r\nAccept: text/event-stream\r\n{auth}"
            "Content-Length: %d\r\n\r\n"
        ).encode()
        extra = b',"stream":true,"stream_options":{"include_usage":true}' if self.stream else b""
        if self.ignore_eos:
            extra += b',"ignore_eos":true'
        if self.endpoint == "chat":
            self._body = (
                b'{"model":' + model + b',"messages":[{"role":"user","content":"%s"}],'
                b'"max_tokens":%d' + extra + b"}"
            )
        else:
            self._body = b'{"model":' + model + b',"prompt":"%s","max_tokens":%d' + extra + b"}"
        self._filler = b"".join(w.encode() for w in _FILLER_WORDS)

    def _filler_bytes(self, words: int) -> bytes:
        need = words * _WORD_BYTES
        while len(self._filler) < need:
            self._filler += self._filler
        return self._filler[:need]

    def prompt(self, call: int, input_tokens: int) -> bytes:
        """The prompt of ``call``: a unique tag, then filler words (about one token each)."""
        tag = b"%s-%d:" % (self.run_tag.encode(), call)
        return tag + self._filler_bytes(max(input_tokens - 4, 0))

    def encode(self, call: int, input_tokens: int, output_tokens: int) -> bytes:
        """The whole HTTP request of one call."""
        body = self._body % (self.prompt(call, input_tokens), output_tokens)
        return self._head % len(body) + body

    def models_request(self) -> bytes:
        """A ``GET /v1/models`` request."""
        auth = f"Authorization: Bearer {self.api_key}\r\n" if self.api_key else ""
        return (
            f"GET {self.target.prefix}/v1/models HTTP/1.1\r\nHost: {self.target.host}\r\n"
            f"{auth}Connection: close\r\n\r\n"
        ).encode()
