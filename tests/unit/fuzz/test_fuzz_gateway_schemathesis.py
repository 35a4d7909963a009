"""schemathesis against the gateway's own OpenAPI document (``GET /openapi.json``).

Positive cases (valid by the schema) and negative ones (each breaking it somewhere) for
both generation routes, sent with a tenant's key to a real `headway gateway` process in
front of a real `headway emulate` process, and the GET routes. Checks: no 5xx, the status
and content type are among those documented, and every 4xx is OpenAI-shaped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis.checks import (  # noqa: E402
    content_type_conformance,
    status_code_conformance,
)
from schemathesis.generation import GenerationMode  # noqa: E402

from headway.emulate.process import EmulatorProcess  # noqa: E402
from headway.gateway.process import GatewayProcess  # noqa: E402

pytestmark = pytest.mark.timeout(150)
SCALE = max(1, int(os.environ.get("HEADWAY_FUZZ_EXAMPLES", "1")))
MODEL = "llama-3-8b"
KEY = "key-schema"
SENT = {"requests": 0, "late_503": 0}


@pytest.fixture(scope="module")
def api_schema() -> Iterator[Any]:
    with EmulatorProcess(["--speedup", "50", "--num-kv-blocks", "512"]) as emu:
        config = {
            "upstreams": [{"url": emu.url}],
            "tenants": {KEY: {"name": "schema"}},
            "models": [MODEL],
            "admin_token": "admin-schema",
        }
        with GatewayProcess(config) as gw:
            yield schemathesis.openapi.from_url(f"{gw.url}/openapi.json")
            assert gw.proc is not None and gw.proc.poll() is None  # still serving
    print(  # noqa: T201 - the count for the notes (pytest -s)
        f"\ngateway schemathesis: {SENT['requests']} generated requests, "
        f"{SENT['late_503']} 503 refusals of deadlines under 50 ms, no other 5xx"
    )


def _run(operation: Any, mode: GenerationMode, examples: int) -> list[int]:
    statuses: list[int] = []

    @settings(deadline=None, max_examples=examples, suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def holds(case: Any) -> None:
        response = case.call_and_validate(
            headers={"Authorization": f"Bearer {KEY}"},
            checks=[status_code_conformance, content_type_conformance],
        )
        statuses.append(response.status_code)
        if response.status_code >= 500:
            # Only a budget of a few milliseconds (0 is a 400): the client's own budget,
            # refused as the documented overload (503), or, when the speed estimate let
            # it in, cut at its deadline in flight (504); never a crash.
            error = json.loads(response.content)["error"]
            deadline = (case.headers or {}).get("x-headway-deadline-ms", "")
            assert (response.status_code, error["type"]) in (
                (503, "overloaded_error"),
                (504, "timeout"),
            ), error
            assert error["code"] in ("deadline_unmeetable", "expired", "deadline_exceeded"), error
            assert deadline.isdigit() and 0 < int(deadline) < 50, (deadline, error)
            SENT["late_503"] += 1
        elif response.status_code >= 400:
            error = json.loads(response.content)["error"]
            assert set(error) == {"message", "type", "param", "code"}, error
            assert error["message"] and error["type"] == "invalid_request_error", error
        elif mode is GenerationMode.POSITIVE:
            assert response.status_code == 200

    holds()
    SENT["requests"] += len(statuses)
    return statuses


# schemathesis.pytest.from_fixture does not run under pytest 9 (schemathesis 4.32):
# the operations' strategies are driven by Hypothesis directly.
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_openapi_document_holds(api_schema: Any, path: str, mode: GenerationMode) -> None:
    statuses = _run(api_schema[path]["POST"], mode, 100 * SCALE)
    assert len(statuses) >= 60 * SCALE, len(statuses)  # the requests were sent
    assert any(s == (200 if mode is GenerationMode.POSITIVE else 400) for s in statuses)


@pytest.mark.parametrize("path", ["/v1/models", "/health", "/openapi.json"])
def test_get_routes_hold(api_schema: Any, path: str) -> None:
    statuses = _run(api_schema[path]["GET"], GenerationMode.POSITIVE, 5)
    assert statuses and all(s == 200 for s in statuses), statuses


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/admin/state", 401),
        ("POST", "/admin/drain", 401),
        ("POST", "/admin/reload", 401),
        ("GET", "/metrics", 403),
    ],
)
def test_tenant_keys_are_refused_off_the_api(
    api_schema: Any, method: str, path: str, status: int
) -> None:
    """A tenant's key opens neither the admin API (401) nor the metrics (403); either
    refusal is documented and OpenAI-shaped."""
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        if mode is GenerationMode.NEGATIVE and method == "GET":
            continue  # nothing in a GET without parameters to break
        statuses = _run(api_schema[path][method], mode, 10)
        assert statuses and all(s == status for s in statuses), statuses
