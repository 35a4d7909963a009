"""``headway bench`` against a real vLLM: both endpoints, streamed and not, a trace replay.

Issue 14's defects on this path: (2) empty chunks are tokens; (4) the served prompt has the
asked number of tokens, the summary reports asked and served totals and their drift, and
the sent trace holds what the engine really got.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from headway.bench.benchmark import BenchOptions, SloOverride, TraceOptions, load_input, run_bench
from headway.bench.payloads import parse_target
from headway.bench.records import OK
from headway.core.workload.compile import compile_workload
from headway.files.workload import load_workload
from headway.realengine.server import VllmServer
from headway.trace.readers import read_trace


def _workload(tmp_path: Path, calls: int, input_tokens: str, output_tokens: int) -> Path:
    path = tmp_path / "w.yaml"
    path.write_text(
        f"name: real\nseed: 3\nduration_s: {calls / 4}\n"
        f"classes: {{c: {{input_tokens: {input_tokens}, output_tokens: {output_tokens}}}}}\n"
        "sources: [{name: s, arrivals: {process: constant, rate_per_s: 4}}]\n"
    )
    return path


@pytest.mark.parametrize(
    ("endpoint", "stream"),
    [("chat", True), ("chat", False), ("completions", True), ("completions", False)],
)
def test_bench_serves_exactly_the_asked_tokens(
    endpoint: str, stream: bool, vllm_server: VllmServer, tmp_path: Path
) -> None:
    """Every call completes with the asked prompt and output tokens (usage), no drift."""
    path = _workload(tmp_path, 4, "{dist: lognormal, mean: 60, cv: 0.8}", 6)
    bench_input = load_input(str(path), TraceOptions(), SloOverride(), None)
    options = BenchOptions(target=parse_target(vllm_server.url), endpoint=endpoint, stream=stream)  # type: ignore[arg-type]
    run = run_bench(bench_input, options)
    r, w, t = run.records, run.workload, run.result.tokens
    assert w.num_calls == 4 and (r.error == OK).all() and r.usage.all()
    assert np.array_equal(r.completion_tokens, w.call_output_tokens)
    assert np.array_equal(r.prompt_tokens, w.call_input_tokens)  # was +11 tag, +6 template
    assert t.exact_prompts and t.prompt_drift == 0.0 and t.output_drift == 0.0
    assert t.asked_prompt_tokens == t.prompt_tokens_reported == int(w.call_input_tokens.sum())
    assert run.result.warnings == []
    if stream:
        assert np.array_equal(r.token_events, r.completion_tokens)


def test_bench_counts_streamed_chunks_without_text(vllm_server: VllmServer, tmp_path: Path) -> None:
    """Sampled tokens of the tiny model include partial UTF-8 bytes and special tokens
    (about 2%: vLLM streams them as ``"content": ""``); each is one token event, so the
    count without ``usage`` equals the server's (it came out short)."""
    path = _workload(tmp_path, 4, "20", 100)
    bench_input = load_input(str(path), TraceOptions(), SloOverride(), None)
    run = run_bench(bench_input, BenchOptions(target=parse_target(vllm_server.url)))
    r = run.records
    assert (r.error == OK).all() and r.usage.all()
    assert (r.completion_tokens == 100).all()
    # One event per token, but vLLM merges the deltas of steps its API server has not yet
    # sent into one chunk (RequestOutputCollector.put, aggregate in DELTA mode): a call
    # may come out a token or two short when the engine outpaces the frontend (CI,
    # 2026-12-02: 99 of 100 once). The empty-content chunks (~2%) are all counted.
    assert (r.token_events <= r.completion_tokens).all()
    assert (r.token_events >= r.completion_tokens - 2).all(), r.token_events


