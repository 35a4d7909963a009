"""`headway gateway` in front of two real vLLM replicas (issue 14, Deliver 2).

The tier's shared server (seed 0) and a second one of this module, serving the model built
with seed 1 (another tokenizer permutation: the same prompt has other token ids, so other
answers). Relays through the `openai` client, sheds with a computed Retry-After whose
ticket a retry redeems, disconnects (queued and in flight, streamed and not) measured on
vLLM's own gauges, an admin drain, and a readiness fingerprint of token ids that keeps
the seed-1 replica out of a revision recorded on the seed-0 one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import http.client
import json
import math
import re
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

import engine_hooks
import fingerprint_hooks
from headway.gateway.probe import DEFAULT_PROBE_PROMPT, token_ids_fingerprint
from headway.gateway.process import GatewayProcess
from headway.realengine.install import VllmVenv
from headway.realengine.model import ModelSpec, build_model, default_model_dir
from headway.realengine.server import VllmServer, VllmSettings
from headway.realengine.slot_release import engines_busy, release_trial, summarize

MODEL = "tiny"
KEY = "key-acme"
ADMIN = "admin-secret"
AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell me about queues"}]
NO_EOS = {"ignore_eos": True}  # dummy weights may pick EOS at once


@pytest.fixture(scope="module")
def replicas(
    request: pytest.FixtureRequest,
    vllm_venv: VllmVenv,
    tier_settings: VllmSettings,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[VllmServer, VllmServer]]:
    """(the shared seed-0 server, a seed-1 server); the second starts while the first does."""
    spec = ModelSpec(seed=1)
    model = build_model(default_model_dir(spec), spec, python=vllm_venv.python)
    log = tmp_path_factory.mktemp("vllm-seed1") / "vllm.log"
    second = VllmServer(vllm_venv.python, model, log, tier_settings)
    failed: list[RuntimeError] = []

    def start() -> None:
        try:
            second.start()
        except RuntimeError as exc:  # reported below, on the test's thread
            failed.append(exc)

    starter = threading.Thread(target=start, daemon=True)
    starter.start()
    try:
        first: VllmServer = request.getfixturevalue("vllm_server")
        starter.join()
        if failed:
            pytest.fail(f"the second vLLM did not start: {failed[0]}", pytrace=False)
        yield first, second
    finally:
        starter.join()
        second.stop()


def _urls(pair: tuple[VllmServer, VllmServer]) -> list[str]:
    return [s.url for s in pair]


def _config(urls: list[str], **extra: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "upstreams": [{"url": u} for u in urls],
        "tenants": {KEY: {"name": "acme", "max_priority": "interactive"}},
        "admin_token": ADMIN,
        "metrics_public": True,  # the tests and the drill read /metrics without a token
        "slots_per_upstream": 4,
        "kv_blocks_per_upstream": 1365,
        "tpot_s": 0.5,  # calibrated on this machine: one step ~455 ms at 1-4 streams
        "prefill_tokens_per_s": 500.0,
        "queues": {"critical_reserved_slots": 0},
    }
    config.update(extra)
    return config


def _metrics(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        return str(resp.read().decode())


def _value(text: str, name: str, labels: str = "") -> float:
    """The sum of ``name``'s samples whose labels contain ``labels``."""
    pattern = rf"^{re.escape(name)}(?:{{([^}}]*)}})? (\S+)$"
    return sum(
        float(v) for lab, v in re.findall(pattern, text, re.MULTILINE) if labels in (lab or "")
    )


def _served(gateway: str, upstream: str) -> float:
    """Requests the gateway relayed to ``upstream`` (its TTFT histogram's count)."""
    text = _metrics(gateway)
    return _value(text, "headway_gateway_upstream_ttft_seconds_count", f'upstream="{upstream}"')


def _all_ready(gateway: str, urls: list[str]) -> None:
    """Wait until the gateway routes to every upstream: a test that holds one slot on each
    must not start while a loaded host still has one readiness probe under way."""
    _until(
        lambda: _value(_metrics(gateway), "headway_gateway_upstream_ready") == len(urls),
        120,
        "the gateway never had every upstream ready",
    )


