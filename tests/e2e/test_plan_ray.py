"""`--executor ray` gives the same plan as the local pool, on a local Ray instance.

Ray is in the ``test`` extra; under ``CI=true`` a missing ray fails the test, elsewhere
it skips.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_plan_cli import QUICK, WORKLOAD

from headway.cli import main


@pytest.mark.slow
def test_ray_executor_gives_the_same_plan_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if importlib.util.find_spec("ray") is None:
        message = "ray is not installed (pip install -e '.[test]')"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    # A shared test machine can be short of memory: keep Ray's OOM killer off our tasks.
    monkeypatch.setenv("RAY_memory_monitor_refresh_ms", "0")
    w = tmp_path / "w.yaml"
    w.write_text(yaml.safe_dump(WORKLOAD), encoding="utf-8")
    plans: list[dict[str, Any]] = []
    for executor, jobs in (("local", "1"), ("ray", "2")):
        code = main(["plan", str(w), "--json", "--executor", executor, "--jobs", jobs, *QUICK])
        assert code == 0
        data = json.loads(capsys.readouterr().out)
        data.pop("created_at")
        plans.append(data)
    assert plans[0]["simulated"]["knee"]["found"]
    assert plans[0] == plans[1]
