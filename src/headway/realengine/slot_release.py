"""How fast an engine's slot comes free after a client behind the gateway hangs up.

One trial sends a long request through the gateway on a raw socket, waits until the
engines' ``vllm:num_requests_running`` shows it (for a stream, until its first tokens
arrived), closes the socket, and polls the ``/metrics`` of the engine that holds it every
:data:`_POLL_S` until its running plus waiting count is back where it was. ``freed_s`` is
the time from the close to the end of that scrape: an upper bound, at most one poll late.

The poll is sparse on purpose: rendering vLLM's ``/metrics`` (50 KB) costs its API server
~5.5 ms of CPU, and the API server is the process that must notice the disconnect and
send the abort. Polled every 4 ms (both engines), the measure took most of a core from
the path it timed.

What the figure can be: vLLM 0.32's engine core takes an abort off its input socket at
once (``EngineCoreProc.process_input_sockets`` puts it on ``aborts_queue``), but applies
it only when the model step under way ends (``EngineCore.step`` calls
``_process_aborts_queue`` after ``execute_model``, then ``update_from_output``, whose
``make_stats`` carries the new counts to the front end's gauges). So the slot is freed,
and the gauge drops, at the end of the step during which the abort arrived: a uniform
share of one step after the close, plus the API server noticing the disconnect (uvicorn
advertises ASGI 2.3, so Starlette listens for the disconnect while it streams, and
``with_cancellation`` does for a non-streamed call). A trial also measures the engine's
step time during the call (the mean of ``vllm:inter_token_latency_seconds``) to judge the
figure against it.
"""

from __future__ import annotations

import http.client
import json
import statistics
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass

from headway.gateway.probe import metric_samples, parse_engine_metrics

__all__ = ["ReleaseTrial", "engines_busy", "release_trial", "summarize"]

_POLL_S = 0.02
"""The gap between ``/metrics`` scrapes of the holding engine while waiting for the
gauge."""


@dataclass(frozen=True, slots=True)
class ReleaseTrial:
    """One disconnect: close to the engines' gauges dropping, and the step time seen."""

    stream: bool
    freed_s: float | None
    """Close to the first scrape with the request gone; None: not within the limit."""
    step_s: float | None
    """The engine's mean inter-token latency during the call (None: no tokens seen)."""


def _scrape(url: str, timeout_s: float = 5.0) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=timeout_s) as resp:
        return str(resp.read().decode())


def _busy(url: str) -> int:
    """One engine's ``vllm:num_requests_running`` + ``vllm:num_requests_waiting``."""
    m = parse_engine_metrics(_scrape(url))
    return (m.running_requests or 0) + (m.waiting_requests or 0)


def engines_busy(engine_urls: Sequence[str]) -> int:
    """``vllm:num_requests_running`` + ``vllm:num_requests_waiting`` over the engines."""
    return sum(_busy(url) for url in engine_urls)


_ITL = "vllm:inter_token_latency_seconds"


def _itl(engine_urls: Sequence[str]) -> tuple[float, float]:
    """The engines' inter-token latency histogram: (sum, count)."""
    total, count = 0.0, 0.0
    for url in engine_urls:
        for name, _, value in metric_samples(_scrape(url)):
            if name == _ITL + "_sum":
                total += value
            elif name == _ITL + "_count":
                count += value
    return total, count


def _wait_busy(engine_urls: Sequence[str], at_least: int, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while engines_busy(engine_urls) < at_least:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the engines never showed {at_least} request(s) running")
        time.sleep(0.02)


def release_trial(
    gateway_url: str,
    engine_urls: Sequence[str],
    *,
    stream: bool,
    headers: dict[str, str],
    model: str = "tiny",
    max_tokens: int = 400,
    limit_s: float = 5.0,
) -> ReleaseTrial:
    """One in-flight disconnect (see the module docstring); the engines must be idle."""
    bases = {url: _busy(url) for url in engine_urls}
    base = sum(bases.values())
    parts = urllib.parse.urlsplit(gateway_url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=60)
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Tell me about queues"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": stream,
    }
    itl_before = _itl(engine_urls)
    try:
        conn.request(
            "POST",
            "/v1/chat/completions",
            body=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", **headers},
        )
        if stream:
            resp = conn.getresponse()
            if resp.status != 200:
                raise RuntimeError(f"the stream was answered HTTP {resp.status}")
            if not resp.read1(4096):
                raise RuntimeError("the stream ended before its first event")
        _wait_busy(engine_urls, base + 1, within_s=30.0)
        deadline = time.monotonic() + 30.0
        while (itl := _itl(engine_urls))[1] < itl_before[1] + 3 and time.monotonic() < deadline:
            time.sleep(0.02)  # a few decode steps, to time them
        # Poll only the engine that holds it; if none shows it now, all of them.
        holders = [u for u in engine_urls if _busy(u) > bases[u]] or list(engine_urls)
    finally:
        closed = time.monotonic()
        conn.close()
    tokens = itl[1] - itl_before[1]
    step_s = (itl[0] - itl_before[0]) / tokens if tokens > 0 else None
    while True:
        time.sleep(_POLL_S)
        freed = all(_busy(u) <= bases[u] for u in holders)
        now = time.monotonic()
        if freed:
            return ReleaseTrial(stream, now - closed, step_s)
        if now - closed > limit_s:
            return ReleaseTrial(stream, None, step_s)


def summarize(trials: Sequence[ReleaseTrial], bound_s: float = 0.1) -> dict[str, float | int]:
    """Trials, the fractions freed within ``bound_s`` and within the trial's own step plus
    ``bound_s``, the freed time's p50 and max, and the median step time."""
    n = max(1, len(trials))
    freed = [t.freed_s for t in trials if t.freed_s is not None]
    steps = [t.step_s for t in trials if t.step_s is not None]
    in_step = [
        t for t in trials if t.freed_s is not None and t.step_s is not None
        and t.freed_s <= t.step_s + bound_s
    ]  # fmt: skip
    return {
        "trials": len(trials),
        "freed_within_bound_fraction": sum(f <= bound_s for f in freed) / n,
        "freed_within_one_step_fraction": len(in_step) / n,
        "freed_p50_s": round(statistics.median(freed), 4) if freed else -1.0,
        "freed_max_s": round(max(freed), 4) if freed else -1.0,
        "step_s": round(statistics.median(steps), 4) if steps else -1.0,
    }
