"""schemathesis against the emulator's own OpenAPI document (``GET /openapi.json``).

Positive cases (valid by the schema) and negative ones (each breaking it somewhere) for
both generation routes, sent to a real `headway emulate` process. Checks: no 5xx, the
status and content type are among those documented, and every 4xx is OpenAI-shaped.
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
    not_a_server_error,
    status_code_conformance,
)
from schemathesis.generation import GenerationMode  # noqa: E402

from headway.emulate.process import EmulatorProcess  # noqa: E402

pytestmark = pytest.mark.timeout(120)
SCALE = max(1, int(os.environ.get("HEADWAY_FUZZ_EXAMPLES", "1")))


@pytest.fixture(scope="module")
def api_schema() -> Iterator[Any]:
    with EmulatorProcess(["--speedup", "1000", "--num-kv-blocks", "512"]) as emu:
        yield schemathesis.openapi.from_url(f"{emu.url}/openapi.json")
        assert emu.proc is not None and emu.proc.poll() is None  # still serving


# schemathesis.pytest.from_fixture does not run under pytest 9 (schemathesis 4.32):
# the operations' strategies are driven by Hypothesis directly.
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_openapi_document_holds(api_schema: Any, path: str, mode: GenerationMode) -> None:
    operation = api_schema[path]["POST"]
    statuses: list[int] = []

    @settings(deadline=None, max_examples=150 * SCALE, suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def holds(case: Any) -> None:
        response = case.call_and_validate(
            checks=[not_a_server_error, status_code_conformance, content_type_conformance]
        )
        statuses.append(response.status_code)
        if response.status_code >= 400:
            error = json.loads(response.content)["error"]
            assert set(error) == {"message", "type", "param", "code"}, error
            assert error["message"] and error["type"] == "invalid_request_error", error
        elif mode is GenerationMode.POSITIVE:
            assert response.status_code == 200

    holds()
    assert len(statuses) >= 100 * SCALE, len(statuses)  # the requests were sent
    assert any(s == (200 if mode is GenerationMode.POSITIVE else 400) for s in statuses)
