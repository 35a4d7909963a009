"""``headway bench`` end to end: a real mock server on a free port, the CLI as a process."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from headway.loopback import free_port

WORKLOAD = """\
name: e2e
seed: 5
duration_s: 1
classes:
  chat:
    input_tokens: 16
    output_tokens: 8
    slo: {ttft_s: 5.0}
sources:
  - name: users
    arrivals: {process: constant, rate_per_s: 50}
"""


@pytest.fixture
def server() -> Iterator[Callable[..., str]]:
    procs: list[subprocess.Popen[str]] = []

    def start(*flags: str) -> str:
        proc = subprocess.Popen(
            [sys.executable, "-m", "headway.bench.mock_server", "--port", "0", *flags],
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        assert proc.stdout is not None
        return f"http://127.0.0.1:{json.loads(proc.stdout.readline())['port']}"

    yield start
    for proc in procs:
        proc.terminate()
        proc.communicate(timeout=10)


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "headway", "bench", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_run_writes_json_html_and_records(tmp_path: Path, server: Callable[..., str]) -> None:
    workload = tmp_path / "w.yaml"
    workload.write_text(WORKLOAD)
    out = tmp_path / "out"
    done = _bench(
        "--target", server(), str(workload), "--out", str(out), "--json",
        "--lateness-budget-ms", "5000", "--min-rate-ratio", "0.5",  # a busy CI machine
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["schema"] == "headway.bench/1" and result["passed"] is True
    assert result["pacing"]["sent_calls"] == 50 and result["slo"]["attainment"] == 1.0
    assert json.loads((out / "bench.json").read_text()) == result
    assert "<svg" in (out / "bench.html").read_text()
    with np.load(out / "records.npz") as records:
        assert records["scheduled_s"].shape == (50,) and (records["status"] == 200).all()
        assert (records["completion_tokens"] == 8).all() and "task_class" in records


def test_missed_budget_exits_1(tmp_path: Path, server: Callable[..., str]) -> None:
    workload = tmp_path / "w.yaml"
    workload.write_text(WORKLOAD)
    done = _bench("--target", server(), str(workload), "--lateness-budget-ms", "0.000001")
    assert done.returncode == 1, done.stderr
    assert "FAILED" in done.stdout


def test_a_run_where_no_call_got_through_exits_1(tmp_path: Path) -> None:
    """Every call refused (nothing listens on the port): it used to pass, exit 0."""
    workload = tmp_path / "w.yaml"
    workload.write_text(WORKLOAD)
    closed = f"http://127.0.0.1:{free_port()}"
    done = _bench("--target", closed, "--model", "m", str(workload), "--json")
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["outcomes"]["by_error"] == {"connect": 50, "ok": 0}
    line = done.stderr.strip().splitlines()[-1]
    assert line == (
        f"headway: error: no call got through: 50 of 50 failed (50 connect); is {closed} "
        "up and serving m?"
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--load", "-1"], "--load must be > 0"),
        (["--target", "localhost:1"], "--target must be an http(s) URL"),
        (["--slo-target", "2"], "--slo-target must be in (0, 1]"),
    ],
)
def test_bad_input_exits_2_naming_the_flag(tmp_path: Path, flags: list[str], message: str) -> None:
    workload = tmp_path / "w.yaml"
    workload.write_text(WORKLOAD)
    args = ["--target", "http://127.0.0.1:9", str(workload), *flags]
    done = _bench(*args)
    assert done.returncode == 2 and message in done.stderr


def test_trace_replay_scales_and_crops(tmp_path: Path, server: Callable[..., str]) -> None:
    trace = tmp_path / "t.csv"
    times = [0.0, 0.4, 0.5, 1.0, 1.2, 2.0, 3.0]
    trace.write_text(
        "timestamp_s,input_tokens,output_tokens\n"
        + "".join(f"{t},{10 + i},{3 + i}\n" for i, t in enumerate(times))
    )
    out = tmp_path / "out"
    done = _bench(
        "--target", server(), str(trace), "--time-scale", "0.5",
        "--window-start-s", "0.4", "--window-end-s", "2.5", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    with np.load(out / "records.npz") as r:
        scheduled = np.sort(r["scheduled_s"])
        asked = r["output_tokens_asked"]
        got = r["completion_tokens"]
    assert np.allclose(scheduled, (np.array(times[1:6]) - 0.4) * 0.5)
    assert (asked == got).all() and sorted(asked.tolist()) == [4, 5, 6, 7, 8]


def test_sweep_finds_the_servers_knee(tmp_path: Path, server: Callable[..., str]) -> None:
    # 50 ms per call and at most 5 in flight: the server refuses above ~100 calls/s.
    url = server("--ttft-ms", "50", "--max-inflight", "5")
    workload = tmp_path / "w.yaml"
    workload.write_text(WORKLOAD.replace("duration_s: 1", "duration_s: 0.6"))
    out = tmp_path / "out"
    done = _bench(
        "--target", url, str(workload), "--sweep", "--sweep-tolerance", "0.3",
        "--out", str(out), "--json",
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    sweep = json.loads(done.stdout)
    knee = sweep["knee"]
    # Capacity is 100 calls/s (2× the file's 50): the knee lies just below it.
    assert knee["found"] and 1.0 <= knee["load_factor"] <= 2.5
    assert knee["load_factor"] < knee["upper_load_factor"] <= 4.0
    assert (out / "sweep.html").exists()
    # Each measured point is reported as it ends (on stderr, the JSON holding stdout).
    progress = [line for line in done.stderr.splitlines() if line.startswith("load ×")]
    assert len(progress) == len(sweep["points"]) and "attainment" in progress[0]
