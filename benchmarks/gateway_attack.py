"""The gateway under attack (issue 15, "must show"): figures measured on loopback against
a real ``headway gateway`` in front of real ``headway emulate`` engines.

**Retry-After is a promise** (:func:`retry_promise`): two emulated engines (slowed so that
a 2-core machine can offer 2.5× their capacity) behind one gateway with its *default*
settings (only the upstreams and the tenants' keys are configured: no speeds, no queue or
admission settings). Their capacity is measured first, direct, with a closed loop that
keeps the gateway's default slots busy. Then, for ``seconds``, clients arrive open loop at
``overload`` × that capacity with **non-streamed** chat calls, each with a 10 s deadline
(``x-headway-deadline-ms``, sent afresh with every attempt). The clients are the drills'
(:class:`~headway.drill.load.LoadRun`): a refused client waits the
``x-headway-retry-after-ms`` it was given and retries with its ``x-headway-retry-ticket``
(up to ``MAX_ATTEMPTS`` attempts while its patience lasts). Figures:

* ``first_retry_success_nonstreamed``: of the calls that were refused and retried, the
  fraction whose first retry got its answer (target ≥ 0.9);
* ``held_to_deadline_fraction``: attempts that waited in the gateway's queue until their
  deadline and were then refused ``expired`` (the gateway's own count), per call (target
  ≤ 0.01): a refusal at arrival is truthful, a wait until the deadline is not.

**Budgets cannot be bypassed** (:func:`budget_abuse`): a tenant with a 2,000-token bucket
refilling at 200 tokens/s, behind a gateway in front of a real-time emulator, tries two
abuses for ``abuse_s`` each: streaming 1,000-token prompts and hanging up after the first
token (a refund of work the engine did), and presenting each retry ticket it is given on
larger requests, twice (ticket resizing and reuse). ``budget_overrun_ratio``: the most
tokens the engine served to it (its own counters) over the budget of the window (burst +
rate × elapsed), over both abuses (target ≤ 1.05).

**The HTTP boundary** (:func:`http_boundary`), a gateway and an emulator with their default
limits: ``server_errors``: 5xx answers to malformed and hostile bodies (and to every other
request of this run that was not a designed shed; target 0); ``gzip_bomb_rss_growth_mb``:
the growth of the peak resident memory of either server for a gzip body that inflates to
800 MB (target ≤ 20); ``slowloris_open_after_s``: of 150 connections trickling a header
and 50 trickling a chunked body a byte every 0.1 s, those still open 2 s after the
gateway's default header (10 s) and body (30 s) timeouts (target 0).

``secrets_in_logs``: after everything, every line each server of this run wrote (and its
log files) is searched for the keys and tokens it was configured with, after the run sent
malformed header lines carrying them (target 0).

Run from the repository root: ``python benchmarks/gateway_attack.py [--seconds 40]``; it
ends with one JSON line (``--skip retry,abuse,boundary`` leaves parts out).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import math
import re
import select
import socket
import threading
import time
import urllib.request
import zlib
from collections import Counter
from collections.abc import Callable
from typing import Any, Final
from urllib.parse import urlsplit

import aiohttp
import msgspec

from headway.drill.load import LoadRun
from headway.drill.spec import LoadSpec
from headway.emulate.process import EmulatorProcess
from headway.gateway.config import GatewayFileConfig
from headway.gateway.process import GatewayProcess
from headway.server_process import ServerProcess

KEYS: Final = ("sk-acme", "sk-globex")
DEADLINE_MS: Final = 10_000
"""Every attempt's budget (the issue's 10 s deadline)."""
MAX_TOKENS: Final = 32
MAX_ATTEMPTS: Final = 4
PATIENCE_S: Final = 150.0
"""A client's whole patience: it retries while the Retry-After fits in what is left."""
SPEEDUP: Final = 0.1
"""Emulated engine seconds per wall second: slow engines, so that 2.5× their capacity is
a rate two shared cores can offer."""


