"""The executors `plan`, `sweep` and `simulate --bad-days` share: results in call order,
each finished call reported once, and a clear error for every bad `--executor`, `--jobs`
or `--ray-address`. Ray itself is in tests/e2e/test_executor_ray.py."""

from __future__ import annotations

import argparse
import importlib.util
import socket

import pytest

from headway import executors
from headway.core.errors import ConfigError
from headway.executors import LocalExecutor, make_executor


def _cube(x: int) -> int:
    return x**3


def _fails_on_three(x: int) -> int:
    if x == 3:
        raise ValueError(f"call {x} failed")
    return x


@pytest.mark.parametrize("workers", [1, 2])
def test_local_results_in_call_order_and_each_call_reported_once(workers: int) -> None:
    executor = LocalExecutor(workers)
    heard: list[tuple[int, int]] = []
    try:
        calls = [(x,) for x in (5, 1, 4, 2, 3)]
        results = executor.map(_cube, calls, on_done=lambda i, r: heard.append((i, r)))
        assert results == [125, 1, 64, 8, 27]
        assert sorted(heard) == [(i, r) for i, r in enumerate(results)]
        assert executor.map(_cube, [(2,)]) == [8]  # without on_done; the pool is reused
    finally:
        executor.close()


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failed_call_raises_its_error_and_the_next_batch_still_runs(workers: int) -> None:
    """A failed (or interrupted) batch stops its pool's workers; the next gets new ones."""
    executor = LocalExecutor(workers)
    try:
        with pytest.raises(ValueError, match="call 3 failed"):
            executor.map(_fails_on_three, [(x,) for x in range(6)], on_done=lambda i, r: None)
        with pytest.raises(ValueError, match="call 3 failed"):
            executor.map(_fails_on_three, [(x,) for x in range(6)])
        assert executor.map(_cube, [(x,) for x in range(4)]) == [0, 1, 8, 27]
    finally:
        executor.close()


def test_bad_counts_and_kinds_name_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"--jobs must be >= 1 \(got 0\)"):
        LocalExecutor(0)
    with pytest.raises(ConfigError, match=r"--jobs must be >= 1 \(got -2\)"):
        executors.jobs_or_cpus(-2)
    assert executors.jobs_or_cpus(3) == 3
    assert executors.jobs_or_cpus(None) >= 1
    with pytest.raises(ConfigError, match="--executor must be local or ray"):
        make_executor("dask", jobs=1, ray_address=None)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="headway sweep", exit_on_error=False)
    executors.add_arguments(parser, "the sweep's points", only_with="--bad-days")
    return parser


def test_flags_refuse_an_unknown_executor_and_name_both_choices() -> None:
    with pytest.raises(argparse.ArgumentError, match="invalid choice: 'dask'") as raised:
        _parser().parse_args(["--executor", "dask"])
    assert "--executor" in str(raised.value)
    assert "local" in str(raised.value) and "ray" in str(raised.value)
    help_text = _parser().format_help()
    assert "with --bad-days: where the sweep's points run" in help_text


def test_from_arguments_defaults_to_local_and_reads_ray_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    executor = executors.from_arguments(_parser().parse_args([]), jobs=1)
    assert isinstance(executor, LocalExecutor) and executor.workers == 1
    executor.close()
    if importlib.util.find_spec("ray") is None:
        pytest.skip("ray is not installed (pip install -e '.[test]')")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    with pytest.raises(ConfigError, match=rf"--ray-address 127.0.0.1:{port}: cannot connect"):
        executors.from_arguments(_parser().parse_args(["--executor", "ray"]), jobs=1)
