"""The compiled build (``hatch_build.py``, ``headway.native``): what may be compiled, that
CI really runs it, that it gives the same results as the sources, and that an edited
source is never shadowed by its old extension."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from headway import native

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
COMPILED = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["hooks"][
    "custom"
]["compile"]


@pytest.mark.parametrize("path", COMPILED)
def test_compiled_modules_avoid_what_mypyc_changes(path: str) -> None:
    """mypyc drops a ``msgspec.Struct``'s class options (frozen, forbid_unknown_fields)
    and cannot compile a class attribute that aliases a method: neither may appear."""
    tree = ast.parse((SRC / path).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                assert "Struct" not in ast.unparse(base), f"{path}: {node.name} is a Struct"
            methods = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
            for item in node.body:
                if isinstance(item, ast.Assign) and isinstance(item.value, ast.Name):
                    assert item.value.id not in methods, f"{path}: {node.name} aliases a method"


def test_ci_runs_the_compiled_build() -> None:
    status = native.status()
    if not status.compiled:
        message = f"headway is not compiled here ({status.reason})"
        if os.environ.get("CI") == "true":
            pytest.fail(message + ": the README's install compiles it (gcc, Python headers)")
        pytest.skip(message)
    assert sorted(status.modules) == sorted(
        p.removesuffix(".py").replace("/", ".") for p in COMPILED
    )
    import headway.core.engine.scheduler as scheduler

    assert scheduler.__file__ is not None
    assert scheduler.__file__.endswith(".so")


SIMULATE = """
import hashlib, sys, numpy as np
from headway import native
from headway.core.workload.compile import compile_workload
from headway.files.workload import load_workload, read_yaml
from headway.sim.cluster import parse_cluster
from headway.sim.run import simulate_compiled
loaded = load_workload("examples/overload.yaml")
from pathlib import Path
cluster = read_yaml(Path("examples/clusters/overload.yaml"))
cluster.update(replicas=2, gateway={"preset": sys.argv[1]})
workload = compile_workload(loaded.spec, traces=loaded.traces)
_, outcome = simulate_compiled(workload, parse_cluster(cluster))
c = outcome.calls
digest = hashlib.sha256()
for name in ("dispatch_s", "first_token_s", "finish_s", "num_output_tokens", "replica"):
    digest.update(np.ascontiguousarray(getattr(c, name)).tobytes())
print(native.status().compiled, len(c.finish_s), digest.hexdigest())
"""


@pytest.mark.parametrize("preset", ["fifo-unbounded", "headway-default"])
def test_compiled_and_pure_python_give_identical_records(preset: str) -> None:
    if not native.status().compiled:
        pytest.skip("nothing compiled here: test_ci_runs_the_compiled_build says why")
    runs = []
    for pure in ("0", "1"):
        env = {**os.environ, "HEADWAY_PURE_PYTHON": pure}
        done = subprocess.run(
            [sys.executable, "-c", SIMULATE, preset],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            check=True,
        )
        runs.append(done.stdout.split())
    (compiled, n, a), (pure_compiled, m, b) = runs
    assert (compiled, pure_compiled) == ("True", "False")
    assert int(n) > 1000
    assert (n, a) == (m, b)


def _fake_build(root: Path, source: str, recorded: str) -> None:
    package = root / "headway" / "core"
    package.mkdir(parents=True)
    (package / "fast.py").write_text(source)
    manifest = {"modules": {"headway.core.fast": recorded}}
    (root / "headway" / native.MANIFEST_NAME).write_text(json.dumps(manifest))


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the process's status and import finders as they were; no forced sources."""
    monkeypatch.delenv("HEADWAY_PURE_PYTHON", raising=False)
    monkeypatch.setattr(native, "_status", native.status())
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))


@pytest.mark.usefixtures("isolated")
def test_an_edited_source_is_imported_instead_of_its_old_extension(tmp_path: Path) -> None:
    source = "VALUE = 2\n"
    _fake_build(tmp_path, source, recorded=hashlib.sha256(b"VALUE = 1\n").hexdigest())
    status = native.install(tmp_path)
    assert not status.compiled
    assert "changed since they were compiled" in status.reason
    assert "headway.core.fast" in status.reason
    spec = sys.meta_path[0].find_spec("headway.core.fast", None)
    assert spec is not None
    assert spec.origin == str(tmp_path / "headway" / "core" / "fast.py")
    assert sys.meta_path[0].find_spec("headway.core.other", None) is None


