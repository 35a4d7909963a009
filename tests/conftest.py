"""Test settings: the Hypothesis profile (a smaller one under CI), the log scan that
fails a test whose servers wrote a configured secret (``tests/log_secrets.py``), and a
collection after each network test so a leaked socket fails that test (``tests/leaks.py``)."""

from __future__ import annotations

import os

from hypothesis import settings

from leaks import collect_after_network_tests
from log_secrets import (
    no_secrets_in_module_server_logs,
    no_secrets_in_server_logs,
    no_secrets_in_session_server_logs,
)
from openai_clients import close_openai_clients

__all__ = [
    "close_openai_clients",
    "collect_after_network_tests",
    "no_secrets_in_module_server_logs",
    "no_secrets_in_server_logs",
    "no_secrets_in_session_server_logs",
]

settings.register_profile("ci", max_examples=60, deadline=None)
settings.register_profile("dev", max_examples=100, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") == "true" else "dev")
