"""The simulated findings of a plan as report sections: capacity at SLO, latency against
load, replicas for the peak, the peak burst, tails, bad days, analytic against simulated,
and cost; and the growth what-if (analytic). Each takes the plan's JSON data and returns
HTML text (empty when absent).
"""

from __future__ import annotations

import html
import math
from typing import Any

from headway.report.svg import PALETTE, Frame, Line, Rule, bar_chart, line_chart
from headway.report.tables import fmt, heat, pct, seconds, share, table
from headway.sim.segments import COLD_WINDOW_S, MIN_RANKED_CALLS, MIN_RANKED_SHARE


def _per_task(point: dict[str, Any], calls_per_s: float) -> float:
    """``calls_per_s`` at a sweep point in tasks/s: divided by the calls each task makes
    there (SLO goodput counts calls; the other two numbers count tasks)."""
    tasks, calls = point["offered_tasks_per_s"], point["offered_calls_per_s"]
    return calls_per_s * tasks / calls if calls else 0.0


STEEP_FROM = 0.9
"""Past this share of the saturation throughput a queue's wait grows as 1 / (1 − ρ): a
10% error in capacity there moves the tails by an order of magnitude (seed 002: "a knee,
not a straight line")."""


def _steep_region_rules(knee: dict[str, Any]) -> list[Rule]:
    """The band where tails turn steep, and μ (the KV stability boundary) when known."""
    saturation = knee.get("saturation_tasks_per_s") or 0.0
    rules = []
    if saturation > 0:
        rules.append(
            Rule(f"tails steep from {saturation * STEEP_FROM:.3g}/s", saturation * STEEP_FROM,
                 color="#f79009")
        )  # fmt: skip
    stability = knee.get("stability")
    if stability:
        rules.append(Rule(f"μ {stability['mu_tasks_per_s']:.3g}/s", stability["mu_tasks_per_s"]))
    return rules


def _steep_region_text(knee: dict[str, Any]) -> str:
    """What the steep region and μ mean for the plan, in a sentence each."""
    saturation = knee.get("saturation_tasks_per_s") or 0.0
    text = ""
    if saturation > 0:
        text += (
            f"<p>Past {saturation * STEEP_FROM:.3g} tasks/s ({STEEP_FROM:.0%} of saturation) "
            "a queue's wait grows as 1/(1 − ρ): there a capacity error of 10% moves the "
            "latency tails by an order of magnitude, so a plan that lands in this region "
            "rests on a figure the simulator cannot promise.</p>"
        )
    stability = knee.get("stability")
    if stability:
        text += (
            f"<p>The KV stability boundary μ is {stability['mu_tasks_per_s']:.3g} tasks/s "
            f"(the analytic capacity {stability['analytic_capacity_tasks_per_s']:.3g}); "
            f"knee/μ {stability['knee_over_mu']:.2f}"
            + (f": {html.escape(stability['warning'])}" if stability.get("warning") else "")
            + ".</p>"
        )
    return text