def test_bench_replays_a_trace_and_writes_what_it_sent(
    vllm_server: VllmServer, tmp_path: Path
) -> None:
    """A generic trace replayed on vLLM; the sent trace has the served counts and the send
    times, and ``simulate`` replays it as it is."""
    trace = tmp_path / "t.csv"
    trace.write_text(
        "timestamp_s,input_tokens,output_tokens\n0.0,40,4\n0.3,300,3\n0.5,9,5\n1.1,120,2\n"
    )
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "headway", "bench", str(trace), "--target", vllm_server.url]
    cmd += ["--out", str(out), "--json", "--lateness-budget-ms", "1000"]  # a loaded host
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["outcomes"]["by_error"] == {"ok": 4}
    tokens = result["tokens"]
    assert tokens["asked_prompt_tokens"] == tokens["prompt_tokens_reported"] == 469
    assert tokens["asked_output_tokens"] == tokens["output_tokens"] == 14
    records = np.load(out / "records.npz")
    sent = read_trace(out / "sent-trace.jsonl")
    order = np.argsort(records["sent_s"], kind="stable")
    assert sent.input_tokens.tolist() == records["prompt_tokens"][order].tolist()
    assert sent.output_tokens.tolist() == records["completion_tokens"][order].tolist()
    sent_s = records["sent_s"][order]
    assert np.allclose(sent.arrival_s, sent_s - sent_s[0], atol=1e-6)
    assert np.allclose(sent.arrival_s, [0.0, 0.3, 0.5, 1.1], atol=0.05)  # paced as the trace
    loaded = load_workload(out / "sent-workload.yaml")
    w = compile_workload(loaded.spec, seed=1, traces=loaded.traces)
    assert w.call_input_tokens.tolist() == sent.input_tokens.tolist()
    assert w.call_output_tokens.tolist() == sent.output_tokens.tolist()
    assert np.allclose(w.task_arrival_s, sent.arrival_s, atol=1e-9)
    sim = subprocess.run(
        [sys.executable, "-m", "headway", "simulate", str(out / "sent-workload.yaml"), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert sim.returncode == 0, sim.stderr
    assert json.loads(sim.stdout)["calls"] == 4


def _prefix_counters(url: str) -> tuple[float, float]:
    """vLLM's ``vllm:prefix_cache_queries_total`` and ``…_hits_total`` (tokens)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    totals = {"vllm:prefix_cache_queries_total": 0.0, "vllm:prefix_cache_hits_total": 0.0}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in totals:
            totals[name] += float(line.rsplit(" ", 1)[1])
    return totals["vllm:prefix_cache_queries_total"], totals["vllm:prefix_cache_hits_total"]


def test_bench_replays_shared_prefixes_that_vllm_caches(
    vllm_server: VllmServer, tmp_path: Path
) -> None:
    """A Mooncake trace whose first two calls share two 512-token blocks: vLLM's prefix
    cache hits exactly those 1,024 tokens (8 of its 128-token blocks; every prompt had
    been unique), and ``simulate`` of the sent trace with vLLM's block size finds the same
    hit rate."""
    rows = [
        {"timestamp": 0, "input_length": 1100, "output_length": 3, "hash_ids": [1, 2, 900]},
        {"timestamp": 1500, "input_length": 1200, "output_length": 3, "hash_ids": [1, 2, 901]},
        {"timestamp": 3000, "input_length": 700, "output_length": 3, "hash_ids": [5, 902]},
    ]
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    queries0, hits0 = _prefix_counters(vllm_server.url)
    cmd = [sys.executable, "-m", "headway", "bench", str(trace), "--target", vllm_server.url,
           "--trace-format", "mooncake", "--out", str(out), "--json",
           "--lateness-budget-ms", "1000"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["outcomes"]["by_error"] == {"ok": 3}
    queries1, hits1 = _prefix_counters(vllm_server.url)
    assert queries1 - queries0 == 1100 + 1200 + 700
    assert hits1 - hits0 == 1024
    cluster = tmp_path / "c.yaml"
    cluster.write_text("replicas: 1\nengine: {block_size: 128, enable_prefix_caching: true}\n")
    sim_cmd = [sys.executable, "-m", "headway", "simulate", str(out / "sent-workload.yaml"),
               "--cluster", str(cluster), "--json"]  # fmt: skip
    sim = subprocess.run(sim_cmd, capture_output=True, text=True, timeout=300)
    assert sim.returncode == 0, sim.stderr
    ratio = json.loads(sim.stdout)["engine"]["prefix_hit_ratio"]
    assert ratio == pytest.approx(1024 / 3000)
