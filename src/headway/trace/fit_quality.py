"""How well a fitted workload reproduces its trace, tenant by tenant.

:func:`fit_quality` compiles the fitted workload (its own seed) and sets each large
tenant's figures beside the trace's (shares, mean and peak rate, IAT CV, length
percentiles: :func:`~headway.trace.stats.tenant_figures`), with the relative error of each,
so that ``headway trace fit`` can show what the model kept and what it lost. A trace
without tenants is one row, ``(all)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from headway.core.trace_data import TraceData
from headway.core.workload.compile import compile_workload
from headway.core.workload.spec import WorkloadSpec
from headway.trace.stats import tenant_figures

FIGURES = (
    "request_share",
    "token_share",
    "mean_rate_rps",
    "peak_rate_rps",
    "iat_cv",
    "input_tokens_p50",
    "input_tokens_p95",
    "output_tokens_p50",
    "output_tokens_p95",
)
"""The figures compared, in the table's order."""
ALL = "(all)"
MISS_TOLERANCE = 0.1
"""A figure the fit misses by more than this (relative) is named on the terminal."""
_HEADINGS = {
    "request_share": "requests",
    "token_share": "tokens",
    "mean_rate_rps": "rate/s",
    "peak_rate_rps": "peak/s",
    "iat_cv": "IAT CV",
    "input_tokens_p50": "in p50",
    "input_tokens_p95": "in p95",
    "output_tokens_p50": "out p50",
    "output_tokens_p95": "out p95",
}


@dataclass(frozen=True, slots=True)
class FitRow:
    """One tenant's figures in the trace and in the fitted workload's calls."""

    tenant: str
    trace: dict[str, float | None]
    fitted: dict[str, float | None]

    def error(self, figure: str) -> float | None:
        """``fitted / trace - 1`` for ``figure`` (None where either is missing or the
        trace's is 0)."""
        a, b = self.trace.get(figure), self.fitted.get(figure)
        if a is None or b is None or a == 0:
            return None
        return b / a - 1.0

    def worst(self) -> tuple[str, float] | None:
        """The figure the fit missed by most, and its relative error."""
        errors = [(f, e) for f in FIGURES if (e := self.error(f)) is not None]
        return max(errors, key=lambda fe: abs(fe[1])) if errors else None


def fit_quality(trace: TraceData, spec: WorkloadSpec, *, seed: int | None = None) -> list[FitRow]:
    """The trace's and the compiled ``spec``'s figures for the tenants fitted on their own
    (the sources of one tenant), and for the whole, as :class:`FitRow`\\ s."""
    calls = compile_workload(spec, seed=spec.seed if seed is None else seed).calls_trace()
    rows = [FitRow(ALL, _whole(trace), _whole(calls))]
    if trace.tenant is None:
        return rows
    alone = [
        next(iter(source.tenants))
        for source in spec.sources
        if source.tenants is not None and len(source.tenants) == 1
    ]
    mine = tenant_figures(trace, trace.arrival_s - trace.arrival_s[0], alone)
    theirs = tenant_figures(calls, calls.arrival_s - calls.arrival_s[0], alone)
    rows += [FitRow(name, mine[name], theirs[name]) for name in alone]
    return rows


def _whole(trace: TraceData) -> dict[str, float | None]:
    """The figures of the whole trace, as one tenant's."""
    one = TraceData(
        name=trace.name,
        kind=trace.kind,
        arrival_s=trace.arrival_s,
        input_tokens=trace.input_tokens,
        output_tokens=trace.output_tokens,
        tenant=np.full(len(trace), ALL, dtype=object),
    )
    return tenant_figures(one, one.arrival_s - one.arrival_s[0], [ALL])[ALL]


def quality_lines(rows: list[FitRow]) -> list[str]:
    """The comparison as fixed-width lines: a tenant per row, each figure as the trace's
    value then the fitted one (shares in %, the peak over 10 s windows)."""
    cells = [[_HEADINGS[f] for f in FIGURES]] + [
        [f"{_value(f, row.trace)}->{_value(f, row.fitted)}" for f in FIGURES] for row in rows
    ]
    widths = [max(len(line[i]) for line in cells) for i in range(len(FIGURES))]
    names = ["trace->fit", *(r.tenant for r in rows)]
    width = max(len(n) for n in names)
    return [
        "  ".join([name.ljust(width), *(c.rjust(w) for c, w in zip(line, widths, strict=True))])
        for name, line in zip(names, cells, strict=True)
    ]


def misses(rows: list[FitRow], tolerance: float = MISS_TOLERANCE) -> list[str]:
    """Each tenant's worst figure where it is off by more than ``tolerance``, as text."""
    out = []
    for row in rows:
        worst = row.worst()
        if worst is not None and abs(worst[1]) > tolerance:
            out.append(f"{row.tenant} {_HEADINGS[worst[0]]} {worst[1]:+.0%}")
    return out


def _value(figure: str, figures: dict[str, float | None]) -> str:
    value = figures.get(figure)
    if value is None:
        return "-"
    if figure.endswith("_share"):
        return f"{value:.1%}"
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"
