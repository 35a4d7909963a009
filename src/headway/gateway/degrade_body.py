"""A degraded request's body: what the core's :class:`~headway.core.policy.degraded.Degradation`
changes of it, applied to the JSON the gateway relays.

The core decides (the cap, the prompt limit, the rule); this module only rewrites the
body to match, as pure functions of the bytes:

* the output cap goes into ``max_tokens`` (and into ``max_completion_tokens`` when the
  client sent that; a client that sent neither gets ``max_tokens``);
* the prompt is trimmed until the gateway's own estimate of it (body bytes /
  ``prompt_bytes_per_token``, the estimate admission read) fits ``context_tokens``:
  ``oldest_turns`` drops the oldest chat messages that are not system (or developer)
  messages, never the last one; ``prompt_head`` cuts the head of that text instead,
  keeping its end. A completion's ``prompt`` string loses its head under either rule, a
  list of token ids keeps its last ``context_tokens`` ids; a batch of prompts is left as
  sent. What the rule cannot drop (system messages, the last message) stays; a prompt the
  rule could not shorten is not said to be trimmed.

The body is decoded, changed and re-encoded (the rare path, as for a fallback's
``model``): every other member, ``cache_salt`` included, is kept in its place.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import msgspec

from headway.core.policy.degraded import Degradation, Trim

__all__ = ["capped_output", "degraded_body", "estimated_tokens", "trimmed_prompt"]


def estimated_tokens(raw: bytes, bytes_per_token: float) -> int:
    """The gateway's prompt-token estimate of a body (what admission reads)."""
    return math.ceil(len(raw) / bytes_per_token)


def capped_output(data: dict[str, Any], cap: int) -> None:
    """Set the output cap in ``data``: ``max_completion_tokens`` when the client used it,
    ``max_tokens`` when it used that or neither (a field already lower keeps its value)."""
    used = [k for k in ("max_tokens", "max_completion_tokens") if data.get(k) is not None]
    for key in used or ["max_tokens"]:
        value = data.get(key)
        data[key] = cap if not isinstance(value, int) or value > cap else value


def _size(data: dict[str, Any]) -> int:
    return len(msgspec.json.encode(data))


def _cut_head(text: str, excess_bytes: int) -> str:
    """``text`` without enough of its head to lose ``excess_bytes`` of encoded JSON (each
    character is at least one byte), keeping at least its last character."""
    return text[min(excess_bytes, max(len(text) - 1, 0)) :]


def _trim_chat(data: dict[str, Any], limit_bytes: int, trim: Trim) -> None:
    messages = data.get("messages")
    if not isinstance(messages, list):
        return
    size = _size(data)  # kept exact as messages go: each dropped one had a comma after it
    keep = ("system", "developer")
    at = 0
    while size > limit_bytes and at < len(messages) - 1:
        message = messages[at]
        if isinstance(message, dict) and message.get("role") in keep:
            at += 1
            continue
        excess = size - limit_bytes
        content = message.get("content") if isinstance(message, dict) else None
        if trim == "prompt_head" and isinstance(content, str) and len(content) > excess:
            # Cutting ``excess`` characters loses at least ``excess`` bytes: it fits.
            cut = content[excess:]
            size -= len(msgspec.json.encode(content)) - len(msgspec.json.encode(cut))
            messages[at] = {**message, "content": cut}
            return
        size -= len(msgspec.json.encode(message)) + 1
        del messages[at]


def _trim_completion(data: dict[str, Any], limit_bytes: int, context_tokens: int) -> None:
    prompt = data.get("prompt")
    if isinstance(prompt, str):
        excess = _size(data) - limit_bytes
        if excess > 0:
            data["prompt"] = _cut_head(prompt, excess)
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        data["prompt"] = prompt[-context_tokens:]


def trimmed_prompt(
    data: dict[str, Any],
    context_tokens: int,
    trim: Trim,
    *,
    kind: str,
    bytes_per_token: float,
) -> bool:
    """Trim the prompt of ``data`` (``kind`` ``chat`` or ``completion``) until its estimate
    fits ``context_tokens`` (module docstring); False when the rule could not shorten it."""
    limit_bytes = math.floor(context_tokens * bytes_per_token)
    field = "messages" if kind == "chat" else "prompt"
    before = msgspec.json.encode(data.get(field))
    if kind == "chat":
        _trim_chat(data, limit_bytes, trim)
    else:
        _trim_completion(data, limit_bytes, context_tokens)
    return msgspec.json.encode(data.get(field)) != before


def degraded_body(
    raw: bytes, degradation: Degradation, *, kind: str, bytes_per_token: float
) -> tuple[bytes, Degradation]:
    """``raw`` (a checked request body, before the gateway's ``cache_salt``) as the
    degraded mode serves it: its output capped, its prompt trimmed (module docstring); and
    what was applied (``context_tokens`` None when the rule could not shorten the prompt:
    the header and the metrics say only what changed)."""
    data = msgspec.json.decode(raw)
    if degradation.max_tokens is not None:
        capped_output(data, degradation.max_tokens)
    if degradation.context_tokens is not None and not trimmed_prompt(
        data,
        degradation.context_tokens,
        degradation.trim,
        kind=kind,
        bytes_per_token=bytes_per_token,
    ):
        degradation = dataclasses.replace(degradation, context_tokens=None)
    return msgspec.json.encode(data), degradation
