"""Compiling a workload: determinism, structure of tasks and calls, statistics."""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pytest

from headway.core.workload.compile import compile_workload
from headway.core.workload.spec import WorkloadSpec
from headway.files.workload import load_workload, parse_workload

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _spec(**overrides: object) -> WorkloadSpec:
    data: dict[str, object] = {
        "name": "t",
        "duration_s": 2000,
        "classes": {
            "a": {
                "calls": 7.5,
                "input_tokens": {"dist": "gamma", "mean": 500, "cv": 1.0},
                "output_tokens": 100,
                "tools_per_call": 1,
                "tool_latency_s": 0.5,
            },
            "b": {
                "calls": 1,
                "parallel_branches": 3,
                "route": "r2",
                "input_tokens": {"dist": "lognormal", "mean": 300, "cv": 0.5, "max": 400},
            },
        },
        "sources": [
            {
                "name": "s1",
                "arrivals": {"process": "poisson", "rate_per_s": 2},
                "mix": {"a": 0.75, "b": 0.25},
            },
            {"name": "s2", "arrivals": {"process": "constant", "rate_per_s": 1}, "mix": {"b": 1}},
        ],
        "tenants": {"x": {"share": 3}, "y": {"share": 1}},
        "routes": {"r1": {}, "r2": {}},
    }
    data.update(overrides)
    return parse_workload(data)


def test_same_seed_same_run_and_other_seed_differs() -> None:
    spec = _spec()
    one, two = compile_workload(spec, seed=5), compile_workload(spec, seed=5)
    other = compile_workload(spec, seed=6)
    for name in ("task_arrival_s", "task_class", "call_input_tokens", "call_tool_after_s"):
        assert np.array_equal(getattr(one, name), getattr(two, name))
    assert not np.array_equal(one.call_input_tokens[:50], other.call_input_tokens[:50])


def test_editing_one_source_leaves_the_other_unchanged() -> None:
    spec = _spec()
    changed = msgspec.structs.replace(
        spec,
        sources=[
            msgspec.structs.replace(
                spec.sources[0],
                arrivals=msgspec.convert(
                    {"process": "poisson", "rate_per_s": 3}, type(spec.sources[0].arrivals)
                ),
            ),
            spec.sources[1],
        ],
    )
    a, b = compile_workload(spec, seed=1), compile_workload(changed, seed=1)
    for run in (a, b):
        assert run.num_tasks > 0
    s2a = a.task_arrival_s[a.task_source == 1]
    s2b = b.task_arrival_s[b.task_source == 1]
    assert np.array_equal(s2a, s2b)


def test_task_and_call_structure() -> None:
    run = compile_workload(_spec(), seed=3)
    assert np.all(np.diff(run.task_arrival_s) >= 0)
    assert run.task_num_calls.sum() == run.num_calls
    cls_a = run.task_class == run.class_names.index("a")
    steps_a = run.task_num_steps[cls_a]
    assert set(np.unique(steps_a)) == {7, 8}
    assert steps_a.mean() == pytest.approx(7.5, abs=0.1)
    cls_b = ~cls_a
    assert np.all(run.task_num_calls[cls_b] == 3) and np.all(run.task_num_steps[cls_b] == 1)
    # calls are grouped by task, ordered by step then branch
    for i in range(20):
        task = run.task(i)
        assert [c.task for c in task.calls] == [i] * len(task.calls)
        keys = [(c.step, c.branch) for c in task.calls]
        assert keys == sorted(keys)
        # tool time only between steps, never after the last one
        last = max(c.step for c in task.calls)
        assert all(c.tool_after_s == 0 for c in task.calls if c.step == last)
        if task.task_class == "a":
            assert all(c.tool_after_s > 0 for c in task.calls if c.step < last)
            assert {c.route for c in task.calls} == {"r1"}
        else:
            assert {c.route for c in task.calls} == {"r2"}


def test_token_distributions_and_caps() -> None:
    run = compile_workload(_spec(), seed=4)
    a_calls = run.task_class[run.call_task] == run.class_names.index("a")
    assert run.call_input_tokens[a_calls].mean() == pytest.approx(500, rel=0.05)
    assert np.all(run.call_output_tokens[a_calls] == 100)
    assert run.call_input_tokens[~a_calls].max() <= 400


def test_mix_and_tenant_shares() -> None:
    run = compile_workload(_spec(duration_s=20_000), seed=9)
    s1 = run.task_source == 0
    share_a = np.mean(run.task_class[s1] == run.class_names.index("a"))
    assert share_a == pytest.approx(0.75, abs=0.02)
    assert np.mean(run.task_tenant == run.tenant_names.index("x")) == pytest.approx(0.75, abs=0.02)


def test_rates_match_spec() -> None:
    run = compile_workload(_spec(duration_s=20_000), seed=2)
    assert np.count_nonzero(run.task_source == 0) / 20_000 == pytest.approx(2.0, rel=0.03)
    assert np.count_nonzero(run.task_source == 1) == pytest.approx(20_000, abs=1)


@pytest.mark.parametrize("name", ["reference-assistant", "agent-amplification"])
def test_examples_compile_to_their_rates(name: str) -> None:
    loaded = load_workload(EXAMPLES / f"{name}.yaml")
    run = compile_workload(loaded.spec, traces=loaded.traces)
    calls_per_task = run.num_calls / run.num_tasks
    assert run.num_tasks > 100
    if name == "reference-assistant":
        assert calls_per_task == pytest.approx(1.2, abs=0.05)
        burst = (run.task_arrival_s >= 300) & (run.task_arrival_s < 330)
        assert np.count_nonzero(burst) == pytest.approx(600, rel=0.15)
