"""Run a ``headway`` server verb (``emulate``, ``gateway``) as a child process.

Tests, benchmarks and drills start a server on a free loopback port, wait for the line it
prints with its URL, and stop it with SIGTERM (then SIGKILL). What it writes afterwards
(stdout and stderr: its logs) is drained into :attr:`ServerProcess.output` by two threads,
so a chatty server never blocks on a full pipe, and a caller can scan the logs for the
:meth:`ServerProcess.secrets` it was configured with. The verbs' own wrappers
(:class:`~headway.emulate.process.EmulatorProcess`,
:class:`~headway.gateway.process.GatewayProcess`) only say which command line to run and
which secrets it holds.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, ClassVar, Final, Self

__all__ = ["MIN_SECRET_CHARS", "ServerProcess"]

_URL = re.compile(r"at (http://\S+)")

MIN_SECRET_CHARS: Final = 6
"""Secrets shorter than this are not searched for in logs (they would match words)."""


class ServerProcess:
    """A ``headway VERB ...`` child process that prints ``... at http://HOST:PORT``."""

    started: ClassVar[list[ServerProcess]] = []
    """Every server started in this process, in order (for log scanning: :meth:`leaks`,
    ``tests/log_secrets.py``)."""

    def __init__(self, verb: str, args: Sequence[str] = (), *, prefix: Sequence[str] = ()) -> None:
        self.verb = verb
        self.args = list(args)
        """Arguments after the verb."""
        self.prefix = list(prefix)
        """Command words before the interpreter (e.g. ``taskset -c 1``)."""
        self.url = ""
        self.proc: subprocess.Popen[str] | None = None
        self.output: list[str] = []
        """Lines it wrote after its URL line (stdout and stderr, as they came)."""
        self._readers: list[threading.Thread] = []

    def secrets(self) -> list[str]:
        """The secrets it was configured with (keys, tokens): none may reach its logs."""
        return []

    def log_files(self) -> list[str]:
        """Files it writes its logs to, besides stdout and stderr."""
        return []

    def leaks(self, start: int = 0, end: int | None = None) -> list[str]:
        """Where its logs disclose a secret it was configured with, one line per find: its
        output lines ``start:end`` and its log files. Names only the secret's first two
        characters."""
        secrets = [s for s in self.secrets() if len(s) >= MIN_SECRET_CHARS]
        lines = self.output[start:end]
        texts = [(f"{self.verb} output line {start + i + 1}", line) for i, line in
                 enumerate(lines)]  # fmt: skip
        for name in self.log_files():
            path = Path(name)
            if path.is_file():
                texts.append((f"{self.verb} log file {name}", path.read_text(errors="replace")))
        return [
            f"{where}: a configured secret ({secret[:2]}...) appears"
            for where, text in texts for secret in secrets if secret in text
        ]  # fmt: skip

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
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                reader = threading.Thread(target=self._drain, args=(stream,), daemon=True)
                reader.start()
                self._readers.append(reader)
        ServerProcess.started.append(self)
        return self.url

    def _drain(self, stream: IO[str]) -> None:
        for line in iter(stream.readline, ""):
            self.output.append(line)

    @property
    def pid(self) -> int:
        """The process id."""
        assert self.proc is not None
        return self.proc.pid

    def rss_kib(self, field: str = "VmRSS") -> int:
        """Its resident memory (KiB) from ``/proc``: now (``VmRSS``) or its peak (``VmHWM``)."""
        with open(f"/proc/{self.pid}/status") as f:
            line = next(line for line in f if line.startswith(f"{field}:"))
        return int(line.split()[1])

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
        for reader in self._readers:
            reader.join(timeout_s)  # the pipes end with the process
        self._readers = []
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
