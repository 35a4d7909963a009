"""A self-contained HTML page of a bench run or sweep (inline CSS and SVG, no network).

It renders the same dicts that are written as ``bench.json`` / ``sweep.json`` (plus, for
a run, per-second series from the records), so a page can be rebuilt from the files.
"""

from __future__ import annotations

import html
import math
from typing import Any

from headway.core.metrics import task_deadline_text
from headway.report.tables import fmt

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


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else fmt(seconds * 1000, " ms")


def _table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _page(title: str, body: str) -> str:
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head>"
        f"<body>{body}</body></html>\n"
    )


def _lines_svg(
    series: list[tuple[str, str, list[float]]], xs: list[float], x_label: str, y_label: str
) -> str:
    """Polylines of ``series`` (label, colour, values) over ``xs``."""
    width, height, pad = 620, 260, 50
    values = [v for _, _, ys in series for v in ys if math.isfinite(v)]
    if not xs or not values:
        return "<p class='muted'>no data to draw</p>"
    top = max(values) * 1.08 or 1.0
    left, right = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1

    def x(v: float) -> float:
        return pad + (width - 2 * pad) * (v - left) / (right - left)

    def y(v: float) -> float:
        return height - pad - (height - 2 * pad) * (v / top)

    parts = [
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" '
        'stroke="#98a2b3"/>',
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="#98a2b3"/>',
        f'<text x="{width / 2}" y="{height - 12}" text-anchor="middle">{html.escape(x_label)}'
        "</text>",
        f'<text x="8" y="{pad - 14}">{html.escape(y_label)} (max {top:.3g})</text>',
    ]
    for k, (label, colour, ys) in enumerate(series):
        pts = " ".join(
            f"{x(a):.1f},{y(b):.1f}" for a, b in zip(xs, ys, strict=True) if math.isfinite(b)
        )
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{pts}"/>')
        parts.append(
            f'<text x="{width - pad - 4}" y="{pad + 14 + 16 * k}" text-anchor="end" '
            f'fill="{colour}">{html.escape(label)}</text>'
        )
    parts.extend(
        f'<text x="{x(v):.1f}" y="{height - pad + 16}" text-anchor="middle">{v:.3g}</text>'
        for v in (left, (left + right) / 2, right)
    )
    return (
        f'<svg role="img" aria-label="{html.escape(y_label)}" width="{width}" '
        f'height="{height}">{"".join(parts)}</svg>'
    )


