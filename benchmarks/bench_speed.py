"""How fast and how faithful is ``headway bench``? (issue 6, "must show")

Against the fast mock server (``python -m headway.bench.mock_server``: raw asyncio on
uvloop, each 50-token stream in one write), on this machine:

1. **rate**: 50-token streamed chat at a constant ``--rate`` (default 1,000/s) for
   ``--seconds`` (default 10): achieved rate, lateness p99 (sent − scheduled, from bench's
   own records; also measured at the server, aligned by the median), CPU per request
   (``getrusage`` of bench's processes during the run), and a marginal CPU figure: (CPU
   of the run − CPU of a 5/s run of the same length) / Δrequests, children included;
2. **startup**: process launch to the first request's arrival at the server, minus that
   request's scheduled offset, for ``headway bench`` and for ``python -m headway.bench``;
3. **peer**: the best peer that installs here, on the same server and workload
   (aiperf 0.13 in its own venv, ``--peer-python``; it needs a local tokenizer, made with
   ``tokenizers``); the ratio is the peer's marginal CPU per request over headway's, and
   both tools' server-side figures are printed;
4. **replay**: the Azure 2023 code trace, cropped to ``--replay-window-s`` and compressed by
   ``--replay-time-scale``; deviation = sorted server arrivals − sorted trace offsets,
   aligned by the median, p99 of its absolute value.

It ends with one JSON line. The machine is shared (2 cores): figures are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "traces" / "azure_llm_2023_code.csv.gz"
if not TRACE.exists():
    TRACE = Path("/work/shared/traces/azure_llm_2023_code.csv.gz")
PEER_PYTHON = Path("/tmp/peer-aiperf/bin/python")

WORKLOAD = """\
name: speed
seed: 1
duration_s: {seconds}
classes:
  chat:
    input_tokens: 32
    output_tokens: 50
    slo: {{ttft_s: 0.05}}
sources:
  - name: users
    arrivals: {{process: constant, rate_per_s: {rate}}}
