"""Drill hooks for engines a test started: what an operator's hooks file does with
``kubectl`` or ``systemctl``, done with a state file and process groups.

A test records each engine (:func:`record`: its command line, environment, log and URL)
in a state directory, starts it (:func:`start`) and writes a hooks file
(:func:`hooks_file`) whose commands run this module as a script::

    python tests/engine_hooks.py kill STATE_DIR ENGINE    # SIGKILL its process group
    python tests/engine_hooks.py start STATE_DIR ENGINE   # start it again on its port;
                                                          # exit 0 once /v1/models answers

The engine a hook starts outlives the hook (its own session); :func:`stop_all` stops
whatever the state says runs, when the test ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["hooks_file", "record", "start", "stop_all"]

_READY_TIMEOUT_S = 600.0
_STARTED: dict[int, subprocess.Popen[bytes]] = {}
"""The engines this process started (pid -> process): :func:`stop_all` reaps them."""


def _state(directory: Path, engine: int) -> Path:
    return directory / f"engine-{engine}.json"


def record(
    directory: Path,
    engine: int,
    *,
    command: Sequence[str],
    env: Mapping[str, str],
    log_path: Path,
    url: str,
    pid: int | None = None,
) -> None:
    """Note how engine ``engine`` starts (its command names its port), and its process
    group when it already runs (started elsewhere, in a session of its own); :func:`start`
    starts it, here or from a hook."""
    directory.mkdir(parents=True, exist_ok=True)
    data = {"command": list(command), "env": dict(env), "log": str(log_path), "url": url,
            "pid": pid}  # fmt: skip
    _state(directory, engine).write_text(json.dumps(data))


def hooks_file(directory: Path) -> Path:
    """A hooks file: ``kill_engine`` and ``restart_engine`` through this script."""
    script = Path(__file__).resolve()
    run = f"{sys.executable} {script}"
    path = directory / "hooks.yaml"
    path.write_text(
        f"kill_engine: '{run} kill {directory} {{engine}}'\n"
        f"restart_engine: '{run} start {directory} {{engine}}'\n"
    )
    return path


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _listening(url: str) -> bool:
    parts = urllib.parse.urlsplit(url)
    try:
        with socket.create_connection((parts.hostname, parts.port), timeout=1.0):
            return True
    except OSError:
        return False


def kill(directory: Path, engine: int) -> None:
    """SIGKILL the engine's process group; return once its port refuses connections (a
    killed process stays a zombie until its parent, the test, reaps it)."""
    data = json.loads(_state(directory, engine).read_text())
    _signal(data["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 30.0
    while _listening(data["url"]) and time.monotonic() < deadline:
        time.sleep(0.02)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/v1/models", timeout=5) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def start(directory: Path, engine: int) -> None:
    """Start the engine again (same command, so the same port); wait for ``/v1/models``."""
    path = _state(directory, engine)
    data = json.loads(path.read_text())
    with open(data["log"], "ab") as log:
        proc = subprocess.Popen(
            data["command"], env=data["env"], stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    _STARTED[proc.pid] = proc
    data["pid"] = proc.pid
    path.write_text(json.dumps(data))
    deadline = time.monotonic() + _READY_TIMEOUT_S
    while not _ready(data["url"]):
        if proc.poll() is not None:
            raise SystemExit(f"engine {engine} exited {proc.returncode}; log {data['log']}")
        if time.monotonic() > deadline:
            raise SystemExit(f"engine {engine} not ready within {_READY_TIMEOUT_S:g} s")
        time.sleep(0.2)


def stop_all(directory: Path) -> None:
    """SIGTERM, then SIGKILL, every engine the state names; reap those started here."""
    found = (json.loads(p.read_text())["pid"] for p in directory.glob("engine-*.json"))
    pids = [pid for pid in found if pid is not None]
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        for pid, proc in list(_STARTED.items()):  # a zombie stays in its group until reaped
            if proc.poll() is not None:
                del _STARTED[pid]
        if not any(_alive(p) for p in pids):
            break
        time.sleep(0.05)
    for pid in [*pids, *_STARTED]:
        _signal(pid, signal.SIGKILL)
    for proc in list(_STARTED.values()):
        proc.wait()
    _STARTED.clear()


if __name__ == "__main__":
    verb, state_dir, index = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    {"kill": kill, "start": start}[verb](state_dir, index)
