"""``report.html`` opened in headless Chromium: no console errors, no network, every plot drawn.

Needs ``/usr/bin/chromium`` and the ``playwright`` package (``tests/browser.py``); under
``CI=true`` a missing one fails the test, elsewhere it skips. The full-page screenshot
goes to the test's temporary folder; ``HEADWAY_UPDATE_SCREENSHOT=1`` also writes the top
of the page to ``docs/report-screenshot.png`` for the README.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec
import pytest

from browser import open_report
from headway.files.jsonout import to_builtins
from headway.files.workload import load_workload
from headway.planner.executors import LocalExecutor
from headway.planner.plan import build_plan, default_cluster
from headway.planner.simulated import PlanSettings
from headway.report.html import render_plan_html

ROOT = Path(__file__).resolve().parents[2]
CLIP = {"x": 0, "y": 0, "width": 1200, "height": 1560}
PLOTS = {
    "attainment", "goodput", "latency-ttft", "latency-tpot", "latency-e2e", "replicas",
    "burst-queue", "burst-kv", "tails",
}  # fmt: skip
BAD_DAYS = {
    "rows": [
        {
            "policy": "headway-default", "scenario": "one replica lost", "goodput_per_s": 9.1,
            "slo_attainment": 0.93, "ttft_p99_s": 1.2, "e2e_p99_s": 11.0, "shed": 40,
            "amplification": 1.1, "cost_per_successful_task": 0.0015,
        },
        {
            "policy": "fifo-unbounded", "scenario": "one replica lost", "goodput_per_s": 4.0,
            "slo_attainment": 0.41, "ttft_p99_s": 19.0, "e2e_p99_s": 60.0, "shed": 0,
            "amplification": 1.7, "cost_per_successful_task": 0.0041,
        },
    ]
}  # fmt: skip


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference assistant's report: a lighter plan, or the full one for the README."""
    spec = load_workload(ROOT / "examples" / "reference-assistant.yaml").spec
    full = os.environ.get("HEADWAY_UPDATE_SCREENSHOT") == "1"
    settings = PlanSettings() if full else PlanSettings(seeds=2, steady_duration_s=30)
    plan = build_plan(
        spec, default_cluster(spec), LocalExecutor(2 if full else 1), settings=settings
    )
    data: dict[str, Any] = to_builtins(msgspec.structs.replace(plan, bad_days=BAD_DAYS))
    path = tmp_path_factory.mktemp("report") / "report.html"
    path.write_text(render_plan_html(data), encoding="utf-8")
    return path


def test_report_in_chromium(report: Path, tmp_path: Path) -> None:
    shot = tmp_path / "report.png"
    readme = None
    if os.environ.get("HEADWAY_UPDATE_SCREENSHOT") == "1":  # the README's: the top
        readme = (ROOT / "docs" / "report-screenshot.png", CLIP)
    seen = open_report(report, shot, readme)
    assert seen.errors == []
    assert seen.requests == [report.as_uri()]  # the file itself, nothing else
    names = {p["name"] for p in seen.plots}
    assert names >= PLOTS, f"missing plots: {PLOTS - names}"
    assert seen.empty_plots() == [], f"plots drawn empty: {seen.empty_plots()}"
    assert shot.stat().st_size > 10_000


def test_report_has_bad_day_matrix_and_no_network_urls(report: Path) -> None:
    page = report.read_text(encoding="utf-8")
    assert page.startswith("<!doctype html>")
    assert "<script" not in page and "http://" not in page and "https://" not in page
    assert "one replica lost" in page and "fifo-unbounded" in page
    assert page.count('class="plot"') >= len(PLOTS)
