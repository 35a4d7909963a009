"""The gateway's ``gateway.request`` spans through the real OpenTelemetry SDK (an
in-memory exporter): a gateway in this test's event loop in front of a real emulator
process, and the span builder on a hand-made record. No prompt text by default."""

from __future__ import annotations

import asyncio
import json
import time
import timeit
import uuid
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import NoOpTracerProvider

from headway.emulate.process import EmulatorProcess
from headway.gateway.config import parse_config
from headway.gateway.ops import RequestRecord, record_span
from headway.gateway.server import GatewayServer

MODEL = "llama-3-8b"
KEY = "key-acme"


@pytest.fixture(scope="module")
def emulator() -> Iterator[str]:
    # Slow enough that a stream arrives in several reads even on a busy host (chunks > 1).
    with EmulatorProcess(["--speedup", "2"]) as emu:
        yield emu.url


def _exporter() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


async def _through_gateway(
    emulator: str, provider: TracerProvider, marker: str, **extra: Any
) -> None:
    config = parse_config(
        {
            "upstreams": [{"url": emulator, "revision": "rev-a"}],
            "tenants": {
                KEY: {"name": "acme"},
                "key-tiny": {"name": "tiny", "token_rate_per_s": 1.0, "burst_s": 1.0},
            },
            **extra,
        }
    )
    server = GatewayServer(config)
    server.tracer = provider.get_tracer("test")
    url = await server.start()
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"about {marker}"}],
        "max_tokens": 8,
    }
    try:
        async with aiohttp.ClientSession() as session:
            for stream, key in ((True, KEY), (False, "key-tiny")):
                async with session.post(
                    f"{url}/v1/chat/completions",
                    json={**body, "stream": stream},
                    headers={"Authorization": f"Bearer {key}", "x-request-id": f"req-{stream}"},
                ) as resp:
                    await resp.read()
                    # tiny's whole bucket holds 1 token: the request can never pass (400)
                    assert resp.status == (200 if stream else 400)
    finally:
        await server.stop()


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def test_spans_through_a_gateway(emulator: str) -> None:
    provider, exporter = _exporter()
    marker = f"marker-{uuid.uuid4().hex}"
    asyncio.run(_through_gateway(emulator, provider, marker))
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["gateway.request", "gateway.request"]
    served, shed = spans
    a = _attrs(served)
    assert a["headway.request_id"] == "req-True"
    assert a["headway.tenant"] == "acme" and a["headway.class"] == "interactive"
    assert a["headway.route"] == "/v1/chat/completions" and a["headway.model"] == MODEL
    assert a["headway.revision"] == "rev-a" and a["headway.upstream"] == emulator.rstrip("/")
    assert a["headway.admission.decision"] == "admit"
    assert "headway.admission.reason" not in a
    assert a["headway.queue_wait_ms"] >= 0 and a["headway.upstream_ttft_ms"] > 0
    assert a["headway.stream"] is True and a["headway.stream.chunks"] > 1
    assert a["http.response.status_code"] == 200
    assert [e.name for e in served.events] == ["admission", "dispatch", "first_byte"]
    times = [e.timestamp for e in served.events]
    assert served.start_time is not None and served.end_time is not None
    assert served.start_time <= times[0] <= times[1] <= times[2] <= served.end_time
    s = _attrs(shed)
    assert s["headway.tenant"] == "tiny"
    assert s["headway.admission.decision"] == "shed"
    assert s["headway.admission.reason"] == "tenant_token_rate"
    assert s["http.response.status_code"] == 400
    assert [e.name for e in shed.events] == ["admission"]
    for span in spans:
        assert all(marker not in str(v) for v in _attrs(span).values())
        assert all(marker not in str(e.attributes) for e in span.events)


def test_log_content_puts_the_prompt_on_the_span(emulator: str) -> None:
    provider, exporter = _exporter()
    marker = f"marker-{uuid.uuid4().hex}"
    asyncio.run(_through_gateway(emulator, provider, marker, log_content=True))
    for span in exporter.get_finished_spans():
        assert marker in _attrs(span)["headway.prompt"]


def test_span_builder_on_a_record() -> None:
    provider, exporter = _exporter()
    now = time.monotonic()
    record = RequestRecord(
        "r-1", "/v1/completions", now - 0.5, tenant="acme", band="critical", model="m",
        admission="enqueue", status=502, upstream="http://u", revision="rev-b",
        dispatched_s=now - 0.4, attempt_started_s=now - 0.3, first_byte_s=now - 0.1,
        retries=1, tokens_in=10,
    )  # fmt: skip
    record_span(provider.get_tracer("test"), record, now)
    (span,) = exporter.get_finished_spans()
    a = _attrs(span)
    assert a["headway.queue_wait_ms"] == pytest.approx(100.0)
    assert a["headway.upstream_ttft_ms"] == pytest.approx(200.0)
    assert a["headway.retries"] == 1 and a["headway.class"] == "critical"
    assert span.status.status_code.name == "ERROR"
    assert span.end_time is not None and span.start_time is not None
    assert (span.end_time - span.start_time) / 1e9 == pytest.approx(0.5, abs=1e-3)
    assert "headway.prompt" not in a


def test_no_provider_costs_next_to_nothing() -> None:
    record = RequestRecord("r-1", "/v1/completions", time.monotonic(), tenant="acme")
    tracer = NoOpTracerProvider().get_tracer("test")
    per_call_s = timeit.timeit(lambda: record_span(tracer, record), number=20_000) / 20_000
    assert per_call_s < 20e-6  # typically ~1 µs


async def _refused_through_gateway(emulator: str, provider: TracerProvider, marker: str) -> int:
    """Malformed, unauthenticated and engine-refused requests carrying ``marker``; the
    number of requests sent."""
    config = parse_config({"upstreams": [{"url": emulator}], "tenants": {KEY: {"name": "acme"}}})
    server = GatewayServer(config)
    server.tracer = provider.get_tracer("test")
    url = await server.start()
    chat = {"model": MODEL, "messages": [{"role": "user", "content": f"about {marker}"}]}
    sent: list[tuple[str, bytes, int]] = [
        (KEY, f'{{"model": "{MODEL}", "messages": "{marker}'.encode(), 400),  # not JSON
        (KEY, json.dumps({**chat, "max_tokens": marker}).encode(), 400),  # wrong type
        ("wrong", json.dumps(chat).encode(), 401),
        (KEY, json.dumps({**chat, "temperature": marker}).encode(), 400),  # the engine's
    ]
    try:
        async with aiohttp.ClientSession() as session:
            for key, body, status in sent:
                async with session.post(
                    f"{url}/v1/chat/completions",
                    data=body,
                    headers={"Authorization": f"Bearer {key}"},
                ) as resp:
                    await resp.read()
                    assert resp.status == status
    finally:
        await server.stop()
    return len(sent)


def test_refused_requests_spans_carry_no_prompt(emulator: str) -> None:
    provider, exporter = _exporter()
    marker = f"marker-{uuid.uuid4().hex}"
    sent = asyncio.run(_refused_through_gateway(emulator, provider, marker))
    spans = exporter.get_finished_spans()
    assert len(spans) == sent
    for span in spans:
        assert span.status.status_code.name == "ERROR"
        assert all(marker not in str(v) for v in _attrs(span).values())
        assert all(marker not in str(e.attributes) for e in span.events)
        assert marker not in str(span.status.description)
