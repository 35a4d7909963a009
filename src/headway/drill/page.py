"""``drills.html``: the drills' results on one self-contained page, in the plan report's
style (inline CSS and SVG, no scripts)."""

from __future__ import annotations

import html
import math
from typing import Any

from headway.report.html import CSS
from headway.report.svg import PALETTE, Frame, Line, line_chart
from headway.report.tables import fmt, table

__all__ = ["render_drills_html"]


def _figure(value: Any) -> str:
    if value is None:
        return "not measured"
    if isinstance(value, float) and not math.isfinite(value):
        return "never"
    return fmt(value)


def _drill_section(result: dict[str, Any], about: dict[str, Any]) -> str:
    status = result["status"]
    css = {"passed": "good", "failed": "bad", "error": "bad"}.get(status, "muted")
    head = (
        f"<h2 id='{html.escape(result['name'])}'>{html.escape(result['title'])} "
        f"<span class='{css}'>{status}</span></h2>"
    )
    parts = [head]
    if about:
        parts.append(
            f"<p class='muted'>Seed: “{html.escape(about['seed_text'])}”</p>"
            f"<p>{html.escape(about['designed'])}</p>"
        )
    if result.get("detail"):
        parts.append(f"<p class='warn'>{html.escape(result['detail'])}</p>")
    rows = []
    for check in result["checks"]:
        mark = (
            "<span class='good'>pass</span>"
            if check["passed"]
            else ("<span class='bad'>FAIL</span>")
        )
        rows.append([
            html.escape(check["figure"]),
            f"{html.escape(check['op'])} {fmt(check['value'])}",
            _figure(check["observed"]),
            mark,
            html.escape(check["why"]),
        ])  # fmt: skip
    if rows:
        parts.append(table(["figure", "expected", "observed", "", "why"], rows))
    if result.get("timeline"):
        steps = [
            [fmt(t["at_s"]) + " s", html.escape(t["action"]), str(t.get("engine", "")),
             fmt(t.get("took_s", 0.0)) + " s"]
            for t in result["timeline"]
        ]  # fmt: skip
        parts.append(table(["at", "fault", "engine", "took"], steps))
    series = result.get("series") or {}
    t = series.get("t_s") or []
    plots = []
    for key, label, color in (
        ("engine_running", "requests running in the engines", PALETTE[0]),
        ("kv_usage", "highest engine KV use (0-1)", PALETTE[1]),
        ("rss_mb", "gateway memory (MiB)", PALETTE[2]),
    ):
        values = series.get(key) or []
        points = [
            (x, y) for x, y in zip(t, values, strict=False) if y is not None and math.isfinite(y)
        ]
        if len(points) >= 2:
            frame = Frame(f"{result['name']}-{key}", label, "seconds", label, width=360,
                          height=220)  # fmt: skip
            plots.append(line_chart(frame, [Line(label, points, color, markers=False)]))
    if plots:
        parts.append(f"<div class='plots'>{''.join(plots)}</div>")
    figures = result.get("figures") or {}
    if figures:
        cells = [[html.escape(k), _figure(v)] for k, v in sorted(figures.items())]
        parts.append(
            "<details><summary>All figures</summary>" + table(["figure", "value"], cells)
            + "</details>"
        )  # fmt: skip
    return "".join(parts)


def render_drills_html(data: dict[str, Any]) -> str:
    """The page for ``drills.json`` data."""
    results = data["results"]
    about = {d["name"]: d for d in data.get("drills", [])}
    passed = sum(1 for r in results if r["status"] == "passed")
    skipped = sum(1 for r in results if r["status"] == "skipped")
    failed = len(results) - passed - skipped
    line = f"{passed} passed, {failed} failed, {skipped} skipped against {data['target']}."
    summary_rows = [
        [f"<a href='#{html.escape(r['name'])}'>{html.escape(r['name'])}</a>",
         html.escape(r["status"]), fmt(r.get("wall_s", 0.0)) + " s",
         str(sum(1 for c in r["checks"] if c["passed"])) + f" / {len(r['checks'])}"]
        for r in results
    ]  # fmt: skip
    body = [
        f"<div class='summary'><p>{html.escape(line)}</p></div>",
        table(["drill", "status", "wall", "checks passed"], summary_rows),
        *(_drill_section(r, about.get(r["name"], {})) for r in results),
    ]
    title = "headway drill"
    meta = f"schema {data['schema']}; created {data.get('created_at', '')}; seed {data['seed']}"
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<meta name='viewport' content='width=device-width,initial-scale=1'><title>{title}"
        f"</title><style>{CSS}td:last-child,th:last-child{{text-align:left}}</style></head>"
        f"<body><h1>{title}</h1>"
        f"<p class='muted'>{html.escape(meta)}.</p>{''.join(body)}</body></html>\n"
    )