def _body() -> bytes:
    words = " ".join(["capacity"] * 40)  # the drills' prompt length
    body = {"model": "llama-3-8b", "messages": [{"role": "user", "content": words}],
            "max_tokens": MAX_TOKENS}  # fmt: skip
    return json.dumps(body).encode()


async def _capacity(urls: list[str], concurrency: int, seconds: float) -> float:
    """Answers per second the engines give to a closed loop of ``concurrency`` callers
    each (direct, no gateway)."""
    body = _body()
    done = 0
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        end = time.monotonic() + seconds

        async def worker(url: str) -> None:
            nonlocal done
            while time.monotonic() < end:
                path = f"{url}/v1/chat/completions"
                async with session.post(path, data=body, headers=headers) as resp:
                    await resp.read()
                    done += resp.status == 200

        start = time.monotonic()
        await asyncio.gather(*(worker(u) for u in urls for _ in range(concurrency)))
        return done / (time.monotonic() - start)


async def _offer(url: str, spec: LoadSpec, seed: int) -> LoadRun:
    """The drills' clients (:class:`~headway.drill.load.LoadRun`): they obey
    ``x-headway-retry-after-ms`` and send the retry ticket."""
    load = LoadRun([url], spec, model="llama-3-8b", seed=seed)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await load.run(session)
        await load.finish(spec.timeout_s)
    return load


METRICS_TOKEN: Final = "gateway-attack-metrics"
"""The bearer token of the gateway's /metrics (private by default)."""


def _sheds(url: str) -> dict[str, float]:
    request = urllib.request.Request(
        f"{url}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        text = resp.read().decode()
    found: dict[str, float] = {}
    for reason, value in re.findall(
        r'^headway_gateway_sheds_total\{[^}]*reason="([a-z_]+)"[^}]*\} (\S+)$', text, re.MULTILINE
    ):
        found[reason] = found.get(reason, 0.0) + float(value)
    return found


def retry_promise(
    seconds: float = 40.0, overload: float = 2.5, *, capacity_s: float = 8.0, seed: int = 15
) -> dict[str, Any]:
    """``first_retry_success_nonstreamed`` and ``held_to_deadline_fraction`` (see the
    module docstring), with the counts they come from."""
    slots = 64  # the gateway's default slots_per_upstream: the closed loop keeps them busy
    emulate = ["--speedup", str(SPEEDUP)]
    with EmulatorProcess(emulate) as one, EmulatorProcess(emulate) as two:
        urls = [one.url, two.url]
        capacity = asyncio.run(_capacity(urls, slots, capacity_s))
        rate = overload * capacity
        config = {
            "upstreams": [{"url": u} for u in urls],
            "tenants": {k: {"name": k.removeprefix("sk-")} for k in KEYS},
            "metrics_token": METRICS_TOKEN,  # not an admission setting: defaults hold
        }
        spec = LoadSpec(
            rate_per_s=rate, duration_s=seconds, tenants=dict.fromkeys(KEYS, 1.0),
            stream_fraction=0.0, max_tokens=MAX_TOKENS, deadline_ms=DEADLINE_MS,
            retry="obey", max_attempts=MAX_ATTEMPTS, timeout_s=PATIENCE_S,
        )  # fmt: skip
        with GatewayProcess(config) as gw:
            started = time.monotonic()
            load = asyncio.run(_offer(gw.url, spec, seed))
            wall_s = time.monotonic() - started
            sheds = _sheds(gw.url)
    calls = load.calls
    retried = [c for c in calls if c.attempts >= 2]
    first_ok = sum(1 for c in retried if c.attempts == 2 and c.state == "ok")
    return {
        "first_retry_success_nonstreamed": first_ok / len(retried) if retried else None,
        "held_to_deadline_fraction": sheds.get("expired", 0.0) / len(calls) if calls else None,
        "retry_promise_capacity_per_s": capacity,
        "retry_promise_offered_per_s": rate,
        "retry_promise_calls": len(calls),
        "retry_promise_retried": len(retried),
        "retry_promise_states": dict(Counter(c.state for c in calls)),
        "retry_promise_sheds": sheds,
        "retry_promise_wall_s": wall_s,
    }


# -- budgets under abuse -------------------------------------------------------------------

MODEL: Final = "llama-3-8b"
FREE: Final = "sk-attack-free"
"""A tenant without a budget."""
METER: Final = "sk-attack-meter"
"""The budgeted tenant that attacks."""
ADMIN_TOKEN: Final = "gateway-attack-admin"
EMULATOR_ADMIN_TOKEN: Final = "emulator-attack-admin"
RATE_PER_S: Final = 200.0
BURST_S: Final = 10.0


def _chat(prompt_tokens: int, max_tokens: int, *, stream: bool) -> bytes:
    """A chat request of about ``prompt_tokens`` (4 bytes each, as both servers count)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "q" * (4 * prompt_tokens)}],
            "max_tokens": max_tokens, "stream": stream}  # fmt: skip
    return json.dumps(body).encode()


def _cost(body: bytes) -> int:
    """What the gateway charges at admission: the body's bytes / 4, plus max_tokens."""
    return math.ceil(len(body) / 4.0) + int(json.loads(body)["max_tokens"])


class _Statuses:
    """Every status this run got, from any thread; 5xx that are not designed sheds."""

    def __init__(self) -> None:
        self.counts: Counter[int] = Counter()
        self.server_errors: list[str] = []
        self._lock = threading.Lock()

    def add(self, where: str, status: int, headers: http.client.HTTPMessage | None) -> int:
        designed = headers is not None and "x-headway-shed-reason" in headers
        with self._lock:
            self.counts[status] += 1
            if status >= 500 and not designed:
                self.server_errors.append(f"{where}: {status}")
        return status


def _connection(url: str, timeout_s: float) -> http.client.HTTPConnection:
    parts = urlsplit(url)
    return http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout_s)


