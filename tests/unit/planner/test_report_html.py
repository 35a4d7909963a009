"""The report's charts and page, from data alone."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from headway.core.errors import ConfigError
from headway.files.jsonout import to_builtins
from headway.files.workload import load_workload
from headway.planner.analytic import plan_analytic
from headway.report.commands import read_plan
from headway.report.html import render_plan_html
from headway.report.svg import Frame, Line, Rule, bar_chart, line_chart, nice_ticks

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


@pytest.mark.parametrize(
    ("lo", "hi", "expected"),
    [
        (0, 1, [0, 0.2, 0.4, 0.6, 0.8, 1.0]),
        (0, 23, [0, 5, 10, 15, 20]),
        (3, 3, [3, 3.2, 3.4, 3.6, 3.8, 4]),
    ],
)
def test_nice_ticks(lo: float, hi: float, expected: list[float]) -> None:
    assert nice_ticks(lo, hi) == pytest.approx(expected)


def test_line_chart_draws_series_rules_and_skips_non_finite_points() -> None:
    svg = line_chart(
        Frame("x", "A & B", "load", "s"),
        [Line("p99", [(1, 2.0), (2, math.nan), (3, 5.0)]), Line("empty", [])],
        [Rule("knee", 2.5), Rule("SLO", 4.0, axis="y")],
    )
    assert svg.startswith('<svg class="plot" data-plot="x"') and svg.endswith("</svg>")
    assert "A &amp; B" in svg  # escaped
    assert svg.count("<polyline") == 1 and svg.count("<circle") == 2
    assert "knee" in svg and "SLO" in svg and "nan" not in svg


def test_bar_chart_draws_one_bar_per_value() -> None:
    svg = bar_chart(Frame("b", "tails", "", "s"), ["a", "b", "c"], [("p99", [1.0, None, 3.0])])
    assert svg.count('<rect class="series"') == 2


def test_an_analytic_only_file_of_the_earlier_schema_still_renders() -> None:
    analytic = to_builtins(plan_analytic(load_workload(EXAMPLES / "reference-assistant.yaml").spec))
    page = render_plan_html(analytic)
    assert "Analytic plan: demand" in page and "Capacity at SLO" not in page
    assert "was not computed" in page  # the bad-day slot says so


def test_bad_days_render_as_a_coloured_table_from_a_list() -> None:
    analytic = to_builtins(plan_analytic(load_workload(EXAMPLES / "reference-assistant.yaml").spec))
    data = {
        "schema": "headway.plan/1", "workload": "w", "summary": ["one line"],
        "analytic": analytic, "simulated": None, "comparison": [], "skipped": "test",
        "bad_days": [{"policy": "p", "scenario": "replica lost", "slo_attainment": 0.5}],
    }  # fmt: skip
    page = render_plan_html(data)
    assert "replica lost" in page and "background:hsl(" in page
    assert "<p>one line</p>" in page and "Not simulated: test." in page


def test_read_plan_names_the_problem(tmp_path: Path) -> None:
    bad = tmp_path / "plan.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(ConfigError, match="not JSON"):
        read_plan(bad)
    with pytest.raises(ConfigError, match="no such file"):
        read_plan(tmp_path / "missing.json")


def test_bad_days_render_from_a_bad_day_matrix() -> None:
    analytic = to_builtins(plan_analytic(load_workload(EXAMPLES / "reference-assistant.yaml").spec))
    matrix = {
        "schema": "headway.baddays/1",
        "cells": [
            {"scenario": "long-prompts", "preset": "headway-default", "slo_attainment": 0.9,
             "goodput_per_s": 3.0, "shed": 12, "amplification": 1.2},
        ],
    }  # fmt: skip
    data = {"schema": "headway.plan/1", "workload": "w", "analytic": analytic, "bad_days": matrix}
    page = render_plan_html(data)
    assert "long-prompts" in page and "headway-default" in page and "1.2×" in page


def test_bad_days_say_what_they_ran_and_flag_a_storm_that_did_not_form() -> None:
    """Issue 16, defect 16: the table did not say it ran the first 180 s (the bursts of
    the reference assistant start at 300 s), nor that a 1x retry storm was none."""
    analytic = to_builtins(plan_analytic(load_workload(EXAMPLES / "reference-assistant.yaml").spec))
    note = "no storm formed: 1.00 attempts per call"
    matrix = {
        "schema": "headway.bad-days/1", "duration_s": 180.0, "load_factor": 1.0,
        "cluster_replicas": 4,
        "cells": [{"scenario": "retry-storm", "preset": "headway-default", "slo_attainment": 1.0,
                   "amplification": 1.0, "note": note}],
    }  # fmt: skip
    data = {"schema": "headway.plan/1", "workload": "w", "analytic": analytic, "bad_days": matrix}
    page = render_plan_html(data)
    assert "first 180 s at 1× its load on 4 replicas" in page
    assert "bursts (from 300 s) start after it" in page
    assert note in page
