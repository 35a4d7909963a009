"""`openai` clients that are closed after the test that made them.

An unclosed client leaves its keep-alive socket to the garbage collector, whose
ResourceWarning then fails whichever later test it runs in (seen twice on CI).
"""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

__all__ = ["close_openai_clients", "openai_client"]

_OPEN: list[openai.OpenAI] = []


def openai_client(url: str, key: str, timeout_s: float | None = None) -> openai.OpenAI:
    """A client of the server at ``url`` (no retries; ``timeout_s`` None: the client's
    default), closed when the test ends."""
    if timeout_s is None:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    else:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0,
                               timeout=timeout_s)  # fmt: skip
    _OPEN.append(client)
    return client


@pytest.fixture(autouse=True)
def close_openai_clients() -> Iterator[None]:
    """Close the clients the test made."""
    yield
    while _OPEN:
        _OPEN.pop().close()
