"""Run ``headway emulate`` as a child process: for tests, benchmarks and drills.

``with EmulatorProcess(["--speedup", "10"]) as emu: ... emu.url ...`` starts the emulator
on a free loopback port, waits for the URL line it prints, and stops it with SIGTERM
(then SIGKILL) on exit.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Sequence
from types import TracebackType

__all__ = ["EmulatorProcess"]

_URL = re.compile(r"at (http://\S+)")


class EmulatorProcess:
    """A ``headway emulate`` child process."""

    def __init__(self, args: Sequence[str] = ()) -> None:
        self.args = ["--host", "127.0.0.1", "--port", "0", *args]
        self.url = ""
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> str:
        """Start it and return its URL once it listens."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "headway", "emulate", *self.args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # the URL line, or "" if it exited
        match = _URL.search(line)
        if match is None:
            self.stop()
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise RuntimeError(f"headway emulate did not start: {line!r} {err[-2000:]}")
        self.url = match.group(1)
        return self.url

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM, wait, SIGKILL if needed; the exit code."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        return proc.returncode

    def __enter__(self) -> EmulatorProcess:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
