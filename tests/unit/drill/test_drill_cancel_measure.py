"""The cancel-half drill's measure: an engine that runs more requests than the gateways
have outstanding with it still holds a slot for a client that left."""

from __future__ import annotations

from headway.drill.observe import Metrics
from headway.drill.run import _engines_hold_more

A, B = "http://127.0.0.1:9001", "http://127.0.0.1:9002"


def _gateway(**outstanding: float) -> Metrics:
    lines = [
        f'headway_gateway_upstream_outstanding_requests{{upstream="{url}"}} {count}'
        for url, count in ((A, outstanding.get("a", 0)), (B, outstanding.get("b", 0)))
    ]
    return Metrics("\n".join(lines) + "\n")


def _engine(running: float, waiting: float = 0) -> Metrics:
    return Metrics(
        f'vllm:num_requests_running{{model_name="m"}} {running}\n'
        f'vllm:num_requests_waiting{{model_name="m"}} {waiting}\n'
    )


def test_an_engine_running_more_than_the_gateways_sent_holds_a_slot() -> None:
    engines = [_engine(3), _engine(1)]
    assert _engines_hold_more([_gateway(a=2, b=1)], engines, [A, B]) is True
    # Two gateways' outstanding add up.
    assert _engines_hold_more([_gateway(a=2, b=1), _gateway(a=1)], engines, [A, B]) is False


def test_waiting_requests_hold_no_slot() -> None:
    """A health probe may wait in an engine: waiting work is not a held slot."""
    assert _engines_hold_more([_gateway(a=2, b=1)], [_engine(2, 1), _engine(1)], [A, B]) is False


def test_a_dispatch_the_engine_has_not_seen_yet_is_no_hold() -> None:
    assert _engines_hold_more([_gateway(a=3, b=1)], [_engine(2), _engine(1)], [A, B]) is False


def test_engines_the_gateways_do_not_name_give_no_answer() -> None:
    other = ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    assert _engines_hold_more([_gateway(a=1)], [_engine(5), _engine(5)], other) is None
