"""Every mistake in a workload file is an error that names the key path, the value and a fix."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from headway.core.errors import WorkloadError
from headway.files.workload import load_workload, parse_workload

GOOD: dict[str, Any] = {
    "name": "t",
    "classes": {
        "chat": {
            "input_tokens": {"dist": "lognormal", "mean": 800, "cv": 1.0},
            "output_tokens": 200,
            "slo": {"ttft_s": 1.0},
        },
        "batch": {"priority": "background", "route": "bulk"},
    },
    "sources": [
        {
            "name": "users",
            "arrivals": {"process": "poisson", "rate_per_s": 3},
            "mix": {"chat": 0.9, "batch": 0.1},
        },
    ],
    "tenants": {"acme": {"share": 1}},
    "routes": {"main": {}, "bulk": {"fallback": "main"}},
}


def _with(path: str, value: Any) -> dict[str, Any]:
    """GOOD with the value at a dotted path (list indices as numbers) replaced or deleted."""
    data = copy.deepcopy(GOOD)
    keys: list[Any] = [int(k) if k.isdigit() else k for k in path.split(".")]
    node = data
    for key in keys[:-1]:
        node = node[key]
    if value is _DELETE:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return data


_DELETE = object()

# (mutation path, new value, fragments the message must contain)
MISTAKES: list[tuple[str, Any, tuple[str, ...]]] = [
    ("classes.chat.input_tokens.cv", -1, ("$.classes.chat.input_tokens", "cv", "-1", ">= 0")),
    ("classes.chat.input_tokens.mean", "lots", ("$.classes.chat.input_tokens.mean", "Expected")),
    (
        "classes.chat.input_tokens.dist",
        "lgnormal",
        ("$.classes.chat.input_tokens.dist", "lognormal"),
    ),
    ("classes.chat.input_tokns", 5, ("$.classes.chat.input_tokns", "did you mean `input_tokens`")),
    ("classes.chat.slo.ttft_s", 0, ("$.classes.chat.slo", "ttft_s", "> 0")),
    ("classes.chat.slo.attainment_target", 90, ("attainment_target", "0.9")),
    ("classes.chat.slo.ttft", 1, ("$.classes.chat.slo.ttft", "did you mean `ttft_s`")),
    ("classes.chat.priority", "urgent", ("$.classes.chat.priority", "urgent")),
    ("classes.chat.parallel_branches", 0, ("parallel_branches", "between 1 and 64")),
    ("classes.chat.retry_multiplier", 0.5, ("retry_multiplier", ">= 1", "1.15")),
    ("classes.chat.calls", {"dist": "poisson"}, ("$.classes.chat.calls", "mean")),
    ("classes.batch.route", "bluk", ("$.classes.batch.route", "did you mean `bulk`")),
    ("sources.0.arrivals.process", "possion", ("$.sources[0].arrivals.process", "poisson")),
    ("sources.0.arrivals.rate_per_s", -2, ("$.sources[0].arrivals", "rate_per_s", ">= 0")),
    ("sources.0.arrivals.rate", 2, ("$.sources[0].arrivals.rate", "did you mean `rate_per_s`")),
    ("sources.0.mix", {"chatt": 1}, ("$.sources[0].mix.chatt", "did you mean `chat`")),
    ("sources.0.mix", {"chat": 0}, ("$.sources[0]", "mix", "positive sum")),
    ("sources.0.mix", _DELETE, ("$.sources[0].mix", "mix")),
    ("sources.0.tenants", {"acmee": 1}, ("$.sources[0].tenants.acmee", "did you mean `acme`")),
    ("sources.0.name", _DELETE, ("`name`", "missing")),
    ("sources.0.arrivals", {"process": "gamma", "rate_per_s": 1}, ("$.sources[0].arrivals", "cv")),
    ("sources.0.arrivals", {"process": "schedule", "steps": []}, ("steps", "must not be empty")),
    (
        "sources.0.arrivals",
        {"process": "schedule", "steps": [{"duration_s": 0, "rate_per_s": 1}]},
        ("$.sources[0].arrivals.steps[0]", "duration_s", "> 0"),
    ),
    (
        "sources.0.arrivals",
        {"process": "poisson", "rate_per_s": 1, "bursts": [{"start_s": 10, "duration_s": 5}]},
        ("$.sources[0].arrivals.bursts[0]", "exactly one of", "rate_per_s"),
    ),
    (
        "sources.0.arrivals",
        {
            "process": "poisson",
            "rate_per_s": 1,
            "bursts": [{"start_s": 10, "duration_s": 5, "rate_per_s": 3, "every_s": 4}],
        },
        ("every_s", "must exceed"),
    ),
    (
        "sources.0.arrivals",
        {"process": "trace", "path": "x.csv", "time_scale": 0},
        ("$.sources[0].arrivals", "time_scale", "> 0"),
    ),
    (
        "sources.0.arrivals",
        {"process": "trace", "path": "x.csv", "tick_policy": "smear"},
        ("$.sources[0].arrivals.tick_policy", "smear"),
    ),
    (
        "sources.0.arrivals",
        {"process": "trace", "path": "x.csv", "window": {"start_s": 50, "end_s": 10}},
        ("window", "end_s", "after"),
    ),
    ("sources", [], ("`sources`", "at least one")),
    ("classes", {}, ("`classes`", "at least one")),
    ("routes.bulk.fallback", "bulk", ("$.routes.bulk.fallback", "itself")),
    ("routes.bulk.fallback", "mian", ("$.routes.bulk.fallback", "did you mean `main`")),
    ("routes.main.servers", 0, ("servers", ">= 1")),
    ("tenants.acme.weight", 0, ("$.tenants.acme", "weight", "> 0")),
    ("tenants.acme.max_priority", "vip", ("$.tenants.acme.max_priority", "vip")),
    ("tenants.acme.share", 0, ("$.tenants", "share")),
    ("planning", {"planning_factor": 70}, ("planning_factor", "0.7")),
    ("planning", {"failures_tolerated": -1}, ("failures_tolerated", ">= 0")),
    ("planning", {"planing_factor": 0.7}, ("did you mean `planning_factor`",)),
    ("clients", {"retries": {"max_attempts": 0}}, ("max_attempts", "between 1 and 100")),
    ("clients", {"retries": {"jitter": "some"}}, ("$.clients.retries.jitter", "some")),
    ("clients", {"duplicate_probability": 2}, ("duplicate_probability", "[0, 1]")),
    ("version", 2, ("version", "2", "version 1")),
    ("seed", -3, ("seed", ">= 0")),
    ("duration_s", "10m", ("$.duration_s", "Expected")),
    ("classes.chat.joint_tokens", {"pairs": [[1, 2]], "trace": "x"}, ("exactly one of",)),
    ("classes.chat.joint_tokens", {"pairs": [[1, 2]], "weights": [1, 2]}, ("one weight per pair",)),
    (
        "classes.chat.input_tokens",
        {"dist": "empirical", "values": [1, 2], "weights": [1]},
        ("one weight per value",),
    ),
    ("classes.chat.input_tokens", {"dist": "uniform", "low": 5, "high": 1}, ("low", "high")),
    (
        "classes.chat.input_tokens",
        {"dist": "gamma", "mean": 5, "cv": 1, "min": 9, "max": 2},
        ("min", "max", "swap"),
    ),
    ("classes.chat.input_tokens", True, ("$.classes.chat.input_tokens", "Expected")),
]


@pytest.mark.parametrize(("path", "value", "fragments"), MISTAKES, ids=[m[0] for m in MISTAKES])
def test_mistake_is_reported_with_path_and_fix(
    path: str, value: Any, fragments: tuple[str, ...]
) -> None:
    with pytest.raises(WorkloadError) as info:
        parse_workload(_with(path, value), "w.yaml")
    message = str(info.value)
    assert message.startswith("w.yaml: ")
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_good_workload_parses() -> None:
    spec = parse_workload(GOOD)
    assert spec.routes["bulk"].fallback == "main"
    assert spec.classes["batch"].priority == "background"


def test_not_a_mapping() -> None:
    with pytest.raises(WorkloadError, match="must be a mapping"):
        parse_workload([1, 2], "w.yaml")


def test_yaml_syntax_error_names_line(tmp_path: Path) -> None:
    path = tmp_path / "w.yaml"
    path.write_text("name: t\nclasses:\n  chat: {calls: [1\n", encoding="utf-8")
    with pytest.raises(WorkloadError, match=r"w.yaml: YAML syntax error at line \d+"):
        load_workload(path)


def test_missing_file_and_missing_trace(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="no such file"):
        load_workload(tmp_path / "nope.yaml")
    path = tmp_path / "w.yaml"
    data = _with("sources.0.arrivals", {"process": "trace", "path": "gone.csv"})
    import yaml

    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(
        WorkloadError, match=r"'gone\.csv' not found.*relative to the workload file"
    ):
        load_workload(path)


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "w.yaml"
    path.write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(WorkloadError, match="not UTF-8"):
        load_workload(path)


@pytest.mark.parametrize("key", ["calls", "input_tokens", "output_tokens", "tool_latency_s"])
def test_bare_negative_numbers_are_rejected(key: str) -> None:
    with pytest.raises(WorkloadError, match=rf"\$\.classes\.chat: `{key}` must be a finite"):
        parse_workload(_with(f"classes.chat.{key}", -5), "w.yaml")


def test_retry_budget_ratio_range_and_null() -> None:
    with pytest.raises(WorkloadError, match=r"budget_ratio.*\[0, 1\].*null turns the budget off"):
        parse_workload(_with("clients", {"retries": {"budget_ratio": 5}}), "w.yaml")
    spec = parse_workload(_with("clients", {"retries": {"budget_ratio": None}}), "w.yaml")
    assert spec.clients.retries.budget_ratio is None


def test_trace_rows_are_single_calls() -> None:
    data = _with("sources.0.arrivals", {"process": "trace", "path": "x.csv"})
    data["classes"]["chat"]["parallel_branches"] = 3
    with pytest.raises(WorkloadError, match=r"\$\.sources\[0\]\.mix\.chat: .*parallel_branches 3"):
        parse_workload(data, "w.yaml")


@pytest.mark.parametrize("name", ["`", "a`b", "x`` - at `$"])
def test_a_named_entry_with_backticks_is_named_whole(name: str) -> None:
    # A backtick in a class name ended msgspec's `$.path` early: the message named
    # "$.` - at `$.classes." (found by the workload fuzzer).
    data = copy.deepcopy(GOOD)
    data["classes"][name] = {"bogus": 0}
    with pytest.raises(WorkloadError) as caught:
        parse_workload(data, "w.yaml")
    shown = name.replace("`", "\\x60")
    message = str(caught.value)
    assert message.startswith(f"w.yaml: $.classes.{shown}.bogus: unknown key"), message
    assert "\n" not in message


def test_an_unknown_family_lists_only_the_families_a_file_may_name() -> None:
    """The hint for `dist: constant` names what to write instead, never the private base
    class the families share (its msgspec tag is its class name, `_Dist`)."""
    with pytest.raises(WorkloadError) as info:
        parse_workload(_with("classes.chat.input_tokens", {"dist": "constant"}), "w.yaml")
    hint = str(info.value).split("Use one of: ", 1)[1].rstrip(".")
    assert hint.split(", ") == sorted(hint.split(", "))
    assert "fixed" in hint.split(", ") and "_" not in hint
