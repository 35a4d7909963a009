"""The readiness fingerprint's logprob checksum (issue 20, deliverable 3): token ids equal
and the greedy logprob sum within its tolerance pass; a drifted sum is wrong and names
the numerical format; a malformed checksum is a config error naming the field."""

from __future__ import annotations

import json

import pytest

from headway.core.errors import ConfigError
from headway.gateway.pool import PoolUpstreamConfig
from headway.gateway.probe import judge, logprob_checksum, token_ids_fingerprint


def _answer(logprobs: list[float] | None) -> bytes:
    choice: dict[str, object] = {"text": "ok", "prompt_token_ids": [5, 9], "token_ids": [17, 3]}
    choice["logprobs"] = None if logprobs is None else {"token_logprobs": logprobs}
    return json.dumps({"choices": [choice]}).encode()


def test_the_checksum_passes_within_its_tolerance_and_drift_is_wrong() -> None:
    expected = token_ids_fingerprint([5, 9], [17, 3], [-1.25, -2.0])
    assert expected == "token_ids:5,9/17,3;logprob_sum:-3.250000"
    assert judge(200, _answer([-1.25, -2.0]), expected).outcome == "pass"
    assert judge(200, _answer([-1.26, -2.01]), expected).outcome == "pass"
    drifted = judge(200, _answer([-1.5, -2.0]), expected)
    assert (drifted.outcome, drifted.reason) == ("wrong", "fingerprint mismatch")
    assert "logprob sum -3.500000 vs -3.250000" in drifted.detail
    assert "numerical format" in drifted.detail
    tight = expected + "~0.001"
    assert judge(200, _answer([-1.26, -2.01]), tight).outcome == "wrong"


def test_other_token_ids_are_wrong_before_the_sum_is_read() -> None:
    expected = token_ids_fingerprint([5, 9], [17, 4], [-1.25, -2.0])
    result = judge(200, _answer([-1.25, -2.0]), expected)
    assert result.outcome == "wrong" and "17,4" in result.detail


def test_an_engine_that_ignores_logprobs_is_malformed() -> None:
    expected = token_ids_fingerprint([5, 9], [17, 3], [-1.0])
    result = judge(200, _answer(None), expected)
    assert (result.outcome, result.reason) == ("wrong", "malformed probe answer")
    assert "logprobs" in result.detail


def test_plain_token_id_fingerprints_are_unchanged() -> None:
    assert logprob_checksum("token_ids:5,9/17,3") is None
    assert judge(200, _answer(None), "token_ids:5,9/17,3").outcome == "pass"


def test_a_malformed_checksum_names_the_field_and_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"upstreams\[\]\.fingerprint.*logprob_sum"):
        PoolUpstreamConfig(url="http://127.0.0.1:1", fingerprint="token_ids:5/7;logprob_sum:x")
    ok = PoolUpstreamConfig(
        url="http://127.0.0.1:1", fingerprint="token_ids:5/7;logprob_sum:-1~0.1"
    )
    assert ok.fingerprint is not None
