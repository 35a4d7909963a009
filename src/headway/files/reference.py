"""The workload format's reference, generated from the types and their field docstrings.

Field docstrings (a string literal right after a field, vLLM's style) are the single
source of the documentation: this module reads them with ``ast`` and puts them into the
JSON Schema (``description``) and into the key tables of ``docs/workload.md``.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import textwrap
from typing import Any

import msgspec

from headway.core.workload import spec as spec_types
from headway.core.workload.spec import WorkloadSpec

# The order in which sections appear in the reference.
SECTIONS: tuple[type[msgspec.Struct], ...] = (
    spec_types.WorkloadSpec,
    spec_types.TaskClass,
    spec_types.Slo,
    spec_types.JointTokens,
    spec_types.Source,
    spec_types.Constant,
    spec_types.PoissonArrivals,
    spec_types.GammaArrivals,
    spec_types.OnOff,
    spec_types.Schedule,
    spec_types.Step,
    spec_types.Burst,
    spec_types.TraceReplay,
    spec_types.Window,
    spec_types.Fixed,
    spec_types.Lognormal,
    spec_types.Gamma,
    spec_types.Exponential,
    spec_types.Uniform,
    spec_types.Poisson,
    spec_types.Empirical,
    spec_types.Tenant,
    spec_types.Route,
    spec_types.ReplicaCapacity,
    spec_types.Clients,
    spec_types.Retries,
    spec_types.Service,
    spec_types.Planning,
    spec_types.Autoscaling,
)


def field_docs(cls: type) -> dict[str, str]:
    """Docstrings of the fields of ``cls`` and its bases (a string right after a field)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass.__module__ != spec_types.__name__:
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for prev, node in itertools.pairwise(body):
            if (
                isinstance(prev, ast.AnnAssign)
                and isinstance(prev.target, ast.Name)
                and isinstance(node, ast.Expr)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                text = " ".join(node.value.value.split())
                docs[prev.target.id] = text.replace("``", "`")
    return docs


def _type_name(info: Any) -> str:
    if isinstance(info, msgspec.inspect.UnionType):
        names = [_type_name(t) for t in info.types]
        dists = {"fixed", "lognormal", "gamma", "exponential", "uniform", "poisson", "empirical"}
        if dists <= {n.removeprefix("dist: ") for n in names}:
            return "number or distribution"
        return " or ".join(dict.fromkeys(names))
    if isinstance(info, msgspec.inspect.StructType):
        if info.tag is not None:
            return f"{info.tag_field}: {info.tag}"
        return info.cls.__name__
    if isinstance(info, msgspec.inspect.DictType):
        return f"map of {_type_name(info.value_type)}"
    if isinstance(info, msgspec.inspect.ListType):
        return f"list of {_type_name(info.item_type)}"
    if isinstance(info, msgspec.inspect.TupleType):
        return "[" + ", ".join(_type_name(t) for t in info.item_types) + "]"
    if isinstance(info, msgspec.inspect.LiteralType):
        return " | ".join(f"`{v}`" for v in info.values)
    simple: dict[type, str] = {
        msgspec.inspect.FloatType: "number",
        msgspec.inspect.IntType: "integer",
        msgspec.inspect.StrType: "string",
        msgspec.inspect.BoolType: "boolean",
        msgspec.inspect.NoneType: "null",
    }
    return simple.get(type(info), type(info).__name__)


def _default(field: Any) -> str:
    if field.required:
        return "required"
    has_default = field.default is not msgspec.NODEFAULT
    value = field.default if has_default else field.default_factory()
    if isinstance(value, msgspec.Struct):
        return "see below"
    if isinstance(value, dict) and any(isinstance(v, msgspec.Struct) for v in value.values()):
        return "one entry: " + ", ".join(f"`{k}`" for k in value)
    return f"`{msgspec.json.encode(msgspec.to_builtins(value)).decode()}`"


def reference_markdown() -> str:
    """Markdown tables of every section: key, type, default, meaning."""
    out = []
    for cls in SECTIONS:
        info = msgspec.inspect.type_info(cls)
        assert isinstance(info, msgspec.inspect.StructType)
        tag = "" if info.tag is None else f" (`{info.tag_field}: {info.tag}`)"
        title = cls.__name__ + tag
        summary = " ".join((cls.__doc__ or "").split("\n\n")[0].split())
        docs = field_docs(cls)
        rows = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
        for field in info.fields:
            kind = _type_name(field.type).replace("|", r"\|")
            meaning = docs.get(field.name, "").replace("|", r"\|")
            rows.append(f"| `{field.encode_name}` | {kind} | {_default(field)} | {meaning} |")
        out.append(f"### {title}\n\n{summary}\n\n" + "\n".join(rows) + "\n")
    return "\n".join(out)


def workload_json_schema() -> dict[str, Any]:
    """The JSON Schema of the workload format, with each field's docstring as description."""
    schema: dict[str, Any] = msgspec.json.schema(WorkloadSpec)
    defs = schema.get("$defs", {})
    for cls in SECTIONS:
        node = defs.get(cls.__name__)
        if node is None:
            continue
        docs = field_docs(cls)
        for name, prop in node.get("properties", {}).items():
            if name in docs and "description" not in prop:
                prop["description"] = docs[name]
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "headway workload"
    return schema