"""


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class Server:
    """The mock server as a subprocess; arrivals come back as monotonic times."""

    def __init__(self, work: Path, nice: int, *flags: str) -> None:
        self.arrivals_file = work / f"arrivals-{time.monotonic_ns()}.npy"
        cmd = [
            sys.executable, "-m", "headway.bench.mock_server", "--port", "0",
            "--arrivals-out", str(self.arrivals_file), *flags,
        ]  # fmt: skip
        self.proc = subprocess.Popen(_niced(cmd, nice), stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.url = f"http://127.0.0.1:{json.loads(self.proc.stdout.readline())['port']}"

    def stop(self) -> tuple[np.ndarray, dict[str, Any]]:
        self.proc.send_signal(2)
        out, _ = self.proc.communicate(timeout=30)
        summary = json.loads(out.strip().splitlines()[-1])
        return np.load(self.arrivals_file), summary


def _niced(cmd: list[str], nice: int) -> list[str]:
    return ["nice", "-n", str(nice), *cmd] if nice else cmd


def _workload(work: Path, rate: float, seconds: float) -> Path:
    path = work / f"w-{rate:g}-{seconds:g}.yaml"
    path.write_text(WORKLOAD.format(rate=rate, seconds=seconds))
    return path


def _headway(
    args: list[str], nice: int, entry: list[str] | None = None
) -> tuple[dict[str, Any], float]:
    """Run bench as a process; returns its JSON and its CPU seconds."""
    entry = entry or [sys.executable, "-m", "headway", "bench"]
    cpu0 = _children_cpu_s()
    done = subprocess.run(
        _niced([*entry, *args, "--json"], nice), capture_output=True, text=True, timeout=600
    )
    cpu = _children_cpu_s() - cpu0
    if done.returncode not in (0, 1):
        raise SystemExit(f"headway bench failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout), cpu


def _server_lateness_ms(arrivals: np.ndarray, rate: float) -> float:
    """p99 of server arrival − ideal constant grid, aligned by the median difference."""
    times = np.sort(arrivals)
    grid = times[0] + np.arange(times.size) / rate
    dev = times - grid
    dev -= np.median(dev)
    return float(np.percentile(np.abs(dev), 99) * 1000)


def measure_rate(work: Path, rate: float, seconds: float, nice: int) -> dict[str, Any]:
    """The main run, a quiet run for the marginal CPU, and server-side truth."""
    server = Server(work, nice)
    try:
        quiet, quiet_cpu = _headway(
            ["--target", server.url, str(_workload(work, 5, seconds))], nice
        )
        server.stop()
        server = Server(work, nice)
        result, cpu = _headway(["--target", server.url, str(_workload(work, rate, seconds))], nice)
    finally:
        arrivals, srv = server.stop()
    sent = result["pacing"]["sent_calls"]
    marginal = (cpu - quiet_cpu) / max(sent - quiet["pacing"]["sent_calls"], 1) * 1000
    return {
        "achieved_rate_per_s": result["pacing"]["achieved_rate_per_s"],
        "offered_rate_per_s": result["pacing"]["offered_rate_per_s"],
        "lateness_p50_ms": result["pacing"]["lateness"]["p50_s"] * 1000,
        "lateness_p99_ms": result["pacing"]["lateness"]["p99_s"] * 1000,
        "lateness_max_ms": result["pacing"]["lateness"]["max_s"] * 1000,
        "server_lateness_p99_ms": _server_lateness_ms(arrivals, rate),
        "server_requests": srv["requests"],
        "server_cpu_ms_per_request": srv["cpu_s"] / max(srv["requests"], 1) * 1000,
        "cpu_ms_per_request": result["cost"]["cpu_ms_per_request"],
        "cpu_ms_per_request_marginal": marginal,
        "cpu_s_total": cpu,
        "errors": result["outcomes"]["by_error"],
        "passed": result["passed"],
        "workers": result["cost"]["workers"],
    }


def measure_startup(work: Path, nice: int, entry: list[str], tries: int = 3) -> float:
    """Median over ``tries`` of launch → first arrival − first scheduled offset."""
    values = []
    for _ in range(tries):
        server = Server(work, nice)
        try:
            launched = time.monotonic()
            _headway(["--target", server.url, str(_workload(work, 20, 0.5))], nice, entry)
        finally:
            arrivals, _ = server.stop()
        # constant 20/s: the first arrival is scheduled uniformly in [0, 50 ms); seed 1
        first_offset = _first_offset(work)
        values.append(float(arrivals.min()) - launched - first_offset)
    return float(np.median(values))


def _first_offset(work: Path) -> float:
    from headway.core.workload.compile import compile_workload
    from headway.files.workload import load_workload

    w = compile_workload(load_workload(_workload(work, 20, 0.5)).spec)
    return float(w.task_arrival_s.min())


def measure_replay(work: Path, window_s: float, time_scale: float, nice: int) -> dict[str, Any]:
    """Replay the Azure code trace; compare server arrivals with the trace's own offsets."""
    from headway.trace.readers import read_trace

    trace = read_trace(TRACE)
    times = trace.arrival_s.astype(np.float64)
    expected = np.sort(times[times < window_s]) * time_scale
    server = Server(work, nice)
    try:
        result, _ = _headway(
            [
                "--target", server.url, str(TRACE), "--time-scale", str(time_scale),
                "--window-end-s", str(window_s),
            ],
            nice,
        )  # fmt: skip
    finally:
        arrivals, _ = server.stop()
    got = np.sort(arrivals)
    if got.size != expected.size:
        raise SystemExit(f"replay: {got.size} arrivals for {expected.size} trace rows")
    dev = got - expected
    dev -= np.median(dev)
    gaps = np.diff(expected)
    return {
        "requests": int(got.size),
        "span_s": float(expected[-1] - expected[0]),
        "mean_rate_per_s": float((expected.size - 1) / (expected[-1] - expected[0])),
        "peak_100ms_rate_per_s": float(
            (np.searchsorted(expected, expected + 0.1) - np.arange(expected.size)).max() / 0.1
        ),
        "trace_gap_cv": float(gaps.std() / gaps.mean()),
        "deviation_p50_ms": float(np.percentile(np.abs(dev), 50) * 1000),
        "deviation_p99_ms": float(np.percentile(np.abs(dev), 99) * 1000),
        "deviation_max_ms": float(np.abs(dev).max() * 1000),
        "bench_lateness_p99_ms": result["pacing"]["lateness"]["p99_s"] * 1000,
    }


def _tokenizer(work: Path, peer_python: Path) -> Path:
    """A small local byte-level BPE tokenizer (the peer insists on one; no hub here)."""
    out = work / "tok"
    script = f"""
import json, os
from tokenizers import Tokenizer, models, trainers, pre_tokenizers, decoders
tok = Tokenizer(models.BPE(unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
words = " the and for you not are but can all one had was her his out day".split()
trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=["<unk>", "<s>", "</s>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tok.train_from_iterator([" ".join(words) * 50], trainer)
os.makedirs({str(out)!r}, exist_ok=True)
tok.save({str(out / "tokenizer.json")!r})
json.dump({{"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>",
    "bos_token": "<s>", "eos_token": "</s>", "model_max_length": 100000}},
    open({str(out / "tokenizer_config.json")!r}, "w"))
"""
    subprocess.run([str(peer_python), "-c", script], check=True, capture_output=True)
    return out


