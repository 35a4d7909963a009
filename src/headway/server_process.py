"""Run a ``headway`` server verb (``emulate``, ``gateway``) as a child process.

Tests, benchmarks and drills start a server on a free loopback port, wait for the line it
prints with its URL, and stop it with SIGTERM (then SIGKILL). The verbs' own wrappers
(:class:`~headway.emulate.process.EmulatorProcess`,
:class:`~headway.gateway.process.GatewayProcess`) only say which command line to run.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Sequence
from types import TracebackType
from typing import Self

__all__ = ["ServerProcess"]

_URL = re.compile(r"at (http://\S+)")


class ServerProcess:
    """A ``headway VERB ...`` child process that prints ``... at http://HOST:PORT``."""

    def __init__(self, verb: str, args: Sequence[str] = (), *, prefix: Sequence[str] = ()) -> None:
        self.verb = verb
        self.args = list(args)
        """Arguments after the verb."""
        self.prefix = list(prefix)
        """Command words before the interpreter (e.g. ``taskset -c 1``)."""
        self.url = ""
        self.proc: subprocess.Popen[str] | None = None

    def verb_args(self) -> list[str]:
        """The arguments after the verb, built when the process starts."""
        return self.args

    def command(self) -> list[str]:
        """The command line."""
        return [*self.prefix, sys.executable, "-m", "headway", self.verb, *self.verb_args()]

    def start(self) -> str:
        """Start it and return its URL once it listens."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            self.command(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # the URL line, or "" if it exited
        match = _URL.search(line)
        if match is None:
            if self.proc.poll() is None:
                self.proc.kill()
            err = self.proc.stderr.read() if self.proc.stderr else ""
            self.stop()
            raise RuntimeError(f"headway {self.verb} did not start: {line!r} {err[-2000:]}")
        self.url = match.group(1)
        return self.url

    @property
    def pid(self) -> int:
        """The process id."""
        assert self.proc is not None
        return self.proc.pid

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

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
