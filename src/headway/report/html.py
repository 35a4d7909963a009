"""A self-contained HTML page for an analytic plan (inline CSS and SVG, no network).

Rendering takes the plan's JSON data (the same dict written to ``plan.json``), so a
report can be re-rendered from the file without re-running anything.
"""

from __future__ import annotations

import html
import math
from typing import Any

_CSS = """
body{font:15px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;
max-width:1100px;color:#1d2330;padding:0 1rem}
h1{font-size:1.6rem;margin-bottom:.2rem}h2{font-size:1.15rem;margin-top:2rem;
border-bottom:1px solid #dde2ea;padding-bottom:.3rem}
.summary{background:#f3f6fb;border-left:4px solid #3b6fd8;padding:.8rem 1rem;margin:1rem 0}
table{border-collapse:collapse;margin:.5rem 0}td,th{padding:.3rem .7rem;text-align:right;
border-bottom:1px solid #eceff4}th{background:#f7f8fa}td:first-child,th:first-child{text-align:left}
.bad{color:#b42318;font-weight:600}.good{color:#067647}.muted{color:#667085;font-size:.9rem}
svg text{font:12px system-ui,sans-serif}
"""


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        if not math.isfinite(value):
            return "∞"
        text = f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
        return html.escape(text + unit)
    return html.escape(str(value))


def _table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _knee_svg(table: dict[str, Any]) -> str:
    """Mean and p95 latency against utilization: the knee, drawn."""
    rows = table["rows"]
    width, height, pad = 520, 260, 45
    ys = [r["mm1_p95_s"] for r in rows]
    top = float(max(ys)) * 1.05

    def x(u: float) -> float:
        return pad + (width - 2 * pad) * u

    def y(v: float) -> float:
        return height - pad - (height - 2 * pad) * (v / top)

    lines = []
    for key, color in (("mm1_mean_s", "#3b6fd8"), ("mm1_p95_s", "#d9480f")):
        pts = " ".join(f"{x(r['utilization']):.1f},{y(r[key]):.1f}" for r in rows)
        lines.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{pts}"/>')
        lines.extend(
            f'<circle cx="{x(r["utilization"]):.1f}" cy="{y(r[key]):.1f}" r="3" fill="{color}"/>'
            for r in rows
        )
    axes = (
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" '
        'stroke="#98a2b3"/>'
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="#98a2b3"/>'
        f'<text x="{width / 2}" y="{height - 10}" text-anchor="middle">utilization</text>'
        f'<text x="12" y="{pad - 10}">seconds (max {top:.3g})</text>'
        f'<text x="{pad + 10}" y="{pad + 14}" fill="#d9480f">p95</text>'
        f'<text x="{pad + 10}" y="{pad + 30}" fill="#3b6fd8">mean</text>'
    )
    ticks = "".join(
        f'<text x="{x(u):.1f}" y="{height - pad + 16}" text-anchor="middle">{u:.0%}</text>'
        for u in (0.0, 0.5, 0.8, 0.9, 1.0)
    )
    return (
        f'<svg role="img" aria-label="latency knee" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}">{axes}{ticks}{"".join(lines)}</svg>'
    )


def _summary(plan: dict[str, Any]) -> str:
    peak = plan["periods"][-1]
    parts = []
    for route in peak["routes"]:
        s = route.get("sizing")
        if s:
            parts.append(
                f"Route <b>{html.escape(route['route'])}</b> needs <b>{s['replicas']}</b> "
                f"replicas at the peak ({s['limiting_phase']}-bound), "
                f"<b>{s['replicas_with_failover']}</b> to survive "
                f"{s['failures_tolerated']} lost."
            )
        q = route["queueing"][0] if route["queueing"] else None
        if q and not q["stable"]:
            parts.append(
                f"<span class='bad'>Route {html.escape(route['route'])} is overloaded at the "
                f"peak (utilization {q['utilization']:.2f}).</span>"
            )
    if peak["little"]["tasks_in_flight"] is not None:
        parts.append(f"About <b>{_fmt(peak['little']['tasks_in_flight'])}</b> tasks in flight.")
    if plan["bursts"]:
        worst = max(plan["bursts"], key=lambda b: b["backlog"])
        drain = (
            f"takes {_fmt(worst['drain_s'], ' s')} to drain" if worst["drained"] else "never drains"
        )
        parts.append(
            f"The worst burst ({_fmt(worst['peak_rate_per_s'])}/s against "
            f"{_fmt(worst['capacity_per_s'])}/s) queues {_fmt(worst['backlog'])} "
            f"{worst['unit']} and {drain}."
        )
    return " ".join(parts) or "No sizing inputs were given."