def _post(
    statuses: _Statuses, url: str, path: str, body: bytes, headers: dict[str, str],
    *, first_event_only: bool = False, timeout_s: float = 30.0,
) -> tuple[int, http.client.HTTPMessage, bytes]:  # fmt: skip
    """POST on a fresh connection: the status, headers and what was read (everything, or
    only the first chunk of a 200 when ``first_event_only``: then it hangs up)."""
    conn = _connection(url, timeout_s)
    try:
        conn.request("POST", path, body=body,
                     headers={"Content-Type": "application/json", **headers})  # fmt: skip
        resp = conn.getresponse()
        data = resp.read1(4096) if first_event_only and resp.status == 200 else resp.read()
        statuses.add(f"POST {path}", resp.status, resp.headers)
        return resp.status, resp.headers, data
    finally:
        conn.close()


def _abuse_config(upstream: str) -> dict[str, Any]:
    return {
        "upstreams": [{"url": upstream}],
        "tenants": {
            FREE: {"name": "free"},
            METER: {"name": "meter", "token_rate_per_s": RATE_PER_S, "burst_s": BURST_S},
        },
        "queues": {"critical_reserved_slots": 0},
        "admin_token": ADMIN_TOKEN,
        "metrics_token": METRICS_TOKEN,
    }


def _window_ratio(
    emulator: EmulatorProcess, seconds: float, attack: Callable[[float], None]
) -> float:
    """Tokens served during ``attack(end)`` over the budget of its window."""
    before = emulator.tokens_served()
    started = time.monotonic()
    attack(started + seconds)
    elapsed = time.monotonic() - started
    time.sleep(0.3)  # the engine's counters settle once its last stream was aborted
    return (emulator.tokens_served() - before) / (RATE_PER_S * BURST_S + RATE_PER_S * elapsed)