def _aiperf(
    peer_python: Path, url: str, tok: Path, rate: float, count: int, out: Path, nice: int
) -> float:
    """Run aiperf once; returns its CPU seconds (children included)."""
    aiperf = peer_python.parent / "aiperf"
    cmd = [
        str(aiperf), "profile", "--model", "mock", "--url", url, "--endpoint-type", "chat",
        "--streaming", "--tokenizer", str(tok), "--request-rate", str(rate),
        "--request-count", str(count), "--synthetic-input-tokens-mean", "32",
        "--synthetic-input-tokens-stddev", "0", "--output-tokens-mean", "50",
        "--output-tokens-stddev", "0", "--artifact-dir", str(out), "--ui-type", "none",
        "--arrival-pattern", "constant",
    ]  # fmt: skip
    cpu0 = _children_cpu_s()
    done = subprocess.run(_niced(cmd, nice), capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"aiperf exited {done.returncode}: {done.stdout[-1500:]}")
    return _children_cpu_s() - cpu0


def measure_peer(
    work: Path, peer_python: Path, rate: float, seconds: float, nice: int
) -> dict[str, Any] | str:
    """aiperf on the same server and workload, or the reason it could not run."""
    if not (peer_python.parent / "aiperf").exists():
        return (
            f"aiperf is not installed at {peer_python.parent}; install it with "
            f"`python3 -m venv {peer_python.parent.parent} && "
            f"{peer_python.parent}/pip install aiperf==0.13.0`"
        )
    try:
        tok = _tokenizer(work, peer_python)
        count = int(rate * seconds)
        server = Server(work, nice)
        try:
            quiet_cpu = _aiperf(
                peer_python, server.url, tok, 5, int(5 * seconds), work / "aip-q", nice
            )
        finally:
            server.stop()
        server = Server(work, nice)
        try:
            started = time.monotonic()
            cpu = _aiperf(peer_python, server.url, tok, rate, count, work / "aip", nice)
            wall = time.monotonic() - started
        finally:
            arrivals, _ = server.stop()
    except (RuntimeError, subprocess.SubprocessError, OSError) as error:
        return f"aiperf did not run: {error}"
    times = np.sort(arrivals)
    span = float(times[-1] - times[0]) if times.size > 1 else float("nan")
    return {
        "name": "aiperf 0.13.0",
        "requests_arrived": int(times.size),
        "achieved_rate_per_s": (times.size - 1) / span if span > 0 else None,
        "server_lateness_p99_ms": _server_lateness_ms(arrivals, rate),
        "cpu_ms_per_request_marginal": (cpu - quiet_cpu) / max(count - 5 * seconds, 1) * 1000,
        "cpu_s_total": cpu,
        "wall_s": wall,
    }


def main() -> int:
    """Run every measurement and print the figures, then one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--replay-window-s", type=float, default=600.0)
    parser.add_argument("--replay-time-scale", type=float, default=0.02)
    parser.add_argument("--peer-python", type=Path, default=PEER_PYTHON)
    parser.add_argument("--peer-seconds", type=float, default=5.0)
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument(
        "--nice", type=int, default=-15, help="nice level of every process (as the anchors)"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_speed."))
    print(f"load average before: {os.getloadavg()}, cpus: {os.cpu_count()}")
    try:
        rate = measure_rate(work, args.rate, args.seconds, args.nice)
        print("rate:", json.dumps(rate))
        startup = measure_startup(work, args.nice, [sys.executable, "-m", "headway", "bench"])
        startup_fast = measure_startup(work, args.nice, [sys.executable, "-m", "headway.bench"])
        print(f"startup: headway bench {startup:.3f} s; python -m headway.bench "
              f"{startup_fast:.3f} s")  # fmt: skip
        replay = measure_replay(work, args.replay_window_s, args.replay_time_scale, args.nice)
        print("replay:", json.dumps(replay))
        peer: dict[str, Any] | str = "skipped (--no-peer)"
        if not args.no_peer:
            peer = measure_peer(work, args.peer_python, args.rate, args.peer_seconds, args.nice)
        print("peer:", json.dumps(peer))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"load average after: {os.getloadavg()}")
    ratio = None
    if isinstance(peer, dict) and rate["cpu_ms_per_request_marginal"] > 0:
        ratio = peer["cpu_ms_per_request_marginal"] / rate["cpu_ms_per_request_marginal"]
    line = {
        "achieved_rate_per_s": rate["achieved_rate_per_s"],
        "lateness_p99_ms": rate["lateness_p99_ms"],
        "cpu_ms_per_request": rate["cpu_ms_per_request"],
        "startup_s": startup,
        "peer": peer["name"] if isinstance(peer, dict) else None,
        "ratio_vs_peer": ratio,
        "replay_deviation_p99_ms": replay["deviation_p99_ms"],
        "ratio_definition": "peer marginal CPU per request / headway's, same server and rate",
        "peer_achieved_rate_per_s": peer["achieved_rate_per_s"] if isinstance(peer, dict) else None,
        "peer_server_lateness_p99_ms": (
            peer["server_lateness_p99_ms"] if isinstance(peer, dict) else None
        ),
        "peer_note": None if isinstance(peer, dict) else peer,
        "startup_python_m_headway_bench_s": startup_fast,
        "cpu_ms_per_request_marginal": rate["cpu_ms_per_request_marginal"],
        "server_lateness_p99_ms": rate["server_lateness_p99_ms"],
    }
    print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
