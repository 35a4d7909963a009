"""A started emulator and gateways (without a pool; with a pool and ``--redis``) expose on
``/metrics`` exactly the metric families that ``headway.metrics_catalog`` declares for
them, with the declared kinds and label names, as prometheus_client's latest text format,
after a request went through each (so the request path updated its series)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from headway.emulate.process import EmulatorProcess
from headway.gateway.process import GatewayProcess
from headway.metrics_catalog import EMULATOR, MetricSpec, gateway_specs

MODEL = "llama-3-8b"
KEY = "key-meter"
TOKEN = "metrics-token-1"


@pytest.fixture(scope="module")
def emulator() -> Iterator[str]:
    with EmulatorProcess(["--speedup", "50"]) as emu:
        yield emu.url


def _scrape(url: str, token: str | None = None) -> tuple[str, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"{url}/metrics", headers=headers)
    with urllib.request.urlopen(request, timeout=10) as resp:
        return resp.headers["Content-Type"], resp.read().decode()


def _complete(url: str, key: str) -> int:
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 3}
    request = urllib.request.Request(
        f"{url}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as error:
        return error.code


def _answered(url: str, key: str, within_s: float = 20.0) -> None:
    """One request answered 200 (a pool admits none before its warm-up probes pass)."""
    end = time.monotonic() + within_s
    while (status := _complete(url, key)) != 200:
        assert time.monotonic() < end, f"no 200 within {within_s:g} s (last {status})"


def _check(content_type: str, text: str, specs: tuple[MetricSpec, ...]) -> None:
    assert content_type == CONTENT_TYPE_LATEST
    types = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            types[name] = kind
    assert types == {s.name: s.kind for s in specs}
    by_name = {s.name: s for s in specs}
    for family in text_string_to_metric_families(text):
        # the parser drops a counter's _total; put it back to find the declaration
        spec = by_name[family.name + ("_total" if family.type == "counter" else "")]
        for sample in family.samples:
            labels = set(sample.labels) - {"le"}
            assert labels == set(spec.labels), (sample, spec.labels)
            if spec.kind == "histogram":
                suffix = sample.name.removeprefix(spec.name)
                assert suffix in ("_bucket", "_sum", "_count"), sample.name


def test_emulator_exposes_its_declared_families(emulator: str) -> None:
    assert _complete(emulator, "any") == 200
    content_type, text = _scrape(emulator)
    _check(content_type, text, EMULATOR)
    assert f'vllm:generation_tokens_total{{model_name="{MODEL}"}} ' in text


@pytest.mark.parametrize("pool", [False, True], ids=["static", "pool-and-redis"])
def test_gateway_exposes_its_declared_families(emulator: str, pool: bool) -> None:
    upstream = {"url": emulator, "revision": "r1", "model": MODEL} if pool else {"url": emulator}
    config = {
        "upstreams": [upstream],
        "tenants": {KEY: {"name": "meter"}},
        "metrics_token": TOKEN,
        **({"pool": {}} if pool else {}),
    }
    args = ("--redis", "redis://127.0.0.1:1") if pool else ()  # unreachable: local shares
    with GatewayProcess(config, args=args) as gateway:
        _answered(gateway.url, KEY)
        content_type, text = _scrape(gateway.url, TOKEN)
    _check(content_type, text, gateway_specs(pool=pool, shared_budgets=pool))
    assert 'headway_gateway_completed_total{tenant="meter"} 1.0' in text
