"""Reading OpenAI requests: client mistakes are 400/404 naming the field, value and fix."""

from __future__ import annotations

import json

import pytest

from headway.emulate.openai_api import ApiError, parse_request
from headway.emulate.tokens import estimate_text_tokens

MODELS = ("llama-3-8b",)


def _parse(kind: str, body: object) -> object:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_request("chat" if kind == "chat" else "completion", raw, MODELS)


@pytest.mark.parametrize(
    ("kind", "body", "status", "param", "words"),
    [
        ("chat", b"{not json", 400, None, "not valid JSON"),
        ("chat", [1, 2], 400, None, "JSON object"),
        ("chat", {"messages": [{"role": "user", "content": "x"}]}, 400, "model", "required"),
        ("chat", {"model": "gpt-9", "messages": []}, 404, "model", "'gpt-9' does not exist"),
        ("chat", {"model": 3, "messages": []}, 400, "model", "must be a string"),
        ("chat", {"model": "llama-3-8b"}, 400, "messages", "required"),
        ("chat", {"model": "llama-3-8b", "messages": "hi"}, 400, "messages", "non-empty list"),
        ("chat", {"model": "llama-3-8b", "messages": [{"role": "bot", "content": "x"}]},
         400, "messages[0].role", "'bot'"),
        ("chat", {"model": "llama-3-8b", "messages": [{"role": "user", "content": 5}]},
         400, "messages[0].content", "got 5"),
        ("chat", {"model": "llama-3-8b", "messages": [{"role": "user", "content": "x"}],
                  "max_tokens": 0}, 400, "max_tokens", "integer >= 1 (got 0)"),
        ("chat", {"model": "llama-3-8b", "messages": [{"role": "user", "content": "x"}],
                  "max_tokens": "5"}, 400, "max_tokens", "got '5'"),
        ("chat", {"model": "llama-3-8b", "messages": [{"role": "user", "content": "x"}],
                  "stream": "yes"}, 400, "stream", "true or false"),
        ("chat", {"model": "llama-3-8b", "messages": [{"role": "user", "content": "x"}],
                  "stream_options": {"include_usage": True}}, 400, "stream_options",
         "only allowed with `stream: true`"),
        ("chat", {"model": "llama-3-8b", "messages": [{"role": "user", "content": "x"}],
                  "temperature": 7}, 400, "temperature", "[0, 2]"),
        ("chat", {"model": "llama-3-8b", "messages": [{"role": "user", "content": "x"}],
                  "n": 2}, 400, "n", "send 2 requests"),
        ("completion", {"model": "llama-3-8b"}, 400, "prompt", "required"),
        ("completion", {"model": "llama-3-8b", "prompt": 12}, 400, "prompt", "got 12"),
        ("completion", {"model": "llama-3-8b", "prompt": [1, -2]}, 400, "prompt[1]", "got -2"),
        ("completion", {"model": "llama-3-8b", "prompt": ["a", "b"]}, 400, "prompt", "2 prompts"),
    ],
)  # fmt: skip
def test_client_mistakes_name_the_field(
    kind: str, body: object, status: int, param: str | None, words: str
) -> None:
    with pytest.raises(ApiError) as info:
        _parse(kind, body)
    error = info.value
    assert error.status == status
    assert error.param == param
    assert words in error.message
    assert error.body()["error"]["type"] == "invalid_request_error"  # type: ignore[index]


def test_prompt_token_estimates() -> None:
    chat = _parse("chat", {"model": "llama-3-8b", "messages": [
        {"role": "system", "content": "a" * 40}, {"role": "user", "content": "b" * 8},
    ]})  # fmt: skip
    assert chat.num_prompt_tokens == 3 + (4 + 10) + (4 + 2)  # type: ignore[attr-defined]
    text = _parse("completion", {"model": "llama-3-8b", "prompt": "héllo"})
    assert text.num_prompt_tokens == estimate_text_tokens("héllo") == 2  # type: ignore[attr-defined]
    ids = _parse("completion", {"model": "llama-3-8b", "prompt": [5, 6, 7]})
    assert ids.num_prompt_tokens == 3  # type: ignore[attr-defined]


def test_output_length_without_max_tokens_is_seeded_and_ends_with_stop() -> None:
    body = {"model": "llama-3-8b", "prompt": "tell me", "temperature": 0}
    req = _parse("completion", body)
    n1, reason = req.output_tokens(128, 1)  # type: ignore[attr-defined]
    n2, _ = req.output_tokens(128, 99)  # type: ignore[attr-defined]
    assert reason == "stop" and 1 <= n1 <= 255 and n1 == n2
    given = _parse("completion", {**body, "max_tokens": 7})
    assert given.output_tokens(128, 1) == (7, "length")  # type: ignore[attr-defined]