def _queued_since_close(gateway: str, closed: float, within_s: float = 5.0) -> float:
    """Scrape the gateway's queue depth until it is 0; the latest start, after
    ``closed``, of a scrape that still found a call queued (0 when none did)."""
    depth = "headway_gateway_queue_depth_requests"
    still_s = 0.0
    while True:
        begun = time.monotonic()
        if _value(_metrics(gateway), depth) == 0:
            return still_s
        still_s = max(still_s, begun - closed)
        assert begun - closed < within_s, "still queued"
        time.sleep(0.01)


def _post(url: str, path: str, body: Any, headers: dict[str, str]) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"{url}{path}", json.dumps(body).encode(),
        {"Content-Type": "application/json", **headers},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=120)


def _until(check: Any, within_s: float, what: str) -> float:
    """Wait until ``check()`` holds; a check whose scrape timed out (vLLM's /metrics took
    over 5 s on a loaded 2-core CI host) has not held yet."""
    start = time.monotonic()
    while True:
        try:
            if check():
                return time.monotonic() - start
        except OSError:
            pass
        assert time.monotonic() - start < within_s, what
        time.sleep(0.05)


def _report(request: pytest.FixtureRequest, line: str) -> None:
    """Show a measured figure in the run's output (with or without ``-s``)."""
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(line)


def _idle(urls: list[str]) -> None:
    _until(lambda: engines_busy(urls) == 0, 60, "the engines never went idle")


def test_relays_completions_and_chat_streamed_and_not(
    replicas: tuple[VllmServer, VllmServer], request: pytest.FixtureRequest
) -> None:
    """Eight calls, both endpoints, streamed and not, through the `openai` client: each
    gets its 4 tokens, and both replicas serve some."""
    urls = _urls(replicas)
    with GatewayProcess(_config(urls)) as gw, _client(gw.url) as client:

        def call(kind: tuple[str, bool]) -> int:
            endpoint, stream = kind
            if endpoint == "chat" and stream:
                chunks = list(client.chat.completions.create(
                    model=MODEL, messages=PROMPT, max_tokens=4, stream=True,
                    stream_options={"include_usage": True}, extra_body=NO_EOS))  # fmt: skip
                assert chunks[-1].usage is not None
                return chunks[-1].usage.completion_tokens
            if endpoint == "chat":
                r = client.chat.completions.create(
                    model=MODEL,
                    messages=PROMPT,
                    max_tokens=4,
                    extra_body=NO_EOS,
                )
                assert r.usage is not None and r.choices[0].finish_reason == "length"
                return r.usage.completion_tokens
            if stream:
                parts = list(client.completions.create(
                    model=MODEL, prompt="Tell me about queues", max_tokens=4, stream=True,
                    stream_options={"include_usage": True}, extra_body=NO_EOS))  # fmt: skip
                assert parts[-1].usage is not None
                return parts[-1].usage.completion_tokens
            c = client.completions.create(
                model=MODEL, prompt="Tell me about queues", max_tokens=4, extra_body=NO_EOS
            )
            assert c.usage is not None
            return c.usage.completion_tokens

        kinds = [("chat", True), ("chat", False), ("completions", True), ("completions", False)]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            tokens = list(pool.map(call, kinds * 2))
        assert tokens == [4] * 8
        served = [_served(gw.url, u) for u in urls]
    _report(request, f"relayed per replica: {served}")
    assert sum(served) == 8 and min(served) >= 1, served


def _shed_config(urls: list[str]) -> dict[str, Any]:
    """Two slots (one per replica), two queue places, drain rates over 20 s."""
    return _config(
        urls, slots_per_upstream=1,
        queues={"critical_reserved_slots": 0, "interactive": {"max_queued_requests": 2},
                "max_queued_per_tenant": 2, "drain_window_s": 20.0},
    )  # fmt: skip


Answer = tuple[int, Any, float]


def _chat(client: openai.OpenAI, max_tokens: int, headers: dict[str, str] | None = None) -> Answer:
    """Status, headers and the time of the answer of one non-streamed chat call."""
    try:
        r = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=PROMPT, max_tokens=max_tokens, extra_body=NO_EOS,
            extra_headers=headers,
        )  # fmt: skip
        return r.status_code, r.headers, time.monotonic()
    except openai.APIStatusError as error:
        return error.status_code, error.response.headers, time.monotonic()


