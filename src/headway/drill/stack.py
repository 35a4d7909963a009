"""Where a drill runs: a local stack it starts (gateway + emulated engines, and Redis when
asked) or a user's deployment, and how each fault action is carried out there.

On the local stack every action is real: engines are killed with SIGKILL and started
again on the same port, faults are switched on through the emulator's ``/admin/faults``,
Redis is killed and restarted, the gateway's config file is rewritten and reloaded. On a
user's deployment an action runs the shell command the hooks file gives for it (e.g.
``kubectl delete pod ...``); a drill whose action has no hook is skipped, not failed.
"""

from __future__ import annotations

import asyncio
import copy
import os
import shlex
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Protocol

import aiohttp

from headway.core.errors import ConfigError
from headway.drill.spec import ACTIONS, Fault, StackSpec
from headway.emulate.process import EmulatorProcess
from headway.files.workload import read_yaml
from headway.gateway.process import GatewayProcess
from headway.loopback import free_port
from headway.redis_process import RedisServer, find_redis_server

__all__ = ["ADMIN_TOKEN", "LocalStack", "RemoteStack", "Stack", "Unsupported", "read_hooks"]

ADMIN_TOKEN: Final = "drill-admin-token"
MODEL: Final = "llama-3-8b"
TENANTS: Final = {
    "sk-drill-a": {"name": "a", "share": 1.0},
    "sk-drill-b": {"name": "b", "share": 1.0},
    "sk-drill-heavy": {"name": "heavy", "share": 1.0},
}


class Unsupported(Exception):
    """This stack cannot carry out the action (a drill needing it is skipped)."""


class Stack(Protocol):
    """What a drill needs of the stack it runs against."""

    gateway_urls: list[str]
    engine_urls: list[str]
    metrics_token: str | None
    """Sent as the bearer token when reading the gateways' ``/metrics``."""
    keys: dict[str, str]
    """The drill's tenant keys → the API keys to send."""

    def gateway_pids(self) -> list[int]: ...
    async def act(self, fault: Fault, session: aiohttp.ClientSession) -> dict[str, float]: ...
    async def wait_ready(self, session: aiohttp.ClientSession, timeout_s: float) -> None: ...


async def _post(
    session: aiohttp.ClientSession,
    url: str,
    body: object,
    headers: Mapping[str, str] | None = None,
    method: str = "POST",
) -> tuple[int, Any]:
    async with (
        asyncio.timeout(10.0),
        session.request(method, url, json=body, headers=dict(headers or {})) as response,
    ):
        try:
            data = await response.json(content_type=None)
        except ValueError:
            data = None
        return response.status, data


async def wait_health(
    session: aiohttp.ClientSession, url: str, timeout_s: float, *, want: int = 200
) -> float:
    """Poll ``url``/health until it answers ``want``; the seconds it took."""
    start = time.monotonic()
    while True:
        try:
            async with asyncio.timeout(2.0), session.get(f"{url}/health") as response:
                if response.status == want:
                    return time.monotonic() - start
        except (TimeoutError, aiohttp.ClientError, OSError):
            pass
        if time.monotonic() - start > timeout_s:
            raise TimeoutError(f"{url}/health did not answer {want} within {timeout_s:g} s")
        await asyncio.sleep(0.05)


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


