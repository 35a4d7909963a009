"""Property-based fuzzing of workload files: ``load_workload`` and ``headway workload check``.

The seeds are the example workloads; Hypothesis replaces, deletes or adds values anywhere
in their trees (NaN, negative, huge, wrong types, nested garbage), mutates their bytes,
writes random and invalid-UTF-8 bytes, deep nesting and YAML alias bombs. The guarantee:
loading either succeeds or raises a :class:`HeadwayError` whose one-line message names the
file and the key path (``$.classes.chat.max_tokens``) or the line; the CLI exits 2 with one
line; a "billion laughs" is refused in milliseconds, not expanded.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz_trees import mutate
from headway.cli import main
from headway.core.errors import HeadwayError, WorkloadError
from headway.files.workload import load_workload, parse_workload, read_yaml

pytestmark = pytest.mark.timeout(120)

SCALE = max(1, int(os.environ.get("HEADWAY_FUZZ_EXAMPLES", "1")))
FUZZ = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
SEEDS = {p.name: p.read_text(encoding="utf-8") for p in sorted(EXAMPLES.glob("*.yaml"))}


def examples(n: int) -> settings:
    return settings(FUZZ, max_examples=n * SCALE)


_COUNTER = iter(range(10**9))


def _file(tmp_path: Path, data: bytes, name: str = "w.yaml") -> Path:
    path = tmp_path / f"{next(_COUNTER)}-{name}"
    path.write_bytes(data)
    return path


def load_or_error(path: Path) -> str | None:
    """Load ``path``; the error message (checked to name the file and a place) or ``None``."""
    try:
        load_workload(path)
    except HeadwayError as error:
        message = str(error)
        assert message.startswith(f"{path}:"), message
        assert "\n" not in message.strip(), message
        return message
    return None


# --- tree mutations --------------------------------------------------------------------------


def _dotted(path: tuple[Any, ...]) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)


@examples(400)
@given(
    seed=st.sampled_from(sorted(SEEDS)),
    data=st.data(),
    action=st.sampled_from(["replace", "delete", "add"]),
)
def test_one_value_changed_anywhere(seed: str, data: st.DataObject, action: str) -> None:
    tree = yaml.safe_load(SEEDS[seed])
    where = mutate(tree, data, action)
    try:
        parse_workload(tree, "fuzz.yaml")
    except WorkloadError as error:
        message = str(error)
        assert message.startswith("fuzz.yaml: $"), message
        assert "\n" not in message, message
        # The key path named is the changed key's, an ancestor's (a deleted required key is
        # reported at its parent) or the root's (a cross-field rule or a version).
        tops = {_escaped(str(k)) for k in [*tree, where[0]]}
        assert message.startswith("fuzz.yaml: $: ") or any(
            message.startswith(f"fuzz.yaml: $.{top}") for top in tops
        ), (message, where)


def _escaped(text: str) -> str:
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


@examples(200)
@given(
    seed=st.sampled_from(sorted(SEEDS)),
    edits=st.lists(
        st.tuples(st.integers(0, 100_000), st.integers(0, 6), st.binary(max_size=8)),
        min_size=1,
        max_size=4,
    ),
)
def test_mutated_bytes(tmp_path: Path, seed: str, edits: list[tuple[int, int, bytes]]) -> None:
    data = SEEDS[seed].encode()
    for at, cut, insert in edits:
        at %= len(data) + 1
        data = data[:at] + insert + data[at + cut :]
    load_or_error(_file(tmp_path, data))


@examples(150)
@given(raw=st.binary(max_size=200))
def test_random_bytes(tmp_path: Path, raw: bytes) -> None:
    message = load_or_error(_file(tmp_path, raw))
    assert message is not None  # nothing random is a workload


@examples(150)
@given(
    text=st.lists(
        st.sampled_from([*"[]{}:-,&*!|>'\"#%@` \n\tab01.", "&a ", "*a", "!!int ", "? "]),
        max_size=60,
    ).map("".join)
)
def test_yaml_punctuation_soup(tmp_path: Path, text: str) -> None:
    load_or_error(_file(tmp_path, text.encode()))


@examples(60)
@given(
    bad=st.binary(min_size=1, max_size=4).filter(lambda b: _not_utf8(b)),
    seed=st.sampled_from(sorted(SEEDS)),
)
def test_invalid_utf8(tmp_path: Path, bad: bytes, seed: str) -> None:
    message = load_or_error(_file(tmp_path, SEEDS[seed].encode() + b"\n# " + bad + b"\n"))
    assert message is not None and "UTF-8" in message


def _not_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


# --- YAML bombs and depth --------------------------------------------------------------------


def _laughs(levels: int, width: int) -> str:
    lines = ["name: lol", 'l0: &l0 ["lol"]']
    lines += [
        f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]" for i in range(1, levels + 1)
    ]
    return "\n".join(lines) + "\n"


@examples(60)
@given(levels=st.integers(1, 12), width=st.integers(2, 12))
def test_alias_bombs_are_refused_fast(tmp_path: Path, levels: int, width: int) -> None:
    path = _file(tmp_path, _laughs(levels, width).encode())
    started = time.monotonic()
    message = load_or_error(path)
    assert time.monotonic() - started < 1.0
    assert message is not None  # an unknown key (l0...) or the bomb
    if width**levels > 2_000_000:
        assert "alias" in message and "line" in message, message


@pytest.mark.parametrize(
    "text",
    [
        "x: &a [*a]",
        "classes: &a {chat: *a}",
        "a: &a\n  b: *a\n",
    ],
)
def test_recursive_aliases_are_refused(tmp_path: Path, text: str) -> None:
    message = load_or_error(_file(tmp_path, text.encode()))
    assert message is not None and "refers to itself" in message and "line 1" in message


@examples(12)
@given(depth=st.integers(1, 1_200), style=st.sampled_from(["flow", "block", "map"]))
def test_deep_nesting(tmp_path: Path, depth: int, style: str) -> None:
    if style == "flow":
        text = "name: " + "[" * depth + "]" * depth
    elif style == "map":
        text = "name: " + "{a: " * depth + "1" + "}" * depth
    else:
        levels = min(depth, 300)
        text = "".join("  " * i + "a:\n" for i in range(levels)) + "  " * levels + "1"
    message = load_or_error(_file(tmp_path, text.encode()))
    assert message is not None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("name: " + "7" * 5000, "line 1"),
        ("name: 2023-13-45", "line 1"),
        ("classes:\n  chat:\n    calls: " + "9" * 5000, "line 3"),
        ("name: x\n\x00", "line 2"),
        ("name: [" * 100_000, "nested too deeply"),
    ],
)
def test_unreadable_scalars_name_the_line(tmp_path: Path, text: str, expected: str) -> None:
    message = load_or_error(_file(tmp_path, text.encode()))
    assert message is not None and expected in message, message


@pytest.mark.parametrize(
    ("number", "value"), [("1e3", 1000.0), ("2.5E2", 250.0), ("1.0e3", 1000.0), ("+1e+3", 1000.0)]
)
def test_yaml_1_2_floats_are_numbers(tmp_path: Path, number: str, value: float) -> None:
    """Issue 19, item 8: PyYAML follows YAML 1.1, where `1e3` and `1.0e3` are text; a
    workload reads them as the numbers every other tool does."""
    text = SEEDS["overload.yaml"].replace("duration_s: 300", f"duration_s: {number}", 1)
    assert load_workload(_file(tmp_path, text.encode())).spec.duration_s == value
    assert read_yaml(_file(tmp_path, b"x: [1e3, 12, 0x1f, .5, 1_000, 1e3x]"))["x"] == [
        1000.0, 12, 31, 0.5, 1000, "1e3x"
    ]  # fmt: skip


def test_a_quoted_number_gets_a_hint(tmp_path: Path) -> None:
    text = SEEDS["overload.yaml"].replace("duration_s: 300", 'duration_s: "1e3"', 1)
    message = load_or_error(_file(tmp_path, text.encode()))
    assert message is not None and "$.duration_s" in message, message
    assert "without quotes" in message, message


def test_alias_of_a_value_is_still_fine(tmp_path: Path) -> None:
    text = SEEDS["overload.yaml"].replace("max_tokens: 1000", "max_tokens: &cap 1000", 1)
    text = text.replace("max_tokens: 400", "max_tokens: *cap", 1)
    path = _file(tmp_path, text.encode())
    assert read_yaml(path)["classes"]["backfill"]["max_tokens"] == 1000
    load_workload(path)


# --- the CLI ---------------------------------------------------------------------------------


@examples(100)
@given(
    seed=st.sampled_from(sorted(SEEDS)),
    edits=st.lists(
        st.tuples(st.integers(0, 100_000), st.integers(0, 6), st.binary(max_size=8)),
        min_size=1,
        max_size=3,
    ),
)
def test_workload_check_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], seed: str, edits: list[Any]
) -> None:
    data = SEEDS[seed].encode()
    for at, cut, insert in edits:
        at %= len(data) + 1
        data = data[:at] + insert + data[at + cut :]
    path = _file(tmp_path, data)
    capsys.readouterr()
    code = main(["workload", "check", str(path)])
    _, err = capsys.readouterr()
    if code == 0:
        return
    assert code == 2
    lines = err.strip().split("\n")
    assert len(lines) == 1 and lines[0].startswith(f"headway: error: {path}:"), err


def test_workload_check_refuses_a_billion_laughs(tmp_path: Path) -> None:
    path = _file(tmp_path, _laughs(9, 10).encode())
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "headway", "workload", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "alias" in done.stderr, done.stderr
    assert time.monotonic() - started < 30