@pytest.mark.usefixtures("isolated")
def test_an_unchanged_build_is_used_unless_pure_python_is_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = "VALUE = 1\n"
    _fake_build(tmp_path, source, recorded=hashlib.sha256(source.encode()).hexdigest())
    finders = len(sys.meta_path)
    status = native.install(tmp_path)
    assert status.compiled
    assert status.modules == ("headway.core.fast",)
    assert len(sys.meta_path) == finders  # nothing rerouted
    monkeypatch.setenv("HEADWAY_PURE_PYTHON", "1")
    status = native.install(tmp_path)
    assert not status.compiled
    assert status.reason == "pure Python: HEADWAY_PURE_PYTHON=1"
    assert len(sys.meta_path) == finders + 1


@pytest.mark.usefixtures("isolated")
def test_a_broken_manifest_falls_back_to_the_sources(tmp_path: Path) -> None:
    (tmp_path / "headway").mkdir()
    (tmp_path / "headway" / native.MANIFEST_NAME).write_text("{not json")
    status = native.install(tmp_path)
    assert not status.compiled
    assert "unreadable" in status.reason
    (tmp_path / "headway" / native.MANIFEST_NAME).unlink()
    assert native.install(tmp_path).reason == "pure Python: this install compiled nothing"


@pytest.mark.usefixtures("isolated")
def test_a_failed_compile_says_why(tmp_path: Path) -> None:
    (tmp_path / "headway").mkdir()
    failed = {"modules": {}, "failed": "CompileError: command '/bin/false' failed"}
    (tmp_path / "headway" / native.MANIFEST_NAME).write_text(json.dumps(failed))
    finders = len(sys.meta_path)
    status = native.install(tmp_path)
    assert not status.compiled
    assert status.reason == (
        "pure Python: compiling at install failed (CompileError: command '/bin/false' failed)"
    )
    assert len(sys.meta_path) == finders  # nothing compiled: nothing to reroute


_SIMPLE = {int: 3, float: 0.25, bool: True, "int": 3, "float": 0.25, "bool": True}


def _number_dataclasses_of_compiled_modules() -> list[type]:
    """Every dataclass of a compiled module whose fields are numbers (compiled or not in
    this process); the others are checked by the test after."""
    import dataclasses
    import importlib

    found = []
    for path in COMPILED:
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        found.extend(
            value
            for value in vars(module).values()
            if isinstance(value, type)
            and value.__module__ == module.__name__
            and dataclasses.is_dataclass(value)
            and all(f.type in _SIMPLE for f in dataclasses.fields(value))
        )
    assert {"AffineStepTime", "ReplicaSnapshot"} <= {c.__name__ for c in found}
    return found


@pytest.mark.parametrize("cls", _number_dataclasses_of_compiled_modules(), ids=lambda c: c.__name__)
def test_values_of_compiled_modules_survive_pickle_and_copy(cls: type) -> None:
    """Process pools (``plan``/``sweep --jobs``) pickle these; compiled, a frozen dataclass
    refused to be unpickled (mypyc's default ``__setstate__`` assigns field by field)."""
    import copy
    import dataclasses
    import pickle

    value = cls(**{f.name: _SIMPLE[f.type] for f in dataclasses.fields(cls)})
    assert pickle.loads(pickle.dumps(value)) == value
    assert copy.copy(value) == value and copy.deepcopy(value) == value


def test_step_time_models_and_clusters_survive_pickle() -> None:
    """What a plan's points carry to its workers: a cluster with a measured profile, and
    the roofline a worker builds (compiled classes both)."""
    import pickle

    from headway.core.engine.roofline import RooflineStepTime
    from headway.core.engine.steptime import AffineStepTime, BatchShape
    from headway.sim.cluster import ClusterSpec, step_time_model
    from headway.sim.run import load_efficiency_table

    profile = AffineStepTime(overhead_s=0.01, per_decode_seq_s=0.002,
                             shared_kv_read_ratio=0.1)  # fmt: skip
    cluster = ClusterSpec(model="llama-3-8b", gpu="h100", step_time="profile", profile=profile)
    assert pickle.loads(pickle.dumps(cluster)) == cluster
    roofline = step_time_model(ClusterSpec(model="llama-3-8b", gpu="h100"), load_efficiency_table())
    assert isinstance(roofline, RooflineStepTime)
    again = pickle.loads(pickle.dumps(roofline))
    batch = BatchShape(num_prefill_tokens=512, prefill_attention_pairs=131328, num_prefill_seqs=1)
    assert again.step_time_s(batch) == roofline.step_time_s(batch)
