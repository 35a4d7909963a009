"""Render a plan: a readable terminal report (rich) and rounded JSON."""

from __future__ import annotations

import math
from typing import Any

import msgspec
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from headway.files.jsonout import to_builtins, to_json
from headway.planner.analytic import AnalyticPlan, Period
from headway.planner.growth import Growth
from headway.planner.plan import Plan
from headway.planner.summary import summarize_growth


def plan_to_builtins(plan: msgspec.Struct) -> Any:
    """The plan as JSON-ready builtins, floats rounded to 10 significant digits."""
    return to_builtins(plan)


def plan_to_json(plan: msgspec.Struct) -> str:
    """The plan as indented JSON text."""
    return to_json(plan)


def _fmt(value: float | None, unit: str = "", digits: int = 3) -> str:
    if value is None:
        return "—"
    if not math.isfinite(value):
        return "∞"
    text = f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.{digits}g}"
    return f"{text}{unit}"


def _period_table(periods: list[Period]) -> Table:
    table = Table(title="Demand", title_justify="left", show_edge=False)
    table.add_column("")
    for p in periods:
        table.add_column(p.name, justify="right")
    rows: list[tuple[str, list[str]]] = [
        ("tasks/s", [_fmt(p.tasks_per_s) for p in periods]),
        ("calls per task", [_fmt(p.calls_per_task) for p in periods]),
        ("calls/s", [_fmt(p.calls_per_s) for p in periods]),
        ("input tokens/s", [_fmt(p.input_tokens_per_s) for p in periods]),
        ("output tokens/s", [_fmt(p.output_tokens_per_s) for p in periods]),
        ("tasks in flight (L = λW)", [_fmt(p.little.tasks_in_flight) for p in periods]),
        ("calls in flight (L = λW)", [_fmt(p.little.calls_in_flight) for p in periods]),
        ("cost per task ($)", [_fmt(p.cost_per_task, digits=3) for p in periods]),
    ]
    for label, values in rows:
        table.add_row(label, *values)
    return table


_ROUTE_COLUMNS: tuple[str, ...] = (
    "period", "route", "calls/s", "out tok/s", "replicas", "+failover", "limit", "util.",
    "M/M/1 mean", "M/M/1 p95",
)  # fmt: skip


def _route_table(periods: list[Period]) -> Table:
    """Routes per period. A column no route has a figure for (the queueing columns of a
    workload that declares no service rate) is left out, and no header is ever cut: a
    narrow terminal or a pipe (80 columns) wraps the values instead."""
    rows = []
    for p in periods:
        for r in p.routes:
            q = r.queueing[0] if r.queueing else None
            s = r.sizing
            rows.append((
                p.name, r.route, _fmt(r.calls_per_s), _fmt(r.output_tokens_per_s),
                str(s.replicas) if s else "—", str(s.replicas_with_failover) if s else "—",
                s.limiting_phase if s else "—", _fmt(q.utilization) if q else "—",
                _fmt(q.mean_s, " s") if q else "—", _fmt(q.p95_s, " s") if q else "—",
            ))  # fmt: skip
    kept = [i for i, _ in enumerate(_ROUTE_COLUMNS) if any(row[i] != "—" for row in rows)]
    table = Table(title="Routes", title_justify="left", show_edge=False)
    for i in kept:
        col = _ROUTE_COLUMNS[i]
        widest_word = max(len(word) for word in col.split())
        table.add_column(
            col,
            justify="left" if col in ("period", "route", "limit") else "right",
            min_width=widest_word,
            overflow="fold",
        )
    for row in rows:
        table.add_row(*(row[i] for i in kept))
    return table


def render_terminal(plan: AnalyticPlan, console: Console) -> None:
    """Print the plan as tables and plain-word findings."""
    parts: list[Any] = [_period_table(plan.periods), Text(""), _route_table(plan.periods)]
    if plan.bursts:
        bursts = Table(title="Bursts (fluid model)", title_justify="left", show_edge=False)
        for col in ("source", "at", "rate", "capacity", "backlog", "drain"):
            bursts.add_column(col, justify="left" if col == "source" else "right")
        for b in plan.bursts[:8]:
            bursts.add_row(
                b.source,
                _fmt(b.start_s, " s"),
                _fmt(b.peak_rate_per_s, "/s"),
                _fmt(b.capacity_per_s, "/s"),
                f"{_fmt(b.backlog)} {b.unit}",
                _fmt(b.drain_s, " s") if b.drained else "never clears",
            )
        parts += [Text(""), bursts]
    for table in plan.knee:
        knee = Table(
            title=f"Utilization knee: {table.route} (capacity {_fmt(table.capacity_per_s)}/s)",
            title_justify="left",
            show_edge=False,
        )
        for col in ("utilization", "arrivals/s", "mean", "p95", "p99"):
            knee.add_column(col, justify="right")
        for row in table.rows:
            knee.add_row(
                f"{row.utilization:.0%}",
                _fmt(row.arrival_per_s),
                _fmt(row.mm1_mean_s, " s"),
                _fmt(row.mm1_p95_s, " s"),
                _fmt(row.mm1_p99_s, " s"),
            )
        parts += [Text(""), knee]
    findings = [a.note for a in plan.autoscaling if a.can_rescue is False][:2] + plan.notes
    if findings:
        parts += [Text(""), Text("\n".join(f"• {f}" for f in findings))]
    console.print(Panel(Group(*parts), title=f"headway plan: {plan.workload} (analytic)"))


