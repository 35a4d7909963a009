"""``report.html``: one self-contained page for a plan (inline CSS and SVG, no scripts).

Rendering takes the plan's JSON data (the dict written to ``plan.json``), so
``headway report plan.json`` re-renders a report without re-running anything. The
executive summary comes first; then the simulated findings (capacity at SLO, latency
against load, replicas for the peak, the peak burst, tails, bad days, analytic against
simulated, cost); then the growth what-if (with ``--growth``) and the analytic plan's
tables.
"""

from __future__ import annotations

import html
from typing import Any

from headway.report import findings
from headway.report.svg import PALETTE, Frame, Line, line_chart
from headway.report.tables import fmt, pct, seconds, share, table

CSS = """
body{font:15px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;
max-width:1120px;color:#1d2330;padding:0 1rem}
h1{font-size:1.6rem;margin-bottom:.2rem}h2{font-size:1.15rem;margin-top:2.2rem;
border-bottom:1px solid #dde2ea;padding-bottom:.3rem}
.summary{background:#f3f6fb;border-left:4px solid #3b6fd8;padding:.6rem 1.1rem;margin:1rem 0;
font-size:1.05rem}.summary p{margin:.45rem 0}
table{border-collapse:collapse;margin:.5rem 0}td,th{padding:.3rem .7rem;text-align:right;
border-bottom:1px solid #eceff4}th{background:#f7f8fa}td:first-child,th:first-child{text-align:left}
.bad{color:#b42318;font-weight:600}.good{color:#067647}.muted{color:#667085;font-size:.9rem}
.plots{display:flex;flex-wrap:wrap;gap:12px}.warn{background:#fff4e5;border-left:4px solid #f79009;
padding:.5rem 1rem}
svg text{font:12px system-ui,sans-serif;fill:#344054}svg .t{font-weight:600;font-size:13px}
svg .k{fill:#667085;font-size:11px}svg .l{font-size:11.5px}
svg .r{font-size:11px;paint-order:stroke;stroke:#fbfcfe;stroke-width:3px}
"""
"""The reports' stylesheet (the plan report; drills use it too, one look)."""


def _knee_svg(knee: dict[str, Any]) -> str:
    """Mean and p95 latency against utilization (M/M/1): the knee, drawn."""
    rows = knee["rows"]
    return line_chart(
        Frame(
            f"analytic-knee-{knee['route']}",
            f"M/M/1 latency against utilization: {knee['route']}",
            "utilization",
            "seconds",
            x_format=share,
            y_format=seconds,
        ),
        [
            Line("mean", [(r["utilization"], r["mm1_mean_s"]) for r in rows]),
            Line("p95", [(r["utilization"], r["mm1_p95_s"]) for r in rows], color=PALETTE[1]),
        ],
    )


def _analytic_sections(plan: dict[str, Any]) -> list[str]:
    sections = []
    periods = plan["periods"]
    demand_rows = [
        [label] + [fmt(p[key]) for p in periods]
        for label, key in (
            ("tasks (tasks/s)", "tasks_per_s"),
            ("calls per task (calls)", "calls_per_task"),
            ("calls (calls/s)", "calls_per_s"),
            ("input (tokens/s)", "input_tokens_per_s"),
            ("output (tokens/s)", "output_tokens_per_s"),
            ("cost per task ($)", "cost_per_task"),
        )
    ]
    demand_rows.append(
        ["tasks in flight (tasks)"] + [fmt(p["little"]["tasks_in_flight"]) for p in periods]
    )
    sections.append(
        "<h2>Analytic plan: demand</h2>"
        + table(["figure"] + [p["name"] for p in periods], demand_rows)
    )
    route_rows = []
    for p in periods:
        for r in p["routes"]:
            s, q = r.get("sizing"), (r["queueing"][0] if r["queueing"] else None)
            route_rows.append(
                [
                    fmt(p["name"]), fmt(r["route"]), fmt(r["calls_per_s"]),
                    fmt(r["output_tokens_per_s"]), fmt(s and s["replicas"]),
                    fmt(s and s["replicas_with_failover"]), pct(q and q["utilization"]),
                    fmt(q and q["mean_s"], " s"), fmt(q and q["p95_s"], " s"),
                ]
            )  # fmt: skip
    sections.append(
        "<h2>Analytic plan: routes</h2>"
        + table(
            [
                "period",
                "route",
                "calls/s",
                "output tok/s",
                "replicas",
                "with failover (replicas)",
                "utilization (%)",
                "M/M/1 mean (s)",
                "M/M/1 p95 (s)",
            ],
            route_rows,
            drop_empty=True,
        )
    )
    if plan["bursts"]:
        rows = [
            [
                fmt(b["source"]),
                fmt(b["start_s"], " s"),
                fmt(b["peak_rate_per_s"], "/s"),
                fmt(b["capacity_per_s"], "/s"),
                fmt(b["backlog"]),
                fmt(b["drain_s"], " s") if b["drained"] else "<span class='bad'>never</span>",
            ]
            for b in plan["bursts"]
        ]
        units = {b["unit"] for b in plan["bursts"]}
        backlog = f"backlog ({units.pop()})" if len(units) == 1 else "backlog (tasks or calls)"
        sections.append(
            "<h2>Analytic plan: bursts (fluid model)</h2>"
            + table(
                ["source", "starts (s)", "rate (/s)", "capacity (/s)", backlog, "drain (s)"], rows
            )
        )
    for knee in plan["knee"]:
        rows = [
            [
                f"{r['utilization']:.0%}",
                fmt(r["arrival_per_s"]),
                fmt(r["mm1_mean_s"], " s"),
                fmt(r["mm1_p95_s"], " s"),
                fmt(r["mm1_p99_s"], " s"),
            ]
            for r in knee["rows"]
        ]
        sections.append(
            f"<h2>Analytic plan: utilization knee ({html.escape(knee['route'])})</h2>"
            f"<div class='plots'>{_knee_svg(knee)}<div>"
            + table(
                [
                    "utilization (%)",
                    "arrivals/s",
                    "M/M/1 mean (s)",
                    "M/M/1 p95 (s)",
                    "M/M/1 p99 (s)",
                ],
                rows,
            )
            + "</div></div>"
        )
    if plan["autoscaling"]:
        yes, no = "<span class='good'>yes</span>", "<span class='bad'>no</span>"
        rows = [
            [
                fmt(a["task_class"]),
                fmt(a["deadline_s"], " s"),
                fmt(a["reaction_s"], " s"),
                yes if a["can_rescue"] else no,
            ]
            for a in plan["autoscaling"]
        ]  # fmt: skip
        sections.append(
            "<h2>Can autoscaling save a request?</h2>"
            + table(["class", "deadline (s)", "reaction (s)", "in time"], rows)
        )
    if plan["notes"]:
        items = "".join(f"<li>{html.escape(n)}</li>" for n in plan["notes"])
        sections.append(f"<h2>Notes</h2><ul>{items}</ul>")
    return sections


