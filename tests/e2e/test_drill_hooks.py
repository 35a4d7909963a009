"""`headway drill kill-decode --target ... --hooks FILE` against a deployment of two
engines the test started (emulators here; `tests/real_engine` does it with vLLM): the
hooks really kill an engine's process group and start it again on its port, and the
drill judges a deployment of any size (it expected three upstreams ready at the end, the
local stack's count, so every two-engine deployment failed the drill)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import engine_hooks
from headway.drill.spec import StackSpec
from headway.drill.stack import ADMIN_TOKEN, MODEL, TENANTS, LocalStack
from headway.gateway.process import GatewayProcess
from headway.loopback import free_port


def test_kill_decode_through_hooks_on_a_two_engine_deployment(tmp_path: Path) -> None:
    state = tmp_path / "engines"
    urls = []
    try:
        for engine in range(2):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            command = [sys.executable, "-m", "headway", "emulate", "--host", "127.0.0.1",
                       "--port", str(port), "--max-num-seqs", "4", "--model", MODEL,
                       "--revision", "r1"]  # fmt: skip
            engine_hooks.record(state, engine, command=command, env=dict(os.environ),
                                log_path=tmp_path / f"engine-{engine}.log", url=url)  # fmt: skip
            engine_hooks.start(state, engine)
            urls.append(url)
        stack = LocalStack(StackSpec(upstreams=2))
        stack.engine_urls = urls
        with GatewayProcess(stack.gateway_config()) as gateway:
            hooks = engine_hooks.hooks_file(state)
            args = ["--target", gateway.url, *(a for u in urls for a in ("--engine", u)),
                    *(a for k in TENANTS for a in ("--api-key", k)),
                    "--metrics-token", ADMIN_TOKEN, "--hooks", str(hooks),
                    "--out", str(tmp_path)]  # fmt: skip
            proc = subprocess.run(
                [sys.executable, "-m", "headway", "drill", "kill-decode", *args],
                capture_output=True, text=True, timeout=300,
            )  # fmt: skip
        result = json.loads((tmp_path / "drills.json").read_text())["results"][0]
        failed = [c for c in result["checks"] if not c["passed"]]
        assert result["status"] == "passed" and proc.returncode == 0, (result["detail"], failed)
        actions = [(e["action"], e["engine"]) for e in result["timeline"]]
        assert sorted(actions) == [("kill_engine", 1), ("restart_engine", 1)]
        figures = result["figures"]
        assert figures["cut"] >= 1  # the kill really cut streams under way
        assert figures["upstreams_ready_after"] == 2
        assert figures["upstreams_not_ready_after"] == 0
    finally:
        engine_hooks.stop_all(state)