def capacity_section(sim: dict[str, Any]) -> str:
    """SLO attainment and goodput against offered load, the knee and the peak marked."""
    knee, sweep = sim.get("knee"), sim.get("sweep") or []
    if not sweep:
        return ""
    rate = [p["offered_tasks_per_s_nominal"] for p in sweep]
    rules = []
    if knee is not None:
        rules.append(
            Rule(f"knee {knee['tasks_per_s']:.3g}/s", knee["tasks_per_s"], color="#c2255c")
        )
        rules.append(Rule(f"peak {knee['peak_tasks_per_s']:.3g}/s", knee["peak_tasks_per_s"]))
        rules += _steep_region_rules(knee)
    target = knee["target"] if knee else None
    lowest = min(
        [p["sweep"]["slo_attainment"] for p in sweep]
        + [p["sweep"]["task_attainment"] for p in sweep]
    )
    floor = max(0.0, math.floor((min(lowest, target or 1.0) - 0.05) * 10) / 10)
    attain = line_chart(
        Frame(
            "attainment",
            "SLO attainment against offered load",
            "offered tasks/s",
            "SLO attainment",
            y_min=floor,
            y_max=1.0,
            y_format=share,
        ),
        [
            Line(
                "SLO attainment",
                [(r, p["sweep"]["slo_attainment"]) for r, p in zip(rate, sweep, strict=True)],
            ),
            Line(
                "tasks within deadline",
                [(r, p["sweep"]["task_attainment"]) for r, p in zip(rate, sweep, strict=True)],
                color=PALETTE[2],
                dashed=True,
            ),
        ],
        [*rules, *([Rule(f"target {target:.0%}", target, axis="y")] if target else [])],
    )

    # One unit on both axes: SLO goodput in tasks/s against the offered.
    goodput = line_chart(
        Frame("goodput", "Goodput against offered load", "offered tasks/s", "tasks/s"),
        [
            Line(
                "SLO goodput (calls/s ÷ calls per task)",
                [
                    (r, _per_task(p["sweep"], p["sweep"]["goodput_per_s"]))
                    for r, p in zip(rate, sweep, strict=True)
                ],
            ),
            Line(
                "verified outcomes",
                [
                    (r, p["sweep"].get("verified_goodput_per_s", 0.0))
                    for r, p in zip(rate, sweep, strict=True)
                ],
                color=PALETTE[2],
            ),
            Line(
                "offered",
                [(r, p["sweep"]["offered_tasks_per_s"]) for r, p in zip(rate, sweep, strict=True)],
                color="#98a2b3",
                dashed=True,
                markers=False,
            ),
        ],
        rules,
    )
    text = ""
    if knee is not None:
        rows = [
            [
                str(s["seed"]),
                fmt(s["knee_tasks_per_s"], "/s"),
                fmt(s["upper_tasks_per_s"], "/s"),
                str(s["points"]),
            ]
            for s in knee["seeds"]
        ]
        text = (
            f"<p>The knee of <b>{knee['replicas']}</b> replicas: <b>{knee['tasks_per_s']:.3g} "
            f"tasks/s</b> (95% interval {knee['tasks_per_s_low']:.3g}–"
            f"{knee['tasks_per_s_high']:.3g}), against a peak of {knee['peak_tasks_per_s']:.3g}; "
            f"saturated, the cluster completes {knee['saturation_tasks_per_s']:.3g} tasks/s.</p>"
            + _steep_region_text(knee)
            + table(
                [
                    "seed",
                    "knee (tasks/s, where attainment crosses the target)",
                    "first miss (tasks/s)",
                    "points",
                ],
                rows,
            )
        )
    return f"<h2>Capacity at SLO</h2><div class='plots'>{attain}{goodput}</div>{text}"


def three_numbers_section(sim: dict[str, Any]) -> str:
    """Seed 002's three numbers of the operations page, side by side over the sweep:
    offered load, SLO goodput, verified-outcome goodput; the gap between the first two is
    serving pressure, between the last two workflow pressure."""
    sweep = sim.get("sweep") or []
    if not sweep:
        return ""
    rows = []
    for p in sweep:
        s = p["sweep"]
        tasks, calls = s["offered_tasks_per_s"], s["offered_calls_per_s"]
        slo_tasks = _per_task(s, s["goodput_per_s"])
        verified = s.get("verified_goodput_per_s", 0.0)
        serving = 1.0 - s["goodput_per_s"] / calls if calls else None
        workflow = 1.0 - verified / slo_tasks if slo_tasks else None
        rows.append(
            [
                fmt(s["load_factor"], "×"),
                fmt(tasks),
                fmt(calls),
                fmt(s["goodput_per_s"]),
                fmt(slo_tasks),
                fmt(verified),
                heat(None if serving is None else 1 - serving, 0.5, 0.95, pct(serving)),
                heat(None if workflow is None else 1 - workflow, 0.5, 0.95, pct(workflow)),
            ]
        )
    return (
        "<h2 id='three-numbers'>Offered load, SLO goodput, verified-outcome goodput</h2>"
        "<p class='muted'>Seed 002's three numbers, at each simulated load: the work trying "
        "to enter (shed and deferred calls included), the calls completed inside every "
        "latency bound (also as tasks: ÷ calls per task), and the tasks completed within "
        "their deadline whose outcome was accepted. Serving pressure: the share of offered "
        "calls that missed; workflow pressure: the share of SLO goodput that became no "
        "verified outcome (deadlines missed across a task's calls, outcomes rejected).</p>"
        + table(
            [
                "load (×)",
                "offered (tasks/s)",
                "offered (calls/s)",
                "SLO goodput (calls/s)",
                "SLO goodput (tasks/s)",
                "verified outcomes (tasks/s)",
                "serving pressure (%)",
                "workflow pressure (%)",
            ],
            rows,
        )
    )


