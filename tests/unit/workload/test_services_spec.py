"""Downstream services in a workload file: `services:` and a class's `tool_service`,
their errors (key path, value, fix), and what compiling exposes per tool call."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import yaml

from headway.core.errors import WorkloadError
from headway.core.workload.compile import CompiledWorkload, compile_workload
from headway.core.workload.spec import Service
from headway.files.workload import dump_workload, parse_workload

GOOD: dict[str, Any] = {
    "name": "t",
    "duration_s": 400,
    "classes": {
        "investigate": {
            "calls": 3,
            "parallel_branches": 2,
            "tools_per_call": 1.5,
            "tool_latency_s": 9.0,
            "tool_service": "orders",
        },
        "chat": {"calls": 2, "tools_per_call": 1, "tool_latency_s": 0.5},
    },
    "sources": [
        {
            "name": "users",
            "arrivals": {"process": "poisson", "rate_per_s": 2},
            "mix": {"investigate": 0.5, "chat": 0.5},
        },
        {
            "name": "ops",
            "arrivals": {"process": "constant", "rate_per_s": 1},
            "mix": {"investigate": 1},
        },
    ],
    "services": {
        "db": {"servers": 10, "service_time_s": 0.02},
        "orders": {
            "servers": 4,
            "service_time_s": {"dist": "uniform", "low": 0.2, "high": 0.6},
            "rate_limit_per_s": 5,
            "burst": 2,
            "queue_limit": 50,
            "timeout_s": 3,
        },
    },
}


def _parse(data: dict[str, Any]) -> Any:
    return parse_workload(copy.deepcopy(data))


def _error(mutate: dict[str, Any]) -> str:
    data = copy.deepcopy(GOOD)
    for path, value in mutate.items():
        node = data
        keys = path.split(".")
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value
    with pytest.raises(WorkloadError) as info:
        parse_workload(data)
    return str(info.value)


def test_a_good_file_parses() -> None:
    spec = _parse(GOOD)
    assert spec.services["orders"] == Service(
        servers=4,
        service_time_s=spec.services["orders"].service_time_s,
        rate_limit_per_s=5,
        burst=2,
        queue_limit=50,
        timeout_s=3,
    )
    assert spec.classes["investigate"].tool_service == "orders"
    assert spec.classes["chat"].tool_service is None


@pytest.mark.parametrize(
    ("mutate", "fragments"),
    [
        (
            {"classes.investigate.tool_service": "order"},
            (
                "$.classes.investigate.tool_service",
                "unknown service `order`",
                "did you mean `orders`",
            ),
        ),
        (
            {"services.orders.servers": 0},
            ("$.services.orders", "`servers` must be >= 1", "(got 0)"),
        ),
        ({"services.orders.burst": 0.5}, ("$.services.orders", "`burst`", "0.5")),
        ({"services.orders.rate_limit_per_s": 0}, ("$.services.orders", "rate_limit_per_s", "> 0")),
        ({"services.orders.queue_limit": -1}, ("$.services.orders", "queue_limit", ">= 0")),
        ({"services.orders.timeout_s": 0}, ("$.services.orders", "timeout_s", "> 0")),
        ({"services.orders.service_time_s": -1}, ("$.services.orders", "service_time_s", ">= 0")),
        ({"services.orders.servrs": 2}, ("$.services.orders.servrs", "did you mean `servers`")),
        (
            {"services.orders.service_time_s": {"dist": "gamma", "mean": 1}},
            ("$.services.orders.service_time_s", "cv"),
        ),
    ],
)
def test_mistakes_name_the_key_the_value_and_a_fix(
    mutate: dict[str, Any], fragments: tuple[str, ...]
) -> None:
    message = _error(mutate)
    for fragment in fragments:
        assert fragment in message


def test_a_tool_service_without_any_services_says_what_to_do() -> None:
    data = copy.deepcopy(GOOD)
    del data["services"]
    with pytest.raises(WorkloadError) as info:
        parse_workload(data)
    message = str(info.value)
    assert "$.classes.investigate.tool_service" in message
    assert "define it under `services`" in message and "tool_latency_s" in message


def _compiled(data: dict[str, Any], seed: int = 3) -> CompiledWorkload:
    return compile_workload(_parse(data), seed=seed)


def test_compile_exposes_each_tool_calls_service_time() -> None:
    run = _compiled(GOOD)
    assert run.service_names == ("db", "orders")
    invest = run.call_tool_service == run.service_names.index("orders")
    chat_class = run.class_names.index("chat")
    chat = run.task_class[run.call_task] == chat_class
    assert invest.any() and chat.any()
    assert (run.call_tool_service[chat] == -1).all() and (run.call_tool_first[chat] == -1).all()
    assert not (invest & chat).any()

    # Every tool call through the service has a service time from its distribution.
    assert run.tool_service_s.size > 0
    assert ((run.tool_service_s >= 0.2) & (run.tool_service_s <= 0.6)).all()
    counts = run.call_tool_count[invest]
    firsts = run.call_tool_first[invest]
    assert ((counts == 0) == (firsts == -1)).all()
    for j in np.flatnonzero(invest & (run.call_tool_count > 0))[:500]:
        first, count = int(run.call_tool_first[j]), int(run.call_tool_count[j])
        window = run.tool_service_s[first : first + count]
        assert window.size == count
        # With no queueing, the step's tool time is the sum of its calls' service times.
        assert run.call_tool_after_s[j] == pytest.approx(window.sum())
    # tool_latency_s (9 s) is not used for the service class.
    assert run.call_tool_after_s[invest].max() < 9.0
    # Counts: 1.5 per step on average, none after the last step.
    last = run.call_step == run.task_num_steps[run.call_task] - 1
    assert (run.call_tool_count[last] == 0).all()
    assert run.call_tool_count[invest & ~last].mean() == pytest.approx(1.5, abs=0.1)


def test_branches_of_a_step_share_its_tool_calls_and_windows_do_not_overlap() -> None:
    run = _compiled(GOOD)
    owners: dict[tuple[int, int], tuple[int, int]] = {}
    for j in np.flatnonzero(run.call_tool_first >= 0):
        key = (int(run.call_task[j]), int(run.call_step[j]))
        window = (int(run.call_tool_first[j]), int(run.call_tool_count[j]))
        if key in owners:
            assert owners[key] == window  # the other branch: the same tool calls
        owners[key] = window
    used = np.zeros(run.tool_service_s.size, dtype=np.int64)
    for first, count in owners.values():
        used[first : first + count] += 1
    assert used.max() == 1  # no tool call belongs to two steps


def test_services_leave_every_existing_draw_unchanged() -> None:
    without = copy.deepcopy(GOOD)
    del without["services"]
    del without["classes"]["investigate"]["tool_service"]
    one, two = _compiled(GOOD), _compiled(without)
    for name in (
        "task_arrival_s",
        "task_class",
        "task_tenant",
        "call_input_tokens",
        "call_output_tokens",
        "call_tool_count",
    ):
        assert np.array_equal(getattr(one, name), getattr(two, name)), name
    chat = one.task_class[one.call_task] == one.class_names.index("chat")
    assert np.array_equal(one.call_tool_after_s[chat], two.call_tool_after_s[chat])
    assert two.tool_service_s.size == 0 and (two.call_tool_service == -1).all()


def test_service_draws_are_seeded() -> None:
    a, b, c = _compiled(GOOD, seed=3), _compiled(GOOD, seed=3), _compiled(GOOD, seed=4)
    assert np.array_equal(a.tool_service_s, b.tool_service_s)
    assert not np.array_equal(a.tool_service_s[:20], c.tool_service_s[:20])


def test_the_task_view_carries_each_calls_tool_service_times() -> None:
    run = _compiled(GOOD)
    seen = 0
    for task in run.tasks():
        for call in task.calls:
            if task.task_class == "chat":
                assert call.tool_service is None and call.tool_service_s == ()
                continue
            assert call.tool_service == "orders"
            assert sum(call.tool_service_s) == pytest.approx(call.tool_after_s)
            seen += len(call.tool_service_s)
        if seen > 200:
            break
    assert seen > 200


def test_services_round_trip_through_a_dumped_file() -> None:
    spec = _parse(GOOD)
    assert parse_workload(yaml.safe_load(dump_workload(spec)), "dumped") == spec
