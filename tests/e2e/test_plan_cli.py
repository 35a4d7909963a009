"""`headway plan` and `headway report` end to end through the CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from headway.cli import main

WORKLOAD: dict[str, Any] = {
    "name": "small-plan",
    "duration_s": 100,
    "seed": 3,
    "classes": {
        "chat": {
            "input_tokens": {"dist": "lognormal", "mean": 1200, "cv": 0.8, "max": 8000},
            "output_tokens": {"dist": "lognormal", "mean": 200, "cv": 0.8, "max": 2000},
            "slo": {"ttft_s": 0.5, "tpot_s": 0.04, "attainment_target": 0.9},
        }
    },
    "sources": [
        {
            "name": "users",
            "arrivals": {
                "process": "poisson",
                "rate_per_s": 5,
                "bursts": [{"start_s": 50, "duration_s": 10, "rate_per_s": 20}],
            },
            "peak_rate_per_s": 10,
            "capacity_per_s": 12,
        }
    ],
    "routes": {
        "chat": {
            "model": "llama-3-8b",
            "replica": {"output_tokens_per_s": 1500, "price_per_hour": 3.0},
        }
    },
}
CLUSTER = {"replicas": 4, "model": "llama-3-8b", "gpu": "h100"}
QUICK = ["--seeds", "2", "--point-duration-s", "30"]


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    w, c = tmp_path / "w.yaml", tmp_path / "c.yaml"
    w.write_text(yaml.safe_dump(WORKLOAD), encoding="utf-8")
    c.write_text(yaml.safe_dump(CLUSTER), encoding="utf-8")
    return w, c


def test_plan_writes_plan_and_report_and_report_rerenders(
    files: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    w, c = files
    out = tmp_path / "out"
    assert (
        main(["plan", str(w), "--cluster", str(c), "--out", str(out), "--jobs", "1", *QUICK]) == 0
    )
    text = capsys.readouterr().out
    assert re.search(r"\d+ replicas? of Llama-3-8B on H100-SXM holds? the peak", text)
    assert "report.html" in text.replace("\n", "")
    plan = json.loads((out / "plan.json").read_text(encoding="utf-8"))
    assert plan["schema"] == "headway.plan/1" and plan["complete"] is True
    assert plan["bad_days"]["schema"] == "headway.bad-days/1"
    sim = plan["simulated"]
    assert sim["cluster_source"].startswith(str(c))
    assert sim["knee"]["found"] and sim["cost"]["cost_per_successful_task"] > 0
    page = (out / "report.html").read_text(encoding="utf-8")
    assert page.startswith("<!doctype html>") and 'data-plot="attainment"' in page
    assert "retry-storm" in page  # the bad-day matrix is in the report
    again = tmp_path / "again.html"
    assert main(["report", str(out / "plan.json"), "--out", str(again)]) == 0
    assert again.read_text(encoding="utf-8") == page  # rendered from the JSON alone


def test_process_pool_gives_the_same_plan(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    w, _ = files
    plans = []
    for jobs in ("1", "2"):
        assert main(["plan", str(w), "--json", "--jobs", jobs, *QUICK]) == 0
        data = json.loads(capsys.readouterr().out)
        data.pop("created_at")
        plans.append(data)
    assert plans[0] == plans[1]
    assert plans[0]["simulated"]["cluster_source"].startswith("default cluster: llama-3-8b")
    assert any("No --cluster given" in line for line in plans[0]["summary"])


def test_report_rejects_a_file_that_is_not_a_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "sweep.json"
    bad.write_text('{"schema": "headway.sweep/1"}', encoding="utf-8")
    assert main(["report", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "$.schema" in err and "headway.sweep/1" in err and "headway plan" in err


def test_plan_flags_are_checked(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    w, _ = files
    assert main(["plan", str(w), "--seeds", "0"]) == 2
    assert "--seeds must be >= 1" in capsys.readouterr().err
    assert main(["plan", str(w), "--point-duration-s", "-5"]) == 2
    assert "--point-duration-s must be > 0" in capsys.readouterr().err
