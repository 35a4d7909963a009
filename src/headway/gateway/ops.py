"""The gateway's per-request record, its access-log line and its OpenTelemetry span.

The relay fills one :class:`RequestRecord` per request (plain attribute stores on the hot
path); :func:`finish` turns it into one JSON line on the ``headway.gateway.access``
logger (only when that logger is enabled for INFO) and one retroactive
``gateway.request`` span (only when a tracer provider records: with the OpenTelemetry
API's default no-op provider, or without ``opentelemetry-api`` installed, that costs
well under a microsecond). Neither carries prompt or completion text unless the config
says ``log_content: true``.
"""

from __future__ import annotations

import itertools
import logging
import logging.handlers
import os
import queue
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import msgspec

from headway.core.lifecycle import State

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

__all__ = ["ACCESS_LOGGER", "AccessLog", "RequestRecord", "finish", "record_span", "tracer"]

ACCESS_LOGGER: Final = "headway.gateway.access"
access_log = logging.getLogger(ACCESS_LOGGER)

_IDS = itertools.count(1)
_PREFIX = f"{os.getpid():x}"
_ENCODE = msgspec.json.Encoder().encode


def next_request_id() -> str:
    """A request id unique within this process (``PID-N`` in hex)."""
    return f"{_PREFIX}-{next(_IDS):x}"


@dataclass(slots=True)
class RequestRecord:
    """What the gateway knows of one request when it ends (no text unless asked)."""

    request_id: str
    route: str
    arrived_s: float
    """``time.monotonic()`` at arrival."""
    tenant: str | None = None
    band: str | None = None
    model: str | None = None
    stream: bool = False
    admission: str = "invalid"
    """``admit`` (a slot at once), ``enqueue``, ``shed`` or ``invalid`` (a 4xx)."""
    shed_reason: str | None = None
    retry_after_s: float | None = None
    degraded: str | None = None
    """What a degraded mode changed (the ``x-headway-degraded`` header), if any."""
    status: int = 0
    upstream: str | None = None
    revision: str | None = None
    dispatched_s: float | None = None
    first_byte_s: float | None = None
    """``time.monotonic()`` when the upstream's first byte (or whole answer) arrived."""
    attempt_started_s: float | None = None
    tokens_in: int | None = None
    """Prompt tokens: the upstream's ``usage`` when sent, else the gateway's estimate."""
    tokens_out: int | None = None
    retries: int = 0
    state: State = State.OFFERED
    """Where it is in the request lifecycle (:mod:`headway.core.lifecycle`), once offered."""
    cancelled: bool = False
    deadline_cancelled: bool = False
    """Its deadline passed in flight: the gateway cancelled it upstream."""
    chunks: int = 0
    relayed: bool = False
    """Every byte of a streamed answer went out (only the closing chunk may be missing):
    a client that leaves now has the whole answer, and the request counts as completed."""
    prompt: bytes | None = None
    """The request body, kept only with ``log_content: true``."""
    completion: list[bytes] | None = None
    """The answer's bytes, kept only with ``log_content: true``."""

    @property
    def queue_wait_s(self) -> float | None:
        return None if self.dispatched_s is None else self.dispatched_s - self.arrived_s

    @property
    def ttft_s(self) -> float | None:
        if self.first_byte_s is None or self.attempt_started_s is None:
            return None
        return self.first_byte_s - self.attempt_started_s

    def fields(self, now_s: float) -> dict[str, Any]:
        """The access-log line's fields."""
        wait = self.queue_wait_s
        ttft = self.ttft_s
        out: dict[str, Any] = {
            "request_id": self.request_id,
            "tenant": self.tenant,
            "class": self.band,
            "route": self.route,
            "model": self.model,
            "stream": self.stream,
            "upstream": self.upstream,
            "revision": self.revision,
            "status": self.status,
            "admission": self.admission,
            "shed_reason": self.shed_reason,
            "retry_after_s": self.retry_after_s,
            "degraded": self.degraded,
            "queue_wait_ms": None if wait is None else round(wait * 1000, 3),
            "upstream_ttft_ms": None if ttft is None else round(ttft * 1000, 3),
            "duration_ms": round((now_s - self.arrived_s) * 1000, 3),
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "retries": self.retries,
            "state": self.state.value,
            "cancelled": self.cancelled,
            "deadline_cancelled": self.deadline_cancelled,
            "chunks": self.chunks,
        }
        if self.prompt is not None:
            out["prompt"] = self.prompt.decode("utf-8", "replace")
        if self.completion is not None:
            out["completion"] = b"".join(self.completion).decode("utf-8", "replace")
        return out


def tracer() -> Tracer | None:
    """The gateway's tracer from the global provider (None without opentelemetry-api)."""
    try:
        from opentelemetry import trace
    except ImportError:  # pragma: no cover - an optional dependency (the `otel` extra)
        return None
    return trace.get_tracer("headway.gateway")


