"""Plain calls to a gateway under test on loopback (the standard library's HTTP client):
a completion as one tenant, and the parsed ``/metrics``. Shared by the e2e tests that
drive a gateway with many small calls from threads."""

from __future__ import annotations

import json
import urllib.request

from headway.drill.observe import Metrics


def metrics(url: str) -> Metrics:
    """The gateway's (or engine's) ``/metrics``, parsed."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        return Metrics(resp.read().decode())


def complete(url: str, key: str, max_tokens: int, model: str = "llama-3-8b") -> int:
    """One ``/v1/completions`` call of exactly ``max_tokens`` tokens as ``key``'s tenant;
    its HTTP status (an error status raises, as urllib does)."""
    body = {"model": model, "prompt": "queues", "max_tokens": max_tokens, "ignore_eos": True}
    request = urllib.request.Request(
        f"{url}/v1/completions", json.dumps(body).encode(),
        {"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=60) as resp:
        resp.read()
        return int(resp.status)