def latency_section(sim: dict[str, Any], bounds: dict[str, float]) -> str:
    """TTFT, TPOT and e2e percentiles against offered load, with the SLO bounds."""
    sweep = sim.get("sweep") or []
    if not sweep:
        return ""
    knee = sim.get("knee")
    charts = []
    for key, title in (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "End-to-end latency")):
        lines = [
            Line(
                q,
                [
                    (p["offered_tasks_per_s_nominal"], p[key][f"{q}_s"])
                    for p in sweep
                    if p[key][f"{q}_s"] is not None
                ],
                color=PALETTE[i],
            )
            for i, q in enumerate(("p50", "p90", "p99"))
        ]
        rules = [Rule("knee", knee["tasks_per_s"], color="#c2255c")] if knee else []
        if key in bounds:
            rules.append(Rule(f"SLO {bounds[key]:g} s", bounds[key], axis="y"))
        charts.append(
            line_chart(
                Frame(
                    f"latency-{key}", f"{title} against offered load", "offered tasks/s", "seconds",
                    width=360, height=280, y_format=seconds,
                ),
                lines,
                rules,
            )
        )  # fmt: skip
    return "<h2>Latency against offered load</h2><div class='plots'>" + "".join(charts) + "</div>"


def _pool_words(pools: dict[str, Any], answer: dict[str, Any] | None) -> str:
    """``pool agent: 3 replicas (4 with one lost); pool bulk: 2 (3)``, and the answer's
    counts when a declared measurement leads."""
    label = "pool " if pools["kind"] == "pools" else ""
    lost = pools["failures_tolerated"]
    parts = []
    for i, p in enumerate(pools["pools"]):
        held, planned = p["holding_peak"], p["recommended"]
        if held is None:
            parts.append(f"{label}{html.escape(p['name'])}: none up to the search's limit")
            continue
        count = f"{held} replica{'s' if held != 1 else ''}" if i == 0 else str(held)
        extra = (f" ({planned} with {lost} lost)" if i == 0 else f" ({planned})") if lost else ""
        parts.append(f"{label}<b>{html.escape(p['name'])}</b>: {count}{extra}")
    words = "<p>" + "; ".join(parts) + ".</p>"
    if answer is not None and answer.get("basis") == "measured" and answer.get("pools"):
        led = "; ".join(
            f"{label}{html.escape(a['pool'])}: <b>{a['replicas']}</b>" for a in answer["pools"]
        )
        words += (
            f"<p class='bad'>The plan leads with {led}, sized from the capacity measured in "
            "each route's routes.&lt;name&gt;.replica: a measurement wins over an "
            "uncalibrated simulation.</p>"
        )
    return words


def pools_section(sim: dict[str, Any], answer: dict[str, Any] | None = None) -> str:
    """Each pool's count at the steady peak (a cluster of pools, or a disaggregated
    one's prefill and decode): with all up, with the tolerated loss in each pool, and the
    attainment one fewer gives, beside the points tried."""
    pools, search = sim.get("pools"), sim.get("replica_search")
    if not pools or not search:
        return ""
    lost = pools["failures_tolerated"]
    calibrated = sim.get("cluster", {}).get("step_time") == "profile"
    kind = "calibrated" if calibrated else "uncalibrated (a roofline, not your engine)"
    judged = (
        "each pool by its own routes' attainment (a route's calls go to its pool only)"
        if pools["kind"] == "pools"
        else "the prefill and decode counts by the whole cluster's attainment"
    )
    rows = []
    for p in pools["pools"]:
        target = p["target"]
        rows.append(
            [
                html.escape(p["name"]),
                html.escape(", ".join(p["routes"])),
                pct(target),
                fmt(p["holding_peak"]),
                f"<b>{fmt(p['recommended'])}</b>",
                heat(p["attainment_failures_lost"], target - 0.2, target,
                     pct(p["attainment_failures_lost"])),
                heat(p["attainment_one_fewer"], target - 0.2, target,
                     pct(p["attainment_one_fewer"])),
            ]
        )  # fmt: skip
    chart = bar_chart(
        Frame(
            "pools",
            "SLO attainment at the peak, each pool at its count and one fewer",
            "",
            "SLO attainment",
            y_max=1.0,
            y_format=share,
        ),
        [p["name"] for p in pools["pools"]],
        [
            ("at its count", [p["attainment_failures_lost"] for p in pools["pools"]]),
            ("one fewer", [p["attainment_one_fewer"] for p in pools["pools"]]),
        ],
    )
    trials = [
        [
            html.escape(" · ".join(f"{k} {n}" for k, n in t.get("pool_replicas", {}).items())),
            str(t["replicas"]),
            pct(t["sweep"]["slo_attainment"]),
            html.escape(
                ", ".join(f"{k} {pct(v)}" for k, v in t.get("route_attainment", {}).items())
            )
            or "—",
            fmt(t["sweep"]["ttft_p99_s"], " s"),
            fmt(t["sweep"]["e2e_p99_s"], " s"),
        ]
        for t in search["trials"]
    ]
    note = "" if pools["holds"] else (
        "<p class='bad'>Run together, the counts miss the target in a pool.</p>"
    )  # fmt: skip
    return (
        "<h2 id='pools'>Replicas per pool</h2>"
        f"<p>In the {kind} simulation, at the peak of {search['peak_tasks_per_s']:.3g} tasks/s "
        f"(steady), judging {judged}; {lost} replica{'s' if lost != 1 else ''} lost in each "
        f"pool at once:</p>{_pool_words(pools, answer)}{note}"
        f"<p class='muted'>Searched: {html.escape(pools['method'])}.</p>"
        f"<div class='plots'>{chart}<div><h3>Each pool's count</h3>"
        + table(
            [
                "pool",
                "routes",
                "target (%)",
                "holding the peak (replicas)",
                f"with {lost} lost (replicas)",
                "attainment at its count (%)",
                "one fewer: attainment (%)",
            ],
            rows,
        )
        + "</div></div><h3>Points tried at the peak</h3>"
        + table(
            [
                "pool counts (replicas)",
                "replicas",
                "attainment (%)",
                "per route (%)",
                "TTFT p99 (s)",
                "e2e p99 (s)",
            ],
            trials,
        )
    )