def _refusals(futures: list[concurrent.futures.Future[Answer]], count: int = 1) -> Any:
    """The headers of the first refusal, once ``count`` calls have been refused (all
    queue_full): a burst is judged whole before the test lets the line move, since on a
    2-core host a call of the burst can reach the gateway a second after the others."""
    refused: list[Any] = []
    for f in concurrent.futures.as_completed(futures):
        status, headers, _ = f.result()
        if status == 429:
            assert headers["x-headway-shed-reason"] == "queue_full"
            refused.append(headers)
            if len(refused) == count:
                return refused[0]
    raise AssertionError(f"{len(refused)} refusals of {len(futures)} calls, not {count}")


def test_burst_sheds_with_computed_retry_after_and_its_ticket_succeeds(
    replicas: tuple[VllmServer, VllmServer], request: pytest.FixtureRequest
) -> None:
    """Two long streams hold both slots; of a burst of 6, 2 queue and 4 are refused 429
    queue_full. Once one slot frees and the line moves (a third long stream takes the slot
    after it), a second burst's refusals carry a Retry-After below the cap, computed from
    the measured drain, and a retry that waits it with its ticket is served. (The first
    burst's Retry-After, before anything drained, is timed at the slots' pace from
    tpot_s: reported, not asserted.)"""
    urls = _urls(replicas)
    depth = "headway_gateway_queue_depth_requests"
    _idle(urls)
    with (
        GatewayProcess(_shed_config(urls)) as gw,
        _client(gw.url) as client,
        concurrent.futures.ThreadPoolExecutor(16) as pool,
    ):
        _all_ready(gw.url, urls)
        holders = [_open(gw.url, stream=True, max_tokens=1500) for _ in range(2)]
        try:
            _until(lambda: engines_busy(urls) == 2, 30, "the holders never ran")
            first = [pool.submit(_chat, client, 4) for _ in range(6)]
            cold = _refusals(first, 4)
            _until(lambda: _value(_metrics(gw.url), depth) == 2, 10, "nothing queued")
            holders.pop().close()  # a slot frees: the line moves
            _until(lambda: _value(_metrics(gw.url), depth) < 2, 10, "the line never moved")
            # A third long stream joins the line behind the short calls and takes the slot
            # they leave, so the second burst finds both slots held however slowly a
            # starved client sends it (short calls alone had drained before it came).
            holders.append(_open(gw.url, stream=True, max_tokens=1500, read=False))
            _until(lambda: all(f.done() for f in first), 60, "the line never drained")
            _until(lambda: engines_busy(urls) == 2, 30, "the third stream never ran")
            second = [pool.submit(_chat, client, 4) for _ in range(4)]
            warm = _refusals(second)
            for h in holders:
                h.close()  # both slots free: the line drains
            wait_ms = int(warm["x-headway-retry-after-ms"])
            time.sleep(wait_ms / 1000.0)
            ticket = {"x-headway-retry-ticket": warm["x-headway-retry-ticket"]}
            retry = _chat(client, 2, ticket)
            answers = [f.result() for f in first + second]
        finally:
            for h in holders:
                h.close()
    statuses = [s for s, _, _ in answers]
    _report(
        request,
        f"bursts: {sorted(statuses[:6])} then {sorted(statuses[6:])}; Retry-After before any "
        f"drain {cold['Retry-After']} s, after {warm['Retry-After']} s ({wait_ms} ms); "
        f"the ticketed retry: {retry[0]}",
    )
    assert sorted(statuses[:6]) == [200, 200, 429, 429, 429, 429], statuses
    assert 1 <= int(warm["Retry-After"]) < 60  # not the cap: computed
    assert retry[0] == 200


def test_a_deadline_that_passes_in_flight_is_cancelled_in_vllm(
    replicas: tuple[VllmServer, VllmServer], request: pytest.FixtureRequest
) -> None:
    """Seed 003's "if deadline_expires: cancel scheduler state and release blocks", on
    vLLM: a call of 1,500 tokens (minutes here) with a 3 s deadline is answered 504
    deadline_exceeded at its deadline, and vLLM's running gauge drops once the step under
    way ends (the gateway closed the upstream call; vLLM aborts the sequence)."""
    urls = _urls(replicas)
    _idle(urls)
    config = _config(urls, admission={"check_deadlines": False})  # it would refuse it
    with GatewayProcess(config) as gw, _client(gw.url) as client:
        _all_ready(gw.url, urls)
        start = time.monotonic()
        status, _, answered = _chat(client, 1500, {"x-headway-deadline-ms": "3000"})
        took_s = answered - start
        freed_s = _until(lambda: engines_busy(urls) == 0, 20, "vLLM kept the sequence")
        cancels = _value(_metrics(gw.url), "headway_gateway_deadline_cancels_total")
    _report(
        request,
        f"deadline 3 s: answered {status} after {took_s:.3f} s; vLLM idle {freed_s:.3f} s later",
    )
    assert status == 504 and cancels == 1
    assert 3.0 <= took_s <= 3.5, took_s  # the loaded host's round trip on top


