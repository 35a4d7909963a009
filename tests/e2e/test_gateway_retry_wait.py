"""A call whose engine dies under it before anything reached the client is retried, and
when every other engine is busy it waits in line for the next free slot instead of
failing: killed mid-decode, a vLLM replica accepted connections for seconds while its
memory was freed, and the gateway answered the calls it had sent there 502 because the
other replica's slots were full (the real-engine tier's kill-decode drill)."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from typing import Any

import pytest

from headway.emulate.process import EmulatorProcess
from headway.gateway.process import GatewayProcess

MODEL = "llama-3-8b"
KEY = "key-acme"


def _post(url: str, path: str, body: Any, timeout_s: float = 60.0) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"{url}{path}", json.dumps(body).encode(),
        {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def _running(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:num_requests_running")
    )


@pytest.mark.timeout(120)
def test_a_call_whose_engine_dies_waits_for_the_busy_one() -> None:
    with (
        EmulatorProcess(["--speedup", "1", "--model", MODEL]) as a,
        EmulatorProcess(["--speedup", "1", "--model", MODEL]) as b,
    ):
        config = {
            "upstreams": [{"url": a.url, "model": MODEL}, {"url": b.url, "model": MODEL}],
            "tenants": {KEY: {"name": "acme"}},
            "slots_per_upstream": 1,
            "eject_s": 30.0,
            "queues": {"critical_reserved_slots": 0},
        }
        with GatewayProcess(config) as gw:
            held: list[tuple[int, Any]] = []
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hold"}],
                    "max_tokens": 300, "ignore_eos": True}  # fmt: skip
            holder = threading.Thread(
                target=lambda: held.append(_post(gw.url, "/v1/chat/completions", body))
            )
            holder.start()
            deadline = time.monotonic() + 10
            while _running(a.url) + _running(b.url) < 1:
                assert time.monotonic() < deadline, "the holding call never ran"
                time.sleep(0.01)
            busy, free = (a, b) if _running(a.url) else (b, a)
            # The free engine holds the next call 5 s before it sees it, and dies after 0.5 s.
            status, _ = _post(free.url, "/admin/faults", {"delay_s": 5.0, "crash_after_s": 0.5})
            assert status == 200
            status, answer = _post(gw.url, "/v1/chat/completions", {
                "model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 3})  # fmt: skip
            holder.join(60)
            assert free.proc is not None and free.proc.wait(10) != 0  # it really died
            assert held and held[0][0] == 200, held
            assert status == 200, answer  # it waited for the busy engine's slot
            assert answer["usage"]["completion_tokens"] == 3
            assert _running(busy.url) == 0
