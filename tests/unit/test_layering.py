"""The core stays pure: it imports no driver and no I/O, clock or global-RNG module."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "headway"

# Modules the core may never import: I/O, networking, the wall clock, the global RNG,
# subprocesses and files, and every headway driver.
FORBIDDEN_ROOTS = {
    "asyncio", "socket", "ssl", "http", "urllib", "httpx", "aiohttp", "requests",
    "starlette", "uvicorn", "redis", "time", "datetime", "random", "os", "io",
    "pathlib", "subprocess", "shutil", "tempfile", "threading", "multiprocessing",
    "concurrent", "logging", "yaml", "rich", "gzip", "csv", "json", "sys", "glob",
}  # fmt: skip
DRIVER_PACKAGES = {
    "sim", "planner", "trace", "files", "live", "report", "cli", "bench", "emulate",
    "gateway", "drill", "check",
}  # fmt: skip


def _imports(source: str, module: str) -> list[tuple[int, str]]:
    """Absolute names imported by ``source``, the text of module ``module``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: -node.level]
                found.append((node.lineno, ".".join([*base, node.module or ""]).rstrip(".")))
            elif node.module:
                found.append((node.lineno, node.module))
    return found


def _violations(source: str, module: str) -> list[str]:
    bad = []
    for lineno, name in _imports(source, module):
        parts = name.split(".")
        if parts[0] in FORBIDDEN_ROOTS:
            bad.append(f"{module}:{lineno} imports {name}")
        if parts[0] == "headway" and len(parts) > 1 and parts[1] in DRIVER_PACKAGES:
            bad.append(f"{module}:{lineno} imports driver {name}")
    return bad


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(SRC.parent).with_suffix("").parts)


def test_core_is_pure() -> None:
    files = sorted((SRC / "core").rglob("*.py"))
    assert len(files) > 3, "no core modules found"
    problems = [v for f in files for v in _violations(f.read_text("utf-8"), _module_name(f))]
    assert not problems, "core must not do I/O or import drivers:\n" + "\n".join(problems)


def test_checker_catches_violations() -> None:
    """The walker itself must be able to fail, for absolute and relative imports."""
    probe = "import time\nfrom headway.sim import engine\nfrom ...planner import x\nimport numpy\n"
    problems = _violations(probe, "headway.core.workload.probe")
    assert any("imports time" in p for p in problems)
    assert any("driver headway.sim" in p for p in problems)
    assert any("driver headway.planner" in p for p in problems)
    assert not any("numpy" in p for p in problems)


@pytest.mark.parametrize("module", ["headway.core.seeding", "headway.core.engine.steptime"])
def test_core_modules_import_without_drivers(module: str) -> None:
    for name in list(sys.modules):
        if name == module:
            del sys.modules[name]
    before = set(sys.modules)
    importlib.import_module(module)
    loaded = set(sys.modules) - before
    assert not {m for m in loaded if m.split(".")[0] in {"yaml", "rich", "asyncio"}}
