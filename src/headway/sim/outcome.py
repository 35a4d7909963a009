"""What a simulation run produces: call outcomes, per-call records, the run's outcome."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt

from headway.core.policy.decisions import ShedReason

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

_PATIENCE_STREAM, _RETRY_STREAM, _DUPLICATE_STREAM = 101, 102, 103

# Call outcomes (CallRecords.outcome): the index into OUTCOMES.
OUTCOMES = ("not_offered", "in_flight", "completed", "shed", "cancelled", "timed_out", "failed")
"""Every offered call ends in exactly one of the last five. ``not_offered``: a call of a
task that had already failed before reaching it (never offered). ``in_flight`` never
survives a run: a call still live at the end (it could never be served) is ``failed``."""
NOT_OFFERED: Final = 0
IN_FLIGHT: Final = 1
COMPLETED: Final = 2
SHED: Final = 3
CANCELLED: Final = 4
TIMED_OUT: Final = 5
FAILED: Final = 6

STAY_COLUMNS = ("enter_s", "leave_s", "admitted_s", "first_token_s", "prompt_tokens",
                "output_tokens", "computed_tokens", "row", "aborted", "kv_blocks",
                "kv_block_s")  # fmt: skip
"""The columns of :attr:`SimOutcome.replica_stays`, one row per stay of an engine request
in an engine: when it entered and left, when it was first scheduled (its blocks
allocated) and emitted its first token there, the prompt it held and the tokens it
computed there, the tokens it processed there (prompt and output), its row (a call, or
past the workload's calls a client's duplicate), 1 when it was aborted (cancelled, lost
with its replica) rather than finished, and its KV blocks as its engine gave them (chunk
by chunk, a block per ``block_size`` tokens of output, again after a preemption): how
many it was given and the block-seconds it held them, both inside the window the
timeline samples (from 0 to its last sample)."""

SHED_REASONS = tuple(r.value for r in ShedReason)
"""The shed reasons, in the order of the codes in ``CallRecords.shed_reason``."""
SHED_CODE = {r: i for i, r in enumerate(ShedReason)}


@dataclass(slots=True, kw_only=True)
class CallRecords:
    """Per-call records, one row per call of the compiled workload (columns)."""

    dispatch_s: FloatArray
    admitted_s: FloatArray
    first_token_s: FloatArray
    finish_s: FloatArray
    num_output_tokens: IntArray
    itl_max_s: FloatArray
    num_preemptions: IntArray
    replica: IntArray
    cancelled: npt.NDArray[np.bool_]
    arrival_s: FloatArray
    """When the call was offered (to the gateway; without one, its dispatch time)."""
    outcome: npt.NDArray[np.int8]
    """Index into :data:`OUTCOMES`: the call's terminal state."""
    shed_reason: npt.NDArray[np.int8]
    """Index into :data:`SHED_REASONS` for shed calls, -1 for the others."""
    retry_after_s: FloatArray
    """The ``retry_after_s`` of the call's last shed (NaN: none, or never shed)."""
    first_retry_after_s: FloatArray
    """The ``retry_after_s`` of the call's first attempt's shed: the time its first retry
    was told to wait (NaN: its first attempt was not shed, or the shed named no time)."""
    attempts: IntArray
    """Times the call was offered: its first attempt plus its clients' retries."""
    lost_race: npt.NDArray[np.bool_] = field(default_factory=lambda: np.empty(0, dtype=np.bool_))
    """A losing branch (``branch_join: first``): a sibling of its step finished first, so
    its task cancelled it (at once, or ``cancel_losers_after_s`` later) or ignored its
    answer. Not a miss of the SLO: the task's outcome counts once, through its winner."""
    fell_back: npt.NDArray[np.bool_] = field(default_factory=lambda: np.empty(0, dtype=np.bool_))
    """Routed to a fallback route's pool, at least once (its own route's pool had no
    routable replica, and the core ``FallbackPolicy`` allowed the substitute)."""
    degraded: npt.NDArray[np.bool_] = field(default_factory=lambda: np.empty(0, dtype=np.bool_))
    """Served degraded (``gateway.degraded``): a mode capped its output or trimmed its
    prompt, or shed it as optional."""
    deferred: npt.NDArray[np.bool_] = field(default_factory=lambda: np.empty(0, dtype=np.bool_))
    """Shed, and deferred instead (``gateway.receipts``): run later in ``background``,
    within the receipt's retention, its client holding a receipt (no patience)."""
    kv_transfer_s: FloatArray = field(default_factory=lambda: np.empty(0))
    """With disaggregation: seconds its prompt KV took (or, cancelled midway, would have
    taken) to reach its decode replica (NaN: no transfer: not disaggregated, one output
    token, or ended before its prefill did)."""
    cached_prompt_tokens: IntArray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    """Prompt tokens its engine found in the prefix cache at the call's first admission
    (-1: never admitted; a disaggregated call's: its prefill replica's)."""

    @classmethod
    def empty(cls, n: int) -> CallRecords:
        """Rows for ``n`` calls, nothing happened yet."""
        nan = np.full(n, np.nan)
        return cls(
            dispatch_s=nan.copy(),
            admitted_s=nan.copy(),
            first_token_s=nan.copy(),
            finish_s=nan.copy(),
            num_output_tokens=np.zeros(n, dtype=np.int64),
            itl_max_s=np.zeros(n),
            num_preemptions=np.zeros(n, dtype=np.int64),
            replica=np.full(n, -1, dtype=np.int64),
            cancelled=np.zeros(n, dtype=np.bool_),
            arrival_s=nan.copy(),
            outcome=np.zeros(n, dtype=np.int8),
            shed_reason=np.full(n, -1, dtype=np.int8),
            retry_after_s=nan.copy(),
            first_retry_after_s=nan.copy(),
            attempts=np.zeros(n, dtype=np.int64),
            lost_race=np.zeros(n, dtype=np.bool_),
            fell_back=np.zeros(n, dtype=np.bool_),
            degraded=np.zeros(n, dtype=np.bool_),
            deferred=np.zeros(n, dtype=np.bool_),
            kv_transfer_s=nan.copy(),
            cached_prompt_tokens=np.full(n, -1, dtype=np.int64),
        )


