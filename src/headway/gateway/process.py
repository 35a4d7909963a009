"""Run ``headway gateway`` as a child process: for tests, benchmarks and drills.

``with GatewayProcess(config_dict) as gw: ... gw.url ...`` writes the config to a
temporary YAML file, starts the gateway on a free loopback port, waits for its URL line,
and stops it with SIGTERM (then SIGKILL) on exit.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

__all__ = ["GatewayProcess"]

_URL = re.compile(r"at (http://\S+)")


class GatewayProcess:
    """A ``headway gateway`` child process."""

    def __init__(
        self, config: dict[str, Any], *, prefix: tuple[str, ...] = (), args: tuple[str, ...] = ()
    ) -> None:
        self.config = config
        self.prefix = prefix
        self.args = args
        """Extra command-line arguments (e.g. ``--redis URL``)."""
        """Command words before the interpreter (e.g. ``taskset -c 1``)."""
        self.url = ""
        self.proc: subprocess.Popen[str] | None = None
        self.path: Path | None = None

    def write_config(self, config: dict[str, Any]) -> None:
        """(Re)write the config file (``/admin/reload`` reads it)."""
        self.config = config
        if self.path is None:
            fd, name = tempfile.mkstemp(suffix=".yaml", prefix="headway-gateway-")
            os.close(fd)
            self.path = Path(name)
        self.path.write_text(yaml.safe_dump(config), encoding="utf-8")

    def start(self) -> str:
        """Start it and return its URL once it listens."""
        self.write_config(self.config)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [
                *self.prefix,
                sys.executable,
                "-m",
                "headway",
                "gateway",
                "--config",
                str(self.path),
                *self.args,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        match = _URL.search(line)
        if match is None:
            self.stop()
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise RuntimeError(f"headway gateway did not start: {line!r} {err[-2000:]}")
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
        if self.path is not None:
            self.path.unlink(missing_ok=True)
        return proc.returncode

    def __enter__(self) -> GatewayProcess:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