def test_disconnects_free_the_engine(
    replicas: tuple[VllmServer, VllmServer], request: pytest.FixtureRequest
) -> None:
    """In flight, streamed and not: after the client closes, vLLM's running gauge drops
    (at the end of the engine step under way: the fraction within 100 ms is reported,
    not asserted). Queued: the request leaves the gateway's line within 100 ms and never
    reaches an engine."""
    urls = _urls(replicas)
    _idle(urls)
    with GatewayProcess(_config(urls)) as gw:
        trials = [
            release_trial(gw.url, urls, stream=stream, headers=AUTH, max_tokens=1500)
            for stream in (True, False, True, False)
        ]
        for stream in (True, False):
            figures = summarize([t for t in trials if t.stream == stream])
            _report(request, f"in flight, {'streamed' if stream else 'not streamed'}: {figures}")
        for t in trials:
            # Freed long before the 1,500 tokens it asked for (>= 15 s here), though not
            # always within 100 ms: vLLM applies an abort when its step under way ends,
            # and a loaded host stretches steps (slot_release's docstring; the figures
            # come from benchmarks/gateway_vllm_disconnect.py, which also runs them
            # without the gateway).
            assert t.freed_s is not None and t.freed_s <= 3.0, t
        cancelled = _value(_metrics(gw.url), "headway_gateway_cancellations_total",
                           'stage="in_flight"')  # fmt: skip
        assert cancelled == len(trials)
    _idle(urls)
    depth = "headway_gateway_queue_depth_requests"
    with GatewayProcess(_config(urls, slots_per_upstream=1)) as gw:
        _all_ready(gw.url, urls)
        holders = [_open(gw.url, stream=True, max_tokens=400) for _ in range(2)]
        try:
            _until(lambda: engines_busy(urls) == 2, 30, "the holders never ran")
            for stream in (False, True):
                queued = _open(gw.url, stream=stream, max_tokens=400, read=False)
                _until(lambda: _value(_metrics(gw.url), depth) == 1, 10, "never queued")
                closed = time.monotonic()
                queued.close()
                still_s = _queued_since_close(gw.url, closed)
                _report(
                    request,
                    f"queued, {'streamed' if stream else 'not streamed'}: last seen queued "
                    f"by a scrape begun {still_s:.3f} s after the close",
                )
                # A loaded host stretches each scrape itself (0.4 s once on 2 busy cores):
                # what must not happen is a scrape begun 100 ms after the close still
                # finding the call in the line.
                assert still_s <= 0.1
                assert engines_busy(urls) == 2  # it never reached an engine
        finally:
            for h in holders:
                h.close()
    _idle(urls)


