"""Every content event of a stream is a token, also an empty one; the role-only chunk is not."""

from __future__ import annotations

import json
from typing import Any

import pytest

from headway.stream_tokens import count_token_events, is_token_choice

ROLE_ONLY = {"delta": {"role": "assistant", "content": ""}}
EMPTY = {"delta": {"content": ""}}  # a partial UTF-8 character, a special token
TEXT = {"delta": {"content": " world"}}
ROLE_AND_TEXT = {"delta": {"role": "assistant", "content": "Hi"}}
NO_CONTENT = {"delta": {}}
NULL = {"delta": {"content": None, "reasoning_content": None}}
COMPLETION_EMPTY = {"text": ""}
COMPLETION_TEXT = {"text": "x"}
REASONING = {"delta": {"reasoning_content": "hm"}}
COMPLETION_CLOSE = {"text": "", "finish_reason": "length"}  # OpenAI's last chunk
CHAT_CLOSE = {"delta": {"content": ""}, "logprobs": None, "finish_reason": "stop"}
LAST_TOKEN = {"text": " end", "logprobs": None, "finish_reason": "length"}  # vLLM's last
TOOL = {"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"'}}]}}

CASES: list[tuple[dict[str, Any], bool]] = [
    (ROLE_ONLY, False), (EMPTY, True), (TEXT, True), (ROLE_AND_TEXT, True),
    (NO_CONTENT, False), (NULL, False), (COMPLETION_EMPTY, True), (COMPLETION_TEXT, True),
    (REASONING, True), (TOOL, True), (COMPLETION_CLOSE, False), (CHAT_CLOSE, False),
    (LAST_TOKEN, True),
]  # fmt: skip


def _sse(choices: list[dict[str, Any]], sep: tuple[str, str] = (",", ":")) -> bytes:
    events = [json.dumps({"id": "c", "choices": [c]}, separators=sep) for c in choices]
    events.append(json.dumps({"id": "c", "choices": [], "usage": {"completion_tokens": 9}}))
    return b"".join(b"data: " + e.encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


@pytest.mark.parametrize(("choice", "token"), CASES)
def test_one_choice(choice: dict[str, Any], token: bool) -> None:
    assert is_token_choice(choice) is token
    for sep in ((",", ":"), (", ", ": ")):
        assert count_token_events(_sse([choice], sep)) == int(token)


def test_a_vllm_chat_stream_counts_every_generated_token() -> None:
    """Role chunk, 5 tokens of which 2 print nothing, the usage event: 5 tokens."""
    stream = [ROLE_ONLY, TEXT, EMPTY, TEXT, EMPTY, TEXT]
    raw = _sse(stream)
    assert count_token_events(raw) == 5 == sum(map(is_token_choice, stream))
    cut = raw.index(b"\n\n") + 2  # counting from an offset skips what came before
    assert count_token_events(raw, cut) == 5 and count_token_events(raw, 0, cut) == 0