class LocalStack:
    """Gateway(s) + emulated engines (+ Redis) on loopback, started and stopped here."""

    def __init__(self, spec: StackSpec) -> None:
        self.spec = spec
        self.engines: list[EmulatorProcess] = []
        self.engine_args: list[list[str]] = []
        self.gateways: list[GatewayProcess] = []
        self.redis: RedisServer | None = None
        self.engine_urls: list[str] = []
        self.gateway_urls: list[str] = []
        self.metrics_token: str | None = ADMIN_TOKEN  # /metrics takes the admin token
        self.keys = {k: k for k in TENANTS}
        self.config: dict[str, Any] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    def _engine_args(self, revision: str = "r1") -> list[str]:
        spec = self.spec
        args = ["--speedup", str(spec.speedup), "--max-num-seqs", str(spec.max_num_seqs)]
        args += ["--revision", revision, "--model", MODEL]
        if spec.num_kv_blocks is not None:
            args += ["--num-kv-blocks", str(spec.num_kv_blocks)]
        return args

    def gateway_config(self) -> dict[str, Any]:
        """The gateway config for the engines now running."""
        spec = self.spec
        config: dict[str, Any] = {
            "upstreams": [
                {"url": u, "model": MODEL, "revision": spec.revision(i)}
                for i, u in enumerate(self.engine_urls)
            ],
            "tenants": copy.deepcopy(TENANTS),
            "slots_per_upstream": spec.max_num_seqs,
            "admin_token": ADMIN_TOKEN,
            "eject_s": 2.0,
            "shutdown_timeout_s": 5.0,
            "retries": {"max_attempts": 3, "backoff_base_s": 0.0, "backoff_max_s": 0.2},
        }
        if spec.pool:
            config["pool"] = {
                "probe_interval_s": 0.5,
                "probe_deadline_s": 0.4,
                "warmup_probes": 1,
                "metrics_interval_s": 0.5,
            }
        return _merge(config, spec.gateway)

    def start(self) -> None:
        """Start everything (engines first); raises with the reason when a part fails."""
        try:
            if self.spec.redis:
                if find_redis_server() is None:
                    raise Unsupported("needs redis-server (apt-get install redis-server)")
                self.redis = RedisServer()
                self.redis.start()
            for i in range(self.spec.upstreams):
                args = self._engine_args(self.spec.revision(i))
                # A port outside the ephemeral range: a restart gets it back (loopback.py).
                engine = EmulatorProcess([*args, "--port", str(free_port())])
                self.engine_urls.append(engine.start())
                self.engines.append(engine)
                self.engine_args.append(args)
            self.config = self.gateway_config()
            extra = ("--redis", self.redis.url) if self.redis is not None else ()
            for _ in range(self.spec.gateways):
                gateway = GatewayProcess(self.config, args=extra)
                self.gateway_urls.append(gateway.start())
                self.gateways.append(gateway)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop everything that runs."""
        for process in [*self.gateways, *self.engines]:
            process.stop(timeout_s=5.0)
        if self.redis is not None:
            self.redis.kill()

    def gateway_pids(self) -> list[int]:
        """The gateway processes (for their memory)."""
        return [g.pid for g in self.gateways if g.proc is not None and g.proc.poll() is None]

    async def wait_ready(self, session: aiohttp.ClientSession, timeout_s: float) -> None:
        """Until every gateway's /health is 200 (its probes passed)."""
        for url in self.gateway_urls:
            await wait_health(session, url, timeout_s)

    # -- actions -------------------------------------------------------------------------------

    def _port(self, index: int) -> str:
        return self.engine_urls[index].rsplit(":", 1)[1]

    async def _start_engine(self, index: int, args: list[str]) -> None:
        engine = EmulatorProcess([*args, "--port", self._port(index)])
        deadline = time.monotonic() + 10.0
        while True:  # the old socket may linger a moment after a kill
            try:
                await asyncio.to_thread(engine.start)
                break
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
        self.engines[index] = engine
        self.engine_args[index] = args

    async def act(self, fault: Fault, session: aiohttp.ClientSession) -> dict[str, float]:
        """Carry out ``fault``; figures it measured on the way (seconds, counts)."""
        i = fault.engine
        url = self.engine_urls[i] if self.engine_urls else ""
        match fault.action:
            case "engine_faults":
                status, data = await _post(session, f"{url}/admin/faults", fault.params)
                if status != 200:
                    raise RuntimeError(f"{url}/admin/faults answered {status}: {data}")
            case "clear_engine_faults":
                await _post(session, f"{url}/admin/faults", None, method="DELETE")
            case "kill_engine":
                engine = self.engines[i]
                if engine.proc is not None:
                    engine.proc.kill()
                    await asyncio.to_thread(engine.proc.wait)
                engine.stop()
            case "restart_engine":
                await self._start_engine(i, self.engine_args[i])
            case "redeploy_engine":
                await asyncio.to_thread(self.engines[i].stop)
                revision = str(fault.params.get("revision", "r1"))
                await self._start_engine(i, self._engine_args(revision))
            case "rolling_restart":
                return await self._rolling_restart(session)
            case "kill_redis":
                if self.redis is not None:
                    self.redis.kill()
            case "start_redis":
                if self.redis is not None:
                    await asyncio.to_thread(self.redis.start)
            case "reload_config":
                return await self._reload(session, fault.params)
            case "cancel_in_flight":
                raise AssertionError("the runner carries out cancel_in_flight")
        return {}

    def _admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {ADMIN_TOKEN}"}

    async def _upstream_state(self, session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
        status, data = await _post(
            session, f"{self.gateway_urls[0]}/admin/state", None, self._admin(), "GET"
        )
        if status != 200:
            raise RuntimeError(f"/admin/state answered {status}: {data}")
        return next(u for u in data["upstreams"] if u["url"] == url)

    async def _rolling_restart(self, session: aiohttp.ClientSession) -> dict[str, float]:
        """Each engine in turn: drain it at every gateway, wait for its in-flight requests,
        stop it (SIGTERM), start it on its port, wait for the probes, undrain it."""
        longest_drain_s = 0.0
        for i, url in enumerate(self.engine_urls):
            started = time.monotonic()
            for gw in self.gateway_urls:
                body = {"upstream": url, "drain": True}
                status, data = await _post(session, f"{gw}/admin/drain", body, self._admin())
                if status != 200:
                    raise RuntimeError(f"{gw}/admin/drain answered {status}: {data}")
            while (await self._upstream_state(session, url))["outstanding_requests"] > 0:
                if time.monotonic() - started > 30:
                    raise RuntimeError(f"{url} did not drain within 30 s")
                await asyncio.sleep(0.05)
            longest_drain_s = max(longest_drain_s, time.monotonic() - started)
            await asyncio.to_thread(self.engines[i].stop)
            await self._start_engine(i, self.engine_args[i])
            await wait_health(session, url, 10.0)
            for gw in self.gateway_urls:
                body = {"upstream": url, "drain": False}
                await _post(session, f"{gw}/admin/drain", body, self._admin())
            deadline = time.monotonic() + 10.0
            while not (await self._upstream_state(session, url))["ready"]:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{url} was not ready again within 10 s of its restart")
                await asyncio.sleep(0.05)
        return {"longest_drain_s": longest_drain_s}

    async def _reload(
        self, session: aiohttp.ClientSession, params: Mapping[str, Any]
    ) -> dict[str, float]:
        self.config = _merge(self.config, params)
        failed = 0.0
        restart = 0.0
        for gateway in self.gateways:
            gateway.write_config(self.config)
            status, data = await _post(session, f"{gateway.url}/admin/reload", {}, self._admin())
            failed += status != 200
            restart += len((data or {}).get("needs_restart", [])) if status == 200 else 0
        return {"reload_failures": failed, "reload_needs_restart": restart}


def read_hooks(path: str) -> dict[str, str]:
    """The hooks file: a YAML mapping of action → shell command (``{engine}`` and
    ``{engine_url}`` are replaced)."""
    data = read_yaml(Path(path))
    valid = set(ACTIONS) - {"cancel_in_flight"}
    if not isinstance(data, dict):
        raise ConfigError(f"hooks file {path}: write a mapping of action: command", path="$")
    for key, value in data.items():
        if key not in valid:
            raise ConfigError(
                f"hooks file {path}: unknown action {key!r}; use one of {sorted(valid)}",
                path=f"$.{key}",
            )
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"hooks file {path}: {key} must be a shell command", path=f"$.{key}")
    return {str(k): str(v) for k, v in data.items()}


