"""Run ``headway emulate`` as a child process: for tests, benchmarks and drills.

``with EmulatorProcess(["--speedup", "10"]) as emu: ... emu.url ...`` starts the emulator
on a free loopback port, waits for the URL line it prints, and stops it with SIGTERM
(then SIGKILL) on exit.
"""

from __future__ import annotations

import itertools
import re
import urllib.request
from collections.abc import Sequence

from headway.server_process import ServerProcess

__all__ = ["EmulatorProcess"]


class EmulatorProcess(ServerProcess):
    """A ``headway emulate`` child process."""

    def __init__(self, args: Sequence[str] = ()) -> None:
        super().__init__("emulate", ["--host", "127.0.0.1", "--port", "0", *args])

    def secrets(self) -> list[str]:
        """Its ``--admin-token`` (or ``--admin-token=TOKEN``)."""
        args = self.args
        found = [b for a, b in itertools.pairwise(args) if a == "--admin-token"]
        return found + [a.split("=", 1)[1] for a in args if a.startswith("--admin-token=")]

    def tokens_served(self) -> float:
        """Tokens it has prefilled and generated so far (its ``vllm:prompt_tokens_total``
        and ``vllm:generation_tokens_total`` counters): what its tenants really took."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        total = 0.0
        for name in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total"):
            found = re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)
            total += sum(float(v) for v in found)
        return total
