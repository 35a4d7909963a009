"""Ports for servers that restart (issue 16, defect 19: a drill's engine restart met
"address already in use" when an outgoing connection had taken its ephemeral port)."""

from __future__ import annotations

import socket

import pytest

from headway import loopback
from headway.loopback import _ephemeral_low, free_port


def test_a_free_port_lies_below_the_ephemeral_range_and_binds() -> None:
    ports = {free_port() for _ in range(20)}
    low = _ephemeral_low()
    assert all(20_000 <= p < low for p in ports), sorted(ports)
    assert len(ports) > 1  # random, so parallel workers do not pick the same one
    port = ports.pop()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_a_port_taken_by_a_listener_is_not_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", free_port()))
        held.listen()
        taken = held.getsockname()[1]
        # The draw offers the taken port first: it must be skipped for the next one.
        monkeypatch.setattr(loopback.random, "sample", lambda seq, k: [taken, *seq[:k]])
        port = free_port()
        assert port != taken and port < _ephemeral_low()
