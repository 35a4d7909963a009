"""Token counts of prompts and the emulator's deterministic output tokens.

The emulator has no tokenizer. A prompt's token count is an estimate, documented in
``docs/emulate.md``: ``ceil(utf-8 bytes / 4)`` for text (at least 1), the list's length for
a prompt of token ids, and for chat ``3 + Σ (4 + tokens(content))`` over the messages (the
role and separator tokens of a chat template, as OpenAI's cookbook counts them).

Output token ids are a pure function of the model revision, the prompt and the sampling
seed, so a fixed greedy prompt always yields the same output: a readiness *fingerprint*
that changes when the revision does (or when the ``corrupt_fingerprint`` fault is on).
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from typing import Final

from headway.core.engine.kv import chain_block_hashes

__all__ = [
    "BYTES_PER_TOKEN",
    "CHAT_MESSAGE_OVERHEAD_TOKENS",
    "CHAT_REPLY_PRIMING_TOKENS",
    "OutputTokens",
    "estimate_text_tokens",
    "fingerprint",
    "prompt_block_hashes",
    "token_text",
]

BYTES_PER_TOKEN: Final = 4
"""UTF-8 bytes per token in the prompt estimate (English text with BPE vocabularies)."""

CHAT_MESSAGE_OVERHEAD_TOKENS: Final = 4
"""Template tokens per chat message (role, separators)."""

CHAT_REPLY_PRIMING_TOKENS: Final = 3
"""Template tokens that start the assistant's reply."""

_WORDS: Final = tuple(
    str.split(
        "the of and to in is was for on are with as be at by this had not but from or "
        "have an they which one you were her all she there would their we him been has "
        "when who will more no if out so said what up its about into than them can only "
        "other new some could time these two may then do first any my now such like our "
        "over man me even most made after also did many before must through back years "
        "where much your way well down should because each just those people how too "
        "little state good very make world still own see men work long get here between "
        "both life being under never day same another know while last might us great old "
        "year off come since against go came right used take three"
    )
)
"""The emulator's output vocabulary: token id ``i`` reads ``" " + _WORDS[i % len]``."""


def estimate_text_tokens(text: str) -> int:
    """Estimated tokens of ``text``: ``ceil(utf-8 bytes / 4)``, at least 1."""
    # surrogatepass: a JSON string may hold a lone surrogate (``"\\ud800"``), which is not
    # UTF-8 encodable; it counts as its 3 bytes rather than failing the request.
    size = len(text.encode("utf-8", "surrogatepass"))
    return max(1, math.ceil(size / BYTES_PER_TOKEN))


def token_text(token_id: int) -> str:
    """The text of output token ``token_id`` (a space and a common English word)."""
    return " " + _WORDS[token_id % len(_WORDS)]


def _seed_of(*parts: object) -> int:
    digest = hashlib.blake2b(repr(parts).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class OutputTokens:
    """The output token ids of one request, drawn lazily from a seeded generator.

    ``prompt_key`` identifies the prompt (its text, or its token ids); ``sample_seed`` is
    ``None`` for greedy decoding (temperature 0), so the output depends only on the
    revision and the prompt.
    """

    __slots__ = ("_ids", "_rng", "_vocab_size")

    def __init__(
        self, revision: str, prompt_key: object, sample_seed: int | None, vocab_size: int
    ) -> None:
        self._rng = random.Random(_seed_of(revision, prompt_key, sample_seed))
        self._vocab_size = vocab_size
        self._ids: list[int] = []

    def ids(self, count: int) -> Sequence[int]:
        """The first ``count`` token ids."""
        ids = self._ids
        rand = self._rng.randrange
        while len(ids) < count:
            ids.append(rand(self._vocab_size))
        return ids[:count]

    def take(self, start: int, stop: int) -> list[int]:
        """Token ids ``start .. stop - 1``."""
        self.ids(stop)
        return self._ids[start:stop]


def fingerprint(revision: str, prompt: str, num_tokens: int, vocab_size: int) -> str:
    """The greedy output text of ``prompt`` on an emulator serving ``revision``.

    A readiness probe sends ``prompt`` with ``temperature: 0`` and ``max_tokens:
    num_tokens`` to ``/v1/completions`` and compares the text with this.
    """
    ids = OutputTokens(revision, ("text", prompt), None, vocab_size).ids(num_tokens)
    return "".join(token_text(i) for i in ids)


def prompt_block_hashes(
    prompt_key: object, num_prompt_tokens: int, block_size: int, cache_salt: str | None = None
) -> list[int]:
    """Chained hashes of a prompt's full KV blocks, for the engine's prefix cache.

    Without a tokenizer a block stands for ``block_size × BYTES_PER_TOKEN`` bytes of the
    prompt's text (a chat's roles and contents in order), or ``block_size`` token ids, so
    prompts that share a long enough prefix share their first blocks' hashes. As in vLLM,
    ``cache_salt`` is mixed into the first block, so every hash of a salted prompt differs
    from the same prompt's under another salt (or none).
    """
    kind, value = prompt_key if isinstance(prompt_key, tuple) else ("", prompt_key)
    chunks: list[bytes] = []
    if kind == "ids":
        ids: tuple[int, ...] = value
        chunks = [repr(ids[i : i + block_size]).encode() for i in range(0, len(ids), block_size)]
        if len(ids) % block_size:
            chunks.pop()
    elif kind in ("text", "chat"):
        if kind == "text":
            data = value.encode("utf-8", "surrogatepass")
        else:
            data = b"".join(
                role.encode() + b"\x00" + text.encode("utf-8", "surrogatepass") + b"\x01"
                for role, text in value
            )
        step = block_size * BYTES_PER_TOKEN
        chunks = [data[i : i + step] for i in range(0, len(data) - step + 1, step)]
    chunks = chunks[: num_prompt_tokens // block_size]
    if not chunks:
        return []
    if cache_salt is not None:
        chunks[0] = b"salt\x00" + cache_salt.encode("utf-8", "surrogatepass") + b"\x00" + chunks[0]
    contents = [
        int.from_bytes(hashlib.blake2b(chunk, digest_size=8).digest(), "big") for chunk in chunks
    ]
    return chain_block_hashes(contents)