def replicas_section(sim: dict[str, Any], answer: dict[str, Any] | None = None) -> str:
    """Attainment at the steady peak by replica count, the simulation's count marked; with
    ``answer`` (the plan's) saying when a declared measurement leads instead. A cluster
    of pools or a disaggregated one: :func:`pools_section`."""
    if sim.get("pools"):
        return pools_section(sim, answer)
    search = sim.get("replica_search")
    if not search or not search["trials"]:
        return ""
    trials = search["trials"]
    rules = [Rule(f"target {search['target']:.0%}", search["target"], axis="y")]
    if search["recommended"] is not None:
        rules.append(
            Rule(f"simulated {search['recommended']}", search["recommended"], color="#c2255c")
        )
    chart = line_chart(
        Frame(
            "replicas",
            f"SLO attainment at the peak ({search['peak_tasks_per_s']:.3g} tasks/s) by replicas",
            "replicas",
            "SLO attainment",
            y_max=1.0,
            y_format=share,
        ),
        [Line("SLO attainment", [(p["replicas"], p["sweep"]["slo_attainment"]) for p in trials])],
        rules,
    )
    target = search["target"]
    rows = [
        [
            f"<b>{p['replicas']}</b>"
            if p["replicas"] == search["recommended"]
            else str(p["replicas"]),
            heat(
                p["sweep"]["slo_attainment"],
                target - 0.2,
                target,
                pct(p["sweep"]["slo_attainment"]),
            ),
            fmt(p["sweep"]["goodput_per_s"], "/s"),
            fmt(p["sweep"]["ttft_p99_s"], " s"),
            fmt(p["sweep"]["e2e_p99_s"], " s"),
            pct(p["kv_usage_max"]),
        ]
        for p in trials
    ]
    lost = search["failures_tolerated"]
    calibrated = sim.get("cluster", {}).get("step_time") == "profile"
    kind = "calibrated" if calibrated else "uncalibrated (a roofline, not your engine)"
    words = (
        f"<p>In the {kind} simulation {search['holding_peak']} replicas hold the peak at "
        f"target; with {lost} tolerated lost it asks for <b>{search['recommended']}</b>.</p>"
        if search["recommended"] is not None
        else "<p class='bad'>No replica count tried holds the peak at target.</p>"
    )
    if answer is not None and answer.get("basis") == "measured":
        words += (
            f"<p class='bad'>The plan leads with <b>{answer['replicas']}</b>, sized from the "
            f"capacity measured in routes.{html.escape(str(answer['route']))}.replica: a "
            "measurement wins over an uncalibrated simulation.</p>"
        )
    return (
        "<h2>Replicas for the peak</h2>"
        f"<div class='plots'>{chart}<div>{words}"
        + table(
            [
                "replicas",
                "attainment (%)",
                "goodput (calls/s)",
                "TTFT p99 (s)",
                "e2e p99 (s)",
                "KV max (% of blocks)",
            ],
            rows,
        )
        + "</div></div>"
    )


def _window(series: dict[str, Any], lo: float, hi: float) -> list[int]:
    return [i for i, t in enumerate(series["time_s"]) if lo <= t <= hi]


