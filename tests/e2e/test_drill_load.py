"""The drills' clients against a real gateway and emulator on loopback: what a
``cancel_in_flight`` fault may abandon is a call with an attempt on the wire, never one
waiting out a Retry-After (no gateway holds it, so the cancel-half drill waited for a
cancellation the gateways could never count, and failed)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import aiohttp
import pytest

from headway.drill.load import LoadRun, names_no_time
from headway.drill.spec import LoadSpec
from headway.emulate.process import EmulatorProcess
from headway.gateway.process import GatewayProcess

MODEL = "llama-3-8b"
KEY = "sk-drill-load"


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayProcess]:
    with EmulatorProcess(["--speedup", "50", "--model", MODEL]) as emu:
        config = {
            "upstreams": [{"url": emu.url, "model": MODEL}],
            # A bucket of 300 tokens filling at 100/s: two or three calls at once, the
            # rest refused with a Retry-After of seconds.
            "tenants": {KEY: {"name": "metered", "token_rate_per_s": 100, "burst_s": 3}},
        }
        with GatewayProcess(config) as gw:
            yield gw


def _waiting_to_retry(load: LoadRun) -> set[int]:
    """Calls whose every attempt so far was refused and that have not ended: each sleeps
    out its Retry-After before the next attempt."""
    return {
        c.index
        for c in load.calls
        if c.shed_attempts and c.shed_attempts == c.attempts and not load.tasks[c.index].done()
    }


def _load(url: str, duration_s: float, seed: int) -> LoadRun:
    """30 non-streamed calls a second of the metered tenant for ``duration_s``, clients
    obeying the refusals (3 attempts, 20 s each call)."""
    spec = LoadSpec(
        rate_per_s=30, duration_s=duration_s, tenants={KEY: 1.0}, stream_fraction=0.0,
        max_tokens=48, retry="obey", max_attempts=3, timeout_s=20,
    )  # fmt: skip
    return LoadRun([url], spec, model=MODEL, seed=seed)


async def _cancel_while_some_wait(url: str) -> tuple[set[int], list[int], set[int]]:
    load = _load(url, 0.4, seed=7)
    async with aiohttp.ClientSession() as session:
        await load.run(session)
        deadline = time.monotonic() + 10
        # The clients signal no event for a refusal: their records are polled.
        while not _waiting_to_retry(load) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        waiting = _waiting_to_retry(load)
        in_flight = set(load.in_flight)
        cancelled = load.cancel_in_flight(1.0)
        for task in load.tasks.values():
            task.cancel()
        await asyncio.gather(*load.tasks.values(), return_exceptions=True)
    return waiting, cancelled, in_flight


def test_a_call_waiting_out_its_retry_after_is_not_in_flight(gateway: GatewayProcess) -> None:
    waiting, cancelled, in_flight = asyncio.run(_cancel_while_some_wait(gateway.url))
    assert waiting, "no call was refused with a Retry-After: the test shows nothing"
    assert not waiting & in_flight, (waiting, in_flight)
    assert not waiting & set(cancelled), (waiting, cancelled)  # before: all were cancelled


async def _flood(url: str) -> LoadRun:
    load = _load(url, 0.5, seed=11)
    async with aiohttp.ClientSession() as session:
        await load.run(session)
        await asyncio.gather(*load.tasks.values())
    return load


def test_a_budget_refusal_that_names_no_time_is_retried_on_the_clients_backoff(
    gateway: GatewayProcess,
) -> None:
    # 15 calls in half a second against a 300-token bucket: a few pass, the bucket can
    # promise turns to a few more (a Retry-After and a ticket), and the rest are told no
    # time (429 without Retry-After): the drills' clients back off and retry those instead
    # of taking the missing Retry-After for "never", and the drills do not count them
    # as refusals that fail to say when to come back.
    load = asyncio.run(_flood(gateway.url))
    told_no_time = [c for c in load.calls if names_no_time(c.status, c.reason, c.retry_after_s)]
    assert told_no_time, [(c.state, c.status, c.reason, c.retry_after_s) for c in load.calls]
    assert all(c.state == "shed" and c.attempts == 3 for c in told_no_time)
    assert any(c.state == "ok" and c.shed_attempts for c in load.calls)  # a kept turn
