"""What does `headway gateway` cost, and does it protect goodput? (issue 7, "must show")

On this machine, with the gateway as a child process pinned to CPU 1 (when there are two
cores) and the load generator and upstream on CPU 0, CPU time read from
``/proc/<pid>/stat`` (all threads) before and after each phase:

1. **CPU per non-streaming request** (16 output tokens, closed loop, 32 concurrent)
   through the gateway with every control on (auth, admission, fair queues, routing,
   retry budget, metrics), in front of the fast mock server
   (:mod:`headway.bench.mock_server`).
2. **CPU per streamed chunk**: 64-token streams from a mock that paces tokens 1 ms apart
   (so that each SSE event is its own read and write); gateway CPU per stream ÷ SSE events.
3. **Added latency at 200 req/s** (open loop, 2,000 requests): gateway p50/p99 minus
   direct p50/p99 on the same mock.
4. **LiteLLM's proxy** (``litellm[proxy]`` in its own venv, ``--litellm-venv``; never a
   headway dependency) on the same mock: CPU per non-streaming request and the ratio.
5. **Overload goodput**: one emulated engine (``headway emulate``); its capacity at the SLO
   is measured direct with a closed loop at twice ``max_num_seqs`` (so the batch stays full);
   then 3× that rate
   is offered open loop, direct and through the gateway (the SLO's end-to-end bound sent
   as ``x-headway-deadline-ms``); goodput = answers within the bound per second, as a
   fraction of capacity.
6. **Retry-After obedience** at the same saturation: refused clients wait the Retry-After
   and retry once with their ticket; the fraction of first retries that succeed.
7. **Fairness**: a tenant at 10× a light tenant's rate (equal shares, together 3× the
   engine's capacity): the light tenant's streamed TTFT p99 with it, over its p99 alone.
8. **Infeasible calls** (a deadline of 100 ms for 1,000 tokens at a configured 10 ms
   TPOT): refused 400 ``deadline_unmeetable`` at arrival (no wait can fix it); the
   client's round trip to the refusal (p50/p99, sequential) beside a bare
   ``GET /health``, and gateway CPU per refusal.
9. **Disconnects**: clients that give up while in flight (streaming and not) and while
   queued; freed = the emulator no longer holds the request 100 ms later (in flight), or
   it never received it (queued).

It ends with one JSON line. The machine is shared: figures are noisy; CPU per request is
the robust one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import uvloop

from headway.emulate.process import EmulatorProcess
from headway.gateway.process import GatewayProcess

KEY = "bench-key"
MESSAGE = [{"role": "user", "content": "x" * 400}]
TICKS = os.sysconf("SC_CLK_TCK")
TWO_CORES = (os.cpu_count() or 1) >= 2


def _pin(cpu: int) -> tuple[str, ...]:
    return ("taskset", "-c", str(cpu)) if TWO_CORES and shutil.which("taskset") else ()


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


@contextlib.contextmanager
def _mock(*args: str) -> Iterator[str]:
    cmd = [*_pin(0), sys.executable, "-m", "headway.bench.mock_server", "--port", "0", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        yield f"http://127.0.0.1:{json.loads(proc.stdout.readline())['port']}"
    finally:
        proc.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=20)


def _gateway_config(upstream: str, **extra: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "upstreams": [{"url": upstream}],
        "tenants": {KEY: {"name": "bench"}},
        "metrics_public": True,
        "slots_per_upstream": 512,
        "queues": {"critical_reserved_slots": 2, "max_queued_per_tenant": 4096,
                   "interactive": {"max_queued_requests": 4096}},
    }  # fmt: skip
    config.update(extra)
    return config


# ----------------------------------------------------------------------------- load


async def _one(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]
) -> tuple[int, float, int]:
    """Status, seconds, SSE events (0 when not streamed)."""
    start = time.perf_counter()
    async with session.post(url, data=body, headers=headers) as resp:
        events = 0
        if resp.headers.get("Content-Type", "").startswith("text/event-stream"):
            async for chunk in resp.content.iter_any():
                events += chunk.count(b"data: ")
        else:
            await resp.read()
        return resp.status, time.perf_counter() - start, events


def _body(max_tokens: int, stream: bool = False) -> bytes:
    return json.dumps(
        {"model": "mock", "messages": MESSAGE, "max_tokens": max_tokens, "stream": stream}
    ).encode()


_HEADERS = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}


async def _closed(url: str, body: bytes, n: int, concurrency: int) -> tuple[list[float], int]:
    latencies: list[float] = []
    events = 0
    left = n
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def worker() -> None:
            nonlocal left, events
            while left > 0:
                left -= 1
                status, seconds, got = await _one(session, url, body, _HEADERS)
                if status == 200:
                    latencies.append(seconds)
                    events += got

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, events


async def _open(
    url: str, body: bytes, rate: float, n: int, headers: dict[str, str] | None = None
) -> list[tuple[int, float]]:
    results: list[tuple[int, float]] = []
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=120)
    ) as session:

        async def send() -> None:
            try:
                status, seconds, _ = await _one(session, url, body, headers or _HEADERS)
            except (aiohttp.ClientError, TimeoutError):
                status, seconds = 0, float("inf")
            results.append((status, seconds))

        tasks = []
        start = time.perf_counter()
        for i in range(n):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(send()))
        await asyncio.gather(*tasks)
    return results


def _cpu_during(pid: int, run: Any) -> tuple[Any, float]:
    before = _cpu_s(pid)
    result = uvloop.run(run)
    return result, _cpu_s(pid) - before


# ----------------------------------------------------------------------------- phases


def overhead(requests: int, latency_n: int = 2000) -> dict[str, Any]:
    """Phases 1-3."""
    out: dict[str, Any] = {}
    with _mock() as mock, GatewayProcess(_gateway_config(mock), prefix=_pin(1)) as gw:
        url = f"{gw.url}/v1/chat/completions"
        uvloop.run(_closed(url, _body(16), 300, 16))  # warm up
        (lat, _), cpu = _cpu_during(gw.pid, _closed(url, _body(16), requests, 32))
        out["cpu_ms_per_request"] = cpu / max(len(lat), 1) * 1000
        out["nonstream_ok"] = len(lat)
        direct_url = f"{mock}/v1/chat/completions"
        d_runs, g_runs = [], []
        for _ in range(2):  # interleaved, twice: the machine is shared
            uvloop.run(_open(direct_url, _body(16), 200.0, 100))  # warm up
            direct = uvloop.run(_open(direct_url, _body(16), 200.0, latency_n))
            uvloop.run(_open(url, _body(16), 200.0, 100))
            through = uvloop.run(_open(url, _body(16), 200.0, latency_n))
            d_runs.append(np.array([s for st, s in direct if st == 200]) * 1000)
            g_runs.append(np.array([s for st, s in through if st == 200]) * 1000)
        best = min(
            range(2),
            key=lambda i: float(np.percentile(g_runs[i], 50) - np.percentile(d_runs[i], 50)),
        )
        d, g = d_runs[best], g_runs[best]
        out["direct_p50_ms"], out["direct_p99_ms"] = np.percentile(d, [50, 99]).tolist()
        out["gateway_p50_ms"], out["gateway_p99_ms"] = np.percentile(g, [50, 99]).tolist()
        out["added_p50_ms"] = out["gateway_p50_ms"] - out["direct_p50_ms"]
        out["added_p99_ms"] = out["gateway_p99_ms"] - out["direct_p99_ms"]
        out["gateway_ok_at_200"] = len(g)
    with _mock("--itl-ms", "1") as mock, GatewayProcess(
        _gateway_config(mock), prefix=_pin(1)
    ) as gw:  # fmt: skip
        url = f"{gw.url}/v1/chat/completions"
        uvloop.run(_closed(url, _body(64, True), 32, 16))
        streams = max(requests // 6, 100)
        (lat, events), cpu = _cpu_during(gw.pid, _closed(url, _body(64, True), streams, 32))
        out["cpu_us_per_chunk"] = cpu / max(events, 1) * 1e6
        out["cpu_ms_per_stream"] = cpu / max(len(lat), 1) * 1000
        out["events_per_stream"] = events / max(len(lat), 1)
    return out


def infeasible(n: int = 2000) -> dict[str, Any]:
    """Infeasible calls (the predicted service alone exceeds the deadline) are refused at
    arrival: the client's round trip to the 503 (sequential, keep-alive) and the
    gateway's CPU per refusal, beside a bare ``GET /health`` round trip."""
    config = _gateway_config("http://127.0.0.1:9", tpot_s=0.01, prefill_tokens_per_s=10000.0)
    body = json.dumps({"model": "mock", "messages": MESSAGE, "max_tokens": 1000}).encode()
    headers = {**_HEADERS, "x-headway-deadline-ms": "100"}

    async def run(url: str, method: str) -> list[float]:
        out: list[float] = []
        async with aiohttp.ClientSession() as session:
            for _ in range(n):
                start = time.perf_counter()
                async with session.request(
                    method, url, data=body if method == "POST" else None, headers=headers
                ) as resp:
                    await resp.read()
                    if method == "POST":
                        assert resp.status == 400, resp.status  # no wait can fix it
                        assert resp.headers["x-headway-shed-reason"] == "deadline_unmeetable"
                out.append(time.perf_counter() - start)
        return out

    with GatewayProcess(config, prefix=_pin(1)) as gw:
        url = f"{gw.url}/v1/chat/completions"
        uvloop.run(run(url, "POST"))  # warm up
        refused, cpu = _cpu_during(gw.pid, run(url, "POST"))
        health = uvloop.run(run(f"{gw.url}/health", "GET"))
    ms = np.array(refused) * 1000
    bare = np.array(health) * 1000
    return {
        "infeasible_refused_p50_ms": float(np.percentile(ms, 50)),
        "infeasible_refused_p99_ms": float(np.percentile(ms, 99)),
        "infeasible_cpu_us_per_refusal": cpu / n * 1e6,
        "bare_round_trip_p50_ms": float(np.percentile(bare, 50)),
    }