def render_run(result: dict[str, Any], series: dict[str, list[float]]) -> str:
    """The page of one run; ``series`` holds per-second ``time_s``, ``scheduled``,
    ``sent``, ``ttft_p50_s`` and ``ttft_p99_s``."""
    pacing, lat, slo, cost = result["pacing"], result["latencies"], result["slo"], result["cost"]
    verdict = (
        "<span class='good'>sender within budget</span>"
        if result["passed"]
        else "<span class='bad'>sender outside its budget: these latencies measure the "
        "generator too</span>"
    )
    summary = (
        f"<div class='summary'><b>{fmt(pacing['achieved_rate_per_s'])} calls/s sent</b> "
        f"(offered {fmt(pacing['offered_rate_per_s'])}), lateness p99 "
        f"{_ms(pacing['lateness']['p99_s'])}; SLO attainment "
        f"<b>{slo['attainment']:.1%}</b> (target {slo['target']:.0%}), goodput "
        f"{fmt(slo['goodput_per_s'])}/s; {verdict}.</div>"
    )
    checks = _table(
        ["check", "value", "limit", "passed"],
        [
            [
                html.escape(c["name"]),
                fmt(c["value"]),
                fmt(c["limit"]),
                "<span class='good'>yes</span>" if c["passed"] else "<span class='bad'>no</span>",
            ]
            for c in result["checks"]
        ],
    )
    pace = _table(
        ["", "value"],
        [
            ["scheduled calls", fmt(pacing["scheduled_calls"])],
            ["sent calls", fmt(pacing["sent_calls"])],
            ["offered rate /s", fmt(pacing["offered_rate_per_s"])],
            ["achieved rate /s", fmt(pacing["achieved_rate_per_s"])],
            ["scheduled gap CV", fmt(pacing["scheduled_gap_cv"])],
            ["sent gap CV", fmt(pacing["sent_gap_cv"])],
            *[
                [f"lateness {q}", _ms(pacing["lateness"][f"{q}_s"])]
                for q in ("p50", "p90", "p99", "max")
            ],
        ],
    )
    lat_rows = [
        [name, *(_ms(lat[key][q]) for q in ("mean_s", "p50_s", "p90_s", "p99_s", "max_s"))]
        for name, key in (
            ("TTFT", "ttft"),
            ("TPOT", "tpot"),
            ("e2e", "e2e"),
            ("largest token gap", "itl_max"),
            ("first byte", "time_to_first_byte"),
        )
    ]
    latencies = _table(["from scheduled time", "mean", "p50", "p90", "p99", "max"], lat_rows)
    classes = _table(
        ["class", "calls", "completed", "attainment", "TTFT p99", "e2e p99"],
        [
            [
                html.escape(g["name"]),
                fmt(g["calls"]),
                fmt(g["completed"]),
                "—" if g["slo_attainment"] is None else f"{g['slo_attainment']:.1%}",
                _ms(g["ttft_p99_s"]),
                _ms(g["e2e_p99_s"]),
            ]
            for g in result["by_class"]
        ],
    )
    outcomes = result["outcomes"]
    out_rows = [[html.escape(k), fmt(v)] for k, v in outcomes["by_error"].items()]
    out_rows += [[f"HTTP {html.escape(k)}", fmt(v)] for k, v in outcomes["by_status"].items()]
    cost_rows = [
        ["workers", fmt(cost["workers"])],
        ["event loop", html.escape(cost["loop"])],
        ["CPU per request", fmt(cost["cpu_ms_per_request"], " ms")],
        ["startup", fmt(cost["startup_s"], " s")],
        ["connections pre-opened / opened", f"{cost['connections_prefilled']} / "
         f"{outcomes['connects']}"],
    ]  # fmt: skip
    xs = series.get("time_s", [])
    rate_svg = _lines_svg(
        [
            ("scheduled", "#98a2b3", series.get("scheduled", [])),
            ("sent", "#3b6fd8", series.get("sent", [])),
        ],
        xs,
        "seconds since start",
        "calls per second",
    )
    ttft_svg = _lines_svg(
        [
            ("TTFT p50", "#3b6fd8", series.get("ttft_p50_s", [])),
            ("TTFT p99", "#d9480f", series.get("ttft_p99_s", [])),
        ],
        xs,
        "seconds since start (by scheduled time)",
        "seconds",
    )
    deadlines = task_deadline_text(slo["task_attainment"], slo.get("task_deadlines_declared", True))
    body = (
        f"<h1>bench: {html.escape(result['workload'])}</h1>"
        f"<p class='muted'>{html.escape(result['target'])} · model "
        f"{html.escape(result['model'])} · {html.escape(result['endpoint'])} · seed "
        f"{result['seed']} · load ×{fmt(result['load_factor'])}</p>{summary}"
        f"<h2>Checks (exit code 1 when one fails)</h2>{checks}"
        f"<h2>Pacing</h2>{pace}{rate_svg}"
        f"<h2>Latencies</h2>{latencies}{ttft_svg}"
        f"<h2>SLO by class</h2>{classes}"
        f"<p>{deadlines} "
        f"(verified goodput {fmt(slo['verified_goodput_per_s'])}/s)</p>"
        f"<h2>Outcomes</h2>{_table(['outcome', 'calls'], out_rows)}"
        f"<h2>The generator</h2>{_table(['', 'value'], cost_rows)}"
    )
    return _page(f"bench {result['workload']}", body)


def render_sweep(sweep: dict[str, Any]) -> str:
    """The page of a ``--sweep``: attainment and goodput by load, and the knee."""
    points = sweep["points"]
    knee = sweep["knee"]
    xs = [p["offered_calls_per_s"] for p in points]
    svg = _lines_svg(
        [
            ("attainment", "#3b6fd8", [p["slo_attainment"] for p in points]),
            ("target", "#98a2b3", [knee["target"]] * len(points)),
        ],
        xs,
        "offered calls per second",
        "SLO attainment",
    )
    rows = [
        [
            fmt(p["load_factor"]),
            fmt(p["offered_calls_per_s"]),
            f"{p['slo_attainment']:.1%}",
            fmt(p["goodput_per_s"]),
            _ms(p["ttft_p99_s"]),
            _ms(p["lateness_p99_s"]),
            "yes" if p["sender_ok"] else "<span class='bad'>no</span>",
        ]
        for p in points
    ]
    verdict = (
        f"knee at ×{fmt(knee['load_factor'])} ({fmt(knee['offered_calls_per_s'])} calls/s) "
        f"keeps attainment ≥ {knee['target']:.0%}"
        if knee["found"]
        else f"even ×{fmt(knee['upper_load_factor'])} misses {knee['target']:.0%}"
    )
    note = (
        "<p class='bad'>a point next to the knee missed the sender's budget: the knee may be "
        "the generator's, not the server's</p>"
        if sweep["sender_limited"]
        else ""
    )
    body = (
        f"<h1>bench sweep: {html.escape(sweep['workload'])}</h1>"
        f"<p class='muted'>{html.escape(sweep['target'])}</p>"
        f"<div class='summary'>{verdict}</div>{note}{svg}"
        + _table(
            ["load", "calls/s", "attainment", "goodput/s", "TTFT p99", "lateness p99", "sender ok"],
            rows,
        )
    )
    return _page(f"bench sweep {sweep['workload']}", body)