def burst_section(sim: dict[str, Any]) -> str:
    """Calls, queue and KV occupancy through the worst burst; fluid model vs measured."""
    run = sim.get("replay")
    if not run:
        return ""
    series = run["series"]
    bursts = sim.get("bursts") or []
    worst = max(bursts, key=lambda b: b["fluid_backlog_tasks"]) if bursts else None
    lo, hi = (worst["window_start_s"], worst["window_end_s"]) if worst else (0.0, run["duration_s"])
    idx = _window(series, lo, hi) or list(range(len(series["time_s"])))
    t = [series["time_s"][i] for i in idx]
    rules = []
    if worst:
        rules = [
            Rule("burst", worst["start_s"], color="#c2255c"),
            Rule("overload ends", worst["start_s"] + worst["overload_s"], color="#f79009"),
        ]

    def line(key: str, label: str, color: str, dashed: bool = False) -> Line:
        points = [(t[n], series[key][i]) for n, i in enumerate(idx)]
        return Line(label, points, color, dashed=dashed, markers=False)

    calls = line_chart(
        Frame("burst-queue", "Calls through the peak burst", "time (s)", "calls", width=520),
        [
            line("running", "running", PALETTE[2]),
            line("queued_calls", "queued", PALETTE[1]),
            line("in_system_calls", "in system (running + queued + retrying)", PALETTE[0], True),
        ],
        rules,
    )
    kv = line_chart(
        Frame(
            "burst-kv",
            "KV-cache occupancy through the peak burst",
            "time (s)",
            "KV blocks held",
            width=520,
            y_max=1.0,
            y_format=share,
        ),
        [line("kv_usage", "mean over replicas", PALETTE[3])],
        rules,
    )
    never = "<span class='bad'>never</span>"
    not_in_run = "<span class='bad'>not in the run</span>"
    rows = [
        [
            f"{b['start_s']:g} s",
            f"{b['peak_rate_per_s']:g}/s for {b['overload_s']:g} s",
            fmt(b["fluid_backlog_tasks"]),
            never if b["fluid_drain_s"] is None else fmt(b["fluid_drain_s"], " s"),
            fmt(b["fluid_at_simulated_backlog_tasks"]),
            fmt(b["fluid_at_simulated_drain_s"], " s"),
            fmt(b["measured_backlog_tasks"]),
            not_in_run if b["measured_drain_s"] is None else fmt(b["measured_drain_s"], " s"),
        ]
        for b in bursts
    ]  # fmt: skip
    burst_table = (
        table(
            [
                "burst (starts at, s)",
                "arrivals (tasks/s)",
                "fluid backlog (tasks)",
                "fluid drain (s)",
                "fluid backlog at simulated capacity (tasks)",
                "fluid drain at simulated capacity (s)",
                "measured backlog (tasks)",
                "measured drain (s)",
            ],
            rows,
        )
        if rows
        else "<p class='muted'>No overload episode in the fluid model.</p>"
    )
    return (
        f"<h2>Through the peak burst ({run['replicas']} replicas)</h2>"
        f"<div class='plots'>{calls}{kv}</div>{burst_table}"
        "<p class='muted'>Measured backlog: calls in the system above their level in the minute "
        "before, per call of a task; drain: from the end of the overload until the system is "
        "back within 20% of that level.</p>"
    )


def tails_section(sim: dict[str, Any]) -> str:
    """p99 TTFT and e2e by tenant, class and input-length bucket."""
    run = sim.get("replay")
    if not run or not run["tails"]:
        return ""
    tails = run["tails"]
    names = [f"{t['name']}" for t in tails]
    width = max(420, 58 * len(tails))
    charts = "".join(
        bar_chart(
            Frame(name, title, "", "seconds", width=width, height=260, y_format=seconds),
            names,
            [(label, [t[key] for t in tails])],
        )
        for name, title, label, key in (
            ("tails", "TTFT p99 by tenant, class and input length", "TTFT p99", "ttft_p99_s"),
            ("tails-e2e", "e2e p99 by tenant, class and input length", "e2e p99", "e2e_p99_s"),
        )
    )
    rows = [
        [
            html.escape(t["segment"]),
            html.escape(t["name"]),
            fmt(t["calls"]),
            heat(t["slo_attainment"], 0.75, 0.95, pct(t["slo_attainment"])),
            fmt(t["ttft_p99_s"], " s"),
            fmt(t["e2e_p99_s"], " s"),
        ]
        for t in tails
    ]
    return (
        "<h2>Tails by tenant, class and input length</h2>"
        f"<p class='muted'>The workload as written (bursts included) on {run['replicas']} "
        "replicas.</p>"
        f"<div class='plots'>{charts}</div>"
        + table(["segment", "name", "calls", "attainment (%)", "TTFT p99 (s)", "e2e p99 (s)"], rows)
    )


