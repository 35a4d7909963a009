"""Run vLLM's OpenAI-compatible server on a free loopback port, and stop what it started.

``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script fails in the
CPU build: it asks for a distribution named ``vllm``) with the flags that work on a CPU
machine: float32, eager mode, a 2,048-token context, a small KV space. It starts in its own
process group and logs to a file; readiness is ``GET /v1/models`` answering 200, within a
bounded time; a server that dies first raises with its log's tail. Stopping sends SIGTERM
to the group, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from headway.loopback import free_port

__all__ = ["VllmServer", "VllmSettings", "split_cpus"]


def split_cpus(cpus: set[int] | None = None) -> tuple[str, str] | None:
    """``(host, worker)`` CPU lists for :attr:`VllmSettings.host_cpus` and
    :attr:`VllmSettings.worker_cpus`: the worker gets the last CPU this process may use,
    everything else the rest; None with fewer than two CPUs.

    vLLM's CPU build runs three processes: the API server, the engine core and a worker
    that computes the model. While the worker computes a step, the engine core waits for
    its answer on a shared-memory queue that busy-polls (``shm_broadcast.SpinCondition``,
    ``sched_yield`` for a second after each read): under a Poisson load of 6.8 calls/s on
    two cores the engine core took 0.92 of a core, the worker 0.99 and the API server 0.06,
    and the worker's steps slowed whenever the API server, the gateway or the load
    generator wanted a core (TPOT p50 105 ms against 70 ms with the worker on a core of
    its own, in back-to-back runs of the same load). With the worker alone on its CPU the
    engine is what it is on a GPU host: a device that computes its steps at the speed its
    probes measured, the host processes sharing the other cores.
    """
    available = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    if len(available) < 2:
        return None
    return ",".join(map(str, available[:-1])), str(available[-1])


@dataclass(frozen=True, slots=True, kw_only=True)
class VllmSettings:
    """The engine's settings (vLLM's flag names, units in the names)."""

    served_model_name: str = "tiny"
    kv_cache_space_gib: int = 2
    """``VLLM_CPU_KVCACHE_SPACE``: the KV pool, GiB."""
    max_model_len: int = 2048
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 2048
    seed: int = 0
    """vLLM's ``--seed`` (sampling; the dummy weights do not depend on it)."""
    extra_args: tuple[str, ...] = ()
    host_cpus: str | None = None
    """CPUs (a ``taskset --cpu-list``) for the API server and the engine core; None: as
    ``pin_worker`` says."""
    worker_cpus: str | None = None
    """CPUs the worker's compute threads are bound to (``VLLM_CPU_OMP_THREADS_BIND``);
    None: as ``pin_worker`` says."""
    nice: int = 0
    """The server's niceness (``nice -n``; every process and thread of it inherits it).
    The real tier runs its engines at 10: they stand in for GPU engines, which never take
    the CPU the gateway and the client run on, and on a two-core host they did. A call
    through the gateway with a 3 s deadline was answered 0.6-1.8 s late in 3 of 10
    calls: the gateway needed 4-6 ms of CPU in the call and waited up to 2.0 s runnable
    (``/proc/PID/schedstat``). At nice 10 the latest of 36 calls was 93 ms late, the
    longest wait 59 ms (docs/real-engine.md)."""
    pin_worker: bool = False
    """Where neither CPU list is given: the worker on a CPU of its own and the rest on
    the others (:func:`split_cpus`); False (the default): nothing bound. The benchmarks of
    one server pin it; the real tier does not: with two servers pinned on a two-core host
    (both workers on the last CPU, both engine cores' busy-polls beside the API servers
    and the gateway on the other) a call through the gateway once never reached either
    engine within 30 s, and the tier's burst and disconnect tests timed out."""

    def __post_init__(self) -> None:
        if not 0 <= self.nice <= 19:
            raise ValueError(
                f"VllmSettings.nice must be 0-19 (got {self.nice}): a lower priority for the "
                "engine; raising it above the others' needs root and is never what a test wants"
            )

    def cpus(self) -> tuple[str | None, str | None]:
        """``(host, worker)`` CPU lists, None where unbound."""
        if self.host_cpus or self.worker_cpus or not self.pin_worker:
            return self.host_cpus, self.worker_cpus
        return split_cpus() or (None, None)


