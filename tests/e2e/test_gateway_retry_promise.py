"""Retry-After is a promise for non-streamed traffic under default settings (issue 15,
defect 5): a real gateway with its default settings in front of two real emulators on
loopback, offered 2.5× their capacity of non-streamed calls by clients that obey
``x-headway-retry-after-ms`` and send their ticket. At 3c8fc1a no speed was measured from
whole answers, so no deadline was checked at arrival: calls waited in the queue until
their deadline and were refused ``expired``, and first retries failed."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "gateway_attack.py"


def _benchmark() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gateway_attack", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_non_streamed_retries_keep_their_promise_at_2_5x_overload() -> None:
    figures = _benchmark().retry_promise(seconds=15.0, overload=2.5, capacity_s=4.0)
    assert figures["retry_promise_retried"] >= 20, figures
    # Issue 15's targets, both met: 0.99 and 0.0003 over 40 s (0.56 and 0.41 at 3c8fc1a;
    # 0.70 and 0.0 while promises were capped at 60 s and timed at the rate a queue fed by
    # retries measured).
    assert figures["first_retry_success_nonstreamed"] >= 0.9, figures
    assert figures["held_to_deadline_fraction"] <= 0.01, figures
    assert figures["retry_promise_states"].get("ok", 0) > 0.9 * figures["retry_promise_calls"]