def _hang_up_after_first_token(statuses: _Statuses, gateway: str) -> Callable[[float], None]:
    body = _chat(1000, 400, stream=True)
    assert _cost(body) <= RATE_PER_S * BURST_S
    auth = {"Authorization": f"Bearer {METER}"}

    def attack(end: float) -> None:
        while time.monotonic() < end:
            status, _, _ = _post(statuses, gateway, "/v1/chat/completions", body, auth,
                                 first_event_only=True)  # fmt: skip
            if status != 200:
                time.sleep(0.05)

    return attack


def _resize_and_reuse_tickets(
    statuses: _Statuses, gateway: str, clients: int = 3
) -> Callable[[float], None]:
    small = _chat(100, 50, stream=False)
    large = _chat(1500, 50, stream=False)
    assert _cost(small) < _cost(large) <= RATE_PER_S * BURST_S
    auth = {"Authorization": f"Bearer {METER}"}
    path = "/v1/chat/completions"

    def client(end: float) -> None:
        while time.monotonic() < end:
            status, headers, _ = _post(statuses, gateway, path, small, auth)
            ticket = headers.get("x-headway-retry-ticket")
            if status == 200 or not ticket:
                continue
            wait_s = int(headers.get("x-headway-retry-after-ms", "100")) / 1000.0
            time.sleep(max(0.0, min(wait_s, end - time.monotonic())))
            for _ in range(2):  # the ticket on a larger request, then again
                _post(statuses, gateway, path, large, {**auth, "x-headway-retry-ticket": ticket})

    def attack(end: float) -> None:
        threads = [threading.Thread(target=client, args=(end,)) for _ in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    return attack


def budget_abuse(statuses: _Statuses, abuse_s: float = 6.0) -> dict[str, Any]:
    """``budget_overrun_ratio`` (see the module docstring) and its parts."""
    with EmulatorProcess(["--speedup", "1"]) as emu:
        with GatewayProcess(_abuse_config(emu.url)) as gw:
            disconnects = _window_ratio(emu, abuse_s, _hang_up_after_first_token(statuses, gw.url))
        with GatewayProcess(_abuse_config(emu.url)) as gw:
            tickets = _window_ratio(emu, abuse_s, _resize_and_reuse_tickets(statuses, gw.url))
    return {
        "budget_overrun_ratio": max(disconnects, tickets),
        "budget_ratio_disconnects": disconnects,
        "budget_ratio_tickets": tickets,
    }


# -- the HTTP boundary ---------------------------------------------------------------------


def _hostile_bodies() -> list[tuple[str, bytes, dict[str, str]]]:
    """(name, body, extra headers): bodies no server may answer with a 5xx."""
    deep = b"[" * 20_000 + b"]" * 20_000
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    fields: list[tuple[str, Any]] = [
        ("model", 7), ("model", None), ("model", "m" * 100_000), ("messages", "hi"),
        ("messages", [1, 2]), ("messages", [{"role": 5, "content": "x"}]),
        ("messages", [{"role": "user", "content": [{"type": "image", "x": 1}]}]),
        ("messages", []), ("max_tokens", "10"), ("max_tokens", -1), ("max_tokens", 1e20),
        ("max_tokens", 1.5), ("max_tokens", True), ("max_tokens", None), ("n", 1000),
        ("temperature", "hot"), ("stream", "yes"), ("stop", ["x"] * 5000),
        ("prompt", list(range(50_000))), ("logprobs", {"a": 1}), ("priority", "critical"),
    ]  # fmt: skip
    cases: list[tuple[str, bytes, dict[str, str]]] = [
        ("empty", b"", {}), ("truncated", b"{", {}), ("null", b"null", {}), ("list", b"[]", {}),
        ("string", b'"x"', {}), ("huge number", b"1e999999", {}), ("bad utf-8", b"\xff\xfe{}", {}),
        ("lone surrogate", b'{"model": "\\ud800"}', {}), ("deep nesting", deep, {}),
        ("duplicate keys", b'{"model": 1, "model": "x", "max_tokens": 1}', {}),
        ("not gzip", b"not gzip", {"Content-Encoding": "gzip"}),
        ("brotli", b"\x00" * 64, {"Content-Encoding": "br"}),
        ("text/plain", json.dumps(chat).encode(), {"Content-Type": "text/plain"}),
    ]  # fmt: skip
    cases += [(f"{k}={json.dumps(v)[:20]}", json.dumps({**chat, k: v}).encode(), {})
              for k, v in fields]  # fmt: skip
    return cases


def _gzip_bomb(inflated_mb: int) -> bytes:
    """A gzip body of ``inflated_mb`` MB of zeros (about 1 KB per MB)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = bytes(1 << 20)
    return b"".join(packer.compress(block) for _ in range(inflated_mb)) + packer.flush()


def _raw(url: str, data: bytes, timeout_s: float = 10.0) -> bytes:
    """Send ``data`` on a fresh connection, read until the server closes it."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=timeout_s) as sock:
        sock.sendall(data)
        answer = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                answer += chunk
        return answer


def _raw_status(statuses: _Statuses, where: str, answer: bytes) -> int:
    head = answer.split(b"\r\n\r\n", 1)[0]
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else 0
    return statuses.add(where, status, None)


def _secret_header_lines(statuses: _Statuses, url: str, secret: str) -> None:
    """Malformed requests whose broken header lines carry ``secret`` (once logged whole)."""
    key = secret.encode()
    cases = [
        b"GET /health HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key + b"\x01\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: x\r\nX-Key: " + key * 800 + b"\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: x\r\n"
        + b"".join(b"X-%d: %s\r\n" % (i, key) for i in range(200)) + b"\r\n",
        b"POST /admin/drain HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key
        + b"\r\nContent-Length: 5\r\n\r\n{bad}",
    ]  # fmt: skip
    for data in cases:
        _raw_status(statuses, "malformed header line", _raw(url, data))


def _slowloris(url: str, headers_n: int, bodies_n: int, header_s: float, body_s: float) -> int:
    """Connections still open 2 s after their timeout: ``headers_n`` trickle a header,
    ``bodies_n`` a chunked body (after whole headers), a byte every 0.1 s."""
    parts = urlsplit(url)
    address = (parts.hostname or "127.0.0.1", parts.port or 80)
    heads = [socket.create_connection(address, timeout=5) for _ in range(headers_n)]
    bodies = [socket.create_connection(address, timeout=5) for _ in range(bodies_n)]
    for sock in bodies:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                     + FREE.encode() + b"\r\nTransfer-Encoding: chunked\r\n\r\n")  # fmt: skip
    trickle = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100_000
    open_socks = set(heads + bodies)
    started = time.monotonic()
    still_open = 0
    checks = {"headers": (header_s + 2.0, heads), "bodies": (body_s + 2.0, bodies)}
    i = 0
    try:
        while checks:
            now_s = time.monotonic() - started
            for name, (at_s, group) in list(checks.items()):
                if now_s >= at_s:
                    still_open += sum(1 for sock in group if sock in open_socks)
                    del checks[name]
            for sock in list(open_socks):
                with contextlib.suppress(OSError):
                    sock.send(trickle[i : i + 1] if sock in heads else b"1\r\na\r\n")
            readable, _, _ = (
                select.select(list(open_socks), [], [], 0.1) if open_socks else ([], [], [])
            )
            for sock in readable:
                try:
                    data = sock.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    open_socks.discard(sock)
            i += 1
            if not open_socks:
                time.sleep(0.1)
    finally:
        for sock in heads + bodies:
            sock.close()
    return still_open


