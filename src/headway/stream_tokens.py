"""Which events of an OpenAI-compatible stream are generated tokens: one rule for every reader.

Every content event counts as one token, also when its text is empty: a token that ends in
the middle of a UTF-8 character, or a special token the server does not print, is a real
token that took a step (vLLM sends it as ``"content": ""`` or ``"text": ""``; a 300-token
stream had 3 of them). Not tokens: the role-only first chunk of a chat stream
(``{"role": "assistant", "content": ""}``), an empty content beside a ``finish_reason``
(the closing chunk of OpenAI's completions stream; vLLM sends its last token with the
``finish_reason``), events without a content string (``null``, the final ``choices: []``
event that carries ``usage``), and ``[DONE]``. A role chunk whose content is not empty
carries the first token and counts.

:func:`count_token_events` reads raw SSE bytes (the bench's hot path, no JSON decoding);
:func:`is_token_choice` reads one decoded choice (calibrate's probes).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["count_token_events", "is_token_choice"]

_CONTENT_KEYS = ("content", "text", "reasoning_content", "reasoning", "arguments")
_TOKEN = re.compile(rb'"(?:content|text|reasoning_content|reasoning|arguments)"\s*:\s*"')
"""A content string, empty or not."""
_ROLE_ONLY = re.compile(
    rb'"role"\s*:\s*"[^"]*"\s*,\s*"content"\s*:\s*""|"content"\s*:\s*""\s*,\s*"role"\s*:\s*"'
)
"""A delta whose role comes with empty content (the opening chunk of a chat stream)."""
_EMPTY_FINISH = re.compile(
    rb'"(?:content|text)"\s*:\s*""[^\n{}]*\}?[^\n{}]*"finish_reason"\s*:\s*"'
)
"""An empty content followed, in the same choice, by a finish reason (a closing chunk)."""


def count_token_events(raw: bytes | bytearray, start: int = 0, end: int | None = None) -> int:
    """Token events in the complete SSE events of ``raw[start:end]``."""
    stop = len(raw) if end is None else end
    found = len(_TOKEN.findall(raw, start, stop))
    if found:
        found -= len(_ROLE_ONLY.findall(raw, start, stop))
        found -= len(_EMPTY_FINISH.findall(raw, start, stop))
    return found


def is_token_choice(choice: dict[str, Any]) -> bool:
    """Whether one decoded ``choices[i]`` of a stream event is a generated token."""
    delta = choice.get("delta")
    fields = delta if isinstance(delta, dict) else choice
    for key in _CONTENT_KEYS:
        value = fields.get(key)
        if isinstance(value, str):
            closing = choice.get("finish_reason") is not None and key in ("content", "text")
            return bool(value) or ("role" not in fields and not closing)
    tool_calls = fields.get("tool_calls")
    if isinstance(tool_calls, list):
        return any(
            isinstance(c, dict)
            and isinstance(c.get("function"), dict)
            and isinstance(c["function"].get("arguments"), str)
            for c in tool_calls
        )
    return False
