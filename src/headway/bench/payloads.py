"""The target endpoint and the bytes of each request (HTTP/1.1, OpenAI-compatible JSON).

A call of ``n`` input tokens gets a prompt of ``n`` tokens: a tag unique to the run and
the call (so no two prompts share a prefix block, and a prefix cache cannot make a
synthetic benchmark look faster than the real traffic), then filler words. A replayed
trace's prefix-block ids (Mooncake ``hash_ids``) put one text per id before the tag, so the
calls that share ids share that prefix, as the trace says. When the server
has ``/tokenize`` (vLLM, SGLang) the words are ones its tokenizer makes one token each, the
tag is spelled in those words (the run and the call number in base 16), and the tokens the
chat template or a BOS add are subtracted (:mod:`headway.server_vocabulary`), so the served
prompt has exactly ``n`` tokens (at least the added ones plus one). Without ``/tokenize``
the tag is text (``run-call:``, counted as 4 tokens) and the words are ones that are one
token in common BPE vocabularies. The server's ``usage.prompt_tokens`` says what it really
counted; the summary compares it with what was asked. ``max_tokens`` is the call's
output tokens; ``ignore_eos`` (vLLM, SGLang) asks the engine to produce exactly that many.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

import msgspec

from headway.core.errors import ConfigError
from headway.server_vocabulary import ServerVocabulary

Endpoint = Literal["chat", "completions"]

_FILLER_WORDS = (
    " the", " and", " for", " you", " not", " are", " but", " can",
    " all", " one", " had", " was", " her", " his", " out", " day",
)  # fmt: skip
_WORD_BYTES = 4
"""Every filler word is four bytes, so ``n`` words are a slice of ``4 n`` bytes."""

_RUN_DIGITS = 4
"""Words that spell the run in a tag (16⁴ runs before two tags repeat)."""

_PREFIX_ID_DIGITS = 8
"""Words that spell a prefix block's id at the start of its text (16⁸ distinct ids)."""

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
    vocabulary: ServerVocabulary | None = None
    """The server's one-token words and added tokens (exact prompts), or None."""
    _filler: bytes = b""
    _digits: tuple[bytes, ...] = ()
    _run_words: bytes = b""
    _overhead: int = 0
    _call_blocks: dict[int, tuple[int, ...]] = field(default_factory=dict)
    _block_text: dict[int, bytes] = field(default_factory=dict)
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
        vocab = self.vocabulary
        words = vocab.words if vocab is not None else _FILLER_WORDS
        self._filler = b"".join(w.encode() for w in words)
        if vocab is not None:
            self._digits = tuple(w.encode() for w in vocab.words)
            self._overhead = vocab.overhead_tokens(self.endpoint)
            base = len(self._digits)
            run = int(self.run_tag, 16) % base**_RUN_DIGITS
            self._run_words = self._spell(run, _RUN_DIGITS)

    def _filler_bytes(self, words: int) -> bytes:
        need = words * _WORD_BYTES
        while len(self._filler) < need:
            self._filler += self._filler
        return self._filler[:need]

    def _spell(self, number: int, width: int = 1) -> bytes:
        """``number`` in base ``len(words)``, one word per digit, at least ``width`` digits."""
        digits = self._digits
        base = len(digits)
        out: list[bytes] = []
        while number or len(out) < width:
            number, d = divmod(number, base)
            out.append(digits[d])
        return b"".join(reversed(out))

    def share_prefixes(
        self, call_prefix_row: Sequence[int], prefix_hash_ids: Sequence[tuple[Iterable[int], int]]
    ) -> None:
        """Give calls that carry prefix-block ids (a replayed trace's ``hash_ids``) a prompt
        that starts with one text per id: the same id, the same ``block_tokens`` words, so
        calls sharing leading ids share a prefix the engine's cache can hit; the call's
        unique tag follows. ``call_prefix_row[c]`` indexes ``prefix_hash_ids`` (-1: none)."""
        for call, row in enumerate(call_prefix_row):
            if row < 0:
                continue
            ids, block_tokens = prefix_hash_ids[row]
            self._call_blocks[call] = tuple(int(i) for i in ids)
            for i in self._call_blocks[call]:
                if i not in self._block_text:
                    self._block_text[i] = self._block(i, block_tokens)

    def _block(self, block_id: int, block_tokens: int) -> bytes:
        if self.vocabulary is None:  # text: about 3 tokens of id, then filler words
            return b"#%d:" % block_id + self._filler_bytes(max(block_tokens - 3, 0))
        spelled = self._spell(block_id % len(self._digits) ** _PREFIX_ID_DIGITS, _PREFIX_ID_DIGITS)
        words = [spelled[i : i + _WORD_BYTES] for i in range(0, len(spelled), _WORD_BYTES)]
        head = b"".join(reversed(words))[: block_tokens * _WORD_BYTES]  # low digit first
        return head + self._filler_bytes(block_tokens - len(head) // _WORD_BYTES)

    def _shared_prefix(self, call: int, words: int) -> bytes:
        """The call's shared blocks, cut to ``words`` words (b"" without prefix ids)."""
        ids = self._call_blocks.get(call)
        if not ids:
            return b""
        return b"".join(self._block_text[i] for i in ids)[: words * _WORD_BYTES]

    def prompt(self, call: int, input_tokens: int) -> bytes:
        """The prompt of ``call``: its shared prefix blocks if any, a unique tag, then
        filler words (one token each)."""
        if self.vocabulary is None:
            prefix = self._shared_prefix(call, max(input_tokens - 4, 0))
            tag = b"%s-%d:" % (self.run_tag.encode(), call)
            rest = max(input_tokens - 4 - len(prefix) // _WORD_BYTES, 0)
            return prefix + tag + self._filler_bytes(rest)
        words = max(input_tokens - self._overhead, 1)
        prefix = self._shared_prefix(call, words)
        words -= len(prefix) // _WORD_BYTES
        tag = (self._run_words + self._spell(call))[: words * _WORD_BYTES]
        return prefix + tag + self._filler_bytes(words - len(tag) // _WORD_BYTES)

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
