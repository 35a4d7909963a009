"""The drills as data: every expectation names a figure the runner measures, every fault
an action the stacks carry out; the CLI refuses bad input with a clear error; a remote
target without hooks skips the drills that need them and runs the rest."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from headway.drill.catalog import DRILLS
from headway.drill.load import STATES
from headway.drill.run import FIGURES
from headway.drill.spec import ACTIONS, Expect
from headway.drill.stack import read_hooks
from headway.emulate.process import EmulatorProcess
from headway.gateway.process import GatewayProcess

FAULT_FIGURES = {
    "excluded_within_s", "cancel_free_s", "cancelled_calls", "cancelled_in_flight",
    "longest_drain_s", "reload_failures", "reload_needs_restart",
    "serving_fingerprints_distinct", "upstreams_ready_after", "engine_kv_usage_after",
    "faulted_ttft_ratio", "faulted_share", "budget_sheds_after_return", "cancelled_unseen",
    "ready_again_s", "route_back_within_s", "errors_after_route_back",
}  # fmt: skip
"""Figures measured beside :data:`FIGURES`: by fault actions and the runner's extras."""


def _known(figure: str) -> bool:
    return (
        figure in FIGURES
        or figure in FAULT_FIGURES
        or figure.startswith(("gateway_sheds_", "ok_fraction_"))
        or figure.removesuffix("_done") in ACTIONS
    )


@pytest.mark.parametrize("name", list(DRILLS))
def test_each_drill_names_measured_figures_and_real_actions(name: str) -> None:
    drill = DRILLS[name]
    assert drill.expect, "a drill with no expectation shows nothing"
    for expect in drill.expect:
        assert _known(expect.figure), f"{name}: {expect.figure} is never measured"
        assert expect.why
    for fault in drill.faults:
        assert fault.action in ACTIONS
        assert 0 <= fault.at_s < drill.load.duration_s, f"{name}: a fault after the load"
    for key in drill.load.tenants:
        assert key.startswith("sk-drill-")
    assert set(STATES) <= set(FIGURES)


def test_expect_judges_and_fails_what_was_not_measured() -> None:
    at_most = Expect(figure="lost", op="<=", value=0.1, why="")
    assert at_most.holds(0.1) and not at_most.holds(0.2)
    assert not at_most.holds(None) and not at_most.holds(math.nan)
    assert Expect(figure="x", op="<", value=1, why="").holds(0.99)
    assert not Expect(figure="x", op="==", value=1, why="").holds(math.inf)


def _headway(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "headway", "drill", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_cli_refuses_unknown_drills_and_stray_flags(tmp_path: Path) -> None:
    proc = _headway("no-such-drill")
    assert proc.returncode == 2
    assert "unknown drill 'no-such-drill'" in proc.stderr and "kill-prefill" in proc.stderr
    proc = _headway("all", "--engine", "http://127.0.0.1:1")
    assert proc.returncode == 2 and "--target" in proc.stderr
    proc = _headway("soak", "--duration-s", "-1")
    assert proc.returncode == 2 and "--duration-s" in proc.stderr
    listing = _headway("--list")
    assert listing.returncode == 0
    assert [line.split()[0] for line in listing.stdout.splitlines()] == list(DRILLS)


def test_hooks_file_errors_name_the_action(tmp_path: Path) -> None:
    path = tmp_path / "hooks.yaml"
    path.write_text("kill_engine: kubectl delete pod vllm-{engine}\nrestart_engine: ''\n")
    with pytest.raises(Exception, match="restart_engine must be a shell command"):
        read_hooks(str(path))
    path.write_text("kill_gpu: 'true'\n")
    with pytest.raises(Exception, match="unknown action 'kill_gpu'"):
        read_hooks(str(path))
    path.write_text("kill_engine: 'true'\n")
    assert read_hooks(str(path)) == {"kill_engine": "true"}


def test_remote_target_runs_what_needs_no_hook_and_skips_the_rest(tmp_path: Path) -> None:
    """A user's deployment (here: a gateway and an engine started by the test): a drill
    without faults runs against it; one that must kill an engine has no hook and is
    skipped, not failed; a hook that fails makes its drill an error (exit 1)."""
    with EmulatorProcess(["--speedup", "20", "--max-num-seqs", "8"]) as engine:
        config = {"upstreams": [{"url": engine.url}], "tenants": {"sk-mine": {"name": "me"}},
                  "metrics_token": "t0k"}  # fmt: skip
        with GatewayProcess(config) as gateway:
            base = ["--target", gateway.url, "--engine", engine.url, "--api-key", "sk-mine",
                    "--metrics-token", "t0k", "--duration-s", "2"]  # fmt: skip
            proc = _headway("slow-client", "kill-prefill", "--out", str(tmp_path), *base)
            data = json.loads((tmp_path / "drills.json").read_text())
            status = {r["name"]: r["status"] for r in data["results"]}
            assert status == {"slow-client": "passed", "kill-prefill": "skipped"}, proc.stderr
            assert proc.returncode == 0
            skipped = data["results"][1]
            assert "kill_engine" in skipped["detail"] and "restart_engine" in skipped["detail"]
            hooks = tmp_path / "hooks.yaml"
            hooks.write_text("kill_engine: 'exit 3'\nrestart_engine: 'true'\n")
            proc = _headway("kill-prefill", "--out", str(tmp_path), "--hooks", str(hooks), *base)
            assert proc.returncode == 1
            result = json.loads((tmp_path / "drills.json").read_text())["results"][0]
            assert result["status"] == "error" and "exited 3" in result["detail"]
