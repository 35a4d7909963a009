"""The real-engine tier: one vLLM (CPU build, tiny dummy-weight model) shared by the tier.

The session fixture installs vLLM into its own venv unless it is there (``.ci/run`` does
that first, with ``python -m headway.realengine``), builds the model and starts one
server; a test that needs a second replica starts its own. Under ``CI=true`` a failure to
install or start vLLM fails the tests; elsewhere they skip with the reason. The summary
prints how long each stage took. Every test of this directory gets a long timeout: the
first one waits for the server (about four minutes on a loaded two-core machine).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from headway.realengine.install import InstallError, VllmVenv, default_venv_path
from headway.realengine.model import ModelSpec, build_model, default_model_dir
from headway.realengine.server import VllmServer, VllmSettings

_TIMES: dict[str, float] = {}
_HERE = Path(__file__).parent


def _unavailable(message: str) -> None:
    """Fail under CI (the tier must run there), skip elsewhere."""
    if os.environ.get("CI") == "true":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A startup-sized timeout for the tier's tests."""
    for item in items:
        if _HERE in Path(item.path).parents:
            item.add_marker(pytest.mark.timeout(1200))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """How long installing, building and starting took."""
    if _TIMES:
        parts = ", ".join(f"{name} {s:.1f} s" for name, s in _TIMES.items())
        terminalreporter.write_line(f"real-engine tier: {parts}")


@pytest.fixture(scope="session")
def vllm_venv() -> VllmVenv:
    """vLLM's venv, installed unless present."""
    t0 = time.monotonic()
    try:
        venv = VllmVenv(default_venv_path()).ensure(progress=lambda s: None)
    except InstallError as exc:
        _unavailable(str(exc))
    _TIMES["vllm venv"] = time.monotonic() - t0
    return venv


@pytest.fixture(scope="session")
def tiny_model(vllm_venv: VllmVenv) -> Path:
    """The tiny model's directory (seed 0), built unless present."""
    t0 = time.monotonic()
    spec = ModelSpec()
    try:
        path = build_model(default_model_dir(spec), spec, python=vllm_venv.python)
    except (OSError, RuntimeError) as exc:
        _unavailable(f"building the tiny model failed: {exc}")
    _TIMES["model build"] = time.monotonic() - t0
    return path


TIER_SETTINGS = VllmSettings(nice=10)
"""The tier's engines run below the gateway and the test (see ``VllmSettings.nice``)."""


@pytest.fixture(scope="session")
def tier_settings() -> VllmSettings:
    """The settings of the tier's engines (for servers a test module starts itself)."""
    return TIER_SETTINGS


def _start(
    venv: VllmVenv, model_dir: Path, log_path: Path, settings: VllmSettings | None = None
) -> VllmServer:
    """Start one vLLM server (fail under CI, skip elsewhere, when it does not start)."""
    server = VllmServer(venv.python, model_dir, log_path, settings or TIER_SETTINGS)
    try:
        server.start()
    except RuntimeError as exc:
        _unavailable(str(exc))
    return server


StartVllm = Callable[..., VllmServer]


@pytest.fixture
def start_vllm(vllm_venv: VllmVenv, tmp_path: Path) -> Iterator[StartVllm]:
    """Start more vLLM servers in a test: ``start_vllm(model_dir, settings=None)``; each
    is stopped when the test ends."""
    started: list[VllmServer] = []

    def start(model_dir: Path, settings: VllmSettings | None = None) -> VllmServer:
        log = tmp_path / f"vllm-{len(started)}.log"
        server = _start(vllm_venv, model_dir, log, settings)
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            server.stop()


@pytest.fixture(scope="session")
def vllm_server(
    vllm_venv: VllmVenv, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    """The tier's shared vLLM server."""
    t0 = time.monotonic()
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    server = _start(vllm_venv, tiny_model, log)
    _TIMES["vllm start"] = time.monotonic() - t0
    try:
        yield server
    finally:
        server.stop()