WORST_SEGMENTS = 15
"""Rows of the segmented-tails table."""
SEGMENT_COLUMNS = ["segment", "name", "calls", "share (%)", "attainment (%)", "TTFT p99 (s)",
                   "e2e p99 (s)"]  # fmt: skip


def segments_section(sim: dict[str, Any]) -> str:
    """The worst segments of the replayed run, cut by every dimension seed 002 lists
    (the plan's JSON holds them all): lowest SLO attainment first, then highest p99."""
    run = sim.get("replay")
    if not run:
        return ""
    ranked = [s for s in run.get("segments") or [] if s.get("ranked", True)]
    if not ranked:
        return ""
    rows = [
        [
            html.escape(s["segment"]),
            html.escape(s["name"]),
            fmt(s["calls"]),
            pct(s.get("share")),
            heat(s["slo_attainment"], 0.75, 0.95, pct(s["slo_attainment"])),
            fmt(s["ttft_p99_s"], " s"),
            fmt(s["e2e_p99_s"], " s"),
        ]
        for s in ranked[:WORST_SEGMENTS]
    ]
    dimensions = list(dict.fromkeys(s["segment"] for s in run["segments"]))
    return (
        "<h2 id='segments'>Worst segments of the tail</h2>"
        f"<p class='muted'>The {min(len(ranked), WORST_SEGMENTS)} worst of {len(ranked)} "
        f"segments of the workload as written on {run['replicas']} replicas, cut by "
        f"{html.escape(', '.join(dimensions))}; lowest SLO attainment first, then highest "
        f"e2e and TTFT p99. Segments under {MIN_RANKED_CALLS} calls or {MIN_RANKED_SHARE:.0%} "
        "of them, the only value of their dimension, and outcomes other than completed are "
        "left out of the order (the plan's JSON holds every one). Prefix cache: none, partial "
        "or full reuse of the prompt blocks an engine can reuse; replica cold: first admitted "
        f"within {COLD_WINDOW_S:g} s of its replica's start or cache flush. No call takes a "
        "fallback route in the simulator.</p>" + table(SEGMENT_COLUMNS, rows)
    )


def little_section(sim: dict[str, Any]) -> str:
    """Little's law at every boundary of the replayed run: the sampled occupancy L
    against λW from the records over the same window (a mismatch above 1% says the
    instrumentation or the records are wrong, not the system)."""
    run = sim.get("replay")
    if not run or not run.get("little"):
        return ""
    rows = [
        [
            html.escape(b["boundary"]),
            fmt(b["mean_in_system"]),
            fmt(b["arrival_rate_per_s"]),
            fmt(b["mean_time_in_system_s"]),
            fmt(b["lambda_w"]),
            heat(1.0 - b["relative_mismatch"], 0.95, 0.99, pct(b["relative_mismatch"])),
        ]
        for b in run["little"]
    ]
    return (
        "<h2 id='little'>Little's law at every boundary</h2>"
        f"<p class='muted'>The workload as written on {run['replicas']} replicas: the mean "
        "of the occupancy sampled during the run (L) against the arrival rate and time "
        "inside from its records (λW), over the same window.</p>"
        + table(["boundary", "L (items)", "λ (/s)", "W (s)", "λW (items)", "mismatch (%)"], rows)
    )


def _bad_days_window(matrix: Any, burst_starts_s: list[float]) -> str:
    """What the matrix ran: its window, load and replicas, which bursts fall outside it."""
    if not isinstance(matrix, dict) or matrix.get("duration_s") is None:
        return ""
    window = float(matrix["duration_s"])
    later = [s for s in burst_starts_s if s >= window]
    bursts = (
        f"; the workload's bursts (from {min(later):g} s) start after it, so no cell has one"
        if later
        else ""
    )
    return (
        f"<p class='muted'>Each cell simulates the workload's first {window:g} s at "
        f"{fmt(matrix.get('load_factor'))}× its load on {matrix.get('cluster_replicas')} "
        f"replicas (the plan's count){bursts}. Its costs are this window's, not the "
        "headline's; a replica lost to a fault is paid for until the window ends.</p>"
    )