def _open(
    url: str, *, stream: bool, max_tokens: int, read: bool = True
) -> http.client.HTTPConnection:
    """A chat call on its own connection, left open (a stream's first event read)."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=120)
    body = {"model": MODEL, "messages": PROMPT, "max_tokens": max_tokens, "stream": stream,
            **NO_EOS}  # fmt: skip
    conn.request("POST", "/v1/chat/completions", json.dumps(body).encode(),
                 {"Content-Type": "application/json", **AUTH})  # fmt: skip
    if read:
        resp = conn.getresponse()
        assert resp.status == 200
        assert resp.read1(4096)  # the first event
    return conn


STREAM_TOKENS = 30  # the drained replica's stream: ~14 s of steps on a loaded 2-core host


def test_drain_stops_routing_while_in_flight_work_finishes(
    replicas: tuple[VllmServer, VllmServer],
) -> None:
    urls = _urls(replicas)
    _idle(urls)
    with GatewayProcess(_config(urls)) as gw, _client(gw.url) as client:
        stream = client.chat.completions.create(
            model=MODEL,
            messages=PROMPT,
            max_tokens=STREAM_TOKENS,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=NO_EOS,
        )
        first = next(iter(stream))
        assert first.choices
        # The replica that serves the stream, from the gateway's own count (observed before
        # the first event is relayed), not from vLLM's running gauge, which a fast host
        # empties before a second scrape.
        busy = [u for u in urls if _served(gw.url, u) == 1]
        assert len(busy) == 1, busy
        drained, other = busy[0], next(u for u in urls if u != busy[0])
        status, body = _post(gw.url, "/admin/drain", {"upstream": drained, "drain": True},
                             {"Authorization": f"Bearer {ADMIN}"})  # fmt: skip
        assert status == 200 and body["draining"] is True, body
        before = (_served(gw.url, drained), _served(gw.url, other))
        for _ in range(3):
            r = client.chat.completions.create(
                model=MODEL,
                messages=PROMPT,
                max_tokens=2,
                extra_body=NO_EOS,
            )
            assert r.usage is not None and r.usage.completion_tokens == 2
        after = (_served(gw.url, drained), _served(gw.url, other))
        assert after == (before[0], before[1] + 3), (before, after)
        rest = list(stream)  # the in-flight stream on the drained replica ends whole
        # Whole: every token, by the engine's own count (a loaded host's vLLM may put
        # several tokens in one event, so events are not tokens), and its natural end.
        usage = [c.usage for c in rest if c.usage is not None]
        assert usage and usage[-1].completion_tokens == STREAM_TOKENS, usage
        reasons = [c.choices[0].finish_reason for c in rest if c.choices]
        assert reasons and reasons[-1] == "length", reasons
        status, body = _post(gw.url, "/admin/drain", {"upstream": drained, "drain": False},
                             {"Authorization": f"Bearer {ADMIN}"})  # fmt: skip
        assert status == 200 and body["draining"] is False, body


def _fingerprint(url: str) -> str:
    """The probe's token-id fingerprint, asked of the engine directly."""
    status, body = _post(url, "/v1/completions", {
        "model": MODEL, "prompt": DEFAULT_PROBE_PROMPT, "max_tokens": 2, "temperature": 0,
        "return_token_ids": True}, {})  # fmt: skip
    assert status == 200, body
    choice = body["choices"][0]
    return token_ids_fingerprint(choice["prompt_token_ids"], choice["token_ids"])


def test_a_logprob_checksum_passes_on_the_engine_and_a_drifted_one_is_wrong(
    replicas: tuple[VllmServer, VllmServer], request: pytest.FixtureRequest
) -> None:
    """The readiness fingerprint with a logprob checksum (issue 20: "compared on real
    token ids, and a logprob checksum where the engine returns logprobs"): the probe asks
    vLLM for ``logprobs: 1`` and passes on the sum it recorded; the same token ids with a
    sum moved past the tolerance are wrong, naming the numerical format."""
    from headway.gateway.probe import probe_session, run_probe

    url = _urls(replicas)[0]
    status, body = _post(url, "/v1/completions", {
        "model": MODEL, "prompt": DEFAULT_PROBE_PROMPT, "max_tokens": 2, "temperature": 0,
        "return_token_ids": True, "logprobs": 1}, {})  # fmt: skip
    assert status == 200, body
    choice = body["choices"][0]
    logprobs = choice["logprobs"]["token_logprobs"]
    recorded = token_ids_fingerprint(choice["prompt_token_ids"], choice["token_ids"], logprobs)
    ids, _, total = recorded.partition(";logprob_sum:")
    drifted = f"{ids};logprob_sum:{float(total) + 1.0:.6f}"
    _report(request, f"logprob fingerprint: {recorded}")

    async def probe(expected: str) -> Any:
        async with probe_session() as session:
            return await run_probe(session, url, model=MODEL, prompt=DEFAULT_PROBE_PROMPT,
                                   max_tokens=2, expected=expected, deadline_s=30.0)  # fmt: skip

    assert asyncio.run(probe(recorded)).outcome == "pass"
    wrong = asyncio.run(probe(drifted))
    assert (wrong.outcome, wrong.reason) == ("wrong", "fingerprint mismatch")
    assert "logprob sum" in wrong.detail and "numerical format" in wrong.detail


