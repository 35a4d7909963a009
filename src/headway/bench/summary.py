"""The summary of a bench run (``bench --json``): pacing, latencies, SLOs, outcomes, checks.

Latencies run from each call's **scheduled** time, not from when it was sent, so a late
sender cannot hide queueing (no coordinated omission). SLO attainment divides by every
call of the workload: calls that got 429/503, timed out, failed or were never sent stay
in the denominator and never meet the SLO (the core's ``meets_slo``).
"""

from __future__ import annotations

import math

import msgspec
import numpy as np
import numpy.typing as npt

from headway.bench.records import ERRORS, OK, CallRecords
from headway.core.metrics import (
    LatencySummary,
    LittleCheck,
    meets_slo,
    summarize,
    task_deadlines_s,
    time_inside_s,
    tpot_s,
)
from headway.core.workload.compile import CompiledWorkload
from headway.sim.results import Little, little_of

SCHEMA = "headway.bench/1"
FloatArray = npt.NDArray[np.float64]


class Budgets(msgspec.Struct, frozen=True, kw_only=True):
    """What the sender must achieve for the run to count (else exit code 1)."""

    lateness_p99_s: float = 0.010
    """Largest allowed p99 of (sent − scheduled)."""
    min_rate_ratio: float = 0.98
    """Smallest allowed achieved / offered send rate."""


class Pacing(msgspec.Struct, frozen=True, kw_only=True):
    """How faithfully the schedule was sent."""

    scheduled_calls: int
    sent_calls: int
    offered_rate_per_s: float | None
    """(scheduled calls − 1) / span of their scheduled times."""
    achieved_rate_per_s: float | None
    """(sent calls − 1) / span of their send times."""
    rate_ratio: float | None
    lateness: LatencySummary
    """sent − scheduled, seconds."""
    scheduled_gap_cv: float | None
    """Coefficient of variation of the gaps between scheduled times (constant: 0,
    Poisson: about 1)."""
    sent_gap_cv: float | None
    """The same for the send times."""


class Check(msgspec.Struct, frozen=True, kw_only=True):
    """One budget check."""

    name: str
    value: float | None
    limit: float
    passed: bool


class Latencies(msgspec.Struct, frozen=True, kw_only=True):
    """Latencies of completed calls, from their scheduled times."""

    ttft: LatencySummary
    tpot: LatencySummary
    e2e: LatencySummary
    itl_max: LatencySummary
    """Per call, the largest gap between reads that carried tokens."""
    time_to_first_byte: LatencySummary


class Slo(msgspec.Struct, frozen=True, kw_only=True):
    """SLO attainment over all calls; goodput per second of the run window."""

    calls: int
    met: int
    attainment: float
    target: float
    goodput_per_s: float
    tasks: int
    tasks_met_deadline: int
    task_attainment: float
    verified_goodput_per_s: float
    task_deadlines_declared: bool = True
    """Whether any class declares ``task_deadline_s`` (see the simulator's ``Slo``)."""


class ClassGroup(msgspec.Struct, frozen=True, kw_only=True):
    """One class's calls."""

    name: str
    calls: int
    completed: int
    slo_attainment: float | None
    ttft_p99_s: float | None
    e2e_p99_s: float | None


DRIFT_WARNING = 0.02
"""A served token total this far from the asked one (relative) gets a warning."""


class Tokens(msgspec.Struct, frozen=True, kw_only=True):
    """Token counts of completed calls: what the workload asked and what the server served.

    A simulation of the workload uses the asked counts; when the served ones drift, the
    sent trace (``sent-trace.jsonl``) holds what the engine really got.
    """

    output_tokens: int
    output_tokens_per_s: float
    from_usage: float
    """Fraction of completed calls whose counts came from the server's ``usage`` (the rest
    are estimates: one token per streamed event)."""
    prompt_tokens_reported: int
    """The served prompt tokens (``usage.prompt_tokens``) of the completed calls."""
    asked_prompt_tokens: int
    """The workload's input tokens of the completed calls."""
    asked_output_tokens: int
    """What the workload asked for (``max_tokens``) on the completed calls."""
    prompt_drift: float | None
    """Served / asked prompt tokens − 1, over the completed calls with ``usage``."""
    output_drift: float | None
    """Served / asked output tokens − 1, over the completed calls with ``usage``."""
    exact_prompts: bool
    """Whether prompts were built with the server's tokenizer (``/tokenize``)."""


