"""Latency summaries, SLO attainment, goodput and Little's-law checks from request records.

Pure functions over numpy columns, shared by every driver that measures requests (the
simulator now; bench and the gateway later). Vocabulary as in DESIGN.md: **SLO
attainment** counts every offered request in its denominator (a request that never
completed did not meet its SLO); **SLO goodput** is requests that met every named bound,
per second.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


class LatencySummary(msgspec.Struct, frozen=True, kw_only=True):
    """Mean and percentiles of one latency, in seconds (NaN-free; None when empty)."""

    count: int
    mean_s: float | None
    p50_s: float | None
    p90_s: float | None
    p99_s: float | None
    max_s: float | None


def summarize(values: FloatArray) -> LatencySummary:
    """Summarise the finite values of ``values`` (numpy linear percentiles)."""
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return LatencySummary(count=0, mean_s=None, p50_s=None, p90_s=None, p99_s=None, max_s=None)
    p50, p90, p99 = np.percentile(finite, [50, 90, 99]).tolist()
    return LatencySummary(
        count=int(finite.size),
        mean_s=float(finite.mean()),
        p50_s=p50,
        p90_s=p90,
        p99_s=p99,
        max_s=float(finite.max()),
    )


def summarize_histogram(counts: npt.NDArray[np.int64], edges: FloatArray) -> LatencySummary:
    """Summarise a histogram of values (each bin stands at its geometric centre)."""
    total = int(counts.sum())
    if total == 0:
        return LatencySummary(count=0, mean_s=None, p50_s=None, p90_s=None, p99_s=None, max_s=None)
    centres = np.sqrt(edges[:-1] * edges[1:])
    cum = np.cumsum(counts)

    def pct(q: float) -> float:
        return float(centres[int(np.searchsorted(cum, q * total, side="left"))])

    nonzero = np.flatnonzero(counts)
    return LatencySummary(
        count=total,
        mean_s=float(np.dot(counts, centres) / total),
        p50_s=pct(0.5),
        p90_s=pct(0.9),
        p99_s=pct(0.99),
        max_s=float(edges[nonzero[-1] + 1]),
    )


def tpot_s(
    e2e_s: FloatArray, ttft_s: FloatArray, output_tokens: npt.NDArray[np.int64]
) -> FloatArray:
    """Time per output token after the first: (e2e − TTFT) / (output tokens − 1).

    NaN for requests with one output token (no gap to measure).
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        out = (e2e_s - ttft_s) / (output_tokens - 1)
    out[output_tokens <= 1] = np.nan
    return np.asarray(out, dtype=np.float64)


def meets_slo(
    ttft_s: FloatArray,
    tpot: FloatArray,
    e2e_s: FloatArray,
    *,
    ttft_bound_s: FloatArray,
    tpot_bound_s: FloatArray,
    e2e_bound_s: FloatArray,
) -> npt.NDArray[np.bool_]:
    """Whether each request met every named bound (NaN bound: not named).

    A request that did not complete (NaN e2e) never meets its SLO; a one-token request
    has no TPOT and meets a TPOT bound trivially.
    """
    completed = np.isfinite(e2e_s)
    ok_ttft = np.isnan(ttft_bound_s) | (ttft_s <= ttft_bound_s)
    ok_tpot = np.isnan(tpot_bound_s) | np.isnan(tpot) | (tpot <= tpot_bound_s)
    ok_e2e = np.isnan(e2e_bound_s) | (e2e_s <= e2e_bound_s)
    return np.asarray(completed & ok_ttft & ok_tpot & ok_e2e)


@dataclass(frozen=True, slots=True)
class LittleCheck:
    """Little's law at one boundary over one window: the sampled L against λW from the
    records, both over the same window."""

    boundary: str
    mean_in_system: float
    """L: the mean of the occupancy samples taken inside the window."""
    arrival_rate_per_s: float
    """λ: items that entered inside the window, per second of it."""
    mean_time_in_system_s: float
    """W: the time items spent inside the window, per item that entered in it (an item
    that entered before the window or leaves after it counts only its part inside), so
    λW is the records' exact time-average of the occupancy over the window."""

    @property
    def lambda_w(self) -> float:
        """λW."""
        return self.arrival_rate_per_s * self.mean_time_in_system_s

    @property
    def relative_mismatch(self) -> float:
        """|L − λW| / max(L, λW); 0 when both are 0."""
        top = max(self.mean_in_system, self.lambda_w)
        return 0.0 if top == 0 else abs(self.mean_in_system - self.lambda_w) / top