def render_plan_html(plan: dict[str, Any]) -> str:
    """The whole page for plan JSON data."""
    sections = [f"<div class='summary'>{_summary(plan)}</div>"]
    periods = plan["periods"]
    demand_rows = [
        [label] + [_fmt(p[key]) for p in periods]
        for label, key in (
            ("tasks/s", "tasks_per_s"),
            ("calls per task", "calls_per_task"),
            ("calls/s", "calls_per_s"),
            ("input tokens/s", "input_tokens_per_s"),
            ("output tokens/s", "output_tokens_per_s"),
            ("cost per task ($)", "cost_per_task"),
        )
    ]
    demand_rows.append(
        ["tasks in flight"] + [_fmt(p["little"]["tasks_in_flight"]) for p in periods]
    )
    sections.append("<h2>Demand</h2>" + _table([""] + [p["name"] for p in periods], demand_rows))
    route_rows = []
    for p in periods:
        for r in p["routes"]:
            s, q = r.get("sizing"), (r["queueing"][0] if r["queueing"] else None)
            route_rows.append(
                [
                    _fmt(p["name"]),
                    _fmt(r["route"]),
                    _fmt(r["calls_per_s"]),
                    _fmt(r["output_tokens_per_s"]),
                    _fmt(s and s["replicas"]),
                    _fmt(s and s["replicas_with_failover"]),
                    _fmt(q and q["utilization"]),
                    _fmt(q and q["mean_s"], " s"),
                    _fmt(q and q["p95_s"], " s"),
                ]
            )
    sections.append(
        "<h2>Routes</h2>"
        + _table(
            [
                "period",
                "route",
                "calls/s",
                "output tok/s",
                "replicas",
                "with failover",
                "utilization",
                "M/M/1 mean",
                "M/M/1 p95",
            ],
            route_rows,
        )
    )
    if plan["bursts"]:
        rows = [
            [
                _fmt(b["source"]),
                _fmt(b["start_s"], " s"),
                _fmt(b["peak_rate_per_s"], "/s"),
                _fmt(b["capacity_per_s"], "/s"),
                _fmt(b["backlog"]),
                _fmt(b["drain_s"], " s") if b["drained"] else "<span class='bad'>never</span>",
            ]
            for b in plan["bursts"]
        ]
        sections.append(
            "<h2>Bursts (fluid model)</h2>"
            + _table(["source", "starts", "rate", "capacity", "backlog", "drain"], rows)
        )
    for table in plan["knee"]:
        rows = [
            [
                f"{r['utilization']:.0%}",
                _fmt(r["arrival_per_s"]),
                _fmt(r["mm1_mean_s"], " s"),
                _fmt(r["mm1_p95_s"], " s"),
                _fmt(r["mm1_p99_s"], " s"),
            ]
            for r in table["rows"]
        ]
        sections.append(
            f"<h2>Utilization knee: {html.escape(table['route'])}</h2>"
            + _knee_svg(table)
            + _table(["utilization", "arrivals/s", "mean", "p95", "p99"], rows)
        )
    if plan["autoscaling"]:
        rows = [
            [
                _fmt(a["task_class"]),
                _fmt(a["deadline_s"], " s"),
                _fmt(a["reaction_s"], " s"),
                "<span class='good'>yes</span>"
                if a["can_rescue"]
                else "<span class='bad'>no</span>",
            ]
            for a in plan["autoscaling"]
        ]
        sections.append(
            "<h2>Can autoscaling save a request?</h2>"
            + _table(["class", "deadline", "reaction", "in time"], rows)
        )
    if plan["notes"]:
        items = "".join(f"<li>{html.escape(n)}</li>" for n in plan["notes"])
        sections.append(f"<h2>Notes</h2><ul>{items}</ul>")
    title = html.escape(f"headway plan: {plan['workload']}")
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<meta name='viewport' content='width=device-width,initial-scale=1'><title>{title}"
        f"</title><style>{_CSS}</style></head><body><h1>{title}</h1>"
        f"<p class='muted'>Analytic plan ({html.escape(plan['schema'])}); planning factor "
        f"{_fmt(plan['planning_factor'])}, failures tolerated {plan['failures_tolerated']}."
        f"</p>{''.join(sections)}</body></html>\n"
    )
