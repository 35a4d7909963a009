"""Drill hooks for engines a test started: what an operator's hooks file does with
``kubectl`` or ``systemctl``, done with a state file and process groups.

A test records each engine (:func:`record`: its command line, environment, log and URL)
in a state directory, starts it (:func:`start`) and writes a hooks file
(:func:`hooks_file`) whose commands run this module as a script::

    python tests/engine_hooks.py kill STATE_DIR ENGINE    # SIGKILL all its processes;
                                                          # exit 0 once its port is shut
    python tests/engine_hooks.py start STATE_DIR ENGINE   # start it again on its port
                                                          # once free; exit 0 once
                                                          # /v1/models answers

A kill finds the engine by its recorded pid and by who holds its port, and exits non-zero
when the port stays open (a fault that did not happen must fail the drill, not pass as
done); a kill and a start of one engine take turns (a lock file). The engine a hook
starts outlives the hook (its own session); :func:`stop_all` stops whatever the state
says runs, when the test ends.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
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
    """Whether process group ``pid`` has a member that is not a zombie (a zombie whose
    parent is gone stays when init does not reap, as in some containers)."""
    return any(p.pgid == pid and not p.zombie for p in _processes().values())


def _port(url: str) -> int:
    port = urllib.parse.urlsplit(url).port
    if port is None:
        raise SystemExit(f"engine url {url!r} names no port; record it as http://HOST:PORT")
    return port


def _listening(url: str) -> bool:
    parts = urllib.parse.urlsplit(url)
    try:
        with socket.create_connection((parts.hostname, parts.port), timeout=1.0):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def _locked(directory: Path, engine: int) -> Iterator[None]:
    """Hold engine ``engine``'s lock: a kill and a start of one engine run one at a time
    (the drill fires its faults on their own clocks, and a restart's new pid written while
    a kill was still reading the state made the kill miss the engine that ran)."""
    with open(directory / f"engine-{engine}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@dataclass(frozen=True)
class _Proc:
    """One process as ``/proc/PID/stat`` and ``cmdline`` show it."""

    pid: int
    ppid: int
    pgid: int
    sid: int
    zombie: bool
    cmdline: tuple[str, ...]


def _proc(pid: int) -> _Proc | None:
    """The process ``pid`` (None once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # the name in parentheses may hold spaces
    args = tuple(a.decode(errors="replace") for a in raw.split(b"\0")[:-1])
    return _Proc(pid, int(fields[1]), int(fields[2]), int(fields[3]), fields[0] in "ZX", args)


def _processes() -> dict[int, _Proc]:
    """Every process now running (zombies included: they hold no sockets)."""
    found = (_proc(int(p.name)) for p in Path("/proc").iterdir() if p.name.isdigit())
    return {p.pid: p for p in found if p is not None}


def _listen_inodes(port: int) -> set[str]:
    """The sockets that listen on TCP ``port`` (IPv4 or IPv6), as ``/proc/net/tcp{,6}``
    list them (``socket:[INODE]``, the link name a holder's ``/proc/PID/fd`` shows)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                cols = line.split()
                if int(cols[1].rsplit(":", 1)[1], 16) == port and cols[3] == "0A":  # LISTEN
                    inodes.add(f"socket:[{cols[9]}]")
    return inodes


def _port_holders(port: int) -> set[int]:
    """The processes holding a socket that listens on TCP ``port``."""
    inodes = _listen_inodes(port)
    holders: set[int] = set()
    if not inodes:
        return holders
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                holders.add(int(proc.name))
    return holders


def _engine_tree(roots: set[int], procs: Mapping[int, _Proc]) -> set[int]:
    """``roots``, their descendants, and whoever shares a root's own session or process
    group (a child the root's exit left to init keeps those): the engine's processes.
    Never this hook's own session, group or ancestors (the drill, the test)."""
    mine = {os.getsid(0), os.getpgrp()}
    ours: set[int] = set()
    pid = os.getpid()
    while pid > 1 and pid in procs:
        ours.add(pid)
        pid = procs[pid].ppid
    groups = {procs[r].pgid for r in roots if r in procs and procs[r].pgid == r} - mine
    sessions = {procs[r].sid for r in roots if r in procs and procs[r].sid == r} - mine
    tree = {r for r in roots if r in procs}
    grew = True
    while grew:
        more = {p.pid for p in procs.values() if p.ppid in tree or p.pgid in groups
                or p.sid in sessions} - tree  # fmt: skip
        tree |= more
        grew = bool(more)
    return tree - ours


def _runs_command(pid: int, command: Sequence[str], procs: Mapping[int, _Proc]) -> bool:
    """Whether ``pid``, or a process it descends from, runs the engine's command."""
    proc = procs.get(pid)
    while proc is not None and proc.pid > 1:
        if proc.cmdline == tuple(command):
            return True
        proc = procs.get(proc.ppid)
    return False


def _is_engine(pid: int, command: Sequence[str], recorded: int | None,
               procs: Mapping[int, _Proc]) -> bool:  # fmt: skip
    """Whether ``pid``, a process on the engine's port, is the engine's: it runs (or
    descends from one that runs) the engine's command, or it is in the recorded process's
    own session (a child the engine's exit left to init)."""
    proc = procs.get(pid)
    in_session = proc is not None and recorded is not None and proc.sid == recorded
    return in_session or _runs_command(pid, command, procs)


def _describe(pids: set[int], procs: Mapping[int, _Proc]) -> str:
    return ", ".join(
        f"pid {p} ({' '.join(' '.join(procs[p].cmdline).split())[:120] or '?'})"
        if p in procs
        else f"pid {p}"
        for p in sorted(pids)
    )


def kill(directory: Path, engine: int, wait_s: float = 30.0) -> None:
    """SIGKILL every process of the engine (the recorded process's tree, session and
    group, and whoever of the engine holds its port); exit 0 once its port refuses
    connections, else exit non-zero naming who still listens. A killed vLLM keeps its
    port for seconds while the kernel frees its memory, so this waits up to ``wait_s``.
    A process on the port that is not the engine's is named, never killed."""
    with _locked(directory, engine):
        data = json.loads(_state(directory, engine).read_text())
        url, command, recorded = data["url"], data["command"], data["pid"]
        port = _port(url)
        procs = _processes()
        holders = _port_holders(port)
        strangers = {h for h in holders if not _is_engine(h, command, recorded, procs)}
        if strangers:
            raise SystemExit(f"engine {engine}: {url} is held by {_describe(strangers, procs)}, "
                             f"not by the engine recorded in {_state(directory, engine)}; "
                             "not killed")  # fmt: skip
        # the recorded pid only while it runs the engine's command (a pid the kernel gave
        # another process since is not the engine's)
        ran = recorded is not None and _runs_command(recorded, command, procs)
        roots = holders | ({recorded} if ran else set())
        killed: set[int] = set()
        deadline = time.monotonic() + wait_s
        while True:
            procs = _processes()
            live = {p for p in _engine_tree(roots, procs) if not procs[p].zombie}
            live |= {h for h in _port_holders(port) if _is_engine(h, command, recorded, procs)}
            for pid in live:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            killed |= live
            roots |= live
            if not live and not _listen_inodes(port) and not _listening(url):
                break
            if time.monotonic() > deadline:
                procs = _processes()
                left = _port_holders(port) | {p for p in killed if p in procs
                                              and not procs[p].zombie}  # fmt: skip
                raise SystemExit(
                    f"engine {engine}: not down {wait_s:g} s after SIGKILL to "
                    f"{_describe(killed, procs) or 'nothing'}: {url} listening "
                    f"{bool(_listen_inodes(port)) or _listening(url)}; still there: "
                    f"{_describe(left, procs) or 'no process found on the port'}"
                )
            time.sleep(0.25)  # a round reads /proc (~50 ms with two vLLMs up): gentle
        if not killed:
            raise SystemExit(f"engine {engine}: nothing to kill: pid {recorded} is not "
                             f"running and nothing listens on {url}")  # fmt: skip


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/v1/models", timeout=5) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def start(directory: Path, engine: int, free_within_s: float = 60.0) -> None:
    """Start the engine again (same command, so the same port) once its port is free;
    wait for ``/v1/models``. A port still taken (a kill still under way: vLLM keeps it
    for seconds) is waited for up to ``free_within_s``, so the answer that ends the wait
    is the new engine's, never the old one's."""
    path = _state(directory, engine)
    url = json.loads(path.read_text())["url"]
    deadline = time.monotonic() + free_within_s
    while _listen_inodes(_port(url)) or _listening(url):
        if time.monotonic() > deadline:
            holders = _port_holders(_port(url))
            raise SystemExit(f"engine {engine}: {url} still listens after {free_within_s:g} "
                             f"s ({_describe(holders, _processes()) or 'holder not found'}); "
                             "kill it first")  # fmt: skip
        time.sleep(0.2)
    with _locked(directory, engine):
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