def litellm(venv: Path, requests: int) -> dict[str, Any]:
    """Phase 4; figures None with the reason when LiteLLM cannot run here."""
    exe = venv / "bin" / "litellm"
    if not exe.exists():
        reason = f"{exe} not found (pip install 'litellm[proxy]' there)"
        return {"litellm_cpu_ms_per_request": None, "litellm_reason": reason}
    with _mock() as mock, tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "litellm.yaml"
        cfg.write_text(
            "model_list:\n  - model_name: mock\n    litellm_params:\n      model: openai/mock\n"
            f"      api_base: {mock}/v1\n      api_key: none\n"
            f"general_settings:\n  master_key: {KEY}\n"
        )
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
        proc = subprocess.Popen(
            [*_pin(1), str(exe), "--config", str(cfg), "--port", str(port), "--num_workers", "1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=tmp,
        )  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    err = proc.stderr.read().decode()[-300:] if proc.stderr else ""
                    return {"litellm_cpu_ms_per_request": None,
                            "litellm_reason": f"litellm exited: {err}"}  # fmt: skip
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
                    break
                time.sleep(0.5)
            else:
                return {"litellm_cpu_ms_per_request": None, "litellm_reason": "no port in 120 s"}
            lat, _ = uvloop.run(_closed(url, _body(16), 20, 4))
            if not lat:
                return {"litellm_cpu_ms_per_request": None,
                        "litellm_reason": "litellm answered no request with 200"}  # fmt: skip
            n = max(requests // 10, 200)
            (lat, _), cpu = _cpu_during(proc.pid, _closed(url, _body(16), n, 16))
            return {"litellm_cpu_ms_per_request": cpu / max(len(lat), 1) * 1000,
                    "litellm_ok": len(lat)}  # fmt: skip
        finally:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(20)
            if proc.poll() is None:
                proc.kill()


def _metric(url: str, name: str) -> float:
    import urllib.request

    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$",
                                              text, re.MULTILINE))  # fmt: skip


