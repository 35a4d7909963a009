"""The analytic plan reproduces the seeds' arithmetic, through the CLI's JSON."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from headway.cli import main
from headway.core.workload.arrivals import RateProfile
from headway.planner.analytic import fluid_episodes

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _plan_json(name: str, capsys: pytest.CaptureFixture[str]) -> Any:
    assert main(["plan", str(EXAMPLES / f"{name}.yaml"), "--analytic-only", "--json"]) == 0
    return json.loads(capsys.readouterr().out)["analytic"]


def _values(data: Any, suffix: str, path: str = "$") -> Iterator[tuple[str, Any]]:
    """Every (path, value) whose key ends with ``suffix``."""
    if isinstance(data, dict):
        for key, value in data.items():
            if key.endswith(suffix) and not isinstance(value, dict | list):
                yield f"{path}.{key}", value
            yield from _values(value, suffix, f"{path}.{key}")
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from _values(value, suffix, f"{path}[{i}]")


def _has(data: Any, suffix: str, expected: float, rel: float = 5e-4) -> bool:
    return any(
        isinstance(v, int | float) and v == pytest.approx(expected, rel=rel)
        for _, v in _values(data, suffix)
    )


def test_reference_assistant(capsys: pytest.CaptureFixture[str]) -> None:
    plan = _plan_json("reference-assistant", capsys)
    peak = plan["periods"][1]
    assert peak["name"] == "peak"
    assert peak["calls_per_s"] == pytest.approx(12)
    assert peak["input_tokens_per_s"] == pytest.approx(30000)
    assert peak["output_tokens_per_s"] == pytest.approx(4800)
    assert peak["little"]["tasks_in_flight"] == pytest.approx(200)
    sizing = peak["routes"][0]["sizing"]
    assert (sizing["replicas"], sizing["replicas_with_failover"]) == (6, 7)
    assert sizing["limiting_phase"] == "decode"
    burst = max(plan["bursts"], key=lambda b: b["backlog"])
    assert burst["backlog"] == pytest.approx(300) and burst["drain_s"] == pytest.approx(37.5)
    for suffix, value in [
        ("calls_per_s", 12),
        ("input_tokens_per_s", 30000),
        ("output_tokens_per_s", 4800),
        ("in_flight", 200),
        ("replicas", 6),
        ("replicas_with_failover", 7),
        ("backlog", 300),
        ("drain_s", 37.5),
    ]:
        assert _has(plan, suffix, value), suffix
    assert [a["can_rescue"] for a in plan["autoscaling"]] == [False, False]


@pytest.mark.parametrize(
    ("name", "calls", "utilization", "mean_s", "p95_s"),
    [
        ("agent-amplification", 13.8, 0.767, 0.238, 0.713),
        ("agent-amplification-longer-loop", 17.25, 0.958, 1.333, 3.994),
    ],
)
def test_agent_amplification(
    name: str,
    calls: float,
    utilization: float,
    mean_s: float,
    p95_s: float,
    capsys: pytest.CaptureFixture[str],
) -> None:
    plan = _plan_json(name, capsys)
    route = next(r for r in plan["periods"][0]["routes"] if r["route"] == "agent-llm")
    assert route["calls_per_s"] == pytest.approx(calls)
    mm1 = next(q for q in route["queueing"] if q["model"] == "M/M/1")
    assert mm1["utilization"] == pytest.approx(utilization, abs=5e-4)
    assert mm1["mean_s"] == pytest.approx(mean_s, abs=5e-4)
    assert mm1["p95_s"] == pytest.approx(p95_s, abs=5e-4)
    first = plan["bursts"][0]
    assert first["backlog"] == pytest.approx(4800)
    assert first["drain_s"] == pytest.approx(106.7, abs=0.05)
    assert _has(plan, "calls_per_s", calls) and _has(plan, "utilization", utilization, 1e-3)


def test_fluid_model_never_clears_and_two_phase_episode() -> None:
    import numpy as np

    profile = RateProfile(np.array([0.0, 10, 20, 30, 40]), np.array([5.0, 15, 8, 12]))
    episodes = fluid_episodes(profile, 10.0, "s", "tasks")
    # +50 in [10,20), -20 in [20,30) -> 30 left, +20 in [30,40) -> 50 at the end: never clears
    assert len(episodes) == 1
    assert episodes[0].backlog == pytest.approx(50) and not episodes[0].drained


def test_plan_writes_report_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    args = ["plan", str(EXAMPLES / "reference-assistant.yaml"), "--analytic-only"]
    assert main([*args, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "replicas" in text.lower() or "Routes" in text
    data = json.loads((out / "plan.json").read_text())
    assert data["schema"] == "headway.plan/1"
    assert data["analytic"]["schema"] == "headway.plan.analytic/1"
    assert data["simulated"] is None and data["skipped"] == "--analytic-only was given"
    page = (out / "report.html").read_text()
    assert page.startswith("<!doctype html>") and "<svg" in page
    assert "http://" not in page and "https://" not in page  # self-contained


def test_plan_bad_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "w.yaml"
    bad.write_text("name: x\nclasses: {a: {calls: -1}}\nsources: []\n", encoding="utf-8")
    assert main(["plan", str(bad), "--analytic-only"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("headway: error: ") and "$.classes.a" in err


def test_report_files_get_ordinary_permissions(tmp_path: Path) -> None:
    import os
    import stat

    out = tmp_path / "out"
    args = ["plan", str(EXAMPLES / "reference-assistant.yaml"), "--analytic-only"]
    assert main([*args, "--out", str(out)]) == 0
    umask = os.umask(0)
    os.umask(umask)
    mode = stat.S_IMODE((out / "report.html").stat().st_mode)
    assert mode == 0o666 & ~umask
