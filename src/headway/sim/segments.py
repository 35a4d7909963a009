"""Tails segmented the way seed 002 lists them, and ranked worst first.

A mean can improve while p99 degrades, when a change helps ordinary calls and hurts a
minority of long, low-priority, cold or preempted ones: so the calls are cut along every
dimension the seed names and each part summarised (:class:`~headway.sim.results.Segment`):

* input and output length buckets (:data:`INPUT_BUCKETS_TOKENS`,
  :data:`OUTPUT_BUCKETS_TOKENS`; the workload's lengths, so a shed call keeps its own);
* route (the call's class's ``route``, default the first);
* prefix-cache hit class of the calls that reached an engine: ``none`` (no prompt token
  from the cache), ``full`` (every block the engine could reuse: all full blocks of the
  prompt but its last token, which is always recomputed) or ``partial``;
* cold or warm replica: cold when the call was first admitted within
  :data:`COLD_WINDOW_S` of its replica's cache becoming empty (its start, an autoscaled
  one's ready time, a ``cache_flush`` fault);
* preempted at least once or never (calls that reached an engine), retried or first
  attempt (offered calls), fallen back to another route's pool or not (with ``pools``);
* priority, tenant, class, outcome (``completed``, ``shed``, ...);
* arrival-time bucket (:func:`time_bucket_width_s`), so a burst shows as a bad bucket.

Not segmented: model, adapter and quantization apart from the route (one model per
route, no adapters).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from headway.core.workload.spec import PRIORITIES
from headway.sim.outcome import COMPLETED, NOT_OFFERED, OUTCOMES

if TYPE_CHECKING:
    from headway.core.workload.compile import CompiledWorkload
    from headway.sim.outcome import SimOutcome
    from headway.sim.results import Segment

Mask = npt.NDArray[np.bool_]

INPUT_BUCKETS_TOKENS = (0, 512, 2048, 8192, 32768)
"""Input-length bucket edges (tokens); the last bucket is open."""
OUTPUT_BUCKETS_TOKENS = (0, 128, 512, 2048, 8192)
"""Output-length bucket edges (tokens); the last bucket is open."""
COLD_WINDOW_S = 30.0
"""How long a replica counts as cold after its prefix cache was empty (its start or a
flush): its cache holds little of the traffic's prefixes yet."""
MIN_RANKED_CALLS = 20
MIN_RANKED_SHARE = 0.01
"""Segments with fewer calls, or a smaller share of all calls, are noise: not ranked."""
TIME_BUCKETS = 20
"""About how many arrival-time buckets a run is cut into (at least this many seconds
wide each: :data:`TIME_STEPS_S`)."""
TIME_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)
"""The widths an arrival-time bucket may take (seconds)."""
HIT_CLASSES = ("none", "partial", "full")


def bucket_names(edges: Sequence[int]) -> list[str]:
    """``"0-512"``, ``"512-2048"``, ..., ``">=32768"`` for the bucket edges."""
    return [
        f"{edges[i]}-{edges[i + 1]}" if i + 1 < len(edges) else f">={edges[i]}"
        for i in range(len(edges))
    ]


def time_bucket_width_s(horizon_s: float) -> float:
    """The narrowest of :data:`TIME_STEPS_S` that cuts ``horizon_s`` into at most
    :data:`TIME_BUCKETS` buckets (a 600 s run: 30 s buckets, a 30 s burst fits one)."""
    for step_s in TIME_STEPS_S:
        if horizon_s / step_s <= TIME_BUCKETS:
            return float(step_s)
    return float(TIME_STEPS_S[-1])


