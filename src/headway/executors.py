"""Where batches of independent simulations run: this process, a local process pool, or a
Ray cluster; ``headway plan``, ``headway sweep`` and ``headway simulate --bad-days`` share
them (and their ``--executor`` and ``--ray-address`` flags).

Every executor runs a batch of independent calls and returns their results in call order,
so a plan, a sweep or a bad-day matrix is the same whichever ran it; ``on_done`` hears of
each result as it finishes, in completion order, for progress. Pool workers ignore
Ctrl-C: the main process alone handles it. A batch that is interrupted (or fails)
cancels its calls that have not started and stops those running, so Ctrl-C ends a run
at once; what finished before it stays with the caller.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from typing import Any, Protocol, TypeVar

from headway.core.errors import ConfigError
from headway.reachable import connect_error

__all__ = [
    "EXECUTORS",
    "LocalExecutor",
    "PointExecutor",
    "RayExecutor",
    "add_arguments",
    "from_arguments",
    "jobs_or_cpus",
    "make_executor",
]

T = TypeVar("T")

EXECUTORS = ("local", "ray")
"""The values of ``--executor``."""


class PointExecutor(Protocol):
    """Runs batches of calls, results in call order."""

    workers: int

    def map(
        self,
        fn: Callable[..., T],
        calls: Sequence[tuple[Any, ...]],
        *,
        on_done: Callable[[int, T], None] | None = None,
    ) -> list[T]:
        """``[fn(*args) for args in calls]``, possibly in parallel; ``on_done(i, result)``
        as each call finishes (in completion order)."""
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
        self._pool = self._new_pool() if workers > 1 else None

    def _new_pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(max_workers=self.workers, initializer=_ignore_sigint)

    def map(
        self,
        fn: Callable[..., T],
        calls: Sequence[tuple[Any, ...]],
        *,
        on_done: Callable[[int, T], None] | None = None,
    ) -> list[T]:
        """Run ``calls`` in the pool (or here), results in order."""
        if self._pool is None:
            results: list[T] = []
            for args in calls:
                results.append(fn(*args))
                if on_done is not None:
                    on_done(len(results) - 1, results[-1])
            return results
        futures: list[Future[T]] = [self._pool.submit(fn, *args) for args in calls]
        try:
            if on_done is not None:
                index = {future: i for i, future in enumerate(futures)}
                for future in as_completed(futures):
                    on_done(index[future], future.result())
            return [f.result() for f in futures]
        except BaseException:
            self._abandon()
            raise

    def _abandon(self) -> None:
        """Stop the pool's calls now: queued ones are cancelled, running ones end with their
        workers (they ignore Ctrl-C, and nobody waits for their results any more); the
        next batch gets fresh workers."""
        pool = self._pool
        assert pool is not None
        # ProcessPoolExecutor.terminate_workers is 3.14+: its processes, before shutdown drops them
        running = list((pool._processes or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for worker in running:
            worker.terminate()
        self._pool = self._new_pool()

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

    def map(
        self,
        fn: Callable[..., T],
        calls: Sequence[tuple[Any, ...]],
        *,
        on_done: Callable[[int, T], None] | None = None,
    ) -> list[T]:
        """Run ``calls`` as Ray tasks, results in order."""
        remote = self._remote.get(fn)
        if remote is None:
            remote = self._remote[fn] = self._ray.remote(fn)
        refs = [remote.remote(*args) for args in calls]
        try:
            if on_done is None:
                return list(self._ray.get(refs))
            index = {ref: i for i, ref in enumerate(refs)}
            results: list[Any] = [None] * len(refs)
            pending = list(refs)
            while pending:
                ready, pending = self._ray.wait(pending, num_returns=1)
                for ref in ready:
                    i = index[ref]
                    results[i] = self._ray.get(ref)
                    on_done(i, results[i])
            return results
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


def jobs_or_cpus(jobs: int | None) -> int:
    """``--jobs``, or the CPU count when it is not given; refuses a count below 1."""
    chosen = jobs if jobs is not None else max(1, os.cpu_count() or 1)
    if chosen < 1:
        raise ConfigError(f"--jobs must be >= 1 (got {chosen})", path="--jobs")
    return chosen


def add_arguments(parser: argparse.ArgumentParser, what: str, *, only_with: str = "") -> None:
    """Add ``--executor`` and ``--ray-address``: where ``what`` run (``only_with``: the
    flag they belong to, named at the start of their help)."""
    prefix = f"with {only_with}: " if only_with else ""
    parser.add_argument(
        "--executor",
        choices=EXECUTORS,
        default=None,
        help=f"{prefix}where {what} run: a local process pool (default) or Ray",
    )
    parser.add_argument(
        "--ray-address",
        default=None,
        help=f"{prefix}Ray cluster address (default: $RAY_ADDRESS, else a local Ray instance)",
    )


def from_arguments(args: argparse.Namespace, *, jobs: int) -> PointExecutor:
    """The executor that ``--executor`` and ``--ray-address`` (else ``$RAY_ADDRESS``) name,
    with ``jobs`` local workers (or CPUs of a local Ray instance)."""
    address = args.ray_address or os.environ.get("RAY_ADDRESS")
    return make_executor(args.executor or "local", jobs=jobs, ray_address=address)
