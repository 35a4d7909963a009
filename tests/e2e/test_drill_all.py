"""`headway drill all` against the local stack (gateways + emulated engines + Redis, all
started by the command on loopback ports) must pass every drill: the issue's must-show,
run as CI runs it. The JSON and HTML it writes are checked too."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from binaries import require_binary
from browser import open_report
from headway.drill.catalog import DRILLS

pytestmark = [pytest.mark.timeout(900), pytest.mark.xdist_group("drills")]


def test_drill_all_passes_against_the_local_stack(tmp_path: Path) -> None:
    require_binary("redis-server")
    out = tmp_path / "drills"
    proc = subprocess.run(
        [sys.executable, "-m", "headway", "drill", "all", "--out", str(out), "--json"],
        capture_output=True, text=True, timeout=840, env=None,
    )  # fmt: skip
    data = json.loads(proc.stdout)
    failed = {
        r["name"]: r["detail"] or [c for c in r["checks"] if not c["passed"]]
        for r in data["results"]
        if r["status"] != "passed"
    }
    assert not failed, f"{failed}\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [r["name"] for r in data["results"]] == list(DRILLS)
    assert data["schema"] == "headway.drills/1"
    for result in data["results"]:
        assert result["checks"], result["name"]
        assert result["figures"]["lost"] == 0
        assert result["figures"]["calls"] > 0
    written = json.loads((out / "drills.json").read_text())
    assert written["results"] == data["results"]
    page = (out / "drills.html").read_text()
    for name in DRILLS:
        assert f"id='{name}'" in page
    assert "FAIL" not in page
    seen = open_report(out / "drills.html", tmp_path / "drills.png")
    assert seen.errors == [] and seen.requests == [(out / "drills.html").as_uri()]
    assert len(seen.plots) >= 2 * len(DRILLS)  # running requests and KV use, per drill
    assert seen.empty_plots() == [], seen.empty_plots()
