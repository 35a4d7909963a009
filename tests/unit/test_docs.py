"""Generated docs are current, the schema accepts the examples, and files round-trip."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from headway.core.workload.compile import compile_workload
from headway.files.workload import dump_workload, load_workload, parse_workload

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def _gen_docs() -> object:
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_docs"] = module
    spec.loader.exec_module(module)
    return module


def test_generated_docs_are_current() -> None:
    gen = _gen_docs()
    md = (ROOT / "docs" / "workload.md").read_text(encoding="utf-8")
    assert md == gen.expected_workload_md(md), "run: python scripts/gen_docs.py"  # type: ignore[attr-defined]
    schema = (ROOT / "docs" / "workload.schema.json").read_text(encoding="utf-8")
    assert schema == gen.expected_schema(), "run: python scripts/gen_docs.py"  # type: ignore[attr-defined]
    drills = (ROOT / "docs" / "drills.md").read_text(encoding="utf-8")
    assert "<!-- BEGIN GENERATED DRILLS" in drills
    assert drills == gen.expected_drills_md(drills), "run: python scripts/gen_docs.py"  # type: ignore[attr-defined]
    for name, groups in gen.METRIC_TABLES.items():  # type: ignore[attr-defined]
        doc = (ROOT / "docs" / name).read_text(encoding="utf-8")
        assert "<!-- BEGIN GENERATED METRICS" in doc, name
        table = gen.metrics_table(groups)  # type: ignore[attr-defined]
        assert doc == gen.expected_metrics_md(doc, table), "run: python scripts/gen_docs.py"  # type: ignore[attr-defined]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_schema_accepts_examples_and_rejects_a_typo(path: Path) -> None:
    schema = json.loads((ROOT / "docs" / "workload.schema.json").read_text(encoding="utf-8"))
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    jsonschema.validate(data, schema)
    data["planning"] = {**data.get("planning", {}), "planing_factor": 0.5}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, schema)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_dump_and_parse_round_trip(path: Path) -> None:
    spec = load_workload(path).spec
    again = parse_workload(yaml.safe_load(dump_workload(spec)), "dumped")
    assert again == spec
    a, b = compile_workload(spec), compile_workload(again)
    assert (a.task_arrival_s == b.task_arrival_s).all()


def test_every_field_is_documented() -> None:
    import msgspec

    from headway.files.reference import SECTIONS, field_docs

    missing = [
        f"{cls.__name__}.{f.name}"
        for cls in SECTIONS
        for f in msgspec.inspect.type_info(cls).fields  # type: ignore[attr-defined]
        if f.name not in field_docs(cls)
    ]
    assert not missing, f"fields without a docstring: {missing}"