def hit_classes(
    cached_tokens: npt.NDArray[np.int64], input_tokens: npt.NDArray[np.int64], block_size: int
) -> npt.NDArray[np.int8]:
    """Per call, an index into :data:`HIT_CLASSES` (-1: never admitted, or not recorded).
    The most an engine reuses is every full block but the one holding the last prompt
    token (recomputed for its logits)."""
    reusable = (np.maximum(input_tokens - 1, 0) // max(block_size, 1)) * max(block_size, 1)
    cls = np.where(cached_tokens <= 0, 0, np.where(cached_tokens >= reusable, 2, 1))
    cls = np.where(cached_tokens < 0, -1, cls)
    return cls.astype(np.int8)


def cold_calls(
    replica: npt.NDArray[np.int64],
    admitted_s: npt.NDArray[np.float64],
    cache_emptied: npt.NDArray[np.float64],
    window_s: float = COLD_WINDOW_S,
) -> Mask:
    """Calls first admitted within ``window_s`` of their replica's cache last becoming
    empty (``cache_emptied``: rows of replica, time)."""
    since = np.full(replica.size, -math.inf)
    for r in np.unique(cache_emptied[:, 0]).astype(np.int64).tolist():
        times = np.sort(cache_emptied[cache_emptied[:, 0] == r, 1])
        on = np.flatnonzero((replica == r) & np.isfinite(admitted_s))
        k = np.searchsorted(times, admitted_s[on], side="right") - 1
        since[on] = np.where(k >= 0, times[np.maximum(k, 0)], -math.inf)
    with np.errstate(invalid="ignore"):
        return np.asarray(admitted_s - since <= window_s, dtype=np.bool_)


def selections(w: CompiledWorkload, out: SimOutcome, ended: Mask) -> list[tuple[str, str, Mask]]:
    """Every segment as (dimension, name, calls selected), in the order of the module
    docstring; only the non-empty ones. ``ended``: calls that were offered."""
    c = out.calls
    found: list[tuple[str, str, Mask]] = []

    def add(dimension: str, names: Sequence[str], index: npt.NDArray[np.integer]) -> None:
        for i, name in enumerate(names):
            mask = index == i
            if mask.any():
                found.append((dimension, name, mask))

    for dimension, edges, tokens in (
        ("input tokens", INPUT_BUCKETS_TOKENS, w.call_input_tokens),
        ("output tokens", OUTPUT_BUCKETS_TOKENS, w.call_output_tokens),
    ):
        add(dimension, bucket_names(edges), np.searchsorted(edges, tokens, side="right") - 1)
    add("route", w.route_names, w.call_route)
    admitted = np.isfinite(c.admitted_s)
    if c.cached_prompt_tokens.size:
        hits = hit_classes(c.cached_prompt_tokens, w.call_input_tokens, out.replica_block_size)
        add("prefix cache", HIT_CLASSES, np.where(admitted, hits, -1))
    served = admitted & (c.replica >= 0)
    cold = cold_calls(c.replica, c.admitted_s, out.cache_emptied)
    add("replica", ("cold", "warm"), np.where(served, np.where(cold, 0, 1), -1))
    add("preemption", ("preempted", "never preempted"),
        np.where(admitted, np.where(c.num_preemptions > 0, 0, 1), -1))  # fmt: skip
    add("retry", ("first attempt", "retried"), np.where(ended, (c.attempts >= 2).astype(int), -1))
    if c.fell_back.any():
        add("fallback", ("own route", "fell back"), np.where(ended, c.fell_back.astype(int), -1))
    if c.degraded.any():
        add("degraded", ("served whole", "degraded"), np.where(ended, c.degraded.astype(int), -1))
    if c.deferred.any():
        add("deferral", ("served live", "deferred"), np.where(ended, c.deferred.astype(int), -1))
    add("priority", PRIORITIES, w.task_priority[w.call_task])
    add("tenant", w.tenant_names, w.task_tenant[w.call_task])
    add("class", w.class_names, w.task_class[w.call_task])
    outcome = c.outcome.astype(np.int64)
    add("outcome", OUTCOMES, np.where(outcome == NOT_OFFERED, -1, outcome))
    arrival = np.where(np.isfinite(c.arrival_s), c.arrival_s, w.task_arrival_s[w.call_task])
    width_s = time_bucket_width_s(w.duration_s)
    slot = np.floor(np.maximum(arrival, 0.0) / width_s).astype(np.int64)
    if slot.size:
        names = [f"{k * width_s:g}-{(k + 1) * width_s:g} s" for k in range(int(slot.max()) + 1)]
        add("arrival time", names, slot)
    return found


def is_ranked(
    dimension: str, name: str, calls: int, total: int, attainment: float | None, alone: bool
) -> bool:
    """Whether a segment takes part in the worst-first ranking: not when it is noise
    (fewer than :data:`MIN_RANKED_CALLS` calls or under :data:`MIN_RANKED_SHARE` of them),
    the whole run or ``alone`` in its dimension (it says nothing about where the tail
    is), an outcome other than ``completed`` (never meets the SLO, by definition) or has
    no call to judge."""
    if attainment is None or calls >= total or alone:
        return False
    if dimension == "outcome" and name != OUTCOMES[COMPLETED]:
        return False
    return calls >= MIN_RANKED_CALLS and calls >= MIN_RANKED_SHARE * total


def worst_first(segments: Sequence[Segment]) -> list[Segment]:
    """The ranked segments by SLO attainment, lowest first, then e2e and TTFT p99, highest
    first (none: no call completed, worst); the unranked after them, in their order."""

    def key(s: Segment) -> tuple[float, float, float, float]:
        if not s.ranked:
            return (1.0, 0.0, 0.0, 0.0)
        e2e, ttft = s.latencies.e2e.p99_s, s.latencies.ttft.p99_s
        return (
            0.0,
            s.slo_attainment if s.slo_attainment is not None else 2.0,
            -(math.inf if e2e is None else e2e),
            -(math.inf if ttft is None else ttft),
        )

    return sorted(segments, key=key)
