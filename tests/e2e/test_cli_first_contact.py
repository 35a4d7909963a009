"""A new user's mistakes, every verb (issue 16, defects 1-11): each is answered in one line
on stderr, exit code 2, no traceback, and the line names the flag or key and the fix.

Each case runs ``python -m headway`` as a user would, in a folder of its own that holds
the files the case needs (a cluster or gateway file with the mistake in it).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from headway.loopback import free_port

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = str(ROOT / "examples" / "reference-assistant.yaml")
CLUSTER = ROOT / "examples" / "clusters" / "llama3-8b-h100.yaml"
GATEWAY = "upstreams: [{url: 'http://127.0.0.1:9'}]\n"


def _cluster(old: str, new: str) -> Callable[[Path], None]:
    """A copy of the example cluster with the line starting ``old`` replaced by ``new``."""

    def write(folder: Path) -> None:
        lines = CLUSTER.read_text(encoding="utf-8").splitlines()
        edited = [new if line.startswith(old) else line for line in lines]
        assert edited != lines, old
        (folder / "cluster.yaml").write_text("\n".join(edited) + "\n", encoding="utf-8")

    return write


def _file(name: str, text: str) -> Callable[[Path], None]:
    def write(folder: Path) -> None:
        (folder / name).write_text(text, encoding="utf-8")

    return write


def _folder(name: str) -> Callable[[Path], None]:
    def make(folder: Path) -> None:
        (folder / name).mkdir()

    return make


def _simulated_plan(folder: Path) -> None:
    """An output folder that holds a simulated plan (only its ``simulated`` key is read)."""
    (folder / "out").mkdir()
    (folder / "out" / "plan.json").write_text(json.dumps({"simulated": {"replicas": 4}}))


@dataclass(frozen=True)
class Case:
    defect: int
    args: list[str]
    says: list[str]
    """Words the one line must hold (the flag or key, and the fix)."""
    setup: list[Callable[[Path], None]] = field(default_factory=list)


CASES: dict[str, Case] = {
    # 1. Output paths.
    "plan --out in /proc": Case(1, ["plan", WORKLOAD, "--out", "/proc/nope"],
                                ["argument --out", "cannot write there"]),
    "plan --out a file": Case(1, ["plan", WORKLOAD, "--out", "taken"], ["--out", "is a file"],
                              [_file("taken", "")]),
    "simulate --out a file": Case(1, ["simulate", WORKLOAD, "--out", "taken"],
                                  ["--out", "is a file"], [_file("taken", "")]),
    "bench --out a file": Case(1, ["bench", "--target", "http://127.0.0.1:9", "--out", "taken"],
                               ["--out", "is a file"], [_file("taken", "")]),
    "report --out a folder": Case(1, ["report", "plan.json", "--out", "there"],
                                  ["--out", "is a folder"], [_folder("there")]),
    "trace fit -o a folder": Case(1, ["trace", "fit", "t.csv", "-o", "there"],
                                  ["--output", "is a folder"], [_folder("there")]),
    # 2. Bind errors (a port in use: test_a_port_in_use_is_one_line_and_exit_code_2).
    "emulate --port 99999": Case(2, ["emulate", "--port", "99999"], ["--port", "0 to 65535"]),
    "gateway --port 99999": Case(2, ["gateway", "--config", "g.yaml", "--port", "99999"],
                                 ["--port", "0 to 65535"], [_file("g.yaml", GATEWAY)]),
    "emulate --port http": Case(2, ["emulate", "--port", "http"], ["--port", "0 to 65535"]),
    "gateway --port -1": Case(2, ["gateway", "--config", "g.yaml", "--port", "-1"],
                              ["--port", "0 to 65535"], [_file("g.yaml", GATEWAY)]),
    "emulate --host unassigned": Case(2, ["emulate", "--host", "10.255.255.1"],
                                      ["10.255.255.1", "--host"]),
    "gateway --host unassigned": Case(2, ["gateway", "--config", "g.yaml", "--host",
                                          "10.255.255.1"], ["10.255.255.1", "--host"],
                                      [_file("g.yaml", GATEWAY)]),
    # 3. Engine flags only the engine model can judge, and counts.
    "emulate --tp 3": Case(3, ["emulate", "--tp", "3"], ["--tp", "tensor_parallel=3",
                                                         "use a divisor"]),
    "emulate --num-kv-blocks 0": Case(3, ["emulate", "--num-kv-blocks", "0"],
                                      ["--num-kv-blocks", "1 or more"]),
    # 4. A request larger than the KV pool.
    "simulate, a pool of 1 block": Case(4, ["simulate", WORKLOAD, "--cluster", "cluster.yaml",
                                            "--duration-s", "10"],
                                        ["num_kv_blocks", "KV blocks"],
                                        [_cluster("gpu_memory_utilization", "num_kv_blocks: 1")]),
    "plan, a pool of 1 block": Case(4, ["plan", WORKLOAD, "--cluster", "cluster.yaml",
                                        "--jobs", "1", "--out", "p"],
                                    ["num_kv_blocks", "KV blocks"],
                                    [_cluster("gpu_memory_utilization", "num_kv_blocks: 1")]),
    # 5. No bound on replicas.
    "simulate 100,000 replicas": Case(5, ["simulate", WORKLOAD, "--cluster", "cluster.yaml",
                                          "--duration-s", "10"], ["`replicas`", "10,000"],
                                      [_cluster("replicas:", "replicas: 100000")]),
    # 6. An unreachable drill target (the port is filled in by the test).
    "drill --target unreachable": Case(6, ["drill", "kill-decode", "--target", "URL",
                                           "--out", "d"], ["--target", "cannot connect"]),
    # 7. An unreachable Ray head.
    "plan --ray-address unreachable": Case(7, ["plan", WORKLOAD, "--executor", "ray",
                                               "--ray-address", "ADDRESS", "--out", "p"],
                                           ["--ray-address", "cannot connect", "ray start"]),
    # 8. Cluster and gateway files: "did you mean", and an empty file.
    "cluster key typo": Case(8, ["simulate", WORKLOAD, "--cluster", "cluster.yaml"],
                             ["$.replicaz", "did you mean `replicas`", "docs/simulate.md"],
                             [_cluster("replicas:", "replicaz: 4")]),
    "cluster nested key typo": Case(8, ["simulate", WORKLOAD, "--cluster", "cluster.yaml"],
                                    ["$.engine.max_num_seq", "did you mean `max_num_seqs`"],
                                    [_cluster("  max_num_seqs:", "  max_num_seq: 256")]),
    "gateway empty config": Case(8, ["gateway", "--config", "g.yaml"],
                                 ["g.yaml", "empty", "upstreams"], [_file("g.yaml", "")]),
    "gateway key typo": Case(8, ["gateway", "--config", "g.yaml"],
                             ["$.upstreams[0].revison", "did you mean `revision`"],
                             [_file("g.yaml", "upstreams: [{url: 'http://127.0.0.1:9', "
                                    "revison: r1}]\n")]),
    # 9. --analytic-only over a simulated plan.
    "plan --analytic-only over a simulated plan": Case(
        9, ["plan", WORKLOAD, "--analytic-only", "--out", "out"],
        ["--out", "simulated plan", "another --out"], [_simulated_plan]),
    # 11. A subverb's usage error is its own.
    "emulate --gpus x": Case(11, ["emulate", "--gpus", "x"],
                             ["headway emulate: error:", "did you mean --gpu?"]),
    "workload schema foo": Case(11, ["workload", "schema", "foo"],
                                ["headway workload schema: error:", "foo"]),
    "trace stats, no file": Case(11, ["trace", "stats"], ["headway trace stats: error:"]),
}  # fmt: skip


def _run(args: list[str], cwd: Path, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "80"}
    return subprocess.run(
        [sys.executable, "-m", "headway", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False,
    )  # fmt: skip


def _assert_one_line_usage_error(done: subprocess.CompletedProcess[str], says: list[str]) -> None:
    err = done.stderr
    assert done.returncode == 2, (done.returncode, err[-3000:])
    assert "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err[-3000:]
    for words in says:
        assert words in lines[0], (words, lines[0])


@pytest.mark.parametrize("name", list(CASES))
def test_a_mistake_is_one_line_and_exit_code_2(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    for setup in case.setup:
        setup(tmp_path)
    closed = {"URL": f"http://127.0.0.1:{free_port()}", "ADDRESS": f"127.0.0.1:{free_port()}"}
    done = _run([closed.get(a, a) for a in case.args], tmp_path)
    _assert_one_line_usage_error(done, case.says)
    if case.defect == 9:
        assert json.loads((tmp_path / "out" / "plan.json").read_text()) == {
            "simulated": {"replicas": 4}
        }, "the simulated plan was replaced"
    if case.defect in (1, 6, 7):
        leftovers = {p.name for p in tmp_path.iterdir()} - {"taken", "there"}
        assert not leftovers, f"a refused run left {leftovers}"


@pytest.mark.parametrize("verb", ["gateway", "emulate"])
def test_a_port_in_use_is_one_line_and_exit_code_2(verb: str, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = [verb, "--port", str(port)]
        if verb == "gateway":
            (tmp_path / "g.yaml").write_text(GATEWAY, encoding="utf-8")
            args += ["--config", "g.yaml"]
        done = _run(args, tmp_path, timeout_s=60)
    _assert_one_line_usage_error(done, [f"--port {port}", "already in use"])


def test_the_routes_table_keeps_its_headers_at_80_columns(tmp_path: Path) -> None:
    """Piped, at 80 columns (defect 10): every header of the routes table is whole, and a
    column that no route has a figure for is left out."""
    done = _run(["plan", WORKLOAD, "--analytic-only", "--out", "out"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if "Routes" in line)
    header = lines[start + 1]
    for word in ("period", "route", "calls/s", "replicas", "+failover", "limit"):
        assert word in header, header
    assert "…" not in "\n".join(lines[start : start + 6]), "\n".join(lines[start : start + 6])
    assert max(len(line) for line in lines) <= 80


def test_a_fresh_folder_is_not_needed_for_the_checks(tmp_path: Path) -> None:
    """An --out folder that does not exist yet is fine (it is made when results are
    written): the check walks up to the nearest folder that exists."""
    done = _run(["plan", WORKLOAD, "--analytic-only", "--out", "a/b/c"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "a" / "b" / "c" / "plan.json").is_file()
