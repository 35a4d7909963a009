"""The real-engine helpers without vLLM: a failed install names its step, a server that
dies before it is ready raises with its log's tail."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from headway.realengine.install import InstallError, VllmVenv
from headway.realengine.server import VllmServer, VllmSettings, split_cpus


def test_a_failed_install_names_its_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No package source at all: the venv is made, installing torch fails and says so."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no find-links, no local index
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    steps: list[str] = []
    venv = VllmVenv(tmp_path / "venv")
    assert not venv.imports_vllm()
    with pytest.raises(InstallError, match=r"step 'install torch==2\.13\.0' failed") as info:
        venv.ensure(progress=steps.append)
    assert "torch" in str(info.value)
    assert [s.split(":")[0] for s in steps] == ["vllm install 1/4", "vllm install 2/4"]


def test_a_server_that_dies_raises_with_its_log(tmp_path: Path) -> None:
    """This Python has no vllm: the child exits, the error quotes its log; the command has
    the flags that work on a CPU machine."""
    log = tmp_path / "vllm.log"
    server = VllmServer(sys.executable, tmp_path, log, VllmSettings(max_num_seqs=8, seed=3))
    with pytest.raises(RuntimeError, match="exited with 1 before it was ready") as info:
        server.start(timeout_s=60)
    assert "No module named" in str(info.value)
    command = server.command()
    for flag in ("--enforce-eager", "--load-format", "dummy", "--dtype", "float32"):
        assert flag in command
    assert command[command.index("--max-num-seqs") + 1] == "8"
    assert command[command.index("--seed") + 1] == "3"
    env = server.environment()
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2" and env["HF_HUB_OFFLINE"] == "1"
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"  # no spinning on the frontend's cores
    assert server.stop() == 1


def test_the_worker_can_have_a_cpu_of_its_own(tmp_path: Path) -> None:
    """split_cpus gives the worker the last CPU and the rest to the host processes; the
    server binds the worker's threads there and starts the others on the rest."""
    assert split_cpus({0}) is None
    assert split_cpus({0, 1}) == ("0", "1")
    assert split_cpus({3, 0, 2}) == ("0,2", "3")
    pinned = VllmServer(sys.executable, tmp_path, tmp_path / "log",
                        VllmSettings(host_cpus="0", worker_cpus="1"))  # fmt: skip
    assert pinned.command()[:4] == ["taskset", "--cpu-list", "0", sys.executable]
    assert pinned.environment()["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    free = VllmServer(sys.executable, tmp_path, tmp_path / "log", VllmSettings())
    assert free.command()[0] == sys.executable
    assert free.environment()["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    # pin_worker: on a host of two CPUs or more, the worker gets the last one.
    split = split_cpus()
    default = VllmServer(sys.executable, tmp_path, tmp_path / "log", VllmSettings(pin_worker=True))
    if split is not None:
        assert default.command()[:3] == ["taskset", "--cpu-list", split[0]]
        assert default.environment()["VLLM_CPU_OMP_THREADS_BIND"] == split[1]


def test_a_server_can_run_below_the_gateway_and_the_client(tmp_path: Path) -> None:
    """``nice``: every process of the server starts at that niceness (the real tier's
    engines at 10, so that the gateway beside them on two cores is not left waiting)."""
    server = VllmServer(sys.executable, tmp_path, tmp_path / "log", VllmSettings(nice=10))
    command = server.command()
    assert command[:3] == ["nice", "-n", "10"] and command[3] == sys.executable
    probe = [*command[:3], sys.executable, "-c", "import os; print(os.nice(0))"]
    assert subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip() == str(
        min(19, os.nice(0) + 10)
    )
    assert VllmServer(sys.executable, tmp_path, tmp_path / "log").command()[0] == sys.executable
    with pytest.raises(ValueError, match=r"VllmSettings.nice must be 0-19 \(got -5\)"):
        VllmSettings(nice=-5)