@dataclass(slots=True, kw_only=True)
class SimOutcome:
    """Everything a run produced: records, timeline, token-gap histogram, counters."""

    calls: CallRecords
    task_finish_s: FloatArray
    timeline_s: FloatArray
    timeline_running: IntArray
    timeline_waiting: IntArray
    timeline_kv_usage: FloatArray
    itl_histogram: IntArray
    itl_edges_s: FloatArray
    num_steps: int
    num_skipped_steps: int
    num_events: int
    end_s: float
    loop_wall_s: float
    """Wall-clock seconds of the event loop (what Vidur's ``Simulator.run`` times): not
    the set-up, the records' arrays or the summaries."""
    replica_num_blocks: int
    replica_block_size: int = 16
    gateway_preset: str = "fifo-unbounded"
    cancelled_by_patience: int = 0
    """Calls their clients cancelled for want of a first token within ``patience_s``."""
    prefix_queried_tokens: int = 0
    """Prompt tokens looked up in the prefix caches at admission, all replicas."""
    prefix_hit_tokens: int = 0
    """Of those, tokens served from a cache (not recomputed)."""
    replica_s: float = 0.0
    """Replica-seconds provisioned (started or starting, until stopped or the end)."""
    replicas_provisioned_max: int = 0
    """The most replicas provisioned at once."""
    calls_lost_with_replicas: int = 0
    """Attempts that were on a replica when it was lost."""
    tool_failures: int = 0
    """Tool calls to a downstream service that timed out or were refused."""
    tool_retries: int = 0
    """Of those, the ones the agent sent again (the rest ended their task)."""
    duplicates_sent: int = 0
    """Duplicates clients submitted that reached the replicas (no gateway to recognise
    them): the same call computed twice."""
    duplicates_coalesced: int = 0
    """Duplicates the gateway recognised by idempotency key and attached to the call in
    flight (no new work)."""
    duplicate_output_tokens: int = 0
    """Output tokens computed by the copy of a duplicated call that did not answer it."""
    task_end_s: FloatArray = field(default_factory=lambda: np.empty(0))
    """Per task: when it left the system, finished or failed (NaN: still in it)."""
    timeline_tasks: IntArray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    """At each timeline sample: tasks in the system."""
    timeline_calls: IntArray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    """At each timeline sample: calls offered and not yet ended (the gateway boundary)."""
    timeline_kv_blocks: IntArray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    """At each timeline sample: KV blocks held by requests, all replicas."""
    timeline_tool_calls: IntArray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    """At each timeline sample: tool calls waiting in or served by downstream services
    (their own live count)."""
    tool_stays_s: FloatArray = field(default_factory=lambda: np.empty((0, 2)))
    """Every tool call's ``[enter, leave]`` in its downstream service (the records)."""
    kv_transfers: int = 0
    """With disaggregation: prompt KV transfers started (prefill to decode replica)."""
    kv_transfer_s_total: float = 0.0
    """With disaggregation: their seconds, summed (a transfer cancelled midway counts
    whole: the link was committed to it)."""
    replica_up_s: list[float] = field(default_factory=list)
    """Per replica: seconds it was provisioned (from its start to its stop or the end)."""
    replica_busy_s: list[float] = field(default_factory=list)
    """Per replica: seconds of those it spent stepping."""
    replica_stays: FloatArray = field(default_factory=lambda: np.empty((0, len(STAY_COLUMNS))))
    """Every stay of a request in an engine, a row of :data:`STAY_COLUMNS` each: retried
    attempts, clients' duplicates and losing copies included (the call records keep one
    attempt per call)."""
    cache_emptied: FloatArray = field(default_factory=lambda: np.empty((0, 2)))
    """Rows of (replica, time): when a replica's prefix cache was empty and it could serve
    (its start, or an autoscaled one's ready time, and every cache flush): where its
    cold window begins (see :mod:`headway.sim.segments`)."""
    extra: dict[str, float] = field(default_factory=dict)