def bad_days_section(bad_days: Any, burst_starts_s: list[float] | None = None) -> str:
    """The bad-day matrix as a coloured table (or a note that it was not computed),
    after a line on what it ran (its window against ``burst_starts_s``).

    Takes a list of rows, ``{"rows": [...]}``, or a ``headway.sim.baddays`` matrix
    (``{"cells": [...]}``, whose ``preset`` is the row's policy).
    """
    rows_in = bad_days
    if isinstance(bad_days, dict):
        rows_in = bad_days.get("rows")
        if rows_in is None and bad_days.get("cells"):
            rows_in = [{"policy": c.get("preset"), **c} for c in bad_days["cells"]]
    if not rows_in:
        return (
            "<h2>Bad days</h2><p class='muted'>The bad-day matrix (policies × scenarios) was "
            "not computed for this plan.</p>"
        )
    attain = [r.get("slo_attainment") for r in rows_in if r.get("slo_attainment") is not None]
    lo = min(attain, default=0.0)
    rows = [
        [
            fmt(r.get("policy")),
            fmt(r.get("scenario"))
            + (f"<br><span class='bad'>{html.escape(r['note'])}</span>" if r.get("note") else ""),
            fmt(r.get("goodput_per_s"), "/s"),
            heat(r.get("slo_attainment"), min(lo, 0.5), 0.95, pct(r.get("slo_attainment"))),
            fmt(r.get("ttft_p99_s"), " s"),
            fmt(r.get("e2e_p99_s"), " s"),
            fmt(r.get("shed")),
            heat(-(r.get("amplification") or 1.0), -2.0, -1.0, fmt(r.get("amplification"), "×")),
            fmt(r.get("cost_per_successful_task")),
        ]
        for r in rows_in
    ]
    window = _bad_days_window(bad_days, burst_starts_s or [])
    return f"<h2>Bad days</h2>{window}" + table(
        [
            "policy", "scenario", "goodput (calls/s)", "attainment (%)", "TTFT p99 (s)",
            "e2e p99 (s)", "shed (calls)", "amplification (×)", "$ per successful task",
        ],
        rows,
    )  # fmt: skip


def comparison_section(comparison: list[dict[str, Any]]) -> str:
    """Analytic against simulated, with the reasons where they differ."""
    if not comparison:
        return ""
    rows = []
    for c in comparison:
        rel = c["relative_difference"]
        diff = "—" if rel is None else f"{rel:+.0%}"
        rows.append(
            [
                html.escape(c["figure"]),
                html.escape(c["unit"]),
                fmt(c["analytic"]),
                fmt(c["simulated"]),
                f"<span class='bad'>{diff}</span>" if c["differs"] else diff,
            ]
        )
    reasons = list(dict.fromkeys(r for c in comparison for r in c["reasons"]))
    why = (
        "<p>Where they differ by more than 20%:</p><ul>"
        + "".join(f"<li>{html.escape(r)}</li>" for r in reasons)
        + "</ul>"
        if reasons
        else "<p class='good'>Every figure agrees within 20%.</p>"
    )
    return (
        "<h2>Analytic and simulated</h2>"
        + table(["figure", "unit", "analytic", "simulated", "difference (%)"], rows)
        + why
    )


def cost_section(sim: dict[str, Any]) -> str:
    """Cost per successful task and how it was priced."""
    cost = sim.get("cost")
    if not cost:
        return ""
    per = cost["cost_per_successful_task"]
    text = (
        f"<b>${per:.4g}</b> per successful task (${per * 1000:.3g} per thousand)"
        if per is not None
        else "not priced"
    )
    return (
        "<h2>Cost</h2>"
        f"<p>{text}: {cost['replicas']} replicas × "
        f"{fmt(cost['price_per_replica_hour'])}/h ({html.escape(cost['price_source'])}) over "
        f"{cost['run_s']:g} s, {cost['successful_tasks']:,} tasks within their deadline. "
        f"Wasted work: {pct(cost.get('wasted_fraction', 0.0))} of the tokens the engines "
        "processed came to no answer (losing branches, retried attempts, duplicates, "
        "cancelled calls); the cost pays for it.</p>" + _energy_line(cost)
    )


def _energy_line(cost: dict[str, Any]) -> str:
    """Energy beside cost (seed 002), when the GPUs' power is known."""
    per_request = cost.get("joules_per_slo_request")
    if per_request is None:
        return ""
    per_outcome = cost.get("joules_per_verified_outcome")
    outcome = f", {per_outcome:,.0f} J per verified outcome" if per_outcome else ""
    return (
        f"<p>Energy: <b>{per_request:,.0f} J</b> per SLO-satisfying request{outcome} (each "
        "replica's GPUs at full draw while it steps, idle otherwise; the cluster file's "
        "<code>gpu_power_w</code> replaces the catalog's).</p>"
    )