def test_a_replica_with_other_token_ids_is_excluded(
    replicas: tuple[VllmServer, VllmServer], request: pytest.FixtureRequest
) -> None:
    """Both replicas claim revision r, recorded on the seed-0 one: the seed-1 one answers
    the probe with other token ids, is excluded, and gets no traffic."""
    urls = _urls(replicas)
    good, other = _fingerprint(urls[0]), _fingerprint(urls[1])
    _report(request, f"fingerprints: seed 0 {good}, seed 1 {other}")
    assert good != other and good == _fingerprint(urls[0])
    config = _config(urls, pool={
        "fingerprints": {"r": good}, "probe_max_tokens": 2, "probe_interval_s": 1.0,
        "probe_deadline_s": 1.0, "warmup_probes": 1})  # fmt: skip
    config["upstreams"] = [{"url": u, "revision": "r"} for u in urls]
    with GatewayProcess(config) as gw, _client(gw.url) as client:

        def verdicts() -> tuple[float, float, float]:
            text = _metrics(gw.url)
            ready = "headway_gateway_upstream_ready"
            wrong = _value(text, "headway_gateway_upstream_probes_total",
                           f'outcome="wrong",upstream="{urls[1]}"')  # fmt: skip
            return (_value(text, ready, f'upstream="{urls[0]}"'),
                    _value(text, ready, f'upstream="{urls[1]}"'), wrong)  # fmt: skip

        _until(lambda: verdicts()[0] == 1 and verdicts()[2] >= 1, 60, "no verdicts")
        assert verdicts()[1] == 0
        for _ in range(3):
            r = client.chat.completions.create(
                model=MODEL,
                messages=PROMPT,
                max_tokens=2,
                extra_body=NO_EOS,
            )
            assert r.usage is not None and r.usage.completion_tokens == 2
        assert (_served(gw.url, urls[0]), _served(gw.url, urls[1])) == (3, 0)
        assert verdicts()[1] == 0


def test_queue_exhaustion_drill_against_the_replicas(
    replicas: tuple[VllmServer, VllmServer], request: pytest.FixtureRequest
) -> None:
    """`headway drill queue-exhaustion`'s checks, against a gateway in front of the two
    vLLM replicas (the drill's `--target`/`--engine` mode), its load with 4-token answers:
    bounded queues refuse the overload at arrival, vLLM never preempts, nothing is lost,
    no 5xx, the clients' outcomes match the gateway's counters."""
    from headway.drill.catalog import DRILLS
    from headway.drill.run import run_drill
    from headway.drill.stack import TENANTS, RemoteStack

    drill = DRILLS["queue-exhaustion"]
    # Its load is sized for the emulated H100 (96 tokens in its 2.5 s deadline); the tiny
    # CPU engine makes 2-30 tokens/s, so at 96 every call is refused as unmeetable and
    # none is served. 4 tokens fit the deadline at the configured tpot_s (0.5 s).
    drill = msgspec.structs.replace(drill, load=msgspec.structs.replace(drill.load, max_tokens=4))
    urls = _urls(replicas)
    _idle(urls)
    config = _config(
        urls, tenants=dict(TENANTS), slots_per_upstream=drill.stack.max_num_seqs,
        queues={"critical_reserved_slots": 0, **drill.stack.gateway["queues"]},
    )  # fmt: skip
    with GatewayProcess(config) as gw:
        stack = RemoteStack([gw.url], engine_urls=urls, api_keys=list(TENANTS))
        result = asyncio.run(run_drill(drill, stack, seed=0))
    observed = {c.figure: c.observed for c in result.checks}
    _report(request, f"queue-exhaustion on vLLM: {result.status} {result.detail} {observed}")
    failed = [c for c in result.checks if not c.passed]
    assert result.status == "passed" and not failed, (result.detail, failed)
    _idle(urls)


def test_deadline_expires_drill_against_the_replicas(
    replicas: tuple[VllmServer, VllmServer], request: pytest.FixtureRequest
) -> None:
    """`headway drill deadline-expires` (seed 003's "if deadline_expires: cancel scheduler
    state and release blocks") against a gateway in front of the two vLLM replicas: its
    calls of 400 tokens (tens of seconds here) with a 1.5 s deadline are cancelled in vLLM
    at their deadline and answered 504 deadline_exceeded (or a last error event), vLLM
    ends idle, nothing is lost, the counts balance."""
    from headway.drill.catalog import DRILLS
    from headway.drill.run import run_drill
    from headway.drill.stack import TENANTS, RemoteStack

    drill = DRILLS["deadline-expires"]
    urls = _urls(replicas)
    _idle(urls)
    config = _config(urls, tenants=dict(TENANTS), **drill.stack.gateway)
    with GatewayProcess(config) as gw:
        _all_ready(gw.url, urls)
        stack = RemoteStack([gw.url], engine_urls=urls, api_keys=list(TENANTS))
        result = asyncio.run(run_drill(drill, stack, seed=0))
    observed = {c.figure: c.observed for c in result.checks}
    _report(request, f"deadline-expires on vLLM: {result.status} {result.detail} {observed}")
    failed = [c for c in result.checks if not c.passed]
    assert result.status == "passed" and not failed, (result.detail, failed)
    _idle(urls)


