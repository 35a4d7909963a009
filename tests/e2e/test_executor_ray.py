"""`--executor ray` gives the same sweep and the same bad-day matrix as the local pool
(one process or two), on one local Ray instance the module starts.

Ray is in the ``test`` extra; under ``CI=true`` a missing ray fails the test, elsewhere
it skips. ``test_plan_ray.py`` checks the plan the same way.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_cli_baddays import CLUSTER as BAD_DAYS_CLUSTER
from test_cli_baddays import WORKLOAD as BAD_DAYS_WORKLOAD
from test_cli_simulate import CLUSTER, WORKLOAD

from headway.cli import main
from headway.executors import RayExecutor
from headway.files.jsonout import to_json
from headway.files.workload import load_workload
from headway.sim.baddays import BadDayCell, run_bad_days
from headway.sim.commands import load_cluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_executor() -> Iterator[RayExecutor]:
    """One local Ray instance for the module (the CLI's executors join it)."""
    if importlib.util.find_spec("ray") is None:
        message = "ray is not installed (pip install -e '.[test]')"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    with pytest.MonkeyPatch.context() as patch:
        # A shared test machine can be short of memory: keep Ray's OOM killer off our tasks.
        patch.setenv("RAY_memory_monitor_refresh_ms", "0")
        patch.delenv("RAY_ADDRESS", raising=False)
        executor = RayExecutor(None, workers=2)
        try:
            yield executor
        finally:
            executor.close()


def test_ray_reports_each_cell_once_and_keeps_them_in_order(ray_executor: RayExecutor) -> None:
    spec = load_workload(BAD_DAYS_WORKLOAD).spec
    cluster = load_cluster(BAD_DAYS_CLUSTER)
    kwargs: dict[str, Any] = {"scenarios": ["baseline", "long-prompts"], "duration_s": 10.0}
    heard: list[tuple[str, str]] = []

    def hear(cell: BadDayCell) -> None:
        heard.append((cell.scenario, cell.preset))

    on_ray = run_bad_days(spec, cluster, executor=ray_executor, on_cell=hear, **kwargs)
    assert sorted(heard) == sorted((c.scenario, c.preset) for c in on_ray.cells)
    assert len(heard) == 4
    assert to_json(on_ray) == to_json(run_bad_days(spec, cluster, jobs=1, **kwargs))


def _cli_json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    assert main(list(args)) == 0
    return json.loads(capsys.readouterr().out)


def test_sweep_on_ray_matches_one_and_two_local_processes(
    ray_executor: RayExecutor, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    w, c = tmp_path / "w.yaml", tmp_path / "c.yaml"
    w.write_text(yaml.safe_dump({**WORKLOAD, "duration_s": 20}), encoding="utf-8")
    c.write_text(yaml.safe_dump(CLUSTER), encoding="utf-8")
    base = ["sweep", str(w), "--cluster", str(c), "--json"]
    loads = ["--loads", "0.5,1,2"]
    dense = [
        _cli_json(capsys, *base, *loads, "--jobs", jobs, "--executor", executor)
        for jobs, executor in (("1", "local"), ("2", "local"), ("2", "ray"))
    ]
    assert len(dense[0]["points"]) == 3
    assert dense[0] == dense[1] == dense[2]
    # The search's rounds take --jobs points each: the same --jobs, the same knee.
    searched = [
        _cli_json(capsys, *base, "--search", "--jobs", "2", "--executor", executor)
        for executor in ("local", "ray")
    ]
    assert searched[0]["knee"] is not None
    assert searched[0] == searched[1]


def test_bad_days_on_ray_match_one_and_two_local_processes(
    ray_executor: RayExecutor, capsys: pytest.CaptureFixture[str]
) -> None:
    base = [
        "simulate", str(BAD_DAYS_WORKLOAD), "--cluster", str(BAD_DAYS_CLUSTER), "--bad-days",
        "--scenarios", "baseline,retry-storm", "--duration-s", "20", "--json",
    ]  # fmt: skip
    matrices = [
        _cli_json(capsys, *base, "--jobs", jobs, "--executor", executor)
        for jobs, executor in (("1", "local"), ("2", "local"), ("2", "ray"))
    ]
    assert len(matrices[0]["cells"]) == 4
    assert matrices[0] == matrices[1] == matrices[2]
