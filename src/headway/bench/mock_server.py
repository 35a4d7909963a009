"""A fast OpenAI-compatible streaming server: the calibration target of the load generator.

It is not an engine model (``headway emulate`` is): every request gets its tokens at
once (or after fixed ``ttft``/``itl`` delays), so a load test against it measures the
generator, not the server. Raw asyncio protocol, hand-written HTTP/1.1 keep-alive and
chunked SSE; ``/v1/chat/completions`` and ``/v1/completions`` (stream or not,
``stream_options.include_usage``), ``/v1/models`` and ``/health``. It records the
monotonic arrival time of every generation request (Linux's monotonic clock is shared by
all processes, so a client can compare it with its own schedule).

Run: ``python -m headway.bench.mock_server --port 8000 [--tokens N] [--ttft-ms X]
[--itl-ms Y] [--status 429 --status-every K] [--arrivals-out FILE.npy]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

MODEL = "mock"
"""The one model the server lists."""

_TOKEN_TEXT = " the"


@dataclass(slots=True)
class MockConfig:
    """What the server answers."""

    tokens: int | None = None
    """Output tokens per request (default: the request's ``max_tokens``, else 16)."""
    ttft_s: float = 0.0
    """Delay before the first token."""
    itl_s: float = 0.0
    """Delay between tokens (0: the whole stream in one write)."""
    status: int = 200
    """Status answered to every ``status_every``-th generation request."""
    status_every: int = 1
    """1: every request gets ``status`` (200: normal)."""
    max_inflight: int | None = None
    """Answer 429 while this many delayed streams are in flight (a server with a knee)."""


@dataclass(slots=True)
class MockState:
    """Counters and arrival times, shared by all connections."""

    config: MockConfig
    arrivals_s: list[float] = field(default_factory=list)
    requests: int = 0
    inflight: int = 0


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(obj: dict[str, Any]) -> bytes:
    return _chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


class _Frames:
    """Pre-encoded SSE frames (chunked) for chat and completions."""

    def __init__(self) -> None:
        base = {"id": "cmpl-mock", "created": 0, "model": MODEL}
        chat = {**base, "object": "chat.completion.chunk"}
        text = {**base, "object": "text_completion"}
        self.chat_role = _event(
            {**chat, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
        )
        self.chat_token = _event(
            {
                **chat,
                "choices": [{"index": 0, "delta": {"content": _TOKEN_TEXT}, "finish_reason": None}],
            }
        )
        self.chat_finish = _event(
            {**chat, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
        )
        self.text_token = _event(
            {**text, "choices": [{"index": 0, "text": _TOKEN_TEXT, "finish_reason": None}]}
        )
        self.text_finish = _event(
            {**text, "choices": [{"index": 0, "text": "", "finish_reason": "length"}]}
        )
        self.chat_base = chat
        self.text_base = text
        self.done = _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"

    def usage(self, chat: bool, prompt: int, completion: int) -> bytes:
        base = self.chat_base if chat else self.text_base
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        return _event({**base, "choices": [], "usage": usage})


_FRAMES = _Frames()
_SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)


def _json_response(status: int, obj: Any) -> bytes:
    body = json.dumps(obj).encode()
    reason = {200: b"OK", 400: b"Bad Request", 404: b"Not Found"}.get(status, b"Error")
    return b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        status,
        reason,
        len(body),
        body,
    )


def _prompt_tokens(body: dict[str, Any]) -> int:
    """A rough prompt length: words of the prompt or of the messages' contents."""
    if "messages" in body:
        return sum(len(str(m.get("content", "")).split()) for m in body["messages"]) or 1
    return len(str(body.get("prompt", "")).split()) or 1


class _Handler(asyncio.Protocol):
    """One client connection (keep-alive, requests answered in order)."""

    def __init__(self, state: MockState) -> None:
        self.state = state
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            head = buf[:end].lower()
            length = 0
            at = head.find(b"content-length:")
            if at >= 0:
                stop = head.find(b"\r\n", at)
                length = int(head[at + 15 : stop if stop >= 0 else len(head)])
            if len(buf) < end + 4 + length:
                break
            body = buf[end + 4 : end + 4 + length]
            buf = buf[end + 4 + length :]
            self._handle(head, body)
        self.buf = buf

    def _handle(self, head: bytes, body: bytes) -> None:
        transport = self.transport
        assert transport is not None
        line = head[: head.find(b"\r\n")] if b"\r\n" in head else head
        parts = line.split(b" ")
        path = parts[1] if len(parts) > 1 else b"/"
        if path.startswith(b"/v1/models"):
            transport.write(
                _json_response(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
            )
            return
        if path.startswith(b"/health"):
            transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            return
        chat = path.startswith(b"/v1/chat/completions")
        if not chat and not path.startswith(b"/v1/completions"):
            transport.write(_json_response(404, {"error": {"message": "no such path"}}))
            return
        state = self.state
        state.arrivals_s.append(time.monotonic())
        state.requests += 1
        config = state.config
        if config.status != 200 and state.requests % config.status_every == 0:
            transport.write(_json_response(config.status, {"error": {"message": "mock status"}}))
            return
        if config.max_inflight is not None and state.inflight >= config.max_inflight:
            transport.write(_json_response(429, {"error": {"message": "mock is full"}}))
            return
        try:
            request = json.loads(body)
        except ValueError:
            transport.write(_json_response(400, {"error": {"message": "body is not JSON"}}))
            return
        n = config.tokens
        if n is None:
            n = int(request.get("max_tokens") or request.get("max_completion_tokens") or 16)
        prompt = _prompt_tokens(request)
        if not request.get("stream"):
            self._respond_whole(chat, prompt, n)
            return
        usage = bool((request.get("stream_options") or {}).get("include_usage"))
        tail = (_FRAMES.usage(chat, prompt, n) if usage else b"") + _FRAMES.done
        token = _FRAMES.chat_token if chat else _FRAMES.text_token
        finish = _FRAMES.chat_finish if chat else _FRAMES.text_finish
        start = _SSE_HEAD + (_FRAMES.chat_role if chat else b"")
        if config.ttft_s == 0 and config.itl_s == 0:
            transport.write(start + token * n + finish + tail)
            return
        transport.write(start)
        self._stream_later(token, n, finish + tail)

    def _stream_later(self, token: bytes, n: int, tail: bytes) -> None:
        config = self.state.config
        self.state.inflight += 1
        t = self.loop.time() + config.ttft_s
        for _ in range(n - 1):
            self.loop.call_at(t, self._write, token)
            t += config.itl_s
        self.loop.call_at(t, self._write_last, token + tail if n else tail)

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _write_last(self, data: bytes) -> None:
        self.state.inflight -= 1
        self._write(data)

    def _respond_whole(self, chat: bool, prompt: int, n: int) -> None:
        assert self.transport is not None
        usage = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}
        text = _TOKEN_TEXT * n
        if chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "length",
            }
            obj = {**_FRAMES.chat_base, "object": "chat.completion"}
        else:
            choice = {"index": 0, "text": text, "finish_reason": "length"}
            obj = dict(_FRAMES.text_base)
        self.transport.write(_json_response(200, {**obj, "choices": [choice], "usage": usage}))


