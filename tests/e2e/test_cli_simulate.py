"""`headway simulate` and `headway sweep` end to end through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from headway.cli import main

ROOT = Path(__file__).resolve().parents[2]

WORKLOAD = {
    "name": "small",
    "duration_s": 40,
    "seed": 5,
    "classes": {
        "chat": {
            "input_tokens": {"dist": "lognormal", "mean": 1500, "cv": 0.8, "max": 8000},
            "output_tokens": {"dist": "lognormal", "mean": 250, "cv": 0.8, "max": 2000},
            "slo": {"ttft_s": 0.5, "tpot_s": 0.04, "attainment_target": 0.9},
        }
    },
    "sources": [{"name": "users", "arrivals": {"process": "poisson", "rate_per_s": 12}}],
}
CLUSTER = {"replicas": 1, "model": "llama-3-8b", "gpu": "h100"}


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    w, c = tmp_path / "w.yaml", tmp_path / "c.yaml"
    w.write_text(yaml.safe_dump(WORKLOAD), encoding="utf-8")
    c.write_text(yaml.safe_dump(CLUSTER), encoding="utf-8")
    return w, c


def test_simulate_json_and_records(
    files: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    w, c = files
    out = tmp_path / "out"
    assert main(["simulate", str(w), "--cluster", str(c), "--json", "--out", str(out)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["schema"] == "headway.simulate/1"
    assert result["completed_calls"] == result["calls"] > 300
    assert 0 < result["slo"]["attainment"] <= 1
    assert result["latencies"]["ttft"]["p99_s"] >= result["latencies"]["ttft"]["p50_s"]
    records = np.load(out / "records.npz")
    assert records["finish_s"].size == result["calls"]
    assert set(records.files) >= {"dispatch_s", "first_token_s", "finish_s", "replica"}
    assert json.loads((out / "result.json").read_text())["calls"] == result["calls"]


def test_simulate_same_seed_same_result(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    w, c = files
    outputs = []
    for _ in range(2):
        assert main(["simulate", str(w), "--cluster", str(c), "--json", "--seed", "9"]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1]


def test_sweep_search_agrees_with_dense_sweep(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    w, c = files
    step = 0.1
    loads = [round(step * i, 2) for i in range(2, 17)]
    assert main(["sweep", str(w), "--cluster", str(c), "--loads", ",".join(map(str, loads)),
                 "--jobs", "2", "--json"]) == 0  # fmt: skip
    dense = json.loads(capsys.readouterr().out)["points"]
    passing = [p["load_factor"] for p in dense if p["slo_attainment"] >= 0.9]
    failing = [p["load_factor"] for p in dense if p["slo_attainment"] < 0.9]
    assert passing and failing, "the dense sweep must cross the knee"
    assert main(["sweep", str(w), "--cluster", str(c), "--search", "--jobs", "2", "--json"]) == 0
    knee = json.loads(capsys.readouterr().out)["knee"]
    assert knee["found"]
    # Issue 16, defect 14: the text says which load the sweep scaled (the plan's knee differs).
    assert main(["sweep", str(w), "--cluster", str(c), "--search", "--jobs", "2"]) == 0
    text = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "the file's arrivals scaled as written, bursts and schedules included" in text
    assert "`plan` searches a steady load at the peak rate instead" in text
    # Attainment is not perfectly monotone in load for one seed; the knee must lie within one
    # dense step of the largest passing dense point below the first failing one.
    first_fail = min(failing)
    dense_knee = max(p for p in passing if p < first_fail)
    assert abs(knee["load_factor"] - dense_knee) <= step + 1e-9


@pytest.mark.parametrize(
    ("cluster", "fragment"),
    [({"replicas": 0}, "replicas"), ({"gpu": "h1000"}, "h1000"), ({"routr": "x"}, "routr"),
     ({"model": "llama-3-70b", "gpu": "l40s"}, "does not fit")],
)  # fmt: skip
def test_bad_cluster_exits_2(
    files: tuple[Path, Path], cluster: dict[str, object], fragment: str,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    w, c = files
    c.write_text(yaml.safe_dump(cluster), encoding="utf-8")
    assert main(["simulate", str(w), "--cluster", str(c)]) == 2
    assert fragment in capsys.readouterr().err


def test_example_cluster_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(ROOT / "examples" / "reference-assistant.yaml"), "--cluster",
                 str(ROOT / "examples" / "clusters" / "llama3-8b-h100.yaml"), "--duration-s", "120",
                 "--json"]) == 0  # fmt: skip
    result = json.loads(capsys.readouterr().out)
    assert result["engine"]["replicas"] == 4


@pytest.mark.parametrize("deadline_s", [None, 30.0])
def test_the_summary_says_when_no_task_deadline_is_declared(
    deadline_s: float | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 16, defect 15: with no deadline in any class, "tasks within deadline 100.0%"
    said nothing true (at 11% SLO attainment); the line says none was declared."""
    spec = json.loads(json.dumps(WORKLOAD))
    spec["duration_s"] = 10
    if deadline_s is not None:
        spec["classes"]["chat"]["slo"]["task_deadline_s"] = deadline_s
    w, c = tmp_path / "w.yaml", tmp_path / "c.yaml"
    w.write_text(yaml.safe_dump(spec), encoding="utf-8")
    c.write_text(yaml.safe_dump(CLUSTER), encoding="utf-8")
    assert main(["simulate", str(w), "--cluster", str(c)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert main(["simulate", str(w), "--cluster", str(c), "--json"]) == 0
    slo = json.loads(capsys.readouterr().out)["slo"]
    assert slo["task_deadlines_declared"] is (deadline_s is not None)
    if deadline_s is None:
        assert "no task deadline declared" in text and "tasks within deadline 1" not in text
    else:
        assert f"tasks within deadline {slo['task_attainment']:.1%}" in text


def test_sweep_refuses_an_unknown_executor_at_parse(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    w, c = files
    with pytest.raises(SystemExit) as exited:
        main(["sweep", str(w), "--cluster", str(c), "--loads", "1", "--executor", "dask"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "headway sweep: error: argument --executor: invalid choice: 'dask'" in err
