"""`headway workload compile W.yaml -o calls.csv` writes the calls one run generates in the
generic trace format, and replaying that file compiles to the same calls."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from headway.cli import main
from headway.core.workload.compile import compile_workload
from headway.files.workload import load_workload
from headway.trace.readers import read_trace

WORKLOAD = {
    "name": "two-tenants",
    "seed": 5,
    "duration_s": 30,
    "classes": {
        "chat": {"input_tokens": {"dist": "lognormal", "mean": 300, "cv": 0.5},
                 "output_tokens": {"dist": "lognormal", "mean": 40, "cv": 0.5},
                 "priority": "interactive"},
        "batch": {"input_tokens": 900, "output_tokens": 10, "priority": "background"},
    },
    "tenants": {"acme": {"share": 2}, "globex": {"share": 1}},
    "sources": [{"name": "s", "arrivals": {"process": "poisson", "rate_per_s": 4},
                 "mix": {"chat": 0.7, "batch": 0.3}}],
}  # fmt: skip


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_compiled_calls_replay_as_the_same_calls(
    tmp_path: Path, suffix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    spec_path = tmp_path / "w.yaml"
    spec_path.write_text(yaml.safe_dump(WORKLOAD))
    out = tmp_path / f"calls{suffix}"
    assert main(["workload", "compile", str(spec_path), "-o", str(out)]) == 0
    run = compile_workload(load_workload(spec_path).spec)
    assert f"{run.num_calls} calls" in capsys.readouterr().err
    trace = read_trace(out)
    assert trace.ignored_columns == ()
    assert len(trace) == run.num_calls
    assert trace.input_tokens.tolist() == run.call_input_tokens.tolist()
    assert trace.output_tokens.tolist() == run.call_output_tokens.tolist()
    assert trace.tenant is not None and set(trace.tenant.tolist()) == {"acme", "globex"}
    assert trace.priority is not None
    assert set(trace.priority.tolist()) == {"interactive", "background"}
    first = run.task_arrival_s[0]
    assert trace.arrival_s == pytest.approx(run.task_arrival_s[run.call_task] - first, abs=1e-6)
    replay = {"name": "replay", "duration_s": 30,
              "classes": {"c": {"input_tokens": 1, "output_tokens": 1}},
              "sources": [{"name": "r", "arrivals": {"process": "trace", "path": out.name,
                                                     "tick_policy": "literal"}}]}  # fmt: skip
    (tmp_path / "replay.yaml").write_text(yaml.safe_dump(replay))
    loaded = load_workload(tmp_path / "replay.yaml")
    again = compile_workload(loaded.spec, traces=loaded.traces)
    assert again.call_input_tokens.tolist() == run.call_input_tokens.tolist()
    assert set(loaded.spec.tenants) == {"acme", "globex"}  # taken from the trace
    if suffix == ".jsonl":
        assert json.loads(out.read_text().splitlines()[0])["session_id"] == "task-0"