class Outcomes(msgspec.Struct, frozen=True, kw_only=True):
    """Every call's terminal state (they sum to ``calls``) and HTTP statuses."""

    calls: int
    by_error: dict[str, int]
    by_status: dict[str, int]
    connects: int
    connect_errors: int
    resent: int
    max_open_connections: int


def client_little(r: CallRecords, in_flight_s: float, sampled_s: float) -> Little | None:
    """The check over ``[0, sampled_s]`` (None: nothing was sampled)."""
    if sampled_s <= 0:
        return None
    sent = np.isfinite(r.sent_s) & (r.sent_s >= 0) & (r.sent_s <= sampled_s)
    held_s = float(time_inside_s(r.sent_s, r.end_s, 0.0, sampled_s).sum())
    arrivals = int(sent.sum())
    return little_of(
        LittleCheck(
            "client (calls on the wire, sampled every 50 ms by the senders)",
            in_flight_s / sampled_s,
            arrivals / sampled_s,
            held_s / arrivals if arrivals else 0.0,
        )
    )


class Cost(msgspec.Struct, frozen=True, kw_only=True):
    """What the generator itself used."""

    workers: int
    loop: str
    connections_prefilled: int
    run_cpu_s: float
    cpu_ms_per_request: float | None
    """Run-phase CPU of the sending processes per sent call."""
    total_cpu_s: float
    startup_s: float
    """From process start to ``t0``."""
    wall_s: float


class BenchResult(msgspec.Struct, frozen=True, kw_only=True):
    """The summary of one bench run."""

    schema: str
    workload: str
    target: str
    model: str
    endpoint: str
    seed: int
    duration_s: float
    load_factor: float
    window_s: float
    """From the first scheduled time to the last end."""
    throughput_requests_per_s: float
    pacing: Pacing
    latencies: Latencies
    slo: Slo
    by_class: list[ClassGroup]
    tokens: Tokens
    outcomes: Outcomes
    cost: Cost
    checks: list[Check]
    passed: bool
    warnings: list[str] = msgspec.field(default_factory=list)
    """What the reader should know (token drift past 2%)."""
    little: Little | None = None
    """Little's law at the client (calls on the wire: sent, not ended), over the span the
    senders sampled: their own count of calls in flight (L, sampled every 50 ms) against
    λW from the records (a mismatch says the records and the live count disagree)."""


def _gap_cv(times: FloatArray) -> float | None:
    finite = np.sort(times[np.isfinite(times)])
    if finite.size < 3:
        return None
    gaps = np.diff(finite)
    mean = float(gaps.mean())
    return float(gaps.std() / mean) if mean > 0 else None


def _rate(times: FloatArray) -> float | None:
    finite = times[np.isfinite(times)]
    if finite.size < 2:
        return None
    span = float(finite.max() - finite.min())
    return (finite.size - 1) / span if span > 0 else None


def pacing(r: CallRecords) -> Pacing:
    """Lateness, rates and gap CVs of the sent calls."""
    sent = np.isfinite(r.sent_s)
    offered = _rate(r.scheduled_s)
    achieved = _rate(r.sent_s)
    ratio = achieved / offered if offered and achieved else None
    return Pacing(
        scheduled_calls=int(np.isfinite(r.scheduled_s).sum()),
        sent_calls=int(sent.sum()),
        offered_rate_per_s=offered,
        achieved_rate_per_s=achieved,
        rate_ratio=ratio,
        lateness=summarize(r.sent_s[sent] - r.scheduled_s[sent]),
        scheduled_gap_cv=_gap_cv(r.scheduled_s),
        sent_gap_cv=_gap_cv(r.sent_s),
    )


