"""Property-based fuzzing of the other files headway reads: the gateway config, cluster
files, calibration profiles and drill hooks files.

Hypothesis replaces, deletes or adds a value anywhere in a valid document (NaN, negative,
huge, wrong types, nested garbage), and writes random bytes, invalid UTF-8 and alias
bombs. The guarantee: reading either succeeds or raises a :class:`HeadwayError` with a
one-line message that names the file and, for a value, where; nothing else escapes.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz_trees import mutate
from headway.calibrate.profile import Profile, read_profile
from headway.core.engine.steptime import AffineStepTime
from headway.core.errors import HeadwayError
from headway.drill.stack import read_hooks
from headway.files.workload import read_yaml
from headway.gateway.config import load_config
from headway.sim.cluster import parse_cluster

pytestmark = pytest.mark.timeout(120)

SCALE = max(1, int(os.environ.get("HEADWAY_FUZZ_EXAMPLES", "1")))
FUZZ = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
ROOT = Path(__file__).resolve().parents[3]

GATEWAY: dict[str, Any] = {
    "upstreams": [
        {
            "url": "http://127.0.0.1:8000",
            "revision": "r1",
            "slots": 8,
            "route": "big",
            "fingerprint": "sha256:" + "ab" * 32,
        },
        {"url": "http://127.0.0.1:8001", "model": "llama-3-8b", "revision": "r1", "route": "small"},
    ],
    "tenants": {
        "sk-a": {"name": "a", "weight": 2, "share": 3, "max_priority": "critical"},
        "sk-b": {"name": "b", "token_rate_per_s": 500.0, "max_concurrency": 4},
    },
    "routes": {"big": {"fallback": "small", "data_policy": "x"}, "small": {"data_policy": "x"}},
    "models": ["big", "small"],
    "admission": {"max_retry_after_s": 30},
    "queues": {"critical_reserved_slots": 1, "interactive": {"max_queued_requests": 32}},
    "retries": {"max_attempts": 2},
    "pool": {"probe_interval_s": 1.0, "probe_deadline_s": 0.5, "warmup_probes": 2},
    "shared": {"fail_mode": "open"},
    "capacity_tokens_per_s": 20000,
    "admin_token": "adm",
    "metrics_token": "met",
}
PROFILE: dict[str, Any] = msgspec.to_builtins(
    Profile(model="llama-3-8b", hardware="1x H100-SXM", step_time=AffineStepTime())
)
HOOKS: dict[str, Any] = {"kill_engine": "true", "restart_engine": "echo {engine} {engine_url}"}


def _cluster(path: Path) -> object:
    return parse_cluster(read_yaml(path), str(path))


def _gateway(path: Path) -> object:
    config = load_config(path)
    if config.pool is not None:  # the pool's own settings are read at start: read them too
        from headway.gateway.pool import parse_pool_config
        from headway.gateway.pooled import pool_config_data

        parse_pool_config(pool_config_data(config), str(path))
    return config


READERS: dict[str, tuple[Callable[[Path], object], list[Any]]] = {
    "gateway": (_gateway, [GATEWAY]),
    "cluster": (
        _cluster,
        [yaml.safe_load(p.read_text()) for p in sorted(ROOT.glob("examples/clusters/*.yaml"))],
    ),
    "hooks": (lambda p: read_hooks(str(p)), [HOOKS]),
}  # fmt: skip
READERS["profile"] = (read_profile, [PROFILE])


def _read(kind: str, path: Path) -> str | None:
    """Read ``path`` as ``kind``: None when it is valid, else the checked error message."""
    reader, _ = READERS[kind]
    try:
        reader(path)
    except HeadwayError as error:
        message = str(error)
        assert str(path) in message, message
        assert "\n" not in message.strip(), message
        return message
    return None


_COUNTER = iter(range(10**9))


def _write(tmp_path: Path, data: bytes, suffix: str = ".yaml") -> Path:
    path = tmp_path / f"{next(_COUNTER)}{suffix}"
    path.write_bytes(data)
    return path


@settings(FUZZ, max_examples=300 * SCALE)
@given(
    kind=st.sampled_from(sorted(READERS)),
    data=st.data(),
    action=st.sampled_from(["replace", "delete", "add"]),
)
def test_one_value_changed_anywhere(
    tmp_path: Path, kind: str, data: st.DataObject, action: str
) -> None:
    seeds = READERS[kind][1]
    tree = json.loads(json.dumps(data.draw(st.sampled_from(seeds), label="seed")))
    mutate(tree, data, action)
    suffix = ".json" if kind == "profile" else ".yaml"
    text = json.dumps(tree) if kind == "profile" else yaml.safe_dump(tree)
    _read(kind, _write(tmp_path, text.encode(), suffix))


@settings(FUZZ, max_examples=100 * SCALE)
@given(kind=st.sampled_from(sorted(READERS)), raw=st.binary(max_size=300))
def test_random_bytes(tmp_path: Path, kind: str, raw: bytes) -> None:
    _read(kind, _write(tmp_path, raw))


@pytest.mark.parametrize("kind", sorted(READERS))
def test_valid_seeds_read(tmp_path: Path, kind: str) -> None:
    for seed in READERS[kind][1]:
        text = json.dumps(seed) if kind == "profile" else yaml.safe_dump(seed)
        assert _read(kind, _write(tmp_path, text.encode())) is None


@pytest.mark.parametrize("kind", ["gateway", "cluster", "hooks"])
def test_alias_bombs_are_refused_fast(tmp_path: Path, kind: str) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for level in range(1, 12):
        refs = ", ".join([f"*a{level - 1}"] * 10)
        lines.append(f"a{level}: &a{level} [{refs}]")
    path = _write(tmp_path, ("\n".join(lines) + "\n").encode())
    started = time.monotonic()
    message = _read(kind, path)
    assert message is not None and time.monotonic() - started < 2.0
