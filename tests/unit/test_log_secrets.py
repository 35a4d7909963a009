"""The log scan of ``tests/log_secrets.py`` finds a configured secret in a server's output
and in its log file, and nothing else."""

from __future__ import annotations

from pathlib import Path

import log_secrets
from headway.gateway.process import GatewayProcess
from headway.server_process import ServerProcess


def test_the_scan_finds_each_configured_secret_once(tmp_path: Path) -> None:
    access = tmp_path / "access.jsonl"
    config = {
        "upstreams": [{"url": "http://127.0.0.1:9", "api_key": "upstream-key-1"}],
        "tenants": {"tenant-key-1": {"name": "a"}, "short": {"name": "b"}},
        "admin_token": "admin-token-1",
        "access_log": str(access),
    }
    gateway = GatewayProcess(config)  # never started: its output is written here
    ServerProcess.started.append(gateway)
    try:
        gateway.output += ["serving\n", "bad request: Authorization: Bearer tenant-key-1\n"]
        access.write_text('{"status": 200}\n{"note": "admin-token-1"}\n', encoding="utf-8")
        found = log_secrets.leaks()
        assert len(found) == 2, found
        assert "output line 2" in found[0] and "log file" in found[1]
        assert not any("tenant-key-1" in f or "admin-token-1" in f for f in found)
        access.write_text("", encoding="utf-8")
        gateway.output.append("short upstream-key\n")  # "short" is below the minimum length
        assert log_secrets.leaks() == []
        gateway.output.append("upstream-key-1\n")
        assert len(log_secrets.leaks()) == 1
    finally:
        ServerProcess.started.remove(gateway)