def checks(p: Pacing, budgets: Budgets) -> list[Check]:
    """The budget checks of a run (a run with one call or none passes them)."""
    late = p.lateness.p99_s
    return [
        Check(
            name="lateness_p99_s",
            value=late,
            limit=budgets.lateness_p99_s,
            passed=late is None or late <= budgets.lateness_p99_s,
        ),
        Check(
            name="rate_ratio",
            value=p.rate_ratio,
            limit=budgets.min_rate_ratio,
            passed=p.rate_ratio is None or p.rate_ratio >= budgets.min_rate_ratio,
        ),
    ]


def slo_bounds(w: CompiledWorkload) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Per-call TTFT, TPOT and e2e bounds of the call's class (NaN: none named)."""
    per_class = [w.spec.classes[c].slo for c in w.class_names]
    cls = w.task_class[w.call_task]

    def column(name: str) -> FloatArray:
        values = np.array(
            [math.nan if getattr(s, name) is None else getattr(s, name) for s in per_class]
        )
        return np.asarray(values[cls], dtype=np.float64)

    return column("ttft_s"), column("tpot_s"), column("e2e_s")


def attainment_target(w: CompiledWorkload) -> float:
    """The strictest class target (as the simulator's sweep)."""
    return max(c.slo.attainment_target for c in w.spec.classes.values())


def summarize_run(
    w: CompiledWorkload,
    r: CallRecords,
    *,
    target: str,
    model: str,
    endpoint: str,
    load_factor: float,
    cost: Cost,
    outcomes: Outcomes,
    budgets: Budgets,
    exact_prompts: bool = False,
) -> BenchResult:
    """Summarise the records of a run of ``w``."""
    done = r.completed
    ttft = np.where(done, r.first_token_s - r.scheduled_s, np.nan)
    e2e = np.where(done, r.end_s - r.scheduled_s, np.nan)
    out_tokens = r.completion_tokens.astype(np.int64)
    tpot = tpot_s(e2e, ttft, out_tokens)
    b_ttft, b_tpot, b_e2e = slo_bounds(w)
    met = meets_slo(ttft, tpot, e2e, ttft_bound_s=b_ttft, tpot_bound_s=b_tpot, e2e_bound_s=b_e2e)
    n = w.num_calls
    first = float(np.nanmin(r.scheduled_s)) if np.isfinite(r.scheduled_s).any() else 0.0
    last = float(np.nanmax(r.end_s)) if np.isfinite(r.end_s).any() else first
    window = max(last - first, 1e-9)
    task_ok = np.ones(w.num_tasks, dtype=bool)
    np.logical_and.at(task_ok, w.call_task, done)
    task_end = np.full(w.num_tasks, -np.inf)
    np.maximum.at(task_end, w.call_task, np.where(np.isfinite(r.end_s), r.end_s, np.inf))
    deadline_by_class = [w.spec.classes[c].slo.task_deadline_s for c in w.class_names]
    deadlines = task_deadlines_s(deadline_by_class, w.task_class)
    task_met = task_ok & (task_end - w.task_arrival_s <= deadlines)
    call_class = w.task_class[w.call_task]
    groups = []
    for i, name in enumerate(w.class_names):
        mask = call_class == i
        calls = int(mask.sum())
        groups.append(
            ClassGroup(
                name=name,
                calls=calls,
                completed=int((mask & done).sum()),
                slo_attainment=float((mask & met).sum()) / calls if calls else None,
                ttft_p99_s=summarize(ttft[mask & done]).p99_s,
                e2e_p99_s=summarize(e2e[mask & done]).p99_s,
            )
        )
    p = pacing(r)
    run_checks = checks(p, budgets)
    completed = int(done.sum())
    tokens = token_counts(w, r, window, exact_prompts)
    return BenchResult(
        schema=SCHEMA,
        workload=w.spec.name,
        target=target,
        model=model,
        endpoint=endpoint,
        seed=w.seed,
        duration_s=w.duration_s,
        load_factor=load_factor,
        window_s=window,
        throughput_requests_per_s=completed / window,
        pacing=p,
        latencies=Latencies(
            ttft=summarize(ttft[done]),
            tpot=summarize(tpot[done]),
            e2e=summarize(e2e[done]),
            itl_max=summarize(r.itl_max_s[done]),
            time_to_first_byte=summarize((r.first_byte_s - r.scheduled_s)[done]),
        ),
        slo=Slo(
            calls=n,
            met=int(met.sum()),
            attainment=float(met.sum()) / n if n else 0.0,
            target=attainment_target(w),
            goodput_per_s=float(met.sum()) / window,
            tasks=w.num_tasks,
            tasks_met_deadline=int(task_met.sum()),
            task_attainment=float(task_met.sum()) / w.num_tasks if w.num_tasks else 0.0,
            verified_goodput_per_s=float(task_met.sum()) / window,
            task_deadlines_declared=any(d is not None for d in deadline_by_class),
        ),
        by_class=groups,
        tokens=tokens,
        outcomes=outcomes,
        cost=cost,
        checks=run_checks,
        passed=all(c.passed for c in run_checks),
        warnings=drift_warnings(tokens),
    )


