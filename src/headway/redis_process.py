"""Run a throwaway ``redis-server`` on a loopback port: for drills, tests and benchmarks.

No persistence (the gateway's shared budgets are leases that rebuild themselves); it can
be killed and started again on the same port (a Redis outage drill).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

from headway.loopback import free_port

__all__ = ["RedisServer", "find_redis_server"]


def find_redis_server() -> str | None:
    """The path of ``redis-server`` (PATH, then /usr/bin and /usr/local/bin), or None."""
    return shutil.which("redis-server") or next(
        (
            str(p)
            for d in ("/usr/bin", "/usr/local/bin")
            if (p := Path(d) / "redis-server").is_file()
        ),
        None,
    )


class RedisServer:
    """A ``redis-server`` on 127.0.0.1:``port``, no persistence; a context manager."""

    def __init__(self, port: int | None = None, *, binary: str | None = None) -> None:
        found = binary or find_redis_server()
        if found is None:
            raise FileNotFoundError(
                "redis-server is not installed: install it (apt-get install redis-server)"
            )
        self.binary = found
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Its URL (database 0)."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 5.0) -> None:
        """Start it and wait until it accepts connections."""
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--save", "", "--appendonly", "no", "--protected-mode", "no"]
        self.proc = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as c:
                    c.sendall(b"PING\r\n")
                    if c.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            time.sleep(0.02)
        self.kill()
        raise RuntimeError(f"redis-server did not answer on port {self.port}")

    def kill(self) -> None:
        """SIGKILL it (its data is lost) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)
        self.proc = None

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.kill()
