"""Turn a simulation's records into its summary (``simulate --json``) and columnar files.

Latency summaries (TTFT, TPOT, ITL, e2e) overall, by class, tenant, priority and
input-length bucket, and segmented as seed 002 lists (:mod:`headway.sim.segments`), worst
first; throughput; SLO attainment and goodput; task outcomes; KV occupancy
and queue lengths over time; the Little's-law check at the replica boundary.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import msgspec
import numpy as np
import numpy.typing as npt

from headway.core import lifecycle
from headway.core.lifecycle import SIM_WORDS, State
from headway.core.metrics import (
    LatencySummary,
    LittleCheck,
    little_check,
    meets_slo,
    summarize,
    summarize_histogram,
    task_deadlines_s,
    tpot_s,
)
from headway.core.workload.compile import CompiledWorkload
from headway.core.workload.spec import PRIORITIES
from headway.sim.outcome import OUTCOMES, SHED_REASONS, SimOutcome
from headway.sim.segments import (
    INPUT_BUCKETS_TOKENS,
    bucket_names,
    is_ranked,
    selections,
    worst_first,
)

SCHEMA = "headway.simulate/1"
LENGTH_BUCKETS = INPUT_BUCKETS_TOKENS
"""Input-length bucket edges (tokens) of ``by_length``."""


class Latencies(msgspec.Struct, frozen=True, kw_only=True):
    """The four latencies of one group of calls."""

    ttft: LatencySummary
    tpot: LatencySummary
    e2e: LatencySummary
    queue: LatencySummary
    """From dispatch to first admission into the running set."""


class Group(msgspec.Struct, frozen=True, kw_only=True):
    """One segment of the calls (a class, tenant, priority or length bucket)."""

    name: str
    calls: int
    completed: int
    slo_attainment: float | None
    latencies: Latencies


class Segment(msgspec.Struct, frozen=True, kw_only=True):
    """The calls of one value of one dimension (seed 002's segmented tails: see
    :mod:`headway.sim.segments`), e.g. ``output tokens`` ``512-2048``."""

    dimension: str
    """What the calls are cut by: ``input tokens``, ``output tokens``, ``route``,
    ``prefix cache``, ``replica``, ``preemption``, ``retry``, ``fallback``, ``priority``,
    ``tenant``, ``class``, ``outcome``, ``arrival time``."""
    name: str
    calls: int
    share: float
    """``calls`` over all calls of the workload."""
    completed: int
    slo_attainment: float | None
    latencies: Latencies
    ranked: bool
    """Whether it takes part in the worst-first order (not: fewer than 20 calls or 1% of
    them, the whole run or the only value of its dimension, an outcome other than
    completed, or none judged)."""


class Throughput(msgspec.Struct, frozen=True, kw_only=True):
    """Work completed per second over the run (first arrival to last completion)."""

    window_s: float
    requests_per_s: float
    input_tokens_per_s: float
    output_tokens_per_s: float


class Slo(msgspec.Struct, frozen=True, kw_only=True):
    """SLO attainment (over the calls of the workload, losing branches aside) and goodput
    (met SLO per second)."""

    offered_calls: int
    met: int
    attainment: float
    """Calls that met their SLO over the calls of the workload but the losing branches
    (a ``branch_join: first`` step's answer counts once, through its winner)."""
    goodput_per_s: float
    offered_tasks: int
    tasks_completed: int
    tasks_met_deadline: int
    task_attainment: float
    """Tasks completed within their deadline over tasks offered (a task whose class
    declares no deadline counts once it completes)."""
    verified_goodput_per_s: float
    """Verified-outcome goodput (seed 002): tasks completed within their deadline whose
    outcome was accepted (their class's ``acceptance_probability``; a rejected outcome's
    retries take part of the deadline), per second."""
    task_deadlines_declared: bool = True
    """Whether any class declares ``task_deadline_s`` (if none, ``task_attainment`` is
    only the share completed)."""
    losing_branches: int = 0
    """Calls of ``branch_join: first`` steps that lost the race to a sibling (left out of
    ``attainment``; their work is in ``work.losing_branch_tokens``)."""
    tasks_verified: int = 0
    """Tasks completed within their deadline with an accepted outcome."""


class Energy(msgspec.Struct, frozen=True, kw_only=True):
    """Energy beside cost (seed 002: "cost and power per SLO-satisfying request"): each
    replica's GPUs at full draw while it steps, idle the rest of its provisioned time (an
    upper bound while it steps with small batches)."""

    energy_j: float
    """Joules over the run, every replica."""
    mean_power_w: float
    """``energy_j`` over the run's length."""
    joules_per_slo_request: float | None
    """Per call that met its SLO (None: none did)."""
    joules_per_verified_outcome: float | None
    """Per task completed within its deadline with an accepted outcome (None: none)."""


class Work(msgspec.Struct, frozen=True, kw_only=True):
    """Tokens the engines processed, and the share no answer came of (seed 002's "cost
    per successful task": losing branches, retried attempts, clients' duplicates,
    cancelled and failed calls burn GPU time that the answered tasks pay for)."""

    processed_tokens: int
    """Prompt and output tokens processed in engines, every stay of every request."""
    wasted_tokens: int
    """Of those, the ones no delivered answer came of: stays aborted (cancelled, lost
    with a replica, a timed-out attempt), losing branches, the second copy of a
    duplicated call to finish."""
    losing_branch_tokens: int
    """Of the wasted, the losing branches' (``branch_join: first``)."""
    wasted_fraction: float
    """``wasted_tokens / processed_tokens`` (0 when nothing was processed)."""


class Timeline(msgspec.Struct, frozen=True, kw_only=True):
    """The cluster sampled over time."""

    time_s: list[float]
    running: list[int]
    waiting: list[int]
    kv_usage: list[float]
    """Mean over replicas of the fraction of KV blocks held."""


class Little(msgspec.Struct, frozen=True, kw_only=True):
    """L = λW at one boundary over the sampled window: the sampled occupancy against λW
    from the records, and their relative mismatch (reported, not hidden: a mismatch says
    the records and the live state disagree)."""

    boundary: str
    mean_in_system: float
    arrival_rate_per_s: float
    mean_time_in_system_s: float
    lambda_w: float
    relative_mismatch: float


class EngineStats(msgspec.Struct, frozen=True, kw_only=True):
    """What the replicas did."""

    replicas: int
    kv_blocks_per_replica: int
    steps: int
    steps_skipped: int
    """Steps applied in closed form inside decode runs (no event of their own)."""
    events: int
    preemptions: int
    cancelled_calls: int
    prefix_hit_ratio: float | None
    """Prompt tokens served from prefix caches / prompt tokens looked up at a request's
    first admission (a re-admission after a preemption counts apart, as in vLLM's
    ``vllm:prefix_cache_hits`` / ``_queries``: the small-pool real-engine run read 16.6%
    here against vLLM's 0.0 when they were counted in); None when nothing was looked up."""
    replica_hours: float = 0.0
    """Replica-hours provisioned (with an autoscaler or lost replicas, not replicas × run)."""
    replicas_max: int = 0
    """The most replicas provisioned at once."""
    calls_lost_with_replicas: int = 0
    """Attempts that were on a replica when a fault took it."""
    tool_failures: int = 0
    """Tool calls to downstream services that timed out or were refused."""
    tool_retries: int = 0
    """Of those, tool calls the agent sent again under the clients' retry policy."""
    kv_transfers: int = 0
    """Prompt KV moved from a prefill to a decode replica (disaggregated clusters)."""
    kv_transfer_s_mean: float | None = None
    """Mean time of those transfers (None: none)."""


class Accounting(msgspec.Struct, frozen=True, kw_only=True):
    """Where every offered call ended: exactly one terminal state each, so the terminal
    counts sum to ``offered_calls`` (``balanced``)."""

    gateway: str
    """The gateway preset in front of the router."""

    calls: int
    """Calls of the compiled workload: offered plus not offered."""

    offered_calls: int
    """Calls that reached the gateway (or, without one, the router)."""

    not_offered_calls: int
    """Calls of tasks that had already failed (a call shed or timed out) before them."""

    completed: int
    shed: int
    cancelled: int
    timed_out: int
    """Queued at the gateway until their deadline passed; never sent to a replica."""
    failed: int
    """Still unfinished when the run ended (no replica could ever serve them)."""

    balanced: bool
    """``completed + shed + cancelled + timed_out + failed == offered_calls``."""

    shed_by_reason: dict[str, int]
    """Shed calls per :class:`~headway.core.policy.decisions.ShedReason` value (only the
    reasons that occurred; a call retried after a shed counts only if its last attempt
    was shed)."""

    attempts: int
    """Attempts offered in all: first attempts plus the clients' retries of shed calls."""

    amplification: float
    """``(attempts + duplicates_sent) / offered_calls``: calls sent per call offered,
    retries and duplicates included (1 without either)."""

    duplicates_sent: int = 0
    """Duplicate submissions that reached the replicas (no gateway recognised them)."""

    duplicates_coalesced: int = 0
    """Duplicate submissions the gateway attached to the call in flight."""

    duplicate_output_tokens: int = 0
    """Output tokens computed by the copy of a duplicated call that did not answer."""

    cancelled_by_patience: int
    """Of ``cancelled``: calls whose client gave up without a first token within its
    ``clients.patience_s`` (the rest are losing ``first`` branches)."""


class OutcomeGroup(msgspec.Struct, frozen=True, kw_only=True):
    """Calls that ended in one terminal state, and how long they took to get there."""

    name: str
    calls: int
    time_to_end: LatencySummary
    """From the first offer to the end (served, shed, cancelled, timed out, failed)."""


class SimResult(msgspec.Struct, frozen=True, kw_only=True):
    """The summary of one simulation."""

    schema: str
    workload: str
    seed: int
    duration_s: float
    end_s: float
    calls: int
    completed_calls: int
    throughput: Throughput
    latencies: Latencies
    itl: LatencySummary
    slo: Slo
    by_class: list[Group]
    by_tenant: list[Group]
    by_priority: list[Group]
    by_length: list[Group]
    by_retry: list[Group]
    """Calls served on their first attempt, and calls retried at least once."""
    by_outcome: list[OutcomeGroup]
    timeline: Timeline
    little: Little
    little_boundaries: list[Little]
    """Little's law at every boundary: tasks, the gateway (calls offered and not ended),
    the replicas (admitted sequences and waiting requests) and the KV blocks."""
    engine: EngineStats
    accounting: Accounting
    work: Work | None = None
    """The engines' work and the share of it wasted (None: a result from before it)."""
    energy: Energy | None = None
    """Joules per SLO-satisfying request and per verified outcome (None: a GPU's power
    is not known)."""
    segments: list[Segment] = msgspec.field(default_factory=list)
    """The calls cut by every dimension seed 002 lists, the ranked ones worst first (SLO
    attainment, then e2e and TTFT p99), the unranked after them."""
    fallback_calls: int = 0
    """Calls sent to a fallback route's pool (their own pool had no routable replica)."""
    degraded_calls: int = 0
    """Calls a degraded mode changed (``gateway.degraded``): output capped, prompt
    trimmed, or shed as optional. A degraded call served within its SLO counts as met: a
    shorter answer on time is the trade the mode declares."""
    degraded_completed: int = 0
    """Degraded calls that completed (served shorter; the optional ones shed are not)."""
    deferred_calls: int = 0
    """Calls shed and deferred instead (``gateway.receipts``): a receipt, run later."""
    deferred_completed: int = 0
    """Deferred calls that completed within their receipt's retention (each once). Their
    SLO is still their class's, so most are late by it: the receipt changes the completion
    expectation, and this count is the one to read for them."""


def _accounting(out: SimOutcome) -> Accounting:
    """Count the calls' terminal states (see :class:`Accounting`)."""
    counts = np.bincount(out.calls.outcome.astype(np.int64), minlength=len(OUTCOMES))
    by_name = {name: int(counts[i]) for i, name in enumerate(OUTCOMES)}
    offered = int(out.calls.outcome.size) - by_name["not_offered"]

    # The core lifecycle's balance, from the simulator's words; a run ends with nothing
    # in flight (a call still live at the end is failed).
    def count(state: State) -> int:
        return sum(by_name[w] for w, s in SIM_WORDS.items() if s is state)

    shed = count(State.SHED)
    balance = lifecycle.Accounting(
        offered=offered, admitted=offered - shed, shed=shed,
        completed=count(State.COMPLETED), cancelled=count(State.CANCELLED),
        timed_out=count(State.TIMED_OUT), failed=count(State.FAILED),
        in_flight=count(State.DISPATCHED),
    )  # fmt: skip
    attempts = int(out.calls.attempts.sum())
    reasons = out.calls.shed_reason
    shed_counts = np.bincount(reasons[reasons >= 0].astype(np.int64), minlength=len(SHED_REASONS))
    return Accounting(
        gateway=out.gateway_preset,
        calls=int(out.calls.outcome.size),
        offered_calls=offered,
        not_offered_calls=by_name["not_offered"],
        completed=by_name["completed"],
        shed=by_name["shed"],
        cancelled=by_name["cancelled"],
        timed_out=by_name["timed_out"],
        failed=by_name["failed"],
        balanced=balance.balanced and balance.in_flight == 0,
        shed_by_reason={
            reason: int(shed_counts[i]) for i, reason in enumerate(SHED_REASONS) if shed_counts[i]
        },
        attempts=attempts,
        amplification=(attempts + out.duplicates_sent) / offered if offered else 1.0,
        duplicates_sent=out.duplicates_sent,
        duplicates_coalesced=out.duplicates_coalesced,
        duplicate_output_tokens=out.duplicate_output_tokens,
        cancelled_by_patience=out.cancelled_by_patience,
    )


def _bounds(w: CompiledWorkload) -> tuple[npt.NDArray[np.float64], ...]:
    """Per-call TTFT, TPOT and e2e bounds (NaN when a class names none)."""
    per_class = [w.spec.classes[c].slo for c in w.class_names]
    cls = w.task_class[w.call_task]

    def column(name: str) -> npt.NDArray[np.float64]:
        values = np.array(
            [math.nan if getattr(s, name) is None else getattr(s, name) for s in per_class]
        )
        return np.asarray(values[cls], dtype=np.float64)

    return column("ttft_s"), column("tpot_s"), column("e2e_s")


def _latencies(
    mask: npt.NDArray[np.bool_],
    ttft: npt.NDArray[np.float64],
    tpot: npt.NDArray[np.float64],
    e2e: npt.NDArray[np.float64],
    queue: npt.NDArray[np.float64],
) -> Latencies:
    return Latencies(
        ttft=summarize(ttft[mask]),
        tpot=summarize(tpot[mask]),
        e2e=summarize(e2e[mask]),
        queue=summarize(queue[mask]),
    )


def build_result(
    w: CompiledWorkload,
    out: SimOutcome,
    num_replicas: int,
    *,
    replica_power_w: Sequence[tuple[float, float]] | None = None,
) -> SimResult:
    """The summary of a finished simulation.

    Latencies run from the call's arrival at the gateway (without one, its dispatch), so
    a wait in the gateway's queue counts in TTFT and e2e. SLO attainment divides by every
    call of the workload but the losing branches of ``branch_join: first`` steps (their
    task cancelled them, or ignored their answer, once a sibling answered; the step's
    answer counts once, through its winner): shed, timed-out, cancelled and never-offered
    calls stay in the denominator and never meet the SLO.
    """
    c = out.calls
    counted = ~c.lost_race if c.lost_race.size else np.ones(c.outcome.size, dtype=np.bool_)
    ttft = c.first_token_s - c.arrival_s
    completed = c.outcome == OUTCOMES.index("completed")
    e2e = np.where(completed, c.finish_s - c.arrival_s, np.nan)
    tpot = tpot_s(e2e, ttft, c.num_output_tokens)
    queue = c.admitted_s - c.arrival_s
    b_ttft, b_tpot, b_e2e = _bounds(w)
    met = meets_slo(ttft, tpot, e2e, ttft_bound_s=b_ttft, tpot_bound_s=b_tpot, e2e_bound_s=b_e2e)
    met &= counted
    n = w.num_calls
    n_counted = int(counted.sum())
    first = float(w.task_arrival_s[0]) if w.num_tasks else 0.0
    last = float(np.nanmax(c.finish_s)) if n and np.isfinite(c.finish_s).any() else first
    window = max(last - first, 1e-9)

    summaries: dict[bytes, Group] = {}

    def group(name: str, mask: npt.NDArray[np.bool_]) -> Group:
        # Groups often select the same calls (one class, one tenant, every call): each
        # selection is summarised once.
        key = mask.tobytes()
        known = summaries.get(key)
        if known is None:
            calls = int(mask.sum())
            judged = int((mask & counted).sum())
            known = summaries[key] = Group(
                name=name,
                calls=calls,
                completed=int((mask & completed).sum()),
                slo_attainment=float((mask & met).sum()) / judged if judged else None,
                latencies=_latencies(mask & completed, ttft, tpot, e2e, queue),
            )
        return known if known.name == name else msgspec.structs.replace(known, name=name)

    call_class = w.task_class[w.call_task]
    call_tenant = w.task_tenant[w.call_task]
    call_priority = w.task_priority[w.call_task]
    buckets = np.searchsorted(LENGTH_BUCKETS, w.call_input_tokens, side="right") - 1
    length_names = bucket_names(LENGTH_BUCKETS)
    task_done = np.isfinite(out.task_finish_s)
    deadline_by_class = [w.spec.classes[k].slo.task_deadline_s for k in w.class_names]
    deadlines = task_deadlines_s(deadline_by_class, w.task_class)
    task_met = task_done & (out.task_finish_s - w.task_arrival_s <= deadlines)
    verified = task_met & w.task_accepted if w.task_accepted.size else task_met
    occupancy = (out.timeline_running + out.timeline_waiting).astype(np.float64)
    window_s = _sampled_window_s(out)
    stays = out.replica_stays
    little = little_check(
        "replicas (admitted sequences + waiting)",
        stays[:, 0],
        stays[:, 1],
        0.0,
        window_s,
        out.timeline_s,
        occupancy,
    )
    boundaries = [
        little_of(
            little_check(
                "tasks (arrival to finish or failure)",
                w.task_arrival_s,
                out.task_end_s,
                0.0,
                window_s,
                out.timeline_s,
                out.timeline_tasks.astype(np.float64),
            )
        ),
        little_of(
            little_check(
                "gateway (calls offered, not yet ended)",
                c.arrival_s,
                c.finish_s,
                0.0,
                window_s,
                out.timeline_s,
                out.timeline_calls.astype(np.float64),
            )
        ),
        little_of(little),
        _kv_little(out, window_s),
    ]
    if w.service_names:
        tools = out.tool_stays_s
        boundaries.append(
            little_of(
                little_check(
                    "downstream services (tool calls waiting or served)",
                    tools[:, 0],
                    tools[:, 1],
                    0.0,
                    window_s,
                    out.timeline_s,
                    out.timeline_tool_calls.astype(np.float64),
                )
            )
        )
    retried = c.attempts >= 2
    ended = c.outcome != OUTCOMES.index("not_offered")
    cuts = selections(w, out, ended)
    per_dimension = Counter(dimension for dimension, _, _ in cuts)
    segments = worst_first(
        [
            _segment(dimension, group(name, mask), n, alone=per_dimension[dimension] == 1)
            for dimension, name, mask in cuts
        ]
    )
    return SimResult(
        schema=SCHEMA,
        workload=w.spec.name,
        seed=w.seed,
        duration_s=w.duration_s,
        end_s=out.end_s,
        calls=n,
        completed_calls=int(completed.sum()),
        throughput=Throughput(
            window_s=window,
            requests_per_s=float(completed.sum()) / window,
            input_tokens_per_s=float(w.call_input_tokens[completed].sum()) / window,
            output_tokens_per_s=float(c.num_output_tokens[completed].sum()) / window,
        ),
        latencies=_latencies(completed, ttft, tpot, e2e, queue),
        itl=summarize_histogram(out.itl_histogram, out.itl_edges_s),
        slo=Slo(
            offered_calls=n,
            met=int(met.sum()),
            attainment=float(met.sum()) / n_counted if n_counted else 0.0,
            goodput_per_s=float(met.sum()) / window,
            offered_tasks=w.num_tasks,
            tasks_completed=int(task_done.sum()),
            tasks_met_deadline=int(task_met.sum()),
            task_attainment=float(task_met.sum()) / w.num_tasks if w.num_tasks else 0.0,
            verified_goodput_per_s=float(verified.sum()) / window,
            task_deadlines_declared=any(d is not None for d in deadline_by_class),
            losing_branches=n - n_counted,
            tasks_verified=int(verified.sum()),
        ),
        by_class=[group(name, call_class == i) for i, name in enumerate(w.class_names)],
        by_tenant=[group(name, call_tenant == i) for i, name in enumerate(w.tenant_names)],
        by_priority=[
            group(p, call_priority == i)
            for i, p in enumerate(PRIORITIES)
            if (call_priority == i).any()
        ],
        by_length=[
            group(length_names[i], buckets == i)
            for i in range(len(LENGTH_BUCKETS))
            if (buckets == i).any()
        ],
        by_retry=[
            group(name, mask & ended)
            for name, mask in (("first attempt", ~retried), ("retried", retried))
            if (mask & ended).any()
        ],
        by_outcome=[
            OutcomeGroup(
                name=name,
                calls=int((c.outcome == i).sum()),
                time_to_end=summarize((c.finish_s - c.arrival_s)[c.outcome == i]),
            )
            for i, name in enumerate(OUTCOMES)
            if name not in ("not_offered", "in_flight") and (c.outcome == i).any()
        ],
        timeline=Timeline(
            time_s=out.timeline_s.tolist(),
            running=out.timeline_running.tolist(),
            waiting=out.timeline_waiting.tolist(),
            kv_usage=out.timeline_kv_usage.tolist(),
        ),
        little=little_of(little),
        little_boundaries=boundaries,
        engine=EngineStats(
            replicas=num_replicas,
            kv_blocks_per_replica=out.replica_num_blocks,
            steps=out.num_steps,
            steps_skipped=out.num_skipped_steps,
            events=out.num_events,
            preemptions=int(c.num_preemptions.sum()),
            cancelled_calls=int(c.cancelled.sum()),
            prefix_hit_ratio=(
                out.prefix_hit_tokens / out.prefix_queried_tokens
                if out.prefix_queried_tokens
                else None
            ),
            replica_hours=out.replica_s / 3600.0,
            replicas_max=out.replicas_provisioned_max,
            calls_lost_with_replicas=out.calls_lost_with_replicas,
            tool_failures=out.tool_failures,
            tool_retries=out.tool_retries,
            kv_transfers=out.kv_transfers,
            kv_transfer_s_mean=(
                out.kv_transfer_s_total / out.kv_transfers if out.kv_transfers else None
            ),
        ),
        accounting=_accounting(out),
        work=_work(out, c.lost_race),
        fallback_calls=int(c.fell_back.sum()) if c.fell_back.size else 0,
        degraded_calls=int(c.degraded.sum()) if c.degraded.size else 0,
        degraded_completed=int((c.degraded & completed).sum()) if c.degraded.size else 0,
        deferred_calls=int(c.deferred.sum()) if c.deferred.size else 0,
        deferred_completed=int((c.deferred & completed).sum()) if c.deferred.size else 0,
        energy=_energy(out, replica_power_w, int(met.sum()), int(verified.sum())),
        segments=segments,
    )


def _segment(dimension: str, g: Group, total: int, *, alone: bool) -> Segment:
    return Segment(
        dimension=dimension,
        name=g.name,
        calls=g.calls,
        share=g.calls / total if total else 0.0,
        completed=g.completed,
        slo_attainment=g.slo_attainment,
        latencies=g.latencies,
        ranked=is_ranked(dimension, g.name, g.calls, total, g.slo_attainment, alone),
    )


def little_of(check: LittleCheck) -> Little:
    """The check as the results report it."""
    return Little(
        boundary=check.boundary,
        mean_in_system=check.mean_in_system,
        arrival_rate_per_s=check.arrival_rate_per_s,
        mean_time_in_system_s=check.mean_time_in_system_s,
        lambda_w=check.lambda_w,
        relative_mismatch=check.relative_mismatch,
    )


def _energy(
    out: SimOutcome, power_w: Sequence[tuple[float, float]] | None, met: int, verified: int
) -> Energy | None:
    """Each replica's idle draw over its provisioned time, plus its extra draw at full load
    over the time it stepped (``power_w``: per replica, idle and full watts)."""
    if power_w is None or len(power_w) != len(out.replica_up_s):
        return None
    times = zip(power_w, out.replica_up_s, out.replica_busy_s, strict=True)
    energy_j = sum(idle * up + (full - idle) * busy for (idle, full), up, busy in times)
    return Energy(
        energy_j=energy_j,
        mean_power_w=energy_j / out.end_s if out.end_s > 0 else 0.0,
        joules_per_slo_request=energy_j / met if met else None,
        joules_per_verified_outcome=energy_j / verified if verified else None,
    )


def _work(out: SimOutcome, lost_race: npt.NDArray[np.bool_]) -> Work:
    """Tokens processed in engines, from every stay, and those no answer came of."""
    stays = out.replica_stays
    computed = stays[:, 6]
    rows = stays[:, 7].astype(np.int64)
    aborted = stays[:, 8] > 0
    call = rows < lost_race.size
    lost = np.zeros(rows.size, dtype=np.bool_)
    lost[call] = lost_race[rows[call]]
    processed = int(computed.sum())
    wasted = int(computed[aborted | lost].sum()) + out.duplicate_output_tokens
    wasted = min(wasted, processed)
    return Work(
        processed_tokens=processed,
        wasted_tokens=wasted,
        losing_branch_tokens=int(computed[lost].sum()),
        wasted_fraction=wasted / processed if processed else 0.0,
    )


def _sampled_window_s(out: SimOutcome) -> float:
    """The end of the window the occupancy was sampled over (from 0): the last sample,
    at the run's horizon (its duration, or its last arrival)."""
    return float(out.timeline_s[-1]) if out.timeline_s.size else out.end_s


def _kv_little(out: SimOutcome, window_s: float) -> Little:
    """Little's law in block-seconds over ``[0, window_s]``: the sampled blocks held
    against the block-seconds the stays in engines held, from their records of the blocks
    their engine gave them (chunk by chunk, a block per ``block_size`` tokens of output,
    all given back at a preemption or at their leaving), both inside the sampled window.
    Prefix sharing (a block held by several requests is counted once by the pool) makes
    the two differ; the mismatch says by how much."""
    stays = out.replica_stays
    block_s = float(stays[:, 10].sum())
    blocks_entered = float(stays[:, 9].sum())
    inside = out.timeline_s <= window_s
    mean_l = float(out.timeline_kv_blocks[inside].mean()) if inside.any() else math.nan
    check = LittleCheck(
        "KV blocks (held by requests)",
        mean_l,
        blocks_entered / max(window_s, 1e-9),
        block_s / blocks_entered if blocks_entered else 0.0,
    )
    return little_of(check)


def write_records(path: Path, w: CompiledWorkload, out: SimOutcome) -> None:
    """Write per-call records as a compressed columnar ``.npz`` file (one array per column)."""
    c = out.calls
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.npz")
    np.savez_compressed(
        tmp,
        call=np.arange(w.num_calls),
        task=w.call_task,
        step=w.call_step,
        branch=w.call_branch,
        task_class=w.task_class[w.call_task],
        tenant=w.task_tenant[w.call_task],
        priority=w.task_priority[w.call_task],
        input_tokens=w.call_input_tokens,
        output_tokens=c.num_output_tokens,
        dispatch_s=c.dispatch_s,
        admitted_s=c.admitted_s,
        first_token_s=c.first_token_s,
        finish_s=c.finish_s,
        itl_max_s=c.itl_max_s,
        preemptions=c.num_preemptions,
        replica=c.replica,
        cancelled=c.cancelled,
        arrival_s=c.arrival_s,
        outcome=c.outcome,
        shed_reason=c.shed_reason,
        retry_after_s=c.retry_after_s,
        first_retry_after_s=c.first_retry_after_s,
        attempts=c.attempts,
        kv_transfer_s=c.kv_transfer_s,
        cached_prompt_tokens=c.cached_prompt_tokens,
        outcome_names=np.array(OUTCOMES),
        shed_reason_names=np.array(SHED_REASONS),
        class_names=np.array(w.class_names),
        tenant_names=np.array(w.tenant_names),
    )
    tmp.replace(path)
