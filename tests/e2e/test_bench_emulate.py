"""``headway bench`` against ``headway emulate``: the engine model behind real HTTP."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from headway.bench.benchmark import BenchOptions, SloOverride, TraceOptions, load_input, run_bench
from headway.bench.payloads import parse_target
from headway.bench.records import OK


@pytest.fixture
def emulator() -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "headway", "emulate", "--port", "0", "--speedup", "50"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"http://[\d.]+:\d+", line)
    assert match, f"emulate did not say where it serves: {line!r}"
    yield match.group(0)
    proc.terminate()
    proc.communicate(timeout=10)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_bench_reads_the_emulators_streams(endpoint: str, tmp_path: Path, emulator: str) -> None:
    workload = tmp_path / "w.yaml"
    workload.write_text(
        "name: emu\nseed: 4\nduration_s: 1\n"
        "classes: {c: {input_tokens: {dist: lognormal, mean: 200, cv: 0.5},"
        " output_tokens: {dist: lognormal, mean: 40, cv: 0.5}}}\n"
        "sources: [{name: s, arrivals: {process: poisson, rate_per_s: 10}}]\n"
    )
    bench_input = load_input(str(workload), TraceOptions(), SloOverride(), None)
    options = BenchOptions(target=parse_target(emulator), endpoint=endpoint)  # type: ignore[arg-type]
    run = run_bench(bench_input, options)
    r, w = run.records, run.workload
    assert w.num_calls > 0 and (r.error == OK).all()
    # ignore_eos: the engine produces exactly max_tokens; usage reports them; one per event.
    assert np.array_equal(r.completion_tokens, w.call_output_tokens) and r.usage.all()
    assert np.array_equal(r.token_events, r.completion_tokens)
    assert (r.prompt_tokens >= w.call_input_tokens * 0.8).all()
    assert (r.first_token_s > r.sent_s).all() and (r.end_s >= r.last_token_s).all()


def test_bench_checks_littles_law_at_the_client(tmp_path: Path) -> None:
    """Issue 19, result 1 (bench's own measurements): the senders' live count of calls on
    the wire, sampled every 50 ms, against λW from the records over the same span (calls
    of about a second: an engine at real speed)."""
    from headway.emulate.process import EmulatorProcess

    workload = tmp_path / "w.yaml"
    workload.write_text(
        "name: emu\nseed: 5\nduration_s: 3\n"
        "classes: {c: {input_tokens: 200, output_tokens: {dist: lognormal, mean: 40, cv: 0.5}}}\n"
        "sources: [{name: s, arrivals: {process: poisson, rate_per_s: 10}}]\n"
    )
    bench_input = load_input(str(workload), TraceOptions(), SloOverride(), None)
    with EmulatorProcess(["--speedup", "1"]) as emulator:
        run = run_bench(bench_input, BenchOptions(target=parse_target(emulator.url)))
    little = run.result.little
    assert little is not None and little.mean_in_system > 3, little
    assert little.relative_mismatch < 0.05, little
