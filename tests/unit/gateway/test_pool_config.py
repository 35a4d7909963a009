"""The upstream pool's config, probe verdicts, metrics parsing and state machine: pure
parts, no network."""

from __future__ import annotations

import json
from typing import Any

import pytest

from headway.core.errors import ConfigError
from headway.emulate.tokens import fingerprint
from headway.gateway.pool import (
    NOMINAL_KV_BLOCKS,
    PoolConfig,
    PoolConfigError,
    PoolUpstreamConfig,
    Upstream,
    UpstreamPool,
    parse_pool_config,
)
from headway.gateway.probe import (
    DEFAULT_PROBE_PROMPT,
    ProbeResult,
    fingerprint_digest,
    judge,
    parse_engine_metrics,
    token_ids_fingerprint,
)

URL = "http://127.0.0.1:8000"
VOCAB = 128256  # llama-3-8b


def _config(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"upstreams": [{"url": URL, "revision": "r1", "model": "llama-3-8b"}]}
    data.update(overrides)
    return data


# ----------------------------------------------------------------------------- config


def test_defaults_and_model_fingerprint() -> None:
    cfg = parse_pool_config(_config())
    assert cfg.probe_deadline_s <= cfg.probe_interval_s
    expected = fingerprint("r1", DEFAULT_PROBE_PROMPT, cfg.probe_max_tokens, VOCAB)
    assert cfg.expected_fingerprint(cfg.upstreams[0]) == expected


def test_fingerprint_sources_in_order() -> None:
    cfg = parse_pool_config(
        {
            "upstreams": [
                {"url": "http://a:1", "revision": "r1", "fingerprint": " own"},
                {"url": "http://b:1/", "revision": "r1"},
                {"url": "http://c:1", "revision": "r2", "model": "llama-3-8b"},
            ],
            "fingerprints": {"r1": "sha256:" + "ab" * 32, "r2": " by revision"},
        }
    )
    got = [cfg.expected_fingerprint(u) for u in cfg.upstreams]
    assert got == [" own", "sha256:" + "ab" * 32, " by revision"]
    assert UpstreamPool(cfg).upstreams[1].url == "http://b:1"  # trailing slash dropped


@pytest.mark.parametrize(
    ("data", "names"),
    [
        ({"upstreams": []}, ["upstreams", "at least one"]),
        (_config(probe_interval_s=0), ["probe_interval_s", "got 0", "> 0"]),
        (_config(probe_deadline_s=3.0, probe_interval_s=1.0), ["probe_deadline_s", "at most"]),
        (_config(metrics_deadline_s=2.0), ["metrics_deadline_s", "at most"]),
        (_config(probe_max_tokens=0), ["probe_max_tokens", "1..256"]),
        (_config(warmup_probes=0), ["warmup_probes", ">= 1"]),
        (_config(unreachable_after_probes=0), ["unreachable_after_probes"]),
        (_config(probe_prompt=""), ["probe_prompt"]),
        (_config(probe_interval_s=float("nan")), ["probe_interval_s"]),
        ({"upstreams": [{"url": "localhost:8000", "model": "llama-3-8b", "revision": "r1"}]},
         ["upstreams[].url", "localhost:8000", "http://"]),
        ({"upstreams": [{"url": URL + "/v1", "model": "llama-3-8b", "revision": "r1"}]},
         ["upstreams[].url", "/v1"]),
        ({"upstreams": [{"url": URL, "model": "llama-3-8b"}]},
         ["upstreams[].revision", "--revision"]),
        ({"upstreams": [{"url": URL, "model": "no-such-model", "revision": "r1"}]},
         ["upstreams[].model", "no-such-model", "known models"]),
        ({"upstreams": [{"url": URL, "revision": "r1"}]},
         ["upstreams[0].fingerprint", "fails closed", "fingerprints[REVISION]"]),
        ({"upstreams": [{"url": URL, "fingerprint": "sha256:xyz"}]},
         ["upstreams[].fingerprint", "64 hex"]),
        ({"upstreams": [{"url": URL, "fingerprint": "token_ids:1,2"}]},
         ["upstreams[].fingerprint", "token_ids:1,2", "a slash"]),
        ({"upstreams": [{"url": URL, "fingerprint": "token_ids:1,x/3"}]},
         ["upstreams[].fingerprint", "comma-separated"]),
        ({"upstreams": [{"url": URL, "fingerprint": " a", "kv_blocks": 0}]},
         ["upstreams[].kv_blocks", "got 0"]),
        ({"upstreams": [{"url": URL, "fingerprint": " a"},
                        {"url": URL + "/", "fingerprint": " a"}]},
         ["upstreams[1].url", "once"]),
        (_config(probe_every_s=1), ["probe_every_s"]),
        (_config(probe_interval_s="fast"), ["probe_interval_s", "float"]),
    ],
)  # fmt: skip
def test_bad_config_names_field_value_and_fix(data: dict[str, Any], names: list[str]) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_pool_config(data, "gateway.yaml")
    message = str(caught.value)
    assert message.startswith("gateway.yaml: ")
    for name in names:
        assert name in message, message


