"""What a server's tokenizer does with prompts, read from its ``/tokenize`` before a run.

Synthetic prompts must have the token counts a workload asks for, and token-id prompts
must stay inside the model's vocabulary (ids drawn from a fixed range broke on a model of
8,192 tokens: ``Token id … is out of vocabulary``). vLLM and SGLang expose ``POST
/tokenize``; from it this module learns, with a few dozen small requests:

- words that are one token each (with their ids): prompts are built from them, so a prompt
  of ``n`` words is ``n`` tokens, and the ids are valid token-id prompts;
- how many tokens the server adds to a completions prompt (a BOS token) and how many the
  chat template adds around one user message.

A server without ``/tokenize`` gives None; callers then fall back to their estimates and
report what the server counted (``usage``).
"""

from __future__ import annotations

import http.client
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import msgspec

__all__ = ["CANDIDATE_WORDS", "ServerVocabulary", "read_vocabulary"]

CANDIDATE_WORDS = (
    " the", " and", " for", " you", " not", " are", " but", " can",
    " all", " one", " had", " was", " her", " his", " out", " day",
    " use", " any", " may", " new", " has", " its", " who", " see",
    " set", " two", " way", " now", " get", " end", " run", " per",
    " off", " own", " few", " let", " put", " add", " law", " key",
    " old", " top", " low", " map", " how", " why", " yes", " did",
)  # fmt: skip
"""Four bytes each (a space and three letters), common in every English-trained vocabulary."""
_WANTED_WORDS = 16
_PROBE_WORDS = 8


@dataclass(frozen=True, slots=True)
class ServerVocabulary:
    """What the server's tokenizer said (see the module docstring)."""

    words: tuple[str, ...]
    """Words that are one token each, also in a row (at least two)."""
    word_ids: tuple[int, ...]
    """Their token ids."""
    completions_overhead_tokens: int
    """Tokens the server adds to a ``/v1/completions`` text prompt."""
    chat_overhead_tokens: int
    """Tokens the chat template adds around one user message (with the generation prompt)."""

    def overhead_tokens(self, endpoint: str) -> int:
        """The added tokens of ``endpoint`` (``chat`` or ``completions``)."""
        return self.chat_overhead_tokens if endpoint == "chat" else self.completions_overhead_tokens


class _Tokenizer:
    """``POST /tokenize`` over one connection."""

    def __init__(self, url: str, model: str, api_key: str | None, timeout_s: float) -> None:
        parts = urlsplit(url)
        tls = parts.scheme == "https"
        host = parts.hostname or "127.0.0.1"
        port = parts.port or (443 if tls else 80)
        self.conn: http.client.HTTPConnection = (
            http.client.HTTPSConnection(
                host, port, timeout=timeout_s, context=ssl.create_default_context()
            )
            if tls
            else http.client.HTTPConnection(host, port, timeout=timeout_s)
        )
        prefix = parts.path.rstrip("/")
        self.path = (prefix[:-3] if prefix.endswith("/v1") else prefix) + "/tokenize"
        self.model = model
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def tokens(self, **body: Any) -> list[int] | None:
        """The ids the server gives ``body`` (``prompt`` or ``messages``), None if it cannot."""
        payload = msgspec.json.encode({"model": self.model, **body})
        try:
            self.conn.request("POST", self.path, body=payload, headers=self.headers)
            response = self.conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException):
            return None
        if response.status != 200:
            return None
        try:
            tokens = msgspec.json.decode(data).get("tokens")
        except (msgspec.DecodeError, AttributeError):
            return None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            return None
        return tokens

    def close(self) -> None:
        self.conn.close()


def read_vocabulary(
    url: str, model: str, api_key: str | None = None, timeout_s: float = 10.0
) -> ServerVocabulary | None:
    """Ask the server at ``url`` (``http(s)://host:port[/v1]``) about ``model``'s tokenizer;
    None when it has no ``/tokenize`` or its answers do not fit together."""
    tok = _Tokenizer(url, model, api_key, timeout_s)
    try:
        return _read(tok)
    finally:
        tok.close()


def _read(tok: _Tokenizer) -> ServerVocabulary | None:
    joined = tok.tokens(prompt="".join(CANDIDATE_WORDS), add_special_tokens=False)
    if joined is None:
        return None
    if len(joined) == len(CANDIDATE_WORDS):
        words, ids = list(CANDIDATE_WORDS), joined
    else:  # some words are several tokens: ask one by one
        words, ids = [], []
        for word in CANDIDATE_WORDS:
            got = tok.tokens(prompt=word, add_special_tokens=False)
            if got is not None and len(got) == 1:
                words.append(word)
                ids.append(got[0])
    words, ids = words[:_WANTED_WORDS], ids[:_WANTED_WORDS]
    if len(words) < 2:
        return None
    text = "".join(words[i % len(words)] for i in range(_PROBE_WORDS))
    plain = tok.tokens(prompt=text, add_special_tokens=False)
    completion = tok.tokens(prompt=text)
    chat = tok.tokens(messages=[{"role": "user", "content": text}])
    if plain is None or completion is None or chat is None or len(plain) != _PROBE_WORDS:
        return None  # the words merge in a row: no exact prompts from them
    return ServerVocabulary(
        words=tuple(words),
        word_ids=tuple(ids),
        completions_overhead_tokens=len(completion) - _PROBE_WORDS,
        chat_overhead_tokens=len(chat) - _PROBE_WORDS,
    )
