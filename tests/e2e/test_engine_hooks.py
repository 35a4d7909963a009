"""The drill's kill hook (``tests/engine_hooks.py kill``) against real processes: it kills
every process of the engine, the one on its port too when the recorded pid is not it
(a CI run's restart hook had overwritten the pid; the kill then SIGKILLed the fresh
process, the old vLLM kept serving, and the hook returned 0 after 30 s), never a process
that is not the engine's, and it fails loudly when the port stays open."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import engine_hooks
from headway.loopback import free_port

HOOK = str(Path(engine_hooks.__file__).resolve())

# An engine: answers GET with 200 on its port; with "fork" it forks a child into a session
# of its own that holds the listening socket too (as a worker the leader's group lacks).
ENGINE = """
import http.server, os, sys, time
class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Answer)
if sys.argv[2] == "fork" and os.fork() == 0:
    os.setsid()
    open(sys.argv[3], "w").write(str(os.getpid()))
    time.sleep(600)
server.serve_forever()
"""


def _engine(tmp_path: Path, mode: str) -> tuple[list[str], str]:
    port = free_port()
    return [sys.executable, "-c", ENGINE, str(port), mode, str(tmp_path / "child.pid")], (
        f"http://127.0.0.1:{port}"
    )


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts in sessions of their own; killed and reaped at its end."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()


def _spawn(procs: list[subprocess.Popen[bytes]], command: list[str]) -> int:
    proc = subprocess.Popen(command, start_new_session=True)
    procs.append(proc)
    return proc.pid


def _until(check: Callable[[], object], within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    proc = engine_hooks._proc(pid)
    return proc is not None and not proc.zombie


def _hook(state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, HOOK, "kill", str(state), "1"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def _listening_engine(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> tuple[list[str], str, int]:
    """A plain stand-in engine, started and listening: its command, URL and pid."""
    command, url = _engine(tmp_path, "plain")
    pid = _spawn(spawned, command)
    _until(lambda: engine_hooks._listening(url), 30, "the engine never listened")
    return command, url, pid


def _record(tmp_path: Path, command: list[str], url: str, pid: int | None) -> Path:
    """The hooks' state for engine 1 as ``pid`` running ``command`` on ``url``."""
    state = tmp_path / "engines"
    engine_hooks.record(state, 1, command=command, env={}, log_path=tmp_path / "log",
                        url=url, pid=pid)  # fmt: skip
    return state


def test_a_stale_pid_still_kills_the_engine_on_the_port(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    command, url, engine = _listening_engine(tmp_path, spawned)
    other = _spawn(spawned, [sys.executable, "-c", "import time; time.sleep(600)"])
    # The pid another start wrote: not the one serving.
    state = _record(tmp_path, command, url, other)
    done = _hook(state)
    assert done.returncode == 0, done.stderr
    assert not engine_hooks._listening(url)
    assert not _running(engine)
    assert _running(other)  # it does not run the engine's command: not the engine's


def test_a_child_in_a_session_of_its_own_holding_the_port_is_killed(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    command, url = _engine(tmp_path, "fork")
    engine = _spawn(spawned, command)
    child_file = tmp_path / "child.pid"
    _until(lambda: child_file.exists() and child_file.read_text(), 30, "no child")
    child = int(child_file.read_text())
    state = _record(tmp_path, command, url, engine)
    done = _hook(state)
    assert done.returncode == 0, done.stderr
    assert not engine_hooks._listening(url)
    assert not _running(engine) and not _running(child)


def test_a_port_held_by_another_process_fails_loudly_and_kills_nothing(tmp_path: Path) -> None:
    command, url = _engine(tmp_path, "plain")  # recorded, never started
    with socket.socket() as held:  # this test's own socket: not the engine's
        held.bind(("127.0.0.1", int(url.rsplit(":", 1)[1])))
        held.listen()
        state = _record(tmp_path, command, url, None)
        done = _hook(state)
        assert done.returncode != 0
        assert "not by the engine recorded" in done.stderr and "not killed" in done.stderr
        assert engine_hooks._listening(url)  # this process still holds it


def test_nothing_to_kill_fails_loudly(tmp_path: Path) -> None:
    command, url = _engine(tmp_path, "plain")
    state = _record(tmp_path, command, url, None)
    done = _hook(state)
    assert done.returncode != 0 and "nothing to kill" in done.stderr


def test_a_start_waits_while_the_old_engine_holds_the_port(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    """A restart issued before the kill lands must not take the old engine's answer for
    its own: it waits for the port, and says so when it stays taken."""
    command, url, engine = _listening_engine(tmp_path, spawned)
    state = _record(tmp_path, command, url, engine)
    with pytest.raises(SystemExit, match=r"still listens after 0\.5 s .*; kill it first"):
        engine_hooks.start(state, 1, free_within_s=0.5)
    assert engine_hooks._STARTED == {}  # nothing was started


def test_a_restart_fired_before_the_kill_lands_waits_for_it(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    """The CI run's order: the restart hook ran while the kill hook had not read the state
    yet. The restart now waits for the port, so the kill finds the old engine, and the
    engine that answers at the end is the new one."""
    command, url, old = _listening_engine(tmp_path, spawned)
    state = _record(tmp_path, command, url, old)
    failed: list[SystemExit | OSError] = []

    def restart() -> None:
        try:
            engine_hooks.start(state, 1, free_within_s=60)
        except (SystemExit, OSError) as exc:  # reported on the test's thread
            failed.append(exc)

    restarting = threading.Thread(target=restart)
    restarting.start()
    try:
        done = _hook(state)
        restarting.join(60)
        assert done.returncode == 0, done.stderr
        assert not failed and not restarting.is_alive(), failed
        new = engine_hooks._port_holders(int(url.rsplit(":", 1)[1]))
        assert not _running(old)
        assert new == set(engine_hooks._STARTED) and engine_hooks._listening(url)
    finally:
        restarting.join(60)
        engine_hooks.stop_all(state)