def _ns(mono_s: float, now_mono_s: float, now_ns: int) -> int:
    return now_ns - int((now_mono_s - mono_s) * 1e9)


def record_span(tracer: Tracer, record: RequestRecord, now_s: float | None = None) -> None:
    """Emit ``record`` as a finished ``gateway.request`` span (a no-op tracer: ~0.5 µs).

    Attributes: ``headway.tenant``, ``headway.class``, ``headway.route``, ``headway.model``,
    ``headway.revision``, ``headway.upstream``, ``headway.admission.decision``,
    ``headway.admission.reason``, ``headway.degraded``, ``headway.queue_wait_ms``,
    ``headway.upstream_ttft_ms``, ``headway.stream.chunks``, ``headway.retries``,
    ``headway.cancelled``, ``http.response.status_code``; events ``admission``,
    ``dispatch``, ``first_byte``."""
    now_mono = time.monotonic() if now_s is None else now_s
    now_ns = time.time_ns()
    span = tracer.start_span("gateway.request", start_time=_ns(record.arrived_s, now_mono, now_ns))
    if not span.is_recording():
        return
    attrs: dict[str, Any] = {
        "headway.request_id": record.request_id,
        "headway.route": record.route,
        "headway.admission.decision": record.admission,
        "headway.stream": record.stream,
        "headway.stream.chunks": record.chunks,
        "headway.retries": record.retries,
        "headway.cancelled": record.cancelled,
        "http.response.status_code": record.status,
    }
    optional = (
        ("headway.tenant", record.tenant),
        ("headway.class", record.band),
        ("headway.model", record.model),
        ("headway.upstream", record.upstream),
        ("headway.revision", record.revision),
        ("headway.admission.reason", record.shed_reason),
        ("headway.retry_after_s", record.retry_after_s),
        ("headway.degraded", record.degraded),
        ("headway.tokens_in", record.tokens_in),
        ("headway.tokens_out", record.tokens_out),
    )
    attrs.update((k, v) for k, v in optional if v is not None)
    wait = record.queue_wait_s
    if wait is not None:
        attrs["headway.queue_wait_ms"] = wait * 1000
    ttft = record.ttft_s
    if ttft is not None:
        attrs["headway.upstream_ttft_ms"] = ttft * 1000
    if record.prompt is not None:
        attrs["headway.prompt"] = record.prompt.decode("utf-8", "replace")
    span.set_attributes(attrs)
    decision: dict[str, Any] = {"decision": record.admission}
    if record.shed_reason is not None:
        decision["reason"] = record.shed_reason
    span.add_event("admission", decision, timestamp=_ns(record.arrived_s, now_mono, now_ns))
    if record.dispatched_s is not None:
        span.add_event(
            "dispatch",
            {"upstream": record.upstream or ""},
            timestamp=_ns(record.dispatched_s, now_mono, now_ns),
        )
    if record.first_byte_s is not None:
        span.add_event("first_byte", timestamp=_ns(record.first_byte_s, now_mono, now_ns))
    if record.status >= 500 or (record.status >= 400 and record.admission != "shed"):
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, record.shed_reason or str(record.status)))
    span.end(end_time=now_ns)


def finish(record: RequestRecord, span_tracer: Tracer | None) -> None:
    """The end of a request: its access-log line and its span (each only when on)."""
    now = time.monotonic()
    if access_log.isEnabledFor(logging.INFO):
        access_log.info("%s", _Line(record, now))
    if span_tracer is not None:
        record_span(span_tracer, record, now)


class _Line:
    """The JSON text of a record, encoded when a handler formats it."""

    __slots__ = ("now_s", "record")

    def __init__(self, record: RequestRecord, now_s: float) -> None:
        self.record = record
        self.now_s = now_s

    def __str__(self) -> str:
        return _ENCODE(self.record.fields(self.now_s)).decode()


class AccessLog:
    """``access_log: PATH`` (or ``-`` for stderr): the gateway's own handler for the
    access logger, written by a background thread (a :class:`logging.handlers.QueueListener`)
    so the event loop never waits on the file."""

    def __init__(self, target: str) -> None:
        self.handler: logging.Handler = (
            logging.StreamHandler(sys.stderr)
            if target == "-"
            else logging.FileHandler(target, encoding="utf-8")
        )
        self.handler.setFormatter(logging.Formatter("%(message)s"))
        self.queue: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
        self.front = _Enqueue(self.queue)
        self.listener = logging.handlers.QueueListener(self.queue, self.handler)

    def start(self) -> None:
        self.listener.start()
        access_log.addHandler(self.front)
        access_log.setLevel(logging.INFO)

    def stop(self) -> None:
        access_log.removeHandler(self.front)
        self.listener.stop()
        self.handler.close()


class _Enqueue(logging.handlers.QueueHandler):
    """A queue handler that hands the record over unformatted (the JSON is encoded by
    the listener's thread)."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        return record