def test_direct_construction_raises_pool_config_error() -> None:
    up = PoolUpstreamConfig(url=URL, fingerprint=" a")
    with pytest.raises(PoolConfigError, match="probe_deadline_s"):
        PoolConfig(upstreams=(up,), probe_interval_s=0.1, probe_deadline_s=0.2)


# ----------------------------------------------------------------------------- verdicts


def _answer(text: object) -> bytes:
    return json.dumps({"choices": [{"text": text, "finish_reason": "length"}]}).encode()


def test_judge_tells_busy_from_wrong() -> None:
    assert judge(200, _answer(" a b"), " a b").outcome == "pass"
    assert judge(200, _answer(" a b"), fingerprint_digest(" a b")).outcome == "pass"
    wrong = judge(200, _answer(" a c"), " a b")
    assert (wrong.outcome, wrong.reason) == ("wrong", "fingerprint mismatch")
    assert "' a b'" in wrong.detail and "' a c'" in wrong.detail
    digest = judge(200, _answer(" a c"), fingerprint_digest(" a b"))
    assert digest.outcome == "wrong" and "sha256:" in digest.detail
    for status in (429, 503, 504):
        assert judge(status, b"overloaded", " a b").outcome == "busy"
    refused = judge(404, b'{"error": "model"}', " a b")
    assert refused.outcome == "wrong" and "HTTP 404" in refused.reason
    assert judge(500, b"", " a b").outcome == "error"
    assert judge(200, b"not json", " a b").reason == "malformed probe answer"
    assert judge(200, _answer(None), " a b").reason == "malformed probe answer"
    assert judge(200, b'{"choices": []}', " a b").outcome == "wrong"


def _ids_answer(prompt_ids: object, ids: object, text: str = " a b") -> bytes:
    choice = {"text": text, "prompt_token_ids": prompt_ids, "token_ids": ids}
    return json.dumps({"choices": [choice]}).encode()


def test_judge_compares_token_ids_not_text() -> None:
    """A token-id fingerprint tells apart answers whose text agrees (another tokenizer
    or weights) and is wrong, not passed, when the engine returns no ids."""
    expected = token_ids_fingerprint([5, 9], [17, 3])
    assert expected == "token_ids:5,9/17,3"
    assert judge(200, _ids_answer([5, 9], [17, 3]), expected).outcome == "pass"
    other = judge(200, _ids_answer([6, 9], [17, 3]), expected)  # same text, prompt ids differ
    assert (other.outcome, other.reason) == ("wrong", "fingerprint mismatch")
    assert "token_ids:6,9/17,3" in other.detail
    assert judge(200, _ids_answer([5, 9], [17, 4]), expected).reason == "fingerprint mismatch"
    no_ids = judge(200, _answer(" a b"), expected)
    assert no_ids.reason == "malformed probe answer" and "return_token_ids" in no_ids.detail
    assert judge(200, _ids_answer([5, 9], ["17"]), expected).reason == "malformed probe answer"
    assert judge(200, _ids_answer([5, 9], [17, 3]), " a b").outcome == "pass"  # text as before


VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:cache_config_info{block_size="16",cache_dtype="auto",num_gpu_blocks="2048"} 1.0
vllm:prompt_tokens_total{model_name="m"} 1e+06
"""


def test_parse_vllm_metrics() -> None:
    m = parse_engine_metrics(VLLM_METRICS)
    assert (m.running_requests, m.waiting_requests) == (5, 4)
    assert m.kv_usage_fraction == 0.25
    assert m.kv_blocks_total == 2048
    old = parse_engine_metrics('vllm:gpu_cache_usage_perc{model_name="m"} 0.5\n')
    assert old.kv_usage_fraction == 0.5 and old.running_requests is None
    assert (
        parse_engine_metrics("garbage\nvllm:num_requests_running oops\n").running_requests is None
    )


# ----------------------------------------------------------------------------- health moves


def _upstream() -> Upstream:
    return Upstream(PoolUpstreamConfig(url=URL, revision="r1", fingerprint=" a"), " a")


def _state(u: Upstream) -> str:
    """Its state, read through a call (a property read twice narrows in mypy)."""
    return u.state


def _ready(u: Upstream) -> bool:
    return u.ready


PASS = ProbeResult("pass")
WRONG = ProbeResult("wrong", "fingerprint mismatch")
BUSY = ProbeResult("busy", "timeout after 0.5 s")
ERROR = ProbeResult("error", "connection refused")


def _feed(u: Upstream, *results: ProbeResult) -> list[str]:
    states: list[str] = []
    for r in results:
        u._apply_probe(r, 0.0, warmup=2, limit=3)
        states.append(u.state)
    return states


def test_warmup_busy_and_exclusion() -> None:
    u = _upstream()
    assert not _ready(u) and _state(u) == "warming"
    assert _feed(u, PASS, BUSY, PASS) == ["warming", "warming", "ready"]  # busy: no reset
    assert _feed(u, BUSY, BUSY) == ["busy", "busy"]
    assert _ready(u) and u.busy and u.reason.startswith("busy: timeout")
    assert _feed(u, PASS) == ["ready"] and u.busy_probes == 0
    assert _feed(u, WRONG) == ["excluded"] and not _ready(u) and u.reason == "fingerprint mismatch"
    assert _feed(u, BUSY, BUSY) == ["excluded", "excluded"]  # busy never re-admits
    assert _feed(u, PASS, PASS) == ["warming", "ready"]


def test_unreachable_after_n_failures_then_warmup() -> None:
    u = _upstream()
    _feed(u, PASS, PASS)
    assert _feed(u, ERROR, ERROR) == ["ready", "ready"]
    assert _feed(u, ERROR) == ["unreachable"] and not _ready(u)
    assert u.reason == "unreachable: connection refused"
    assert _feed(u, PASS, PASS) == ["warming", "ready"]


def test_load_view_counters_and_metrics() -> None:
    u = Upstream(PoolUpstreamConfig(url=URL, fingerprint=" a", kv_blocks=1000), " a")
    assert u.free_kv_blocks == 1000
    u.started(300)
    u.started(200)
    assert (u.outstanding_requests, u.outstanding_tokens) == (2, 500)
    u._apply_metrics(parse_engine_metrics(VLLM_METRICS), 1.0)
    assert u.outstanding_requests == 9  # the engine sees more than this gateway sent
    assert u.waiting_requests == 4
    assert u.free_kv_blocks == round(0.75 * 2048)  # the engine's block count wins
    u.finished(300)
    u.finished(200)
    u.finished(10)  # never below zero
    assert (u.inflight_requests, u.outstanding_tokens) == (0, 0)
    bare = _upstream()
    bare._apply_metrics(parse_engine_metrics("vllm:kv_cache_usage_perc 0.1\n"), 1.0)
    assert bare.free_kv_blocks == round(0.9 * NOMINAL_KV_BLOCKS)


def test_drain_and_undrain_without_network() -> None:
    pool = UpstreamPool(parse_pool_config(_config()))
    u = pool.upstreams[0]
    _feed(u, PASS, PASS)
    pool._ready_cache.clear()
    assert pool.ready_for("r1") == [u] and pool.ready_for("r2") == []
    seen: list[str] = []
    pool.subscribe(lambda up: seen.append(up.state))
    pool.drain(URL + "/", 5.0)
    assert pool.ready_for(None) == [] and _state(u) == "draining" and u.drained
    u.started(10)
    assert u.inflight_requests == 1  # not drained yet
    pool.undrain(URL)
    assert _state(u) == "warming" and not _ready(u)  # re-admitted only after the warm-up
    assert seen == ["draining", "warming"]
    with pytest.raises(KeyError, match=r"known: http://127\.0\.0\.1:8000"):
        pool.drain("http://elsewhere:1", 1.0)
    with pytest.raises(ValueError, match="deadline_s"):
        pool.drain(URL, -1.0)
    snap = pool.state()
    assert snap["upstreams"][0]["inflight_requests"] == 1
    assert json.loads(json.dumps(snap)) == snap
    states = pool.metric_series()["headway_gateway_upstream_state"]()
    assert ((URL, "warming"), 1.0) in states and ((URL, "ready"), 0.0) in states
