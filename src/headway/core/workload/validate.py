"""Checks that span sections of a workload (references by name, shares, priorities)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from headway.core.errors import WorkloadError
from headway.core.workload.spec import TraceReplay, WorkloadSpec


def _unknown(kind: str, name: str, known: Iterable[str], path: str, fix: str) -> WorkloadError:
    names = sorted(known)
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"did you mean `{close[0]}`? " if close else ""
    return WorkloadError(
        f"{path}: unknown {kind} `{name}`; {hint}known {kind}s: {', '.join(names)}. {fix}",
        path=path,
    )


def unbounded_classes(spec: WorkloadSpec) -> list[str]:
    """The classes whose SLO names no latency bound: any latency meets it."""
    return [name for name, cls in spec.classes.items() if not cls.slo.bounds_latency]


def require_latency_slo(spec: WorkloadSpec, what: str) -> None:
    """Raise :class:`WorkloadError` when no class bounds a latency: SLO attainment is then
    100% at any load, and ``what`` (a knee search, a plan) has nothing to find."""
    if len(unbounded_classes(spec)) < len(spec.classes):
        return
    name = next(iter(spec.classes))
    raise WorkloadError(
        f"$.classes: no class names a latency SLO (slo.ttft_s, slo.tpot_s or slo.e2e_s), "
        f"so every load meets it and {what} has no knee to find; add your promise, e.g. "
        f"`classes.{name}.slo: {{ttft_s: 2.0, tpot_s: 0.1}}` (task_deadline_s alone is "
        "judged per task, not per call)",
        path="$.classes",
    )


def validate_workload(spec: WorkloadSpec) -> WorkloadSpec:
    """Raise :class:`WorkloadError` for broken references between sections.

    Returns ``spec`` unchanged so calls can be chained.
    """
    seen_sources: set[str] = set()
    for i, source in enumerate(spec.sources):
        path = f"$.sources[{i}]"
        if source.name in seen_sources:
            raise WorkloadError(
                f"{path}.name: source name `{source.name}` is used twice; give each source "
                "a unique name",
                path=f"{path}.name",
            )
        seen_sources.add(source.name)
        if source.mix is None:
            if len(spec.classes) != 1:
                raise WorkloadError(
                    f"{path}.mix: missing; with {len(spec.classes)} classes each source needs "
                    f"a `mix` such as {{{', '.join(f'{c}: 0.5' for c in list(spec.classes)[:2])}}}",
                    path=f"{path}.mix",
                )
        else:
            for ref in source.mix:
                if ref not in spec.classes:
                    raise _unknown(
                        "class",
                        ref,
                        spec.classes,
                        f"{path}.mix.{ref}",
                        "Define it under `classes`.",
                    )
        if isinstance(source.arrivals, TraceReplay) and source.arrivals.lengths == "trace":
            for ref in source.mix or spec.classes:
                cls = spec.classes.get(ref)
                if cls is not None and (cls.verification_calls or cls.acceptance_probability < 1):
                    raise WorkloadError(
                        f"{path}.mix.{ref}: class `{ref}` verifies its outcomes "
                        "(verification_calls, acceptance_probability), but each row of a "
                        "replayed trace is one call; use `lengths: class` for this source, "
                        "or a class without them",
                        path=f"{path}.mix.{ref}",
                    )
                branches = spec.classes[ref].parallel_branches if ref in spec.classes else 1
                if branches != 1:
                    raise WorkloadError(
                        f"{path}.mix.{ref}: class `{ref}` has parallel_branches {branches}, "
                        "but each row of a replayed trace is one call; use a class with "
                        "parallel_branches 1 for this source, or `lengths: class`",
                        path=f"{path}.mix.{ref}",
                    )
        for tenant in source.tenants or {}:
            if tenant not in spec.tenants:
                raise _unknown(
                    "tenant",
                    tenant,
                    spec.tenants,
                    f"{path}.tenants.{tenant}",
                    "Define it under `tenants`.",
                )
    if sum(t.share for t in spec.tenants.values()) <= 0:
        raise WorkloadError(
            "$.tenants: every tenant has share 0; give at least one a positive `share`",
            path="$.tenants",
        )
    for cls_name, cls in spec.classes.items():
        path = f"$.classes.{cls_name}"
        if cls.route is not None and cls.route not in spec.routes:
            raise _unknown(
                "route", cls.route, spec.routes, f"{path}.route", "Define it under `routes`."
            )
        if cls.tool_service is not None and cls.tool_service not in spec.services:
            if not spec.services:
                raise WorkloadError(
                    f"{path}.tool_service: service `{cls.tool_service}` is not defined and the "
                    "workload has no `services`; define it under `services`, or remove "
                    "`tool_service` to use `tool_latency_s`",
                    path=f"{path}.tool_service",
                )
            raise _unknown(
                "service",
                cls.tool_service,
                spec.services,
                f"{path}.tool_service",
                "Define it under `services`.",
            )
    for name, route in spec.routes.items():
        if route.fallback is None:
            continue
        path = f"$.routes.{name}.fallback"
        if route.fallback not in spec.routes:
            raise _unknown("route", route.fallback, spec.routes, path, "Define it under `routes`.")
        if route.fallback == name:
            raise WorkloadError(f"{path}: a route cannot fall back to itself", path=path)
    return spec