def time_inside_s(
    enter_s: FloatArray, leave_s: FloatArray, window_start_s: float, window_end_s: float
) -> FloatArray:
    """Each item's time inside the window: the overlap of ``[enter, leave]`` with it (an
    item that never left, NaN or inf, is inside to the window's end; one that never
    entered, NaN, is not)."""
    entered = np.isfinite(enter_s)
    leave = np.where(np.isfinite(leave_s), leave_s, window_end_s)
    low = np.maximum(np.where(entered, enter_s, window_end_s), window_start_s)
    return np.asarray(np.clip(np.minimum(leave, window_end_s) - low, 0.0, None))


def little_check(
    boundary: str,
    enter_s: FloatArray,
    leave_s: FloatArray,
    window_start_s: float,
    window_end_s: float,
    sample_times_s: FloatArray,
    sample_counts: FloatArray,
) -> LittleCheck:
    """Compare the sampled mean occupancy with λW over one window.

    ``sample_counts`` is an independent measurement of the items inside at
    ``sample_times_s`` (the simulator's live counters, a scraped gauge); λ and W come from
    the records of when each item entered and left. Both are taken over the same window
    (an earlier version averaged the samples over the run's duration and counted λ over
    its end, a 12% mismatch on a healthy run), so a mismatch is the instrumentation's or
    the sampling's, not the arithmetic's.
    """
    span = window_end_s - window_start_s
    inside = (sample_times_s >= window_start_s) & (sample_times_s <= window_end_s)
    mean_l = float(sample_counts[inside].mean()) if inside.any() else math.nan
    if span <= 0:
        return LittleCheck(boundary, mean_l, math.nan, 0.0)
    entered = np.isfinite(enter_s) & (enter_s >= window_start_s) & (enter_s <= window_end_s)
    arrivals = int(entered.sum())
    held_s = float(time_inside_s(enter_s, leave_s, window_start_s, window_end_s).sum())
    return LittleCheck(boundary, mean_l, arrivals / span, held_s / arrivals if arrivals else 0.0)


def sampled_area(times_s: Sequence[float], counts: Sequence[float]) -> float:
    """The integral of a count sampled at ``times_s`` over their span (trapezoids): the
    item-seconds a scraped gauge saw, for L = area / window."""
    return sum(
        (t1 - t0) * (n0 + n1) / 2
        for (t0, n0), (t1, n1) in itertools.pairwise(zip(times_s, counts, strict=True))
    )


def little_from_counters(
    boundary: str,
    *,
    window_s: float,
    arrivals: float,
    ended: float,
    time_in_system_s: float,
    mean_in_system: float,
) -> LittleCheck:
    """Little's law over a scrape window from a server's own counters: λ = requests
    offered in the window / its length (the offered counter's increase), W = the time
    the requests that ended in it spent inside / their number (a duration histogram's
    ``_sum`` and ``_count`` increases), against L = the in-system gauge's mean over the
    window. Exact up to the gauge's sampling when the window starts and ends with nothing
    inside; requests straddling an edge otherwise make the difference."""
    lam = arrivals / window_s if window_s > 0 else math.nan
    w = time_in_system_s / ended if ended > 0 else 0.0
    return LittleCheck(boundary, mean_in_system, lam, w)


def task_deadlines_s(
    deadline_by_class: Sequence[float | None], task_class: npt.NDArray[np.int64]
) -> FloatArray:
    """Each task's deadline in seconds from its arrival (infinite where its class
    declares none: such a task is within its deadline once it completes)."""
    per_class = np.array([math.inf if d is None else d for d in deadline_by_class], dtype=float)
    return per_class[task_class] if per_class.size else np.full(task_class.size, math.inf)


def task_deadline_text(task_attainment: float, declared: bool) -> str:
    """How a summary line reports tasks within their deadline: a share of 100% when no
    class declares a deadline says nothing, so it says that instead."""
    if not declared:
        return "tasks within deadline: no task deadline declared"
    return f"tasks within deadline {task_attainment:.1%}"
