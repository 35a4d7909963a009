"""The wire format: the official ``openai`` client and bench read the same stream the same
way; bench's requests are what an OpenAI-compatible server parses."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import openai
import pytest

from headway.bench.benchmark import BenchOptions, SloOverride, TraceOptions, load_input, run_bench
from headway.bench.payloads import RequestEncoder, parse_target
from headway.core.errors import ConfigError

MockFactory = Callable[..., str]


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_openai_client_and_bench_agree(
    endpoint: str, tmp_path: Path, mock_server: MockFactory
) -> None:
    url = mock_server()
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
    if endpoint == "chat":
        stream = client.chat.completions.create(
            model="mock",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=9,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        texts = [c.choices[0].delta.content for c in chunks if c.choices]
    else:
        stream_c = client.completions.create(
            model="mock", prompt="hi", max_tokens=9, stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        chunks = list(stream_c)  # type: ignore[arg-type]
        texts = [c.choices[0].text for c in chunks if c.choices]
    client.close()
    seen_tokens = sum(1 for t in texts if t)
    usage = chunks[-1].usage
    assert usage is not None and seen_tokens == usage.completion_tokens == 9

    workload = tmp_path / "w.yaml"
    workload.write_text(
        "name: one\nduration_s: 1\nclasses: {c: {input_tokens: 5, output_tokens: 9}}\n"
        "sources: [{name: s, arrivals: {process: constant, rate_per_s: 1}}]\n"
    )
    bench_input = load_input(str(workload), TraceOptions(), SloOverride(), None)
    run = run_bench(
        bench_input,
        BenchOptions(target=parse_target(url), endpoint=endpoint),  # type: ignore[arg-type]
    )
    r = run.records
    assert r.token_events[0] == seen_tokens and r.completion_tokens[0] == usage.completion_tokens
    assert r.usage[0]


def test_requests_are_valid_http_with_openai_json_bodies() -> None:
    encoder = RequestEncoder(parse_target("http://h:8000/v1"), 'od"d%model', api_key="k%")
    raw = encoder.encode(7, 100, 33)
    head, body = raw.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /v1/chat/completions HTTP/1.1"
    assert f"Content-Length: {len(body)}" in lines and "Host: h:8000" in lines
    assert "Authorization: Bearer k%" in lines
    obj = json.loads(body)
    assert obj["model"] == 'od"d%model' and obj["max_tokens"] == 33 and obj["stream"] is True
    assert obj["stream_options"] == {"include_usage": True} and obj["ignore_eos"] is True
    words = obj["messages"][0]["content"].split()
    assert 95 <= len(words) <= 100  # about one token per word, tag included
    other = json.loads(encoder.encode(8, 100, 33).split(b"\r\n\r\n", 1)[1])
    assert other["messages"][0]["content"][:12] != obj["messages"][0]["content"][:12]


@pytest.mark.parametrize(
    ("url", "host", "port", "prefix"),
    [
        ("http://127.0.0.1:8000", "127.0.0.1", 8000, ""),
        ("http://x/v1/", "x", 80, ""),
        ("https://api.example.com/openai/v1", "api.example.com", 443, "/openai"),
    ],
)
def test_targets(url: str, host: str, port: int, prefix: str) -> None:
    t = parse_target(url)
    assert (t.host, t.port, t.prefix) == (host, port, prefix)
    assert t.path("chat") == prefix + "/v1/chat/completions"


@pytest.mark.parametrize("url", ["localhost:8000", "ftp://x", "http://:80", "http://x:99999"])
def test_bad_targets_name_the_flag(url: str) -> None:
    with pytest.raises(ConfigError, match="--target"):
        parse_target(url)