async def serve(
    sock: socket.socket, config: MockConfig, stop: asyncio.Event | None = None
) -> MockState:
    """Serve on an already bound, listening socket until ``stop`` is set."""
    state = MockState(config)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Handler(state), sock=sock, backlog=4096)
    stop = stop or asyncio.Event()
    try:
        await stop.wait()
    finally:
        server.close()
    return state


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m headway.bench.mock_server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    parser.add_argument("--tokens", type=int, default=None)
    parser.add_argument("--ttft-ms", type=float, default=0.0)
    parser.add_argument("--itl-ms", type=float, default=0.0)
    parser.add_argument("--status", type=int, default=200)
    parser.add_argument("--status-every", type=int, default=1)
    parser.add_argument("--max-inflight", type=int, default=None)
    parser.add_argument("--arrivals-out", type=Path, default=None)
    parser.add_argument("--no-uvloop", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGINT/SIGTERM; then write arrivals (``.npy``) and print a JSON line."""
    args = _parse(argv)
    config = MockConfig(
        tokens=args.tokens,
        ttft_s=args.ttft_ms / 1000,
        itl_s=args.itl_ms / 1000,
        status=args.status,
        status_every=max(1, args.status_every),
        max_inflight=args.max_inflight,
    )
    sock = socket.create_server((args.host, args.port), backlog=4096)
    port = sock.getsockname()[1]

    async def run() -> MockState:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        print(json.dumps({"port": port}), flush=True)  # noqa: T201 - the parent reads it
        return await serve(sock, config, stop)

    if args.no_uvloop:
        state = asyncio.run(run())
    else:
        import uvloop

        state = uvloop.run(run())
    if args.arrivals_out is not None:
        np.save(args.arrivals_out, np.asarray(state.arrivals_s, dtype=np.float64))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    summary = {"requests": state.requests, "cpu_s": usage.ru_utime + usage.ru_stime}
    print(json.dumps(summary), flush=True)  # noqa: T201 - the parent reads it
    return 0


if __name__ == "__main__":
    sys.exit(main())