class RemoteStack:
    """A user's deployment: gateway URLs, optional engine URLs (for their metrics), API
    keys, and hooks (shell commands) for the fault actions."""

    def __init__(
        self,
        gateway_urls: Sequence[str],
        *,
        engine_urls: Sequence[str] = (),
        api_keys: Sequence[str] = (),
        metrics_token: str | None = None,
        hooks: Mapping[str, str] | None = None,
    ) -> None:
        self.gateway_urls = [u.rstrip("/") for u in gateway_urls]
        self.engine_urls = [u.rstrip("/") for u in engine_urls]
        self.metrics_token = metrics_token
        keys = list(api_keys) or [os.environ.get("OPENAI_API_KEY", "none")]
        self.keys = {k: keys[n % len(keys)] for n, k in enumerate(TENANTS)}
        self.hooks = dict(hooks or {})

    def gateway_pids(self) -> list[int]:
        """Unknown for a remote deployment."""
        return []

    async def wait_ready(self, session: aiohttp.ClientSession, timeout_s: float) -> None:
        """Until every gateway's /health is 200."""
        for url in self.gateway_urls:
            await wait_health(session, url, timeout_s)

    def can(self, action: str) -> bool:
        """Whether a hook carries out ``action``."""
        return action == "cancel_in_flight" or action in self.hooks

    async def act(self, fault: Fault, session: aiohttp.ClientSession) -> dict[str, float]:
        """Run the hook for ``fault.action``; fail when it exits non-zero."""
        command = self.hooks.get(fault.action)
        if command is None:
            raise Unsupported(f"no hook for {fault.action} (see --hooks in docs/drills.md)")
        url = self.engine_urls[fault.engine] if fault.engine < len(self.engine_urls) else ""
        line = command.replace("{engine}", str(fault.engine)).replace(
            "{engine_url}", shlex.quote(url)
        )
        proc = await asyncio.create_subprocess_shell(line)
        code = await proc.wait()
        if code != 0:
            raise RuntimeError(f"hook {fault.action} ({line}) exited {code}")
        return {}
