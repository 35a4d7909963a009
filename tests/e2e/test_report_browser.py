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
from headway.executors import LocalExecutor
from headway.files.jsonout import to_builtins
from headway.files.workload import load_workload
from headway.planner.plan import build_plan, default_cluster
from headway.planner.simulated import PlanSettings
from headway.report.html import render_plan_html

ROOT = Path(__file__).resolve().parents[2]
GROWTH = 10.0
CLIP = {"x": 0, "y": 0, "width": 1200, "height": 1560}
PLOTS = {
    "attainment", "goodput", "latency-ttft", "latency-tpot", "latency-e2e", "replicas",
    "burst-queue", "burst-kv", "tails", "growth",
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
        spec,
        default_cluster(spec),
        LocalExecutor(2 if full else 1),
        settings=settings,
        growth=GROWTH,
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


def test_report_puts_energy_beside_cost(report: Path) -> None:
    """Issue 19, deliverable 7: joules per SLO-satisfying request and per verified outcome
    in the cost section (the H100 catalog's board power)."""
    page = report.read_text(encoding="utf-8")
    cost = page[page.index("<h2>Cost</h2>") :]
    assert "J</b> per SLO-satisfying request" in cost and "J per verified outcome" in cost


def test_report_leads_with_the_three_numbers(report: Path, tmp_path: Path) -> None:
    """Issue 19, deliverable 5: offered load, SLO goodput and verified-outcome goodput
    side by side over the sweep, the first section after the summary."""
    seen = open_report(report, tmp_path / "report.png")
    title = "Offered load, SLO goodput, verified-outcome goodput"
    tables = [t for t in seen.tables if t["title"] == title]
    assert len(tables) == 1, [t["title"] for t in seen.tables]
    columns = tables[0]["columns"]
    assert columns[1:3] == ["offered (tasks/s)", "offered (calls/s)"]
    assert "verified outcomes (tasks/s)" in columns and "workflow pressure (%)" in columns
    page = report.read_text(encoding="utf-8")
    assert page.index("id='three-numbers'") < page.index("Capacity at SLO")
    section = page[page.index("id='three-numbers'") : page.index("Capacity at SLO")]
    assert section.count("<tr>") >= 4  # the header and a row per simulated load


def test_report_shows_littles_law_at_every_boundary(report: Path, tmp_path: Path) -> None:
    """Issue 19, result 1: the replayed run's check at each boundary, in its own table."""
    seen = open_report(report, tmp_path / "report.png")
    tables = [t for t in seen.tables if t["title"] == "Little's law at every boundary"]
    assert len(tables) == 1, [t["title"] for t in seen.tables]
    page = report.read_text(encoding="utf-8")
    section = page[page.index("id='little'") :]
    for boundary in ("tasks (", "gateway (", "replicas (", "KV blocks ("):
        assert boundary in section, boundary


def test_report_shows_the_segmented_tails_worst_first(report: Path, tmp_path: Path) -> None:
    """Issue 19, deliverable 4: the replayed run's worst segments, cut the way seed 002
    lists, in a table Chromium draws with its rows, lowest attainment first."""
    seen = open_report(report, tmp_path / "report.png")
    tables = [t for t in seen.tables if t["title"] == "Worst segments of the tail"]
    assert len(tables) == 1, [t["title"] for t in seen.tables]
    columns, rows = tables[0]["columns"], tables[0]["rows"]
    assert columns[:3] == ["segment", "name", "calls"] and "attainment (%)" in columns
    assert 3 <= len(rows) <= 15
    attainment = [float(r[columns.index("attainment (%)")].rstrip("%")) for r in rows]
    assert attainment == sorted(attainment)
    # The reference assistant's 30 s burst to 20 runs/s is its worst arrival-time bucket.
    assert "arrival time" in {r[0] for r in rows}, rows


def test_no_two_labels_of_a_plot_overlap(report: Path, tmp_path: Path) -> None:
    """Issue 16, defect 18: "knee" was drawn on "SLO 3 s", "target 95%" on "planned 4"."""
    seen = open_report(report, tmp_path / "report.png")
    assert seen.plots, "no plot was read"
    assert seen.overlaps == [], seen.overlaps


UNITS = ("(s)", " s)", "(%", "(×)", "/s", "$", "(tasks", "(calls", "(replicas", "(tokens",
         "(items", "(its unit")  # fmt: skip
"""How a column names its unit ("its unit": each cell carries its row's own unit)."""
DIMENSIONLESS = {"seed", "points", "replicas", "segment", "name", "calls", "policy", "scenario",
                 "period", "route", "source", "class", "in time", "unit", "limit",
                 "boundary", "resource", "of", "fixed limit", "capacity from"}  # fmt: skip
"""Column names that need no unit: names, labels and counts of the thing they name."""


def test_every_table_column_has_a_unit_or_is_dimensionless(report: Path, tmp_path: Path) -> None:
    """Issue 16, defect 17: "goodput" and "KV max" had no unit. A column names its unit
    ("TTFT p99 (s)", "calls/s", "$ per ..."), or is a name or a count by its name; in a
    table whose first column is "figure", each row names its own unit."""
    seen = open_report(report, tmp_path / "report.png")
    assert len(seen.tables) >= 8, seen.tables
    missing = []
    for t in seen.tables:
        columns = t["columns"]
        if columns and columns[0] == "figure":
            continue
        missing += [f"{t['title']}: {c!r}" for c in columns
                    if c not in DIMENSIONLESS and not any(u in c for u in UNITS)]  # fmt: skip
    assert missing == [], missing


def test_report_shows_the_growth_what_if(report: Path, tmp_path: Path) -> None:
    """Issue 19, deliverable 6: the plan made with growth 10 has its section: the
    resources (the first to saturate marked) with utilisation and saturating growth, the
    replicas at 10×, and the utilisation-against-growth plot drawn."""
    seen = open_report(report, tmp_path / "report.png")
    title = f"Growth what-if: today's peak × {GROWTH:g}"
    tables = [t for t in seen.tables if t["title"] == title]
    assert len(tables) == 1, [t["title"] for t in seen.tables]
    columns = tables[0]["columns"]
    assert columns[:4] == ["resource", "of", "utilisation now (%)", "saturates at (×)"]
    needs = [t for t in seen.tables if t["title"] == f"Replicas at {GROWTH:g}×"]
    assert len(needs) == 1 and f"at {GROWTH:g}× (replicas)" in needs[0]["columns"]
    assert "growth" in {p["name"] for p in seen.plots}
    page = report.read_text(encoding="utf-8")
    section = page[page.index("id='growth'") : page.index("Analytic plan: demand")]
    assert "<b>decode (route assistant)</b> saturates first" in section
    assert section.count("<tr>") >= 1 + 3 + 2  # headers, three resources, one route
    assert section.index("decode") < section.index("KV memory")


@pytest.fixture(scope="module")
def pools_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The agent-amplification example's report: two routes, a pool each (the default
    cluster), sized pool by pool (the replica search only, to stay short)."""
    spec = load_workload(ROOT / "examples" / "agent-amplification.yaml").spec
    settings = PlanSettings(seeds=1, steady_duration_s=30, stages=("replicas",))
    plan = build_plan(spec, default_cluster(spec), LocalExecutor(1), settings=settings)
    path = tmp_path_factory.mktemp("pools") / "report.html"
    path.write_text(render_plan_html(to_builtins(plan)), encoding="utf-8")
    return path


def test_report_shows_each_pools_count(pools_report: Path, tmp_path: Path) -> None:
    """Issue 19, deliverable 3: a cluster of pools has its per-pool section: each pool's
    count with all up and with one lost, the attainment at it and one fewer (a chart of
    both), and the points tried, each with its pools' counts."""
    seen = open_report(pools_report, tmp_path / "report.png")
    assert seen.errors == [] and seen.overlaps == []
    counts = [t for t in seen.tables if t["title"] == "Each pool's count"]
    assert len(counts) == 1, [t["title"] for t in seen.tables]
    columns, rows = counts[0]["columns"], counts[0]["rows"]
    assert columns[:4] == ["pool", "routes", "target (%)", "holding the peak (replicas)"]
    assert [r[0] for r in rows] == ["agent-llm", "bulk"]
    assert all(int(r[3]) >= 1 for r in rows)
    tried = [t for t in seen.tables if t["title"] == "Points tried at the peak"]
    assert len(tried) == 1 and all("agent-llm " in r[0] and " · bulk " in r[0]
                                   for r in tried[0]["rows"])  # fmt: skip
    assert "pools" in {p["name"] for p in seen.plots}
    assert "pools" not in seen.empty_plots()
    page = pools_report.read_text(encoding="utf-8")
    assert "pool <b>agent-llm</b>: " in page and "pool <b>bulk</b>: " in page
