"""The drills' clients: an open-loop Poisson stream of chat calls, each ending in one
terminal state.

Every call ends in exactly one of :data:`STATES`: ``ok`` (a whole answer: the JSON, or a
stream that reached ``[DONE]``), ``shed`` (a designed refusal naming its reason: a
429/503 after the client's retries, or a 400 no wait can fix), ``timed_out`` (its
deadline passed in flight and the gateway cancelled it in the engine: a 504, or a stream
whose last event is that error, ``deadline_exceeded``), ``cut`` (a stream that
ended without ``[DONE]``), ``client_error`` (another 4xx), ``server_error`` (a 5xx that
is not a designed refusal), ``conn_error``, ``cancelled`` (the client abandoned it on
purpose) or ``hung`` (still open when the drill ended). A drill's figures count these.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp
import msgspec
import numpy as np

from headway.core.policy.decisions import ShedReason
from headway.core.policy.retries import RetryConfig, RetryPolicy
from headway.drill.spec import LoadSpec

__all__ = ["STATES", "Call", "LoadRun", "names_no_time"]

_BACKOFF: Final = RetryPolicy(RetryConfig())
"""The default clients' backoff (only its schedule is used, not its budget)."""

STATES: Final = (
    "ok", "shed", "timed_out", "cut", "client_error", "server_error", "conn_error",
    "cancelled", "hung",
)  # fmt: skip

DEADLINE_EXCEEDED: Final = "deadline_exceeded"
"""The error code of a call the gateway cancelled at its deadline."""

_WORDS: Final = (
    "queue", "capacity", "replica", "token", "budget", "latency", "prefill", "decode",
    "cache", "block", "tenant", "deadline", "retry", "goodput", "burst", "knee", "drain",
)  # fmt: skip


@dataclass(slots=True)
class Call:
    """One call as the client saw it."""

    index: int
    key: str
    stream: bool
    started_s: float
    state: str = ""
    attempts: int = 0
    status: int = 0
    reason: str = ""
    """The shed reason (``x-headway-shed-reason``) or the error ``code``."""
    retry_after_s: float | None = None
    shed_attempts: int = 0
    """Attempts refused with a designed 429/503 (retried or not)."""
    ttft_s: float | None = None
    ended_s: float | None = None
    chunks: int = 0
    slow: bool = False
    request_ids: list[str] = field(default_factory=list)


def names_no_time(status: int, reason: str, retry_after_s: float | None) -> bool:
    """A tenant budget's 429 without a Retry-After: every turn the budget can promise is
    taken, so the client paces its retry on its own (jittered) backoff."""
    return status == 429 and reason == ShedReason.TENANT_TOKEN_RATE.value and retry_after_s is None


class _Shed(Exception):
    def __init__(self, status: int, reason: str, retry_after_s: float | None, ticket: str) -> None:
        self.status, self.reason, self.retry_after_s, self.ticket = (
            status, reason, retry_after_s, ticket,
        )  # fmt: skip