@dataclass
class VllmServer:
    """One vLLM server process serving ``model_dir`` (see the module docstring)."""

    python: str
    model_dir: Path
    log_path: Path
    settings: VllmSettings = field(default_factory=VllmSettings)
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        """Its base URL (without ``/v1``)."""
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        """The command line."""
        s = self.settings
        host, _ = s.cpus()
        pin = ["taskset", "--cpu-list", host] if host else []
        nice = ["nice", "-n", str(s.nice)] if s.nice else []
        return [
            *nice, *pin, self.python, "-m", "vllm.entrypoints.openai.api_server",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--model", str(self.model_dir), "--served-model-name", s.served_model_name,
            "--load-format", "dummy", "--dtype", "float32", "--enforce-eager",
            "--max-model-len", str(s.max_model_len), "--max-num-seqs", str(s.max_num_seqs),
            "--max-num-batched-tokens", str(s.max_num_batched_tokens),
            "--seed", str(s.seed), "--disable-uvicorn-access-log",
            *s.extra_args,
        ]  # fmt: skip

    def environment(self) -> dict[str, str]:
        """The child's environment: offline, no thread pinning, the KV space, and OpenMP
        threads that sleep between steps (``OMP_WAIT_POLICY=PASSIVE`` unless set).

        The worker's OpenMP threads otherwise spin after each step, on the cores the API
        server, the gateway and the load generator need: on two shared cores a one-request
        decode step measured 19 ms spinning and 9 ms passive, the simulator's median TTFT
        p50 error against this engine fell from 22% to 12% (``benchmarks/real_engine.py
        --quick``), and disconnects through the gateway freed the slot within 100 ms in
        0.94-1.0 of trials instead of 0.84-0.94. On a GPU host the frontend has CPUs of its
        own; passive threads make this engine a closer stand-in for one."""
        env = {
            **os.environ,
            "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
            "VLLM_CPU_KVCACHE_SPACE": str(self.settings.kv_cache_space_gib),
            "VLLM_CPU_OMP_THREADS_BIND": self.settings.cpus()[1] or "nobind",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "PYTHONUNBUFFERED": "1",
        }
        env.pop("PYTHONPATH", None)  # headway's sources are not vLLM's
        return env

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the server's log."""
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-chars:]
        except OSError:
            return ""

    def start(self, timeout_s: float = 900.0) -> str:
        """Start it and wait until ``/v1/models`` answers; returns the URL."""
        self.port = self.port or free_port()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self.environment(),
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                self.stop()
                raise RuntimeError(
                    f"vllm exited with {code} before it was ready (log {self.log_path}):\n"
                    + self.log_tail()
                )
            if self._ready():
                return self.url
            time.sleep(1.0)
        self.stop()
        raise RuntimeError(
            f"vllm was not ready within {timeout_s:.0f} s (log {self.log_path}):\n"
            + self.log_tail()
        )

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/v1/models", timeout=5) as resp:
                body = json.loads(resp.read())
        except (OSError, urllib.error.URLError, ValueError):
            return False
        return any(m.get("id") == self.settings.served_model_name for m in body.get("data", []))

    @property
    def pid(self) -> int:
        """The server's process id (the leader of its process group)."""
        assert self.proc is not None
        return self.proc.pid

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM its process group, wait, then SIGKILL; the exit code."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                proc.wait(timeout_s)
        self._signal_group(signal.SIGKILL)  # workers the leader left behind
        if self._log is not None:
            self._log.close()
            self._log = None
        return proc.returncode

    def _signal_group(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)  # its own group: start_new_session

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
