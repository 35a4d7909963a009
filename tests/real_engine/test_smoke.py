"""The real engine starts, serves the tiny model, and stops by its pid."""

from __future__ import annotations

import json
import os
import urllib.request

from headway.realengine.server import VllmServer


def _post(url: str, body: dict[str, object]) -> dict[str, object]:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        answer: dict[str, object] = json.loads(resp.read())
        return answer


def test_vllm_serves_the_tiny_model(vllm_server: VllmServer) -> None:
    """/v1/models names it with its context; a completion has exactly max_tokens tokens."""
    with urllib.request.urlopen(f"{vllm_server.url}/v1/models", timeout=10) as resp:
        models = json.loads(resp.read())
    assert [(m["id"], m["max_model_len"]) for m in models["data"]] == [("tiny", 2048)]
    answer = _post(
        f"{vllm_server.url}/v1/completions",
        {"model": "tiny", "prompt": "hello", "max_tokens": 3, "ignore_eos": True},
    )
    usage = answer["usage"]
    assert isinstance(usage, dict) and usage["completion_tokens"] == 3
    os.kill(vllm_server.pid, 0)  # still ours, still running