def _growth_points(r: dict[str, Any], x_max: float) -> list[tuple[float, float]]:
    """Utilisation against growth from today (growth 1) through the computed points:
    today's utilisation, then 1 where it saturates (straight between them: exact for the
    resources linear in traffic, through 0 at 0; KV memory is drawn between its two)."""
    u, sat = float(r["utilization"]), r.get("saturates_at_growth")
    if sat is not None and sat <= 1:
        return [(1.0, u)]
    if sat is not None and sat <= x_max:
        return [(1.0, u), (float(sat), 1.0)]
    slope = (1.0 - u) / (sat - 1.0) if sat is not None else u
    return [(1.0, u), (x_max, u + slope * (x_max - 1.0))]


def growth_section(growth: dict[str, Any] | None) -> str:
    """The growth what-if (``--growth``): each resource's utilisation now and the growth
    at which it saturates, drawn and tabled, then the replicas the asked growth needs and
    the fixed limits replicas cannot fix ("" without a what-if)."""
    if not growth:
        return ""
    factor = float(growth["factor"])
    resources = growth["resources"]
    binding = growth.get("binding_growth")
    x_max = max(factor, 1.0, (binding or 0.0) * 1.25)
    lines = [
        Line(f"{r['resource']} ({r['owner'].split(' ', 1)[-1]})", _growth_points(r, x_max),
             color=PALETTE[i % len(PALETTE)], dashed=bool(r["fixed"]))
        for i, r in enumerate(resources)
    ]  # fmt: skip
    chart = line_chart(
        Frame(
            "growth",
            "Utilisation against traffic growth (dashed: fixed limits)",
            "growth (× today's peak)",
            "utilisation",
            width=760,
            y_max=1.1,
            x_format=lambda v: f"{v:g}×",
            y_format=share,
        ),
        lines,
        [Rule("saturated", 1.0, axis="y"), Rule(f"asked {factor:g}×", factor)],
    )
    rows = [
        [
            fmt(r["resource"])
            + (" <span class='bad'>◀ first</span>" if i == 0 and binding else ""),
            fmt(r["owner"]),
            f"{r['utilization']:.0%}",
            fmt(r.get("saturates_at_growth"), "×") if r.get("saturates_at_growth") else "never",
            fmt(r.get("headroom_ends_at_growth"), "×"),
            "<span class='bad'>yes</span>" if r["fixed"] else "no",
            f"{fmt(r['demand'])} / {fmt(r['capacity'])} {html.escape(r['unit'])}",
            fmt(r["basis"]),
        ]
        for i, r in enumerate(resources)
    ]
    resource_table = table(
        ["resource", "of", "utilisation now (%)", "saturates at (×)", "headroom ends (×)",
         "fixed limit", "now / capacity (its unit)", "capacity from"],
        rows,
    )  # fmt: skip
    need_rows = [
        [fmt(n["route"]), fmt(n["replicas_now"]), fmt(n["replicas"]),
         fmt(n["replicas_with_failover"]), fmt(n["limited_by"])]
        for n in growth["routes"]
    ]  # fmt: skip
    needs = (
        f"<h3>Replicas at {factor:g}×</h3>"
        + table(
            [
                "route",
                "today (replicas)",
                f"at {factor:g}× (replicas)",
                "with failover (replicas)",
                "limit",
            ],
            need_rows,
        )
        if need_rows
        else ""
    )
    exceeded = growth.get("fixed_limits_exceeded") or []
    fixed = (
        "<p class='warn'>Limits that replicas cannot fix at "
        f"{factor:g}×: {html.escape(', '.join(exceeded))}.</p>"
        if exceeded
        else ""
    )
    if binding:
        head = (
            f"<p><b>{html.escape(growth['binding'])}</b> saturates first, at "
            f"<b>{fmt(binding, '×')}</b> today's peak of {fmt(growth['tasks_per_s'])} tasks/s.</p>"
        )
    else:
        head = "<p>No resource with a known capacity saturates.</p>"
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in growth.get("notes") or [])
    return (
        f"<h2 id='growth'>Growth what-if: today's peak × {factor:g}</h2>{head}"
        f"<div class='plots'>{chart}</div>{resource_table}{needs}{fixed}"
        + (f"<ul class='muted'>{notes}</ul>" if notes else "")
        + "<p class='muted'>Saturated: utilisation 1, demand equal to capacity (past it a "
        "queue grows without bound). Headroom ends where utilisation reaches the planning "
        "factor. See docs/planning.md, “Growth”.</p>"
    )
