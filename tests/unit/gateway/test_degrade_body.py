"""A degraded request's body (:mod:`headway.gateway.degrade_body`): the output cap in the
field the client used, the prompt trimmed to the gateway's own estimate by the declared
rule, and every other member (the cache salt too) kept."""

from __future__ import annotations

import json
from typing import Any

import pytest

from headway.core.policy.degraded import Degradation
from headway.gateway.degrade_body import degraded_body, estimated_tokens
from headway.gateway.guards import salted_body


def _run(body: dict[str, Any], how: Degradation, kind: str = "chat") -> dict[str, Any]:
    out, applied = degraded_body(json.dumps(body).encode(), how, kind=kind, bytes_per_token=4.0)
    data = json.loads(out)
    trimmed = data.get("messages", data.get("prompt")) != body.get("messages", body.get("prompt"))
    assert (applied.context_tokens is not None) == trimmed  # it says what it changed
    assert applied.max_tokens == how.max_tokens
    return dict(data)


def _turns(n: int, size: int = 200) -> list[dict[str, str]]:
    return [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "x" * size}
        for i in range(n)
    ]


@pytest.mark.parametrize(
    ("sent", "expected"),
    [
        ({"max_tokens": 500}, {"max_tokens": 16}),
        ({"max_completion_tokens": 500}, {"max_completion_tokens": 16}),
        ({}, {"max_tokens": 16}),
        ({"max_tokens": 500, "max_completion_tokens": 8}, {"max_tokens": 16,
                                                           "max_completion_tokens": 8}),
    ],
)  # fmt: skip
def test_the_cap_goes_into_the_field_the_client_used(
    sent: dict[str, int], expected: dict[str, int]
) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **sent}
    out = _run(body, Degradation("brief", max_tokens=16, asked_max_tokens=500))
    assert {k: out[k] for k in expected} == expected
    assert set(out) - set(expected) == {"model", "messages"}


def test_oldest_turns_drops_the_oldest_non_system_messages_and_keeps_the_last() -> None:
    system = {"role": "system", "content": "be brief " + "s" * 100}
    messages = [system, *_turns(12), {"role": "user", "content": "the question"}]
    body = {"model": "m", "messages": messages, "temperature": 0.5, "user": "u-1"}
    out = _run(body, Degradation("brief", context_tokens=300, trim="oldest_turns"))
    kept = out["messages"]
    assert kept[0] == system and kept[-1] == messages[-1]
    assert kept[1:-1] == messages[-1 - len(kept[1:-1]) : -1]  # the newest turns stay
    assert len(kept) < len(messages)
    encoded = json.dumps(out, separators=(",", ":")).encode()
    assert estimated_tokens(encoded, 4.0) <= 300
    # one more turn would not have fitted: it dropped no more than needed
    fuller = {**out, "messages": [system, messages[-2 - len(kept[1:-1])], *kept[1:]]}
    assert estimated_tokens(json.dumps(fuller, separators=(",", ":")).encode(), 4.0) > 300
    assert (out["temperature"], out["user"]) == (0.5, "u-1")


def test_oldest_turns_keeps_system_messages_and_the_last_even_over_the_limit() -> None:
    messages = [{"role": "system", "content": "s" * 2000}, *_turns(3),
                {"role": "user", "content": "q" * 2000}]  # fmt: skip
    out = _run({"model": "m", "messages": messages},
               Degradation("brief", context_tokens=50))  # fmt: skip
    assert out["messages"] == [messages[0], messages[-1]]
    # Nothing left to drop: said untrimmed, not trimmed.
    again, applied = degraded_body(json.dumps(out).encode(),
                                   Degradation("brief", context_tokens=50), kind="chat",
                                   bytes_per_token=4.0)  # fmt: skip
    assert applied.context_tokens is None
    assert json.loads(again)["messages"] == [messages[0], messages[-1]]


def test_prompt_head_cuts_the_oldest_text_keeping_its_end() -> None:
    messages = [{"role": "system", "content": "rules"}, *_turns(2, 400),
                {"role": "user", "content": "the question"}]  # fmt: skip
    out = _run({"model": "m", "messages": messages},
               Degradation("brief", context_tokens=100, trim="prompt_head"))  # fmt: skip
    kept = out["messages"]
    assert kept[0] == messages[0] and kept[-1] == messages[-1]
    assert len(kept) == 3  # the oldest turn dropped whole, the next one cut at its head
    assert messages[2]["content"].endswith(kept[1]["content"])
    assert len(kept[1]["content"]) < len(messages[2]["content"])
    encoded = json.dumps(out, separators=(",", ":")).encode()
    assert estimated_tokens(encoded, 4.0) == 100  # cut to the limit, not below it


@pytest.mark.parametrize("trim", ["oldest_turns", "prompt_head"])
def test_a_completion_prompt_loses_its_head(trim: Any) -> None:
    prompt = "".join(f"{i:04d} " for i in range(400))
    out = _run({"model": "m", "prompt": prompt, "max_tokens": 4},
               Degradation("brief", context_tokens=100, trim=trim), "completion")  # fmt: skip
    assert prompt.endswith(out["prompt"]) and len(out["prompt"]) < len(prompt)
    assert estimated_tokens(json.dumps(out, separators=(",", ":")).encode(), 4.0) <= 100
    assert out["max_tokens"] == 4


def test_a_token_id_prompt_keeps_its_last_ids_and_a_batch_is_left_as_sent() -> None:
    ids = list(range(1000, 1300))
    out = _run({"model": "m", "prompt": ids}, Degradation("brief", context_tokens=64),
               "completion")  # fmt: skip
    assert out["prompt"] == ids[-64:]
    batch = ["a" * 2000, "b" * 2000]
    out = _run({"model": "m", "prompt": batch}, Degradation("brief", context_tokens=64),
               "completion")  # fmt: skip
    assert out["prompt"] == batch


def test_a_salted_body_keeps_its_salt_first_and_unicode_survives() -> None:
    raw = json.dumps({"model": "m", "messages": [
        {"role": "user", "content": "é" * 300}, {"role": "user", "content": "🙂 last"}],
        "max_tokens": 99}, ensure_ascii=False).encode()  # fmt: skip
    salted = salted_body(raw, b"abc123")
    how = Degradation("brief", max_tokens=16, asked_max_tokens=99, context_tokens=20)
    out, applied = degraded_body(salted, how, kind="chat", bytes_per_token=4.0)
    assert applied == how
    data = json.loads(out)
    assert next(iter(data)) == "cache_salt" and data["cache_salt"] == "abc123"
    assert data["messages"] == [{"role": "user", "content": "🙂 last"}]
    assert data["max_tokens"] == 16
