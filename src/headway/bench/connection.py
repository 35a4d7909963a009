"""One keep-alive HTTP/1.1 connection that reads OpenAI-compatible responses, lean.

The response is kept as raw bytes. Chunked framing is walked header by header to find
the end of the message; generated tokens are counted over complete chunks by
:func:`headway.stream_tokens.count_token_events` (every content event is one token, also
when its text is empty; the role-only first chunk and events without content are not). Each
socket read gets one timestamp. ``usage`` is decoded once, from the last event that
carries it. When a server splits an event across chunks, the body is de-chunked at the
end and counted again (timestamps then come from the reads that completed the events).
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from typing import TYPE_CHECKING, Any, cast

import msgspec

from headway.bench.records import OK, PROTOCOL, STATUS, STREAM_ERROR
from headway.stream_tokens import count_token_events

if TYPE_CHECKING:
    from headway.bench.sender import Sender

_now = time.monotonic
_USAGE_AT = re.compile(rb'"usage"\s*:\s*\{')
_ERROR_KEY = re.compile(rb'data:\s*\{"error"\s*:|"object"\s*:\s*"error"')
_MAX_HEAD_BYTES = 65536

_HEAD, _CHUNKED, _LENGTH, _UNTIL_CLOSE = range(4)


def _text_estimate(text: str) -> int:
    """Tokens in ``text`` when the server reports none: one per four characters."""
    return max(1, round(len(text) / 4)) if text else 0


def dechunk(raw: bytes | bytearray, start: int) -> bytes:
    """The payload of a chunked body that begins at ``raw[start]`` (complete chunks only)."""
    out = []
    pos = start
    while True:
        eol = raw.find(b"\r\n", pos)
        if eol < 0:
            break
        size = int(bytes(raw[pos:eol]).split(b";")[0], 16)
        if size == 0 or eol + 2 + size > len(raw):
            break
        out.append(bytes(raw[eol + 2 : eol + 2 + size]))
        pos = eol + 4 + size
    return b"".join(out)


def usage_of(payload: bytes | bytearray, start: int = 0) -> dict[str, Any] | None:
    """The ``usage`` object of the last SSE event that carries one, or None."""
    idx = len(payload)
    while True:
        idx = payload.rfind(b'"usage"', start, idx)
        if idx < 0:
            return None
        if _USAGE_AT.match(payload, idx):
            break
    line = payload.rfind(b"data:", start, idx)
    stop = payload.find(b"\n", idx)
    if line < 0:
        return None
    try:
        event = msgspec.json.decode(bytes(payload[line + 5 : stop if stop >= 0 else None]))
    except msgspec.DecodeError:
        return None
    usage = event.get("usage") if isinstance(event, dict) else None
    return usage if isinstance(usage, dict) else None


class Connection(asyncio.Protocol):
    """A pooled connection; :meth:`send` one call at a time, the sender is told at the end."""

    __slots__ = (
        "aligned",
        "body_start",
        "cols",
        "j",
        "keep_alive",
        "last_io_s",
        "length",
        "mode",
        "pos",
        "prev_token_s",
        "raw",
        "scan",
        "sender",
        "served",
        "sse",
        "status",
        "transport",
    )

    def __init__(self, sender: Sender) -> None:
        self.sender = sender
        self.cols = sender.cols
        self.transport: asyncio.Transport | None = None
        self.j = -1
        """The local call in flight (-1: idle)."""
        self.raw = bytearray()
        self.served = 0
        self.last_io_s = 0.0
        self._reset()

    def _reset(self) -> None:
        self.mode = _HEAD
        self.body_start = -1
        self.pos = 0
        self.scan = 0
        self.length = 0
        self.status = 0
        self.keep_alive = True
        self.sse = False
        self.aligned = True
        self.prev_token_s = math.nan

    # -- asyncio protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def connection_lost(self, exc: Exception | None) -> None:
        j = self.j
        self.transport = None
        if j >= 0 and self.mode == _UNTIL_CLOSE and self.body_start >= 0:
            self._finish(_now())
            return
        self.sender.lost(self, j, bool(self.raw))

    def send(self, j: int, data: bytes) -> None:
        """Write call ``j``'s request; the sender records the send time."""
        self.j = j
        self._reset()
        del self.raw[:]
        transport = self.transport
        assert transport is not None
        now = _now()
        self.cols.sent_s[j] = now
        self.last_io_s = now
        transport.write(data)

    def data_received(self, data: bytes) -> None:
        now = _now()
        j = self.j
        if j < 0:  # bytes nobody asked for: drop the connection
            if self.transport is not None:
                self.transport.abort()
            return
        self.last_io_s = now
        raw = self.raw
        if not raw:
            self.cols.first_byte_s[j] = now
        raw += data
        if self.mode == _HEAD:
            end = raw.find(b"\r\n\r\n")
            if end < 0:
                if len(raw) > _MAX_HEAD_BYTES:
                    self._fail(PROTOCOL)
                return
            if not self._head(end):
                return
        done = False
        complete = len(raw)
        if self.mode == _CHUNKED:
            pos = self.pos
            size_of = int
            while True:
                eol = raw.find(b"\r\n", pos)
                if eol < 0:
                    break
                try:
                    size = size_of(raw[pos:eol], 16)
                except ValueError:
                    size = int(bytes(raw[pos:eol]).split(b";")[0], 16)
                if size == 0:
                    done = raw.find(b"\r\n\r\n", eol) >= 0
                    break
                nxt = eol + size + 4
                if nxt > len(raw):
                    break
                if raw[nxt - 3] != 10:  # the chunk does not end an SSE event
                    self.aligned = False
                pos = nxt
            self.pos = pos
            complete = pos
        elif self.mode == _LENGTH:
            done = len(raw) - self.body_start >= self.length
        if self.sse and complete > self.scan:
            found = count_token_events(raw, self.scan, complete)
            self.scan = complete
            if found:
                cols = self.cols
                if cols.token_events[j] == 0:
                    cols.first_token_s[j] = now
                else:
                    gap = now - self.prev_token_s
                    if not gap <= cols.itl_max_s[j]:
                        cols.itl_max_s[j] = gap
                cols.token_events[j] += found
                cols.token_batches[j] += 1
                cols.last_token_s[j] = now
                self.prev_token_s = now
        if done:
            self._finish(now)

    # -- parsing ---------------------------------------------------------------------

    def _head(self, end: int) -> bool:
        raw = self.raw
        head = bytes(raw[:end]).lower()
        try:
            self.status = int(head[9:12])
        except ValueError:
            self._fail(PROTOCOL)
            return False
        self.body_start = end + 4
        self.pos = self.scan = end + 4
        if head.startswith(b"http/1.0") or b"\r\nconnection: close" in head:
            self.keep_alive = False
        self.sse = self.status == 200 and b"text/event-stream" in head
        if b"\r\ntransfer-encoding: chunked" in head:
            self.mode = _CHUNKED
        else:
            at = head.find(b"\r\ncontent-length:")
            if at >= 0:
                stop = head.find(b"\r\n", at + 2)
                self.mode = _LENGTH
                self.length = int(head[at + 17 : stop if stop >= 0 else len(head)])
            elif self.status in (204, 304) or 100 <= self.status < 200:
                self.mode = _LENGTH
                self.length = 0
            else:
                self.mode = _UNTIL_CLOSE
                self.keep_alive = False
        return True

    def _finish(self, now: float) -> None:
        j = self.j
        cols = self.cols
        cols.end_s[j] = now
        cols.status[j] = self.status
        error = OK
        error = STATUS if self.status != 200 else self._read_body(j)
        self.j = -1
        self.served += 1
        self.sender.release(self, j, error)

    def _read_body(self, j: int) -> int:
        """Token counts and stream errors of a successful response; returns the error."""
        raw = self.raw
        cols = self.cols
        body: bytes | bytearray = raw
        start = self.body_start
        if self.mode == _CHUNKED and (not self.aligned or not self.sse):
            body, start = dechunk(raw, self.body_start), 0
            if self.sse:  # events were split across chunks: count again on the payload
                cols.token_events[j] = count_token_events(body)
        if not self.sse:
            return self._read_json(j, body[start:])
        error = STREAM_ERROR if _ERROR_KEY.search(body, start) else OK
        usage = usage_of(body, start)
        if usage is not None and isinstance(usage.get("completion_tokens"), int):
            cols.completion_tokens[j] = usage["completion_tokens"]
            cols.prompt_tokens[j] = int(usage.get("prompt_tokens") or -1)
            cols.usage[j] = True
        else:
            cols.completion_tokens[j] = cols.token_events[j]
        return error

    def _read_json(self, j: int, payload: bytes | bytearray) -> int:
        """A whole (non-streamed) completion: usage, or an estimate from its text."""
        cols = self.cols
        try:
            obj = msgspec.json.decode(bytes(payload))
        except msgspec.DecodeError:
            return PROTOCOL
        if not isinstance(obj, dict) or "error" in obj:
            return STREAM_ERROR
        cols.first_token_s[j] = cols.last_token_s[j] = cols.end_s[j]
        usage = obj.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            cols.completion_tokens[j] = usage["completion_tokens"]
            cols.prompt_tokens[j] = int(usage.get("prompt_tokens") or -1)
            cols.usage[j] = True
            return OK
        choices = obj.get("choices") or [{}]
        first = choices[0] if isinstance(choices[0], dict) else {}
        message = first.get("message") or {}
        text = first.get("text") or (message.get("content") if isinstance(message, dict) else "")
        cols.completion_tokens[j] = _text_estimate(str(text or ""))
        return OK

    def _fail(self, error: int) -> None:
        """A response that cannot be read: record it and drop the connection."""
        j = self.j
        self.j = -1
        self.keep_alive = False
        self.sender.release(self, j, error)