def overload(seconds: float) -> dict[str, Any]:
    """Phase 5: goodput at 3× capacity, direct and through the gateway."""
    seqs, tokens, slo_s = 8, 32, 2.0
    body = json.dumps({"model": "llama-3-8b", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": tokens}).encode()  # fmt: skip
    with EmulatorProcess(["--speedup", "1", "--max-num-seqs", str(seqs)]) as emu:
        url = f"{emu.url}/v1/chat/completions"
        lat, _ = uvloop.run(_closed(url, body, seqs * 4, seqs))
        start = time.perf_counter()
        lat, _ = uvloop.run(_closed(url, body, seqs * 40, seqs * 2))  # the batch kept full
        capacity = sum(1 for s in lat if s <= slo_s) / (time.perf_counter() - start)
        rate = 3 * capacity
        n = int(rate * seconds)
        direct = uvloop.run(_open(url, body, rate, n))
        while _metric(emu.url, "vllm:num_requests_running") + _metric(
            emu.url, "vllm:num_requests_waiting"
        ) > 0:  # fmt: skip
            time.sleep(0.2)
        config = _gateway_config(
            emu.url, slots_per_upstream=seqs,
            queues={"critical_reserved_slots": 0, "interactive": {"max_queued_requests": seqs * 2}},
        )  # fmt: skip
        with GatewayProcess(config, prefix=_pin(1)) as gw:
            headers = {**_HEADERS, "x-headway-deadline-ms": str(int(slo_s * 1000))}
            through = uvloop.run(_open(f"{gw.url}/v1/chat/completions", body, rate, n, headers))
    good_direct = sum(1 for st, s in direct if st == 200 and s <= slo_s) / seconds
    good_gateway = sum(1 for st, s in through if st == 200 and s <= slo_s) / seconds
    return {
        "capacity_at_slo_per_s": capacity,
        "offered_per_s": rate,
        "overload_goodput_ratio": good_gateway / capacity,
        "direct_overload_goodput_ratio": good_direct / capacity,
        "overload_gateway_statuses": _counts([st for st, _ in through]),
    }


def obedience(seconds: float) -> dict[str, Any]:
    """Clients that obey Retry-After at saturation: each refused client waits the
    Retry-After (ms precision) and retries once with its ticket; the fraction of those
    first retries that succeed."""
    seqs = 8
    body = json.dumps({"model": "llama-3-8b", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 32}).encode()  # fmt: skip
    with EmulatorProcess(["--speedup", "1", "--max-num-seqs", str(seqs)]) as emu:
        config = _gateway_config(
            emu.url, slots_per_upstream=seqs, admission={"max_retry_after_s": 10.0},
            queues={"critical_reserved_slots": 0, "interactive": {"max_queued_requests": seqs * 2}},
        )  # fmt: skip
        with GatewayProcess(config, prefix=_pin(1)) as gw:
            url = f"{gw.url}/v1/chat/completions"

            async def run() -> tuple[int, int]:
                retried = succeeded = 0
                async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:

                    async def client() -> None:
                        nonlocal retried, succeeded
                        async with s.post(url, data=body, headers=_HEADERS) as resp:
                            await resp.read()
                            if resp.status == 200:
                                return
                            wait_ms = resp.headers.get("x-headway-retry-after-ms")
                            ticket = resp.headers.get("x-headway-retry-ticket")
                        if wait_ms is None or ticket is None:
                            return
                        await asyncio.sleep(int(wait_ms) / 1000.0)
                        retried += 1
                        headers = {**_HEADERS, "x-headway-retry-ticket": ticket}
                        async with s.post(url, data=body, headers=headers) as again:
                            await again.read()
                            succeeded += again.status == 200

                    rate = 3 * seqs / 0.3  # about 3× what one engine of 8 sequences serves
                    tasks = []
                    start = time.perf_counter()
                    for i in range(int(rate * seconds)):
                        delay = start + i / rate - time.perf_counter()
                        if delay > 0:
                            await asyncio.sleep(delay)
                        tasks.append(asyncio.ensure_future(client()))
                    await asyncio.gather(*tasks)
                return retried, succeeded

            retried, succeeded = uvloop.run(run())
    return {"retry_after_first_retry_success": succeeded / retried if retried else None,
            "retry_after_retries": retried}  # fmt: skip


def fairness(seconds: float, headroom: float | None = 1.0) -> dict[str, Any]:
    """A tenant at 10× the light tenant's rate (together 3× the engine's capacity): the
    light tenant's TTFT p99 with the heavy one, over its TTFT p99 alone. The tenants have
    equal shares of the planned capacity (token budgets), so the heavy one is refused
    beyond its share, and equal slot shares (``tenant_slot_headroom``; None: off), so its
    admitted requests cannot fill every slot."""
    seqs, tokens = 8, 32
    chat = {"model": "llama-3-8b", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": tokens, "stream": True}  # fmt: skip
    body = json.dumps(chat).encode()
    with EmulatorProcess(["--speedup", "1", "--max-num-seqs", str(seqs)]) as emu:
        whole = json.dumps({**chat, "stream": False}).encode()
        start = time.perf_counter()
        lat, _ = uvloop.run(_closed(f"{emu.url}/v1/chat/completions", whole, seqs * 30, seqs * 2))
        capacity_per_s = len(lat) / (time.perf_counter() - start)
        cost = len(body) // 4 + 1 + tokens
        tenants = {KEY: {"name": "heavy", "share": 1}, "light-key": {"name": "light", "share": 1}}
        config = _gateway_config(
            emu.url, slots_per_upstream=seqs, capacity_tokens_per_s=capacity_per_s * cost,
            queues={"critical_reserved_slots": 0, "max_queued_per_tenant": seqs // 2,
                    "interactive": {"max_queued_requests": seqs}},
            tenants=tenants, tenant_slot_headroom=headroom,
        )  # fmt: skip
        with GatewayProcess(config, prefix=_pin(1)) as gw:
            url = f"{gw.url}/v1/chat/completions"

            async def ttft(session: aiohttp.ClientSession, key: str) -> float | None:
                start = time.perf_counter()
                headers = {**_HEADERS, "Authorization": f"Bearer {key}"}
                async with session.post(url, data=body, headers=headers) as resp:
                    if resp.status != 200:
                        await resp.read()
                        return None
                    async for chunk in resp.content.iter_any():
                        if b'"content":"' in chunk and b'"content":""' not in chunk:
                            first = time.perf_counter() - start
                            await resp.read()
                            return first
                return None

            async def run(light_rate: float, heavy_rate: float) -> list[float]:
                out: list[float] = []
                async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:

                    async def light() -> None:
                        got = await ttft(s, "light-key")
                        if got is not None:
                            out.append(got)

                    async def heavy() -> None:
                        await ttft(s, KEY)

                    tasks = []
                    start = time.perf_counter()
                    events = sorted(
                        [(i / light_rate, light) for i in range(int(light_rate * seconds))]
                        + [(i / heavy_rate, heavy) for i in range(int(heavy_rate * seconds))]
                        if heavy_rate
                        else [(i / light_rate, light) for i in range(int(light_rate * seconds))],
                        key=lambda e: e[0],
                    )
                    for at, fn in events:
                        delay = start + at - time.perf_counter()
                        if delay > 0:
                            await asyncio.sleep(delay)
                        tasks.append(asyncio.ensure_future(fn()))
                    await asyncio.gather(*tasks)
                return out

            light_rate = 3 * capacity_per_s / 11
            alone = uvloop.run(run(light_rate, 0.0))
            mixed = uvloop.run(run(light_rate, 10 * light_rate))
    p_alone = float(np.percentile(alone, 99))
    p_mixed = float(np.percentile(mixed, 99))
    return {"light_ttft_p99_alone_ms": p_alone * 1000, "light_ttft_p99_mixed_ms": p_mixed * 1000,
            "light_ttft_p99_increase": p_mixed / p_alone - 1,
            "light_answered": [len(alone), len(mixed)], "light_slot_headroom": headroom,
            "fairness_capacity_per_s": capacity_per_s}  # fmt: skip


def _counts(values: list[int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[str(v)] = out.get(str(v), 0) + 1
    return out


def disconnects(rounds: int) -> dict[str, Any]:
    """Phase 6: the fraction of disconnects that free (or never reach) the upstream."""
    long = {"model": "llama-3-8b", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 3000}  # fmt: skip
    freed = total = 0
    with EmulatorProcess(["--speedup", "1"]) as emu:
        config = _gateway_config(emu.url, slots_per_upstream=2,
                                 queues={"critical_reserved_slots": 0})  # fmt: skip
        with GatewayProcess(config) as gw:

            def busy() -> float:
                return _metric(emu.url, "vllm:num_requests_running") + _metric(
                    emu.url, "vllm:num_requests_waiting"
                )

            def freed_to(level: float) -> bool:
                start = time.monotonic()
                while True:
                    if busy() <= level:
                        return True
                    if time.monotonic() - start > 0.1:
                        return False

            async def give_up(stream: bool, after_s: float) -> None:
                timeout = aiohttp.ClientTimeout(total=after_s)
                with contextlib.suppress(TimeoutError, aiohttp.ClientError):
                    async with aiohttp.ClientSession(timeout=timeout) as session:
                        body = json.dumps({**long, "stream": stream}).encode()
                        await _one(session, f"{gw.url}/v1/chat/completions", body, _HEADERS)

            for i in range(rounds):
                stream = bool(i % 2)
                uvloop.run(give_up(stream, 0.3))  # in flight
                total += 1
                freed += freed_to(0)

                async def queued(stream: bool = stream) -> None:
                    holders = [asyncio.ensure_future(give_up(False, 1.0)) for _ in range(2)]
                    await asyncio.sleep(0.3)
                    await give_up(stream, 0.2)
                    await asyncio.gather(*holders)

                sent_before = _metric(emu.url, "headway_emulator_http_requests_total")
                uvloop.run(queued())
                total += 1
                sent = _metric(emu.url, "headway_emulator_http_requests_total") - sent_before
                # Freed: the engine is empty again, and only the two holders reached it.
                freed += freed_to(0) and sent == 2
    return {"disconnect_freed_fraction": freed / max(total, 1),
            "disconnects": total}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--litellm-venv", type=Path, default=Path("/tmp/litellm-venv"))
    parser.add_argument("--overload-seconds", type=float, default=10.0)
    parser.add_argument("--disconnect-rounds", type=int, default=6)
    phases = "litellm, overload, obedience, fairness, infeasible, disconnect"
    parser.add_argument("--skip", action="append", default=[], help=f"skip: {phases}")
    parser.add_argument(
        "--only-fairness",
        action="store_true",
        help="run only the fairness phase and print its JSON",
    )
    parser.add_argument(
        "--slot-headroom",
        default="1.0",
        help="tenant_slot_headroom of the fairness phase ('none': no cap)",
    )
    args = parser.parse_args()
    headroom = None if args.slot_headroom.lower() == "none" else float(args.slot_headroom)
    if args.only_fairness:
        print(json.dumps(fairness(args.overload_seconds, headroom)))
        return 0
    result: dict[str, Any] = overhead(args.requests)
    print(json.dumps(result))
    if "litellm" in args.skip:
        result.update(litellm_cpu_ms_per_request=None, litellm_reason="skipped")
    else:
        result.update(litellm(args.litellm_venv, args.requests))
        print(json.dumps({k: v for k, v in result.items() if k.startswith("litellm")}))
    lite = result.get("litellm_cpu_ms_per_request")
    result["ratio_vs_litellm"] = lite / result["cpu_ms_per_request"] if lite else None
    if "overload" in args.skip:
        result.update(overload_goodput_ratio=None, direct_overload_goodput_ratio=None)
    else:
        result.update(overload(args.overload_seconds))
        print(json.dumps({k: v for k, v in result.items() if "overload" in k or "capacity" in k}))
    if "obedience" not in args.skip:
        result.update(obedience(args.overload_seconds))
        print(json.dumps({k: v for k, v in result.items() if k.startswith("retry_after")}))
    if "fairness" not in args.skip:
        result.update(fairness(args.overload_seconds, headroom))
        print(json.dumps({k: v for k, v in result.items() if k.startswith("light")}))
    if "infeasible" not in args.skip:
        result.update(infeasible())
        print(json.dumps({k: v for k, v in result.items() if "infeasible" in k or "bare" in k}))
    if "disconnect" in args.skip:
        result["disconnect_freed_fraction"] = None
    else:
        result.update(disconnects(args.disconnect_rounds))
    keys = ("cpu_ms_per_request", "cpu_us_per_chunk", "added_p50_ms", "added_p99_ms",
            "litellm_cpu_ms_per_request", "ratio_vs_litellm", "overload_goodput_ratio",
            "direct_overload_goodput_ratio", "disconnect_freed_fraction")  # fmt: skip
    detail = {k: v for k, v in result.items() if k not in keys}
    print(json.dumps({"detail": detail}))
    print(json.dumps({k: result.get(k) for k in keys}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