def http_boundary(statuses: _Statuses, slowloris: bool = True) -> dict[str, Any]:
    """``server_errors`` (of this part), ``gzip_bomb_rss_growth_mb``,
    ``slowloris_open_after_s`` (see the module docstring)."""
    defaults = {f.name: f.default for f in msgspec.structs.fields(GatewayFileConfig)}
    header_s = float(defaults["header_timeout_s"])
    body_s = float(defaults["body_timeout_s"])
    emulate = ["--speedup", "50", "--admin-token", EMULATOR_ADMIN_TOKEN]
    figures: dict[str, Any] = {}
    with EmulatorProcess(emulate) as emu:
        config = {
            "upstreams": [{"url": emu.url}],
            "tenants": {FREE: {"name": "free"}},
            "admin_token": ADMIN_TOKEN,
            "metrics_token": METRICS_TOKEN,
        }
        with GatewayProcess(config) as gw:
            servers: list[tuple[ServerProcess, dict[str, str]]] = [
                (gw, {"Authorization": f"Bearer {FREE}"}),
                (emu, {}),
            ]
            bodies = _hostile_bodies()
            for server, auth in servers:
                for path in ("/v1/chat/completions", "/v1/completions"):
                    for _, body, extra in bodies:
                        _post(statuses, server.url, path, body, {**auth, **extra})
            figures["hostile_bodies_sent"] = len(bodies) * 4
            for secret in (FREE, ADMIN_TOKEN, METRICS_TOKEN):
                _secret_header_lines(statuses, gw.url, secret)
            _secret_header_lines(statuses, emu.url, EMULATOR_ADMIN_TOKEN)
            bomb = _gzip_bomb(800)
            growth: dict[str, float] = {}
            for server, auth in servers:
                peak_kib = max(server.rss_kib("VmHWM"), server.rss_kib())
                head = ["POST /v1/completions HTTP/1.1", "Host: x", "Content-Encoding: gzip",
                        "Content-Type: application/json", f"Content-Length: {len(bomb)}",
                        "Connection: close", *(f"{k}: {v}" for k, v in auth.items())]  # fmt: skip
                answer = _raw(server.url, ("\r\n".join(head) + "\r\n\r\n").encode() + bomb)
                _raw_status(statuses, f"{server.verb} gzip bomb", answer)
                growth[server.verb] = (server.rss_kib("VmHWM") - peak_kib) / 1024
            figures["gzip_bomb_rss_growth_mb"] = max(growth.values())
            figures["gzip_bomb_bytes"] = len(bomb)
            if slowloris:
                figures["slowloris_open_after_s"] = _slowloris(gw.url, 150, 50, header_s, body_s)
                figures["slowloris_timeouts_s"] = [header_s, body_s]
    return figures


