"""Run ``headway gateway`` as a child process: for tests, benchmarks and drills.

``with GatewayProcess(config_dict) as gw: ... gw.url ...`` writes the config to a
temporary YAML file, starts the gateway on a free loopback port, waits for its URL line,
and stops it with SIGTERM (then SIGKILL) on exit.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from headway.server_process import ServerProcess

__all__ = ["GatewayProcess"]


class GatewayProcess(ServerProcess):
    """A ``headway gateway`` child process."""

    def __init__(
        self, config: dict[str, Any], *, prefix: tuple[str, ...] = (), args: tuple[str, ...] = ()
    ) -> None:
        """``args``: extra command-line arguments (e.g. ``--redis URL``); ``prefix``:
        command words before the interpreter (e.g. ``taskset -c 1``)."""
        super().__init__("gateway", args, prefix=prefix)
        self.config = config
        self.path: Path | None = None

    def write_config(self, config: dict[str, Any]) -> None:
        """(Re)write the config file (``/admin/reload`` reads it)."""
        self.config = config
        if self.path is None:
            fd, name = tempfile.mkstemp(suffix=".yaml", prefix="headway-gateway-")
            os.close(fd)
            self.path = Path(name)
        self.path.write_text(yaml.safe_dump(config), encoding="utf-8")

    def secrets(self) -> list[str]:
        """Tenant API keys, the admin and metrics tokens, the cache-salt key and the
        upstreams' API keys of its config."""
        config = self.config
        found = [*config.get("tenants", {})]
        names = ("admin_token", "metrics_token", "cache_salt_key")
        found += [str(config[name]) for name in names if config.get(name)]
        found += [str(u["api_key"]) for u in config.get("upstreams", []) if u.get("api_key")]
        return found

    def log_files(self) -> list[str]:
        """Its access log, when it is a file."""
        path = self.config.get("access_log")
        return [str(path)] if path and path != "-" else []

    def verb_args(self) -> list[str]:
        """``--config FILE`` (the config written afresh), then the extra arguments."""
        self.write_config(self.config)
        return ["--config", str(self.path), *self.args]

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """Stop it and remove its config file."""
        code = super().stop(timeout_s)
        if self.path is not None:
            self.path.unlink(missing_ok=True)
        return code
