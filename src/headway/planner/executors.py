"""Where a plan's points run: this process, a local process pool, or a Ray cluster.

Every executor runs a batch of independent calls and returns their results in order, so
a plan is the same whichever ran it. Pool workers ignore Ctrl-C: the main process alone
handles it, cancels what has not started and keeps what has finished.
"""

from __future__ import annotations

import importlib
import signal
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any, Protocol, TypeVar

from headway.core.errors import ConfigError
from headway.reachable import connect_error

T = TypeVar("T")


class PointExecutor(Protocol):
    """Runs batches of calls, results in call order."""

    workers: int

    def map(self, fn: Callable[..., T], calls: Sequence[tuple[Any, ...]]) -> list[T]:
        """``[fn(*args) for args in calls]``, possibly in parallel."""
        ...

    def close(self) -> None:
        """Stop: cancel what has not started, release workers."""
        ...


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class LocalExecutor:
    """A process pool of ``workers`` processes (none: run in this process)."""

    def __init__(self, workers: int) -> None:
        if workers < 1:
            raise ConfigError(f"--jobs must be >= 1 (got {workers})")
        self.workers = workers
        self._pool = (
            ProcessPoolExecutor(max_workers=workers, initializer=_ignore_sigint)
            if workers > 1
            else None
        )

    def map(self, fn: Callable[..., T], calls: Sequence[tuple[Any, ...]]) -> list[T]:
        """Run ``calls`` in the pool (or here), results in order."""
        if self._pool is None:
            return [fn(*args) for args in calls]
        futures: list[Future[T]] = [self._pool.submit(fn, *args) for args in calls]
        try:
            return [f.result() for f in futures]
        except BaseException:
            for f in futures:
                f.cancel()
            raise

    def close(self) -> None:
        """Shut the pool down, cancelling queued calls."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def _check_ray_address(address: str) -> None:
    """``ray.init`` retries an address nothing answers for minutes (with log lines naming
    other addresses): one line and exit code 2 instead. ``auto`` and ``local`` pass."""
    text = address.removeprefix("ray://")
    host, sep, port_text = text.rpartition(":")
    if address in ("auto", "local") or not sep:
        return
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigError(
            f"--ray-address {address!r}: the port is not a number from 1 to 65535; use "
            "HOST:PORT (the head's GCS port, 6379 by default) or ray://HOST:10001",
            path="--ray-address",
        )
    reason = connect_error(host.strip("[]") or "127.0.0.1", int(port_text))
    if reason is not None:
        raise ConfigError(
            f"--ray-address {address}: cannot connect ({reason}); start the Ray head there "
            "(`ray start --head`) or omit --ray-address for a local Ray",
            path="--ray-address",
        )


class RayExecutor:
    """Ray tasks on the cluster at ``address`` (None: start a local Ray instance)."""

    def __init__(self, address: str | None, workers: int | None = None) -> None:
        try:
            self._ray: Any = importlib.import_module("ray")
        except ImportError:
            raise ConfigError(
                "--executor ray needs the ray package; install it with "
                "`pip install 'headway[ray]'` or use --executor local"
            ) from None
        ray = self._ray
        self._started = False
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {
                "include_dashboard": False,
                "log_to_driver": False,
                "configure_logging": False,
            }
            if address is not None:
                _check_ray_address(address)
                kwargs["address"] = address
            elif workers is not None:
                kwargs["num_cpus"] = workers
            ray.init(**kwargs)
            self._started = True
        self.workers = int(ray.available_resources().get("CPU", 1)) or 1
        self._remote: dict[Callable[..., Any], Any] = {}

    def map(self, fn: Callable[..., T], calls: Sequence[tuple[Any, ...]]) -> list[T]:
        """Run ``calls`` as Ray tasks, results in order."""
        remote = self._remote.get(fn)
        if remote is None:
            remote = self._remote[fn] = self._ray.remote(fn)
        refs = [remote.remote(*args) for args in calls]
        try:
            return list(self._ray.get(refs))
        except BaseException:
            for ref in refs:
                self._ray.cancel(ref, force=True)
            raise

    def close(self) -> None:
        """Disconnect (and stop the local instance this executor started)."""
        if self._started:
            self._ray.shutdown()
            self._started = False


def make_executor(kind: str, *, jobs: int, ray_address: str | None) -> PointExecutor:
    """The executor ``--executor`` names."""
    if kind == "local":
        return LocalExecutor(jobs)
    if kind == "ray":
        return RayExecutor(ray_address, jobs if ray_address is None else None)
    raise ConfigError(f"--executor must be local or ray (got {kind!r})")