def _as_plan(data: dict[str, Any]) -> dict[str, Any]:
    """Accept an analytic-only file of the earlier schema too."""
    if data.get("schema", "").startswith("headway.plan.analytic/"):
        return {
            "schema": data["schema"],
            "workload": data["workload"],
            "description": "",
            "summary": [],
            "analytic": data,
            "simulated": None,
            "comparison": [],
            "bad_days": None,
        }
    return data


def _slo_bounds(plan: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in (plan.get("slo_bounds") or {}).items() if v is not None}


def render_plan_html(data: dict[str, Any]) -> str:
    """The whole page for plan JSON data."""
    plan = _as_plan(data)
    analytic = plan["analytic"]
    sim = plan.get("simulated")
    summary = "".join(f"<p>{html.escape(line)}</p>" for line in plan.get("summary") or [])
    sections = [f"<div class='summary'>{summary or 'No summary.'}</div>"]
    if plan.get("interrupted"):
        sections.append(
            f"<p class='warn'>Stopped during {html.escape(plan['interrupted'])}; "
            "this report holds what had finished.</p>"
        )
    if sim:
        sections += [
            findings.three_numbers_section(sim),
            findings.capacity_section(sim),
            findings.latency_section(sim, _slo_bounds(plan)),
            findings.replicas_section(sim, plan.get("answer")),
            findings.burst_section(sim),
            findings.tails_section(sim),
            findings.segments_section(sim),
            findings.little_section(sim),
        ]
    burst_starts = [float(b["start_s"]) for b in analytic.get("bursts", [])]
    sections.append(findings.bad_days_section(plan.get("bad_days"), burst_starts))
    if sim:
        sections += [
            findings.comparison_section(plan.get("comparison") or []),
            findings.cost_section(sim),
        ]
    elif plan.get("skipped"):
        sections.append(f"<p class='muted'>Not simulated: {html.escape(plan['skipped'])}.</p>")
    sections.append(findings.growth_section(plan.get("growth")))
    sections += _analytic_sections(analytic)
    title = html.escape(f"headway plan: {plan['workload']}")
    meta = [f"schema {plan['schema']}"]
    if plan.get("created_at"):
        meta.append(f"created {plan['created_at']}")
    if sim:
        meta.append(f"cluster: {sim['cluster_source']}")
    meta.append(
        f"planning factor {fmt(analytic['planning_factor'])}, failures tolerated "
        f"{analytic['failures_tolerated']}"
    )
    description = html.escape(plan.get("description") or "")
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<meta name='viewport' content='width=device-width,initial-scale=1'><title>{title}"
        f"</title><style>{CSS}</style></head><body><h1>{title}</h1>"
        f"<p>{description}</p><p class='muted'>{html.escape('; '.join(meta))}.</p>"
        f"{''.join(s for s in sections if s)}</body></html>\n"
    )