def test_corrupt_fingerprint_drill_against_the_replicas(
    replicas: tuple[VllmServer, VllmServer], request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """`headway drill corrupt-fingerprint` through hooks: the seed-1 replica's revision
    gets the seed-0 model's fingerprint (an artifact recorded on the wrong model, pushed
    to the gateway's config and reloaded), so vLLM's real token ids no longer match: the
    replica leaves rotation, the seed-0 one serves every call, and once the artifact is
    restored the replica passes its probes again and rejoins. Nothing lost, no 5xx, the
    counts balance. The drill's load with 4-token answers (sized, like queue-exhaustion's,
    for one CPU replica to carry it alone)."""
    from headway.drill.catalog import DRILLS
    from headway.drill.run import run_drill
    from headway.drill.stack import TENANTS, RemoteStack, read_hooks

    drill = DRILLS["corrupt-fingerprint"]
    # The catalog faults engine 2 of its three emulators; here the second of two. Its
    # restore comes at 8 s, not 4.5: each hook took 1-5 s here, and the probes (1 s
    # apart, 2 tokens from a CPU vLLM under the drill's load) need the wrong fingerprint
    # in place for a few seconds to find it (the restore also waits for the fault's hook
    # to finish, as in any drill).
    faults = [
        msgspec.structs.replace(
            f, engine=1, at_s=8.0 if f.action == "clear_engine_faults" else f.at_s
        )
        for f in drill.faults
    ]
    load = msgspec.structs.replace(drill.load, max_tokens=4)
    # The drill times the exclusion from the fault's start; through a hook the fault is
    # in place only once the hook has run (1-3.5 s here, beside two vLLMs on two cores,
    # where the reload itself answers in ~5 ms), and the drill's scrapes of the gateway
    # then lagged up to 1.6 s more on a loaded CI host: the test asserts the exclusion
    # happened (within the drill's 10 s watch) and reports how long it took.
    (exclusion,) = [e for e in drill.expect if e.figure == "excluded_within_s"]
    expect = [e for e in drill.expect if e is not exclusion]
    drill = msgspec.structs.replace(drill, faults=faults, load=load, expect=expect)
    urls = _urls(replicas)
    _idle(urls)
    revisions = ["r0", "r1"]
    config = _config(urls, tenants=dict(TENANTS), pool={
        "fingerprints": {r: _fingerprint(u) for r, u in zip(revisions, urls, strict=True)},
        "probe_max_tokens": 2, "probe_interval_s": 1.0, "probe_deadline_s": 1.0,
        "warmup_probes": 1})  # fmt: skip
    config["upstreams"] = [{"url": u, "revision": r} for u, r in zip(urls, revisions, strict=True)]
    state = tmp_path / "fingerprints"
    with GatewayProcess(config) as gw:
        assert gw.path is not None
        fingerprint_hooks.record(
            state, gateway_url=gw.url, admin_token=ADMIN, config_path=gw.path, config=config,
            revisions=revisions,
        )  # fmt: skip
        _all_ready(gw.url, urls)
        hooks = read_hooks(str(fingerprint_hooks.hooks_file(state)))
        stack = RemoteStack([gw.url], engine_urls=urls, api_keys=list(TENANTS), hooks=hooks)
        result = asyncio.run(run_drill(drill, stack, seed=0))
        wrong = _value(_metrics(gw.url), "headway_gateway_upstream_probes_total",
                       f'outcome="wrong",upstream="{urls[1]}"')  # fmt: skip
    observed = {c.figure: c.observed for c in result.checks}
    took = {e["action"]: e["took_s"] for e in result.timeline}
    _report(request, f"corrupt-fingerprint on vLLM: {result.status} {result.detail} "
            f"{observed} excluded within {result.figures.get('excluded_within_s')} s, "
            f"wrong probes {wrong}, hooks took {took}")  # fmt: skip
    failed = [c for c in result.checks if not c.passed]
    assert result.status == "passed" and not failed, (result.detail, failed)
    assert result.figures["excluded_within_s"] < math.inf, "never out of rotation"
    # The probe compared vLLM's real token ids and found them wrong, not merely that the
    # reload put the replica back to warming.
    assert wrong >= 1
    _idle(urls)


def test_kill_decode_drill_against_the_replicas(
    replicas: tuple[VllmServer, VllmServer], request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """`headway drill kill-decode`'s checks through hooks (the drill's `--target`/`--hooks`
    mode): the hook SIGKILLs every process of the seed-1 replica mid-decode and starts
    vLLM again on its port; streams under way there are cut (at most its 4 slots), other
    calls are served, nothing is lost, no 5xx, and the restarted replica passes its
    token-id fingerprint probe and is back in rotation. Last in the module: the replica
    the hooks restarted is theirs to stop."""
    from headway.drill.catalog import DRILLS
    from headway.drill.run import run_drill
    from headway.drill.stack import TENANTS, RemoteStack, read_hooks

    drill = DRILLS["kill-decode"]
    # 160 tokens are 2-4 s of this engine's steps at 4 streams: 6 calls/s would outrun
    # the 8 slots before the kill, and the one replica left for the 40-85 s vLLM takes to
    # restart builds a queue that a loaded host stretches past the calls' 30 s. At 40 the
    # replica left alone was still over its capacity on a loaded host (overload_factor
    # 1.13-1.21, TTFT p99 25 s, 2-3 of 52 calls past their 30 s: CI at 22c9fef and here);
    # 24 keep one or two streams on each replica when the kill comes.
    drill = msgspec.structs.replace(drill, load=msgspec.structs.replace(drill.load, max_tokens=24))
    urls = _urls(replicas)
    _idle(urls)
    state = tmp_path / "engines"
    victim = replicas[1]
    # The restart runs at niceness 19, below the replica left serving (10): on a GPU host a
    # restarting engine loads on a machine of its own, here its start-up (85 s on a CI
    # host, against ~40 s on a quiet one) took half of the survivor's cores while that
    # survivor held all the calls: its TTFT p99 reached 26 s and 2 of 52 calls passed
    # their 30 s (ok_fraction 0.885 < 0.9; CI at 22c9fef).
    slower = dataclasses.replace(victim.settings, nice=19)
    restart = VllmServer(victim.python, victim.model_dir, victim.log_path, slower, port=victim.port)
    engine_hooks.record(state, 1, command=restart.command(), env=victim.environment(),
                        log_path=victim.log_path, url=victim.url, pid=victim.pid)  # fmt: skip
    # tpot_s: a step is 10-50 ms at a few streams with passive OpenMP threads (the
    # module's 0.5 s predates them and would refuse every 40-token call as unmeetable).
    # eject_s and attempts as in the drill's own stack (LocalStack.gateway_config); a
    # retry budget of 20% (Finagle's and Envoy's default): one replica of two holds half
    # the calls in flight, more than the default 10% of this rate's 10 s window (at least
    # 3 retries) lets be retried: a CI run had 4 to retry, and one got a 502.
    config = _config(urls, tenants=dict(TENANTS), eject_s=2.0, tpot_s=0.05, retries={
        "max_attempts": 3, "backoff_base_s": 0.0, "backoff_max_s": 0.2,
        "budget_ratio": 0.2}, pool={
        "fingerprints": {f"r{n}": _fingerprint(u) for n, u in enumerate(urls)},
        "probe_max_tokens": 2, "probe_interval_s": 1.0, "probe_deadline_s": 1.0,
        "warmup_probes": 1})  # fmt: skip
    config["upstreams"] = [{"url": u, "revision": f"r{n}"} for n, u in enumerate(urls)]
    try:
        with GatewayProcess(config) as gw:
            _all_ready(gw.url, urls)
            hooks = read_hooks(str(engine_hooks.hooks_file(state)))
            stack = RemoteStack([gw.url], engine_urls=urls, api_keys=list(TENANTS), hooks=hooks)
            result = asyncio.run(run_drill(drill, stack, seed=0))
        took = {e["action"]: e["took_s"] for e in result.timeline}
        _report(request, f"kill-decode on vLLM: {result.status} {result.detail} "
                f"{result.figures} hooks took {took}")  # fmt: skip
        failed = [c for c in result.checks if not c.passed]
        assert result.status == "passed" and not failed, (result.detail, failed)
        assert sorted(took) == ["kill_engine", "restart_engine"]
        _idle(urls)
    finally:
        engine_hooks.stop_all(state)