def secrets_in_logs() -> tuple[int, list[str]]:
    """Finds of a configured secret in any log of the servers this run started."""
    found = [leak for server in ServerProcess.started for leak in server.leaks()]
    return len(found), found[:10]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=40.0, help="seconds of overload")
    parser.add_argument("--overload", type=float, default=2.5, help="offered / capacity")
    parser.add_argument("--abuse-seconds", type=float, default=6.0, help="seconds per abuse")
    parser.add_argument(
        "--skip", default="", help="comma-separated: retry, abuse, boundary, slowloris"
    )
    args = parser.parse_args()
    skip = {part.strip() for part in args.skip.split(",") if part.strip()}
    unknown = skip - {"retry", "abuse", "boundary", "slowloris"}
    if unknown:
        parser.error(
            f"--skip {args.skip!r}: unknown part(s) {sorted(unknown)}; "
            "use retry, abuse, boundary, slowloris"
        )
    statuses = _Statuses()
    result: dict[str, Any] = {}
    if "abuse" not in skip:
        result.update(budget_abuse(statuses, args.abuse_seconds))
    if "boundary" not in skip:
        result.update(http_boundary(statuses, slowloris="slowloris" not in skip))
    if "retry" not in skip:
        promise = retry_promise(args.seconds, args.overload)
        result.update(promise)
        server_states = promise["retry_promise_states"].get("server_error", 0)
        statuses.server_errors += ["retry promise: a call ended server_error"] * server_states
    count, where = secrets_in_logs()
    result["server_errors"] = len(statuses.server_errors)
    result["server_errors_where"] = statuses.server_errors[:10]
    result["statuses"] = {str(k): v for k, v in sorted(statuses.counts.items())}
    result["secrets_in_logs"] = count
    result["secrets_in_logs_where"] = where
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
