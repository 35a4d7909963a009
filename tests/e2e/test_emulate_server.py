"""`headway emulate` end to end: a real server on a loopback port, the official `openai`
client, the Prometheus text, client errors and the fault knobs."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from headway.emulate.process import EmulatorProcess
from headway.emulate.server import CRASH_EXIT_CODE
from headway.emulate.tokens import fingerprint
from openai_clients import openai_client

MODEL = "llama-3-8b"
VOCAB = 128256  # Llama-3's
PROBE = "The readiness probe says:"


@pytest.fixture(scope="module")
def emulator() -> Iterator[str]:
    with EmulatorProcess(["--speedup", "20"]) as emu:
        yield emu.url


@pytest.fixture(scope="module")
def drill() -> Iterator[str]:
    """A second emulator whose faults the tests switch on and off."""
    with EmulatorProcess(["--speedup", "20", "--fault", "delay_s=0"]) as emu:
        yield emu.url


def _client(url: str) -> openai.OpenAI:
    return openai_client(url, "unused")


def _http(
    url: str, path: str, body: object | bytes | None = None, method: str | None = None,
    timeout_s: float = 30.0,
) -> tuple[int, Any]:  # fmt: skip
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{url}{path}", data=data, method=method)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            raw = resp.read()
            status = resp.status
    except urllib.error.HTTPError as error:
        raw, status = error.read(), error.code
    try:
        return status, json.loads(raw)
    except json.JSONDecodeError:
        return status, raw.decode()


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)
    assert match is not None, f"{name} not in /metrics"
    return float(match.group(1))


def test_chat_non_streaming(emulator: str) -> None:
    reply = _client(emulator).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hi in five words"}],
        max_tokens=5,
    )  # fmt: skip
    choice = reply.choices[0]
    assert choice.finish_reason == "length"
    assert len((choice.message.content or "").split()) == 5
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 5
    assert reply.usage.prompt_tokens == 3 + 4 + 5  # ceil(20 bytes / 4) = 5
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 5


def test_chat_streaming_with_usage(emulator: str) -> None:
    stream = _client(emulator).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "count"}], max_tokens=12,
        stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) == 12
    assert content[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == 12


def test_greedy_completion_is_the_fingerprint_streamed_or_not(emulator: str) -> None:
    client = _client(emulator)
    whole = client.completions.create(model=MODEL, prompt=PROBE, max_tokens=8, temperature=0)
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=MODEL, prompt=PROBE, max_tokens=8, temperature=0, stream=True
        )
        if c.choices
    )
    expected = fingerprint("r1", PROBE, 8, VOCAB)
    assert whole.choices[0].text == streamed == expected
    assert whole.usage is not None and whole.usage.prompt_tokens == 7  # 25 bytes


def test_token_id_prompt_counts_exactly(emulator: str) -> None:
    reply = _client(emulator).completions.create(model=MODEL, prompt=[5, 6, 7, 8], max_tokens=2)
    assert reply.usage is not None and reply.usage.prompt_tokens == 4


def test_models_health_version(emulator: str) -> None:
    status, models = _http(emulator, "/v1/models")
    assert status == 200 and models["data"][0]["id"] == MODEL
    # Llama-3-8B's context length, as vLLM lists it; not the KV pool (410,400 tokens).
    assert models["data"][0]["max_model_len"] == 8192
    assert _http(emulator, "/health")[0] == 200
    status, version = _http(emulator, "/version")
    assert status == 200 and version["speedup"] == 20 and version["revision"] == "r1"


def test_a_request_past_the_context_length_is_refused_like_vllm(emulator: str) -> None:
    """The KV pool holds 410,400 tokens, but Llama-3-8B takes 8,192: 8,000 prompt tokens
    and 500 to generate are a 400 naming the limit, as vLLM answers."""
    body = {"model": MODEL, "prompt": [7] * 8000, "max_tokens": 500}
    status, error = _http(emulator, "/v1/completions", body)
    assert status == 400 and error["error"]["code"] == "context_length_exceeded"
    assert "maximum context length is 8192 tokens" in error["error"]["message"]
    status, _ = _http(emulator, "/v1/completions", {**body, "max_tokens": 192})
    assert status == 200


def test_max_model_len_flag_lowers_the_limit() -> None:
    with EmulatorProcess(["--speedup", "50", "--max-model-len", "2048"]) as emu:
        status, models = _http(emu.url, "/v1/models")
        assert status == 200 and models["data"][0]["max_model_len"] == 2048
    with EmulatorProcess(["--speedup", "50", "--num-kv-blocks", "64"]) as small:
        # A pool of 64 blocks of 16 tokens holds less than the context: the pool bounds it.
        assert _http(small.url, "/v1/models")[1]["data"][0]["max_model_len"] == 1024


def test_metrics_use_vllm_names(emulator: str) -> None:
    _client(emulator).completions.create(model=MODEL, prompt="warm", max_tokens=3)
    status, text = _http(emulator, "/metrics")
    assert status == 200
    for name in (
        "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
        "headway_emulator_lag_seconds", "headway_emulator_lag_max_seconds",
    ):  # fmt: skip
        assert 0 <= _metric(text, name) < 1e6
    assert _metric(text, "vllm:prompt_tokens_total") > 0
    assert _metric(text, "vllm:generation_tokens_total") >= 3
    assert _metric(text, "vllm:time_to_first_token_seconds_count") >= 1
    assert _metric(text, "vllm:inter_token_latency_seconds_count") >= 2
    assert "vllm:request_success_total{" in text and 'finished_reason="length"' in text


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/v1/chat/completions", b"{oops", 400, None),
        ("/v1/chat/completions", {"model": MODEL}, 400, "messages"),
        ("/v1/chat/completions", {"model": "gpt-4o", "messages": []}, 404, "model"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": "many"}, 400,
         "max_tokens"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 10**9}, 400, "prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": True}, 400, "prompt"),
    ],
)  # fmt: skip
def test_client_mistakes_are_4xx_with_an_openai_error(
    emulator: str, path: str, body: object, status: int, param: str | None
) -> None:
    got, answer = _http(emulator, path, body)
    assert got == status
    assert answer["error"]["param"] == param
    assert answer["error"]["type"] == "invalid_request_error"
    assert len(answer["error"]["message"]) > 20


def _ttft_sum(url: str) -> float:
    return _metric(_http(url, "/metrics")[1], "vllm:time_to_first_token_seconds_sum")


def test_slowdown_scales_engine_time(drill: str) -> None:
    client = _client(drill)

    def one_ttft() -> float:
        before = _ttft_sum(drill)
        client.completions.create(model=MODEL, prompt=[9] * 2000, max_tokens=1)
        return _ttft_sum(drill) - before

    normal = one_ttft()
    assert _http(drill, "/admin/faults", {"slowdown_factor": 3})[1]["slowdown_factor"] == 3
    slow = one_ttft()
    _http(drill, "/admin/faults", method="DELETE")
    assert slow == pytest.approx(3 * normal, rel=1e-6)


def test_corrupt_fingerprint(drill: str) -> None:
    client = _client(drill)
    expected = fingerprint("r1", PROBE, 6, VOCAB)

    def probe() -> str:
        reply = client.completions.create(model=MODEL, prompt=PROBE, max_tokens=6, temperature=0)
        return reply.choices[0].text

    _http(drill, "/admin/faults", {"corrupt_fingerprint": True})
    corrupted = probe()
    _http(drill, "/admin/faults", method="DELETE")
    assert corrupted != expected
    assert probe() == expected


def test_stall_freezes_streams_until_cleared(drill: str) -> None:
    _http(drill, "/admin/faults", {"stall": True})
    try:
        with pytest.raises(TimeoutError):
            _http(drill, "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2},
                  timeout_s=0.5)  # fmt: skip
        assert _http(drill, "/admin/faults")[1]["stall"] is True
    finally:
        _http(drill, "/admin/faults", {"stall": False})
    status, answer = _http(drill, "/v1/completions", {"model": MODEL, "prompt": "x",
                                                      "max_tokens": 2})  # fmt: skip
    assert status == 200 and answer["usage"]["completion_tokens"] == 2


def test_delay_holds_requests(drill: str) -> None:
    _http(drill, "/admin/faults", {"delay_s": 0.3})
    started = time.monotonic()
    status, _ = _http(drill, "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 1})
    took = time.monotonic() - started
    _http(drill, "/admin/faults", method="DELETE")
    assert status == 200 and took >= 0.3


def test_refuse_connections_then_listen_again(drill: str) -> None:
    port = int(drill.rsplit(":", 1)[1])
    _http(drill, "/admin/faults", {"refuse_connections_s": 0.5})
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            break
        except ConnectionRefusedError:
            time.sleep(0.05)
    assert _http(drill, "/health")[0] == 200


def test_bad_fault_update_is_a_400(drill: str) -> None:
    status, answer = _http(drill, "/admin/faults", {"slowdown_factor": -1})
    assert status == 400 and "slowdown_factor" in answer["error"]["message"]
    status, answer = _http(drill, "/admin/faults", {"explode": True})
    assert status == 400 and "knobs" in answer["error"]["message"]


def test_crash_exits_at_once_and_sigterm_stops_cleanly() -> None:
    with EmulatorProcess(["--speedup", "50"]) as crashing:
        with contextlib.suppress(ConnectionError, urllib.error.URLError):  # it may die first
            _http(crashing.url, "/admin/faults", {"crash": True}, timeout_s=5)
        assert crashing.proc is not None
        assert crashing.proc.wait(10) == CRASH_EXIT_CODE
    emu = EmulatorProcess(["--speedup", "50", "--fault", "slowdown_factor=2"])
    emu.start()
    assert _http(emu.url, "/admin/faults")[1]["slowdown_factor"] == 2
    assert emu.stop() == 0