def _pools_table(plan: Plan) -> Table | None:
    """Each pool's count at the peak: with all up, with one lost in it, and the
    attainment one fewer replica gives (below target: the count is the smallest)."""
    sim = plan.simulated
    if sim is None or sim.pools is None or sim.replica_search is None:
        return None
    pools = sim.pools
    lost = pools.failures_tolerated
    table = Table(
        title=f"Replicas per pool at the peak ({_fmt(sim.replica_search.peak_tasks_per_s)} "
        f"tasks/s, steady; {lost} lost in each pool)",
        title_justify="left",
        show_edge=False,
    )
    for col in ("pool", "routes", "target", "replicas", f"with {lost} lost", "attained",
                "one fewer"):  # fmt: skip
        left = col in ("pool", "routes")
        table.add_column(col, justify="left" if left else "right", overflow="fold")
    for p in pools.pools:
        table.add_row(
            p.name,
            ", ".join(p.routes),
            f"{p.target:.0%}",
            "—" if p.holding_peak is None else str(p.holding_peak),
            "—" if p.recommended is None else str(p.recommended),
            "—" if p.attainment_failures_lost is None else f"{p.attainment_failures_lost:.1%}",
            "—" if p.attainment_one_fewer is None else f"{p.attainment_one_fewer:.1%}",
        )
    return table


def _simulated_tables(plan: Plan) -> list[Any]:
    sim = plan.simulated
    parts: list[Any] = []
    if sim is None:
        return parts
    search = sim.replica_search
    pools = _pools_table(plan)
    if pools is not None:
        parts += [pools, Text("")]
    if search is not None and search.trials:
        model = "calibrated" if sim.cluster.step_time == "profile" else "uncalibrated roofline"
        table = Table(
            title=f"Replicas at the peak ({_fmt(search.peak_tasks_per_s)} tasks/s, steady; "
            f"{model}, ◀ its count)",
            title_justify="left",
            show_edge=False,
        )
        for col in ("replicas", "attainment", "goodput/s", "TTFT p99", "e2e p99"):
            table.add_column(col, justify="right")
        planned = {} if sim.pools is None else {p.name: p.recommended for p in sim.pools.pools}
        for p in search.trials:
            at = p.pool_replicas == planned if planned else p.replicas == search.recommended
            mark = " ◀" if at else ""
            count = " · ".join(f"{k} {n}" for k, n in p.pool_replicas.items())
            table.add_row(
                f"{count or p.replicas}{mark}",
                f"{p.sweep.slo_attainment:.1%}",
                _fmt(p.sweep.goodput_per_s),
                _fmt(p.sweep.ttft_p99_s, " s"),
                _fmt(p.sweep.e2e_p99_s, " s"),
            )
        parts += [table, Text("")]
    if plan.comparison:
        table = Table(title="Analytic and simulated", title_justify="left", show_edge=False)
        for col in ("figure", "analytic", "simulated", "difference"):
            table.add_column(col, justify="left" if col == "figure" else "right")
        for c in plan.comparison:
            diff = "—" if c.relative_difference is None else f"{c.relative_difference:+.0%}"
            table.add_row(
                c.figure,
                _fmt(c.analytic),
                _fmt(c.simulated),
                f"[bold red]{diff}[/]" if c.differs else diff,
            )
        parts += [table]
        reasons = list(dict.fromkeys(r for c in plan.comparison for r in c.reasons))
        if reasons:
            parts += [Text("\n".join(f"• {r}" for r in reasons))]
    return parts


def _growth_panel(growth: Growth) -> Panel:
    """The growth what-if: each resource's utilisation now, the growth at which it
    saturates (the first marked), then what the asked growth needs."""
    table = Table(
        title=f"Growth what-if: today's peak ({_fmt(growth.tasks_per_s)} tasks/s) × "
        f"{growth.factor:g}",
        title_justify="left",
        show_edge=False,
    )
    for col in ("resource", "of", "utilisation now", "saturates at", "headroom ends", "fixed"):
        table.add_column(col, justify="left" if col in ("resource", "of") else "right")
    for i, r in enumerate(growth.resources):
        mark = " ◀ first" if i == 0 and growth.binding is not None else ""
        table.add_row(
            r.resource,
            r.owner,
            f"{r.utilization:.0%}",
            f"{r.saturates_at_growth:.3g}×{mark}" if r.saturates_at_growth else "never",
            f"{r.headroom_ends_at_growth:.3g}×" if r.headroom_ends_at_growth else "—",
            "yes" if r.fixed else "no",
        )
    lines = summarize_growth(growth)[1:] + [f"• {n}" for n in growth.notes]
    return Panel(Group(table, Text(""), Text("\n".join(lines))), title="growth")


def render_plan_terminal(plan: Plan, console: Console) -> None:
    """Print the summary, the simulated findings and the analytic tables."""
    console.print(
        Panel(
            Text("\n".join(plan.summary) or "—"),
            title=f"headway plan: {plan.workload}",
            border_style="blue",
        )
    )
    sim_parts = _simulated_tables(plan)
    if sim_parts:
        console.print(Panel(Group(*sim_parts), title="simulated"))
    if plan.growth is not None:
        console.print(_growth_panel(plan.growth))
    render_terminal(plan.analytic, console)
