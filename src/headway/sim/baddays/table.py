"""The bad-day matrix as one terminal table, and the notes a reader of it needs."""

from __future__ import annotations

import math

import numpy as np
from rich.table import Table

from headway.sim.baddays.cell import MODES_OFF
from headway.sim.baddays.matrix import BadDayMatrix


def _fmt_s(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "—"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def _fmt_cost(value: float | None) -> str:
    """Two significant digits, never in scientific notation (0.000083, 0.52, 12)."""
    if value is None:
        return "—"
    if value >= 10:
        return f"{value:.0f}"
    return np.format_float_positional(value, precision=2, unique=False, fractional=False)


def matrix_table(matrix: BadDayMatrix) -> Table:
    """The matrix as one table: a row per (scenario, preset), scenarios in sections."""
    table = Table(
        title=f"{matrix.workload}: bad days at {matrix.load_factor:g}× load, "
        f"{matrix.duration_s:g} s, seed {matrix.seed}, {matrix.cluster_replicas} replica(s)"
    )
    table.add_column("scenario", no_wrap=True)
    table.add_column("preset", no_wrap=True)
    for name in ("goodput/s", "SLO att", "task att", "TTFT p99", "e2e p99", "shed"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("top shed reason", no_wrap=True)
    for name in ("t/out", "cancel", "failed", "amplif", "replica-h", "$/task"):
        table.add_column(name, justify="right", no_wrap=True)
    changed = {s.name: s.changed for s in matrix.scenarios}
    for i, info in enumerate(matrix.scenarios):
        cells = [c for c in matrix.cells if c.scenario == info.name]
        for j, c in enumerate(cells):
            unchanged = not changed[info.name] and info.name != "baseline"
            label = "" if j else f"{info.name} *" if unchanged else info.name
            table.add_row(
                label,
                c.preset,
                f"{c.goodput_per_s:.2f}",
                f"{c.slo_attainment:.1%}",
                f"{c.task_attainment:.1%}",
                _fmt_s(c.ttft_p99_s),
                _fmt_s(c.e2e_p99_s),
                f"{c.shed}",
                c.top_shed_reason or "—",
                f"{c.timed_out}",
                f"{c.cancelled}",
                f"{c.failed}",
                f"{c.amplification:.2f}",
                f"{c.replica_s / 3600:.3f}",
                _fmt_cost(c.cost_per_successful_task),
                end_section=j == len(cells) - 1 and i < len(matrix.scenarios) - 1,
            )
    return table


def matrix_notes(matrix: BadDayMatrix) -> list[str]:
    """What a reader of :func:`matrix_table` needs to know: unchanged scenarios, the cost
    basis."""
    notes = []
    unchanged = [s.name for s in matrix.scenarios if not s.changed and s.name != "baseline"]
    if unchanged:
        notes.append(
            f"* changes nothing in this workload and cluster: {', '.join(unchanged)} "
            "(its rows repeat the baseline)"
        )
    for info in matrix.scenarios:
        on = [c for c in matrix.cells if c.scenario == info.name and c.preset == "headway-default"]
        off = [c for c in matrix.cells if c.scenario == info.name and c.preset == MODES_OFF]
        if on and off:
            gain = on[0].goodput_per_s - off[0].goodput_per_s
            rel = f" ({gain / off[0].goodput_per_s:+.0%})" if off[0].goodput_per_s else ""
            notes.append(
                f"degraded modes on {info.name}: goodput {off[0].goodput_per_s:.2f} → "
                f"{on[0].goodput_per_s:.2f}/s, {gain:+.2f}/s{rel}; "
                f"{on[0].degraded_calls:,} calls served degraded"
            )
    if matrix.price_per_replica_hour is None:
        notes.append(
            "$/task: no price; set price_per_replica_hour in the cluster file (or "
            "routes.<name>.replica.price_per_hour in the workload)"
        )
    else:
        notes.append(
            f"$/task: replica-hours ({matrix.replica_s_basis}) × "
            f"{matrix.price_per_replica_hour:g} per replica-hour / tasks that met their deadline"
        )
    return notes
