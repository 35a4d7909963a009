"""What starting the CLI loads (issue 16, defect 12): ``headway --help`` and a mistyped
verb list the verbs without importing any verb's module, and ``workload check`` does not
load the simulator's or the servers' stacks. Checked on ``sys.modules`` in a fresh
interpreter, not timed (benchmarks/cli_start.py measures the CPU time)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from headway.verbs import VERBS

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("scipy", "numpy", "aiohttp", "rich", "yaml", "headway.sim", "headway.planner")

_PROBE = """
import contextlib, io, json, sys
from headway.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        main(sys.argv[1:])
    except SystemExit:
        pass
print(json.dumps(sorted(sys.modules)))
"""


def _loaded(*args: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True,
                          text=True, check=True, timeout=60)  # fmt: skip
    return list(json.loads(done.stdout.splitlines()[-1]))


def _heavy(modules: list[str], prefixes: tuple[str, ...]) -> list[str]:
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes)]


@pytest.mark.parametrize("args", [["--help"], [], ["plann"], ["--version"]])
def test_listing_the_verbs_imports_none_of_them(args: list[str]) -> None:
    modules = _loaded(*args)
    verb_modules = {v.module for v in VERBS.values()}
    assert not verb_modules & set(modules), sorted(verb_modules & set(modules))
    assert not _heavy(modules, HEAVY), _heavy(modules, HEAVY)


def test_workload_check_does_not_load_the_simulator_or_the_servers() -> None:
    modules = _loaded("workload", "check", str(ROOT / "examples" / "reference-assistant.yaml"))
    assert "headway.files.commands" in modules
    heavy = ("scipy", "aiohttp", "headway.sim", "headway.planner", "headway.gateway")
    assert not _heavy(modules, heavy), _heavy(modules, heavy)


def test_each_verb_module_registers_the_verbs_the_table_names() -> None:
    """The table and the modules agree: importing a verb's module adds that verb."""
    for name, verb in VERBS.items():
        from headway.cli import build_parser

        parser = build_parser(name)
        choices = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
        assert name in choices, (name, verb.module, sorted(choices))
