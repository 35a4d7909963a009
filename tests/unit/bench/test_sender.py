"""Loopback runs against the mock server: records, errors, timeouts, agent tasks, workers."""

from __future__ import annotations

import itertools
import socket
from collections.abc import Callable
from pathlib import Path

import numpy as np
import yaml

from headway.bench.benchmark import (
    BenchOptions,
    SloOverride,
    TraceOptions,
    load_input,
    run_bench,
)
from headway.bench.payloads import parse_target
from headway.bench.records import CONNECT, ERRORS, OK, STATUS, TIMEOUT
from headway.bench.sender import SendSettings

MockFactory = Callable[..., str]


def _workload(tmp_path: Path, **overrides: object) -> str:
    data: dict[str, object] = {
        "name": "t",
        "seed": 3,
        "duration_s": 0.5,
        "classes": {
            "chat": {"input_tokens": 20, "output_tokens": 12, "slo": {"ttft_s": 10.0}},
        },
        "sources": [{"name": "u", "arrivals": {"process": "constant", "rate_per_s": 40}}],
    }
    data.update(overrides)
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _run(path: str, url: str, **options: object):  # type: ignore[no-untyped-def]
    bench_input = load_input(path, TraceOptions(), SloOverride(), None)
    return run_bench(bench_input, BenchOptions(target=parse_target(url), **options))  # type: ignore[arg-type]


def test_constant_run_records_every_call(tmp_path: Path, mock_server: MockFactory) -> None:
    run = _run(_workload(tmp_path), mock_server())
    r, res = run.records, run.result
    assert run.workload.num_calls == 20
    assert (r.error == OK).all() and (r.status == 200).all()
    assert (r.completion_tokens == 12).all() and r.usage.all() and (r.token_events == 12).all()
    # Constant arrivals are evenly spaced: 25 ms apart.
    assert np.allclose(np.diff(np.sort(r.scheduled_s)), 0.025)
    order = ("scheduled_s", "sent_s", "first_byte_s", "first_token_s", "last_token_s", "end_s")
    for a, b in itertools.pairwise(order):
        assert (getattr(r, b) >= getattr(r, a)).all(), (a, b)
    assert res.model == "mock"
    assert res.slo.attainment == 1.0 and res.outcomes.by_error == {"ok": 20}
    assert res.tokens.output_tokens == 240 and res.tokens.from_usage == 1.0


def test_refused_statuses_count_against_attainment(
    tmp_path: Path, mock_server: MockFactory
) -> None:
    url = mock_server("--status", "429", "--status-every", "2")
    run = _run(_workload(tmp_path), url)
    r = run.records
    assert (r.error == STATUS).sum() == 10 and (r.status == 429).sum() == 10
    assert run.result.slo.attainment == 0.5
    assert run.result.outcomes.by_status == {"200": 10, "429": 10}


def test_silent_server_times_out(tmp_path: Path, mock_server: MockFactory) -> None:
    url = mock_server("--ttft-ms", "3000")
    path = _workload(tmp_path, duration_s=0.1)
    run = _run(path, url, send=SendSettings(read_timeout_s=0.3))
    assert (run.records.error == TIMEOUT).all()
    assert run.result.slo.attainment == 0.0


def test_refused_connections_fail_fast(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = _run(_workload(tmp_path), f"http://127.0.0.1:{port}", model="m")
    assert (run.records.error == CONNECT).all()
    assert run.result.outcomes.by_error["connect"] == 20


def test_agent_steps_follow_the_previous_call_plus_tool_time(
    tmp_path: Path, mock_server: MockFactory
) -> None:
    classes = {
        "agent": {
            "calls": 3,
            "tools_per_call": 1,
            "tool_latency_s": {"dist": "fixed", "value": 0.05},
            "input_tokens": 10,
            "output_tokens": 5,
            "slo": {"task_deadline_s": 5.0},
        }
    }
    sources = [{"name": "u", "arrivals": {"process": "constant", "rate_per_s": 10}}]
    run = _run(_workload(tmp_path, classes=classes, sources=sources), mock_server())
    w, r = run.workload, run.records
    assert (r.error == OK).all()
    for task in range(w.num_tasks):
        first = int(w.task_first_call[task])
        assert abs(r.scheduled_s[first] - w.task_arrival_s[task]) < 1e-6
        for j in range(first + 1, first + 3):
            assert r.scheduled_s[j] >= r.end_s[j - 1] + 0.05 - 1e-9
            assert r.sent_s[j] >= r.scheduled_s[j]
    assert run.result.slo.task_attainment == 1.0


def test_two_workers_send_every_call_once(tmp_path: Path, mock_server: MockFactory) -> None:
    run = _run(_workload(tmp_path), mock_server(), workers=2)
    assert run.result.cost.workers == 2
    assert (run.records.error == OK).all()
    assert np.isfinite(run.records.sent_s).all()
    assert ERRORS[OK] == "ok"


def test_poisson_counts_are_random_and_gaps_exponential(tmp_path: Path) -> None:
    path = _workload(
        tmp_path,
        duration_s=200,
        sources=[{"name": "u", "arrivals": {"process": "poisson", "rate_per_s": 50}}],
    )
    from headway.bench.benchmark import compile_input

    bench_input = load_input(path, TraceOptions(), SloOverride(), None)
    counts = {compile_input(bench_input, 1.0, seed).num_calls for seed in range(4)}
    assert len(counts) > 1  # a free-running process: the count is not fixed
    w = compile_input(bench_input, 1.0, 0)
    gaps = np.diff(w.task_arrival_s)
    assert abs(gaps.std() / gaps.mean() - 1) < 0.05