def _drift(served: npt.NDArray[np.int64], asked: npt.NDArray[np.int64]) -> float | None:
    total = int(asked.sum())
    return int(served.sum()) / total - 1.0 if served.size and total > 0 else None


def token_counts(w: CompiledWorkload, r: CallRecords, window_s: float, exact: bool) -> Tokens:
    """Asked and served tokens of the completed calls, and their drift."""
    done = r.completed
    out = r.completion_tokens.astype(np.int64)
    reported = done & r.usage
    prompt = reported & (r.prompt_tokens >= 0)
    asked_in = w.call_input_tokens.astype(np.int64)
    asked_out = w.call_output_tokens.astype(np.int64)
    return Tokens(
        output_tokens=int(out[done].sum()),
        output_tokens_per_s=float(out[done].sum()) / window_s,
        from_usage=float(r.usage[done].mean()) if done.any() else 0.0,
        prompt_tokens_reported=int(np.maximum(r.prompt_tokens[done], 0).sum()),
        asked_prompt_tokens=int(asked_in[done].sum()),
        asked_output_tokens=int(asked_out[done].sum()),
        prompt_drift=_drift(r.prompt_tokens[prompt].astype(np.int64), asked_in[prompt]),
        output_drift=_drift(out[reported], asked_out[reported]),
        exact_prompts=exact,
    )


def drift_warnings(t: Tokens) -> list[str]:
    """A line for each served total more than 2% off the asked one."""
    lines = []
    for what, drift in (("prompt", t.prompt_drift), ("output", t.output_drift)):
        if drift is not None and abs(drift) > DRIFT_WARNING:
            lines.append(
                f"served {what} tokens are {drift:+.1%} off what the workload asked "
                f"(more than {DRIFT_WARNING:.0%}): a simulation of the workload uses the "
                "asked counts; simulate the sent trace (sent-trace.jsonl with --out) instead"
                + (
                    ""
                    if what == "output" or t.exact_prompts
                    else "; the server has no /tokenize, so prompts are estimates"
                )
            )
    return lines


def count_outcomes(r: CallRecords) -> tuple[dict[str, int], dict[str, int]]:
    """Calls per error name and per HTTP status (only those that occurred)."""
    errors = np.bincount(r.error.astype(np.int64), minlength=len(ERRORS))
    by_error = {name: int(errors[i]) for i, name in enumerate(ERRORS) if errors[i]}
    statuses, counts = np.unique(r.status[r.status > 0], return_counts=True)
    by_status = {str(int(s)): int(c) for s, c in zip(statuses, counts, strict=True)}
    by_error.setdefault(ERRORS[OK], 0)
    return by_error, by_status