class LoadRun:
    """Offer ``spec``'s load to the gateways at ``urls`` and keep every call's record."""

    def __init__(self, urls: list[str], spec: LoadSpec, *, model: str, seed: int) -> None:
        self.urls = [u.rstrip("/") for u in urls]
        """Gateways; calls go to them in turn."""
        self.spec = spec
        self.model = model
        self.rng = np.random.default_rng(seed)
        self.calls: list[Call] = []
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.in_flight: set[int] = set()
        """Calls with an attempt on the wire (the ones a ``cancel_in_flight`` fault may
        abandon); not one waiting to retry, which no gateway holds."""
        self.started_s = 0.0
        self.on_tick: Callable[[], None] | None = None

    def _prompt(self) -> str:
        words = self.rng.choice(_WORDS, size=self.spec.prompt_words)
        return " ".join(str(w) for w in words)

    async def run(self, session: aiohttp.ClientSession) -> None:
        """Send the arrivals on schedule; return when the last one is sent."""
        spec = self.spec
        keys = list(spec.tenants)
        weights = np.array([spec.tenants[k] for k in keys], dtype=float)
        weights /= weights.sum()
        self.started_s = time.monotonic()
        at = 0.0
        index = 0
        while True:
            at += float(self.rng.exponential(1.0 / spec.rate_per_s))
            if at >= spec.duration_s:
                break
            delay = self.started_s + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            key = keys[int(self.rng.choice(len(keys), p=weights))]
            stream = bool(self.rng.random() < spec.stream_fraction)
            call = Call(index, key, stream, time.monotonic())
            call.slow = stream and bool(self.rng.random() < spec.slow_reader_fraction)
            cancel = bool(self.rng.random() < spec.cancel_fraction)
            body = self._body(stream)
            self.calls.append(call)
            task = asyncio.create_task(self._call(session, call, body))
            self.tasks[index] = task
            if cancel:
                asyncio.get_running_loop().call_later(spec.cancel_after_s, self.cancel, index)
            index += 1

    def _body(self, stream: bool) -> bytes:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": self._prompt()}],
            "max_tokens": self.spec.max_tokens,
            "stream": stream,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        return msgspec.json.encode(body)

    def cancel(self, index: int) -> bool:
        """Abandon call ``index`` (its connection closes); False if it had ended."""
        task = self.tasks.get(index)
        if task is None or task.done():
            return False
        call = self.calls[index]
        call.state = "cancelled"
        task.cancel()
        return True

    def cancel_in_flight(self, fraction: float) -> list[int]:
        """Abandon ``fraction`` of the calls in flight (the oldest first); their indexes."""
        chosen = sorted(self.in_flight)[: int(len(self.in_flight) * fraction)]
        return [i for i in chosen if self.cancel(i)]

    async def finish(self, settle_s: float) -> None:
        """Wait up to ``settle_s`` for the calls to end; those still open are ``hung``."""
        pending = [t for t in self.tasks.values() if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=settle_s)
        for index, task in self.tasks.items():
            if not task.done():
                self.calls[index].state = "hung"
                task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)

    async def _call(self, session: aiohttp.ClientSession, call: Call, body: bytes) -> None:
        spec = self.spec
        ticket = ""
        try:
            async with asyncio.timeout(spec.timeout_s):
                while True:
                    call.attempts += 1
                    self.in_flight.add(call.index)
                    try:
                        await self._attempt(session, call, body, ticket)
                        return
                    except _Shed as shed:
                        self.in_flight.discard(call.index)
                        call.shed_attempts += 1
                        call.status, call.reason = shed.status, shed.reason
                        call.retry_after_s = shed.retry_after_s
                        final = shed.status == 400  # no wait can fix it (too large, too late)
                        if final or spec.retry == "none" or call.attempts >= spec.max_attempts:
                            call.state = "shed"
                            return
                        if spec.retry == "obey":
                            wait_s = shed.retry_after_s or 0.0
                            if names_no_time(shed.status, shed.reason, shed.retry_after_s):
                                wait_s = _BACKOFF.delay_s(call.shed_attempts, self.rng)
                            left_s = spec.timeout_s - (time.monotonic() - call.started_s)
                            if wait_s >= left_s - 1.0:  # no time left to wait and be served
                                call.state = "shed"
                                return
                            ticket = shed.ticket
                            await asyncio.sleep(wait_s)
        except TimeoutError:
            call.state = "hung"
        except asyncio.CancelledError:
            if call.state not in ("cancelled", "hung"):
                call.state = "cancelled"
        except (aiohttp.ClientError, OSError) as error:
            call.state = call.state or "conn_error"
            call.reason = call.reason or type(error).__name__
        finally:
            call.ended_s = time.monotonic()
            self.in_flight.discard(call.index)
            if self.on_tick is not None:
                self.on_tick()

    async def _attempt(
        self, session: aiohttp.ClientSession, call: Call, body: bytes, ticket: str
    ) -> None:
        spec = self.spec
        request_id = f"drill-{call.index}-{call.attempts}"
        call.request_ids.append(request_id)
        headers = {
            "Authorization": f"Bearer {call.key}",
            "Content-Type": "application/json",
            "x-request-id": request_id,
        }
        # The client's own deadline goes with every attempt (what it has left, less a
        # margin to be served in), so a gateway never keeps it past its patience.
        left_ms = int((spec.timeout_s - (time.monotonic() - call.started_s) - 2.0) * 1000)
        deadline_ms = left_ms if spec.deadline_ms is None else min(spec.deadline_ms, left_ms)
        headers["x-headway-deadline-ms"] = str(max(deadline_ms, 1))
        if ticket:
            headers["x-headway-retry-ticket"] = ticket
        async with session.post(
            f"{self.urls[call.index % len(self.urls)]}/v1/chat/completions",
            data=body,
            headers=headers,
        ) as resp:
            call.status = resp.status
            if resp.status in (400, 429, 503) and "x-headway-shed-reason" in resp.headers:
                await resp.read()
                ms = resp.headers.get("x-headway-retry-after-ms", "")
                raise _Shed(
                    resp.status,
                    resp.headers["x-headway-shed-reason"],
                    int(ms) / 1000 if ms.isdigit() else None,
                    resp.headers.get("x-headway-retry-ticket", ""),
                )
            if resp.status != 200:
                data = await resp.read()
                call.reason = _error_code(data)
                if resp.status == 504 and call.reason == DEADLINE_EXCEEDED:
                    call.state = "timed_out"  # the gateway cancelled it at its deadline
                    return
                call.state = "client_error" if 400 <= resp.status < 500 else "server_error"
                return
            if not call.stream:
                await resp.read()
                call.ttft_s = time.monotonic() - call.started_s
                call.state = "ok"
                return
            done = False
            tail = b""
            async for chunk in resp.content.iter_any():
                if call.ttft_s is None:
                    call.ttft_s = time.monotonic() - call.started_s
                call.chunks += 1
                tail = (tail + chunk)[-64:]
                if b"data: [DONE]" in tail:
                    done = True
                if call.slow:
                    await asyncio.sleep(spec.slow_read_pause_s)
            if done:
                call.state = "ok"
            else:
                cancelled = f'"{DEADLINE_EXCEEDED}"'.encode() in tail
                call.state = "timed_out" if cancelled else "cut"


def _error_code(data: bytes) -> str:
    try:
        decoded = msgspec.json.decode(data)
    except msgspec.DecodeError:
        return "not-json"
    error = decoded.get("error") if isinstance(decoded, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return str(code) if code else "no-code"
