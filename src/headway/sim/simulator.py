"""The discrete-event simulator: tasks and calls through a router onto replicas.

A compiled workload's tasks arrive at their times; each task step sends its calls (one
per branch) to the router, which picks a replica; each replica is a core
:class:`~headway.core.engine.replica.ReplicaModel` advanced on virtual time. When all of a
step's calls finish (or the first, for ``branch_join: first``, which cancels the rest),
the task waits its tool time and sends the next step. Everything is deterministic for a
given compiled workload: the event order is ``(time, priority, seq)`` (:mod:`.kernel`).

**The gateway and the clients.** With a :class:`~headway.sim.gateway.SimGateway`
(``headway-default``), each call is *offered* to it before the router: admitted calls are
routed at once, queued ones when a dispatch slot frees, shed ones end (or their client
retries them through the core ``RetryPolicy``), and queued ones still waiting at their
deadline time out. Without one (``fifo-unbounded``) every call is routed at once, exactly
as before the gateway existed. In both, a client with ``patience_s`` cancels a call that
has no first token in time. Every offered call ends in exactly one of the terminal
:data:`OUTCOMES`; gateway timers, retries and patience are events at ``DISPATCH``
priority.

**Skipping decode steps.** After a step, if the replica's next steps are identical
decode-only steps (``ReplicaModel.max_identical_decode_steps``), the driver schedules
one event at the end of the whole run instead of one per step, without applying it yet.
When something touches the replica inside the run (a call routed to it, a cancellation,
a router that reads its KV state), the steps that started before that moment are applied
and the rest dropped, so the replica is in exactly the state stepping one by one would
have left it (``tests/unit/sim/test_skipping.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import numpy.typing as npt

from headway.core.downstream import DownstreamConfig, DownstreamService
from headway.core.engine.kv import chain_block_hashes, expand_block_hashes
from headway.core.engine.replica import DecodeRun, ReplicaModel, StepResult
from headway.core.engine.scheduler import EngineRequest
from headway.core.policy.admission import AdmissionRequest
from headway.core.policy.autoscaler import Autoscaler, AutoscalerSignals, ScaleDown, ScaleUp
from headway.core.policy.decisions import Admit, Enqueue, ShedReason
from headway.core.policy.queues import BANDS, Queued
from headway.core.policy.retries import (
    AttemptOutcome,
    FailureKind,
    RetryAfter,
    RetryConfig,
    RetryPolicy,
)
from headway.core.policy.routing import Router, RouteRequest
from headway.core.workload.compile import CompiledWorkload
from headway.core.workload.distributions import sample
from headway.sim.faults import CacheFlush, Fault, Slowdown
from headway.sim.gateway import SimGateway
from headway.sim.kernel import BOUNDARY, DISPATCH, SAMPLE, EventQueue

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# Event kinds.
_TASK_ARRIVAL = 0  # a: task
_STEP_DISPATCH = 1  # a: task, b: step
_BOUNDARY = 2  # a: replica, b: version
_SAMPLE = 3
_GATEWAY_EXPIRY = 4  # a queued call's deadline: the gateway expires what is past it
_RETRY = 5  # a: call; its client offers it again after a shed
_PATIENCE = 6  # a: call; its client's patience runs out (cancel if no token yet)
_ATTEMPT_TIMEOUT = 7  # a: call, b: attempt; the client's per-attempt timeout fires
_FAULT = 8  # a: index into the faults; b: 1 when a slowdown ends
_AUTOSCALE = 9  # the autoscaler evaluates its signals
_REPLICA_READY = 10  # a: replica; a started replica becomes ready
_TOOL_CALL = 11  # a: call whose step's tool calls run, b: index of the tool call
_DUPLICATE = 12  # a: call; its client, still waiting, may submit it again
_TOOL_FAILED = 13  # a: call, b: tool call code; the agent sees its tool call time out
_KV_ARRIVED = 14  # a: call row, b: transfer number; its prompt KV reached its decode replica

_ATTEMPT_CODES = 128
"""A queued gateway item is ``call * _ATTEMPT_CODES + attempt`` (``max_attempts`` <= 100),
so that an entry left behind by an abandoned attempt is told from its retry's."""

# Random streams (with the workload's seed) of the clients' draws.
_PATIENCE_STREAM, _RETRY_STREAM, _DUPLICATE_STREAM = 101, 102, 103

# Call outcomes (CallRecords.outcome): the index into OUTCOMES.
OUTCOMES = ("not_offered", "in_flight", "completed", "shed", "cancelled", "timed_out", "failed")
"""Every offered call ends in exactly one of the last five. ``not_offered``: a call of a
task that had already failed before reaching it (never offered). ``in_flight`` never
survives a run: a call still live at the end (it could never be served) is ``failed``."""
_NOT_OFFERED, _IN_FLIGHT, _COMPLETED, _SHED, _CANCELLED, _TIMED_OUT, _FAILED = range(7)

SHED_REASONS = tuple(r.value for r in ShedReason)
"""The shed reasons, in the order of the codes in ``CallRecords.shed_reason``."""
_SHED_CODE = {r: i for i, r in enumerate(ShedReason)}

_SPEED_EWMA_WEIGHT = 0.1
"""Weight of the newest completed call in the gateway's measured prefill speed and TPOT."""

# Replica driver states.
_IDLE, _STEP, _RUN = 0, 1, 2

# ITL histogram: log-spaced bins from 10 µs to 1,000 s, 0.25% wide.
_ITL_EDGES = np.geomspace(1e-5, 1e3, 7373)


@dataclass(frozen=True, slots=True, kw_only=True)
class SimOptions:
    """Knobs of one simulation run."""

    skip_decode: bool = True
    """Jump over runs of identical decode steps (results are identical either way)."""

    sample_points: int = 1000
    """How many timeline samples (KV occupancy, running, waiting) to take."""

    check_invariants: bool = False
    """Check every replica's invariants after every step (slow; for tests)."""

    prefix_block_tokens: int | None = None
    """Token size of the workload's prefix blocks, when calls carry prefix hash ids."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Disaggregation:
    """Prefill/decode disaggregation as the simulator runs it (``docs/simulate.md``).

    Replicas ``0..prefill_replicas - 1`` only prefill (each call runs there with
    ``max_output_tokens=1``: the first token); the others only decode. A call's prompt KV
    then moves to a decode replica in ``kv_transfer_latency_s + prompt tokens ×
    kv_transfer_s_per_token`` and decodes its other tokens there.
    """

    prefill_replicas: int
    """Replicas that only prefill (the first ones); the rest only decode."""

    kv_transfer_s_per_token: float
    """Seconds to move one prompt token's KV: its KV bytes per GPU over the per-GPU,
    one-direction bandwidth (every GPU of the tensor-parallel group sends its shard)."""

    kv_transfer_latency_s: float = 0.0
    """Fixed latency of one transfer (the interconnect's)."""

    def __post_init__(self) -> None:
        if self.prefill_replicas < 1:
            raise ValueError(
                f"disaggregation.prefill_replicas must be >= 1 (got {self.prefill_replicas})"
            )
        for name in ("kv_transfer_s_per_token", "kv_transfer_latency_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"disaggregation.{name} must be finite and >= 0 (got {value})")


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
    attempts: IntArray
    """Times the call was offered: its first attempt plus its clients' retries."""
    kv_transfer_s: FloatArray = field(default_factory=lambda: np.empty(0))
    """With disaggregation: seconds its prompt KV took (or, cancelled midway, would have
    taken) to reach its decode replica (NaN: no transfer: not disaggregated, one output
    token, or ended before its prefill did)."""

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
            attempts=np.zeros(n, dtype=np.int64),
            kv_transfer_s=nan.copy(),
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
    kv_transfers: int = 0
    """With disaggregation: prompt KV transfers started (prefill to decode replica)."""
    kv_transfer_s_total: float = 0.0
    """With disaggregation: their seconds, summed (a transfer cancelled midway counts
    whole: the link was committed to it)."""
    extra: dict[str, float] = field(default_factory=dict)


class _Driver:
    """One replica and what the simulator knows about it.

    It is also the router's view of the replica (``routing.LoadView``): outstanding
    requests and tokens as the dispatcher counts them (dispatched, not yet finished), and
    the engine's KV and queue state for KV-aware routing.
    """

    __slots__ = (
        "alive",
        "draining",
        "index",
        "model",
        "outstanding_requests",
        "outstanding_tokens",
        "pending_finished",
        "pending_loss",
        "ready",
        "reserved_kv_blocks",
        "revision",
        "run_start_s",
        "run_steps",
        "started_s",
        "state",
        "step_result",
        "stopped_s",
        "version",
    )

    def __init__(self, index: int, model: ReplicaModel) -> None:
        self.index = index
        self.model = model
        self.state = _IDLE
        self.version = 0
        self.step_result: StepResult | None = None
        self.run_start_s = 0.0
        """In state ``_RUN``: when the pending decode run started (nothing applied yet)."""
        self.run_steps = 0
        """In state ``_RUN``: the steps the pending decode run has planned."""
        self.pending_finished: tuple[int, ...] = ()
        self.outstanding_requests = 0
        self.outstanding_tokens = 0
        self.reserved_kv_blocks = 0
        """KV blocks promised to the calls dispatched here and not yet ended: each call's
        prompt plus its ``max_tokens`` (or its class's p95 output), as the gateway projects
        it. Token-aware admission keeps the sum within the pool."""
        self.revision: str | None = None
        self.ready = True
        """The router may choose it (started, not lost, not draining)."""
        self.alive = True
        """Not lost to a fault, not removed by the autoscaler."""
        self.draining = False
        """Removed by the autoscaler: it finishes its calls and takes no new ones."""
        self.pending_loss: str | None = None
        """A ``replica_lost`` fault waiting for a step of this phase to strike."""
        self.started_s = 0.0
        """When it was provisioned (billing starts)."""
        self.stopped_s: float | None = None
        """When it stopped (lost, or drained after a scale-down); None: still up."""

    @property
    def free_kv_blocks(self) -> int:
        """Blocks not held by a request (the engine's view; materialize first)."""
        return self.model.scheduler.pool.num_free

    @property
    def waiting_requests(self) -> int:
        """Requests waiting for admission in the engine."""
        return self.model.num_waiting


class Simulator:
    """Runs one compiled workload on a list of replicas behind a router."""

    def __init__(
        self,
        workload: CompiledWorkload,
        replicas: list[ReplicaModel],
        router: Router,
        options: SimOptions | None = None,
        gateway: SimGateway | None = None,
        *,
        faults: Sequence[Fault] = (),
        autoscaler: Autoscaler | None = None,
        new_replica: Callable[[], ReplicaModel] | None = None,
        disaggregation: Disaggregation | None = None,
    ) -> None:
        """``gateway``: the ``headway-default`` gateway in front of the router; None sends
        every call to the router at once (``fifo-unbounded``). ``faults``: injected
        during the run. ``autoscaler`` adds replicas built by ``new_replica`` and drains
        them again. ``disaggregation``: separate prefill and decode replicas (without a
        gateway, faults or autoscaler, for now).

        Raises:
            ValueError: for no replicas, or disaggregation with an unsupported companion.
        """
        if not replicas:
            raise ValueError("a simulation needs at least one replica")
        if disaggregation is not None:
            _check_disaggregation(disaggregation, len(replicas), gateway, faults, autoscaler)
        self.w = workload
        self.options = options or SimOptions()
        self.router = router
        self.drivers = [_Driver(i, r) for i, r in enumerate(replicas)]
        self.events = EventQueue()
        n = workload.num_calls
        # Per-call records, as Python lists while the run goes (a list item is cheaper to
        # read and write than a numpy element); run() returns them as CallRecords arrays.
        nan = math.nan
        self._dispatch_s = [nan] * n
        self._admitted_s = [nan] * n
        self._first_token_s = [nan] * n
        self._finish_s = [nan] * n
        self._last_token_s = [nan] * n
        self._num_output_tokens = [0] * n
        self._itl_max_s = [0.0] * n
        self._num_preemptions = [0] * n
        self._replica = [-1] * n
        self._cancelled = [False] * n
        self._arrival_s = [nan] * n
        self._outcome = [_NOT_OFFERED] * n
        self._shed_reason = [-1] * n
        self._retry_after_s = [nan] * n
        self._attempts = [0] * n
        self._queued: set[int] = set()
        self._backing_off: set[int] = set()
        """Calls whose last attempt failed and whose client waits to retry them."""
        """Calls waiting in the gateway's queues (not those backing off to retry)."""
        self._num_impatient = 0
        self._patience_s: list[float] | None = None
        """Per call: how long its client waits for a first token (None: forever)."""
        patience = workload.spec.clients.patience_s
        if patience is not None:
            rng = np.random.default_rng([workload.seed, _PATIENCE_STREAM])
            self._patience_s = sample(patience, n, rng).tolist()
        self._init_clients(workload)
        self.task_finish_s = np.full(workload.num_tasks, np.nan)
        self._task_end_s = [math.nan] * workload.num_tasks
        self._live_tasks = 0
        self._live_calls = 0
        """Tasks and calls in the system now (for the Little's-law checks)."""
        # Per task: index of the current step, calls of it still running.
        self._task_step = [0] * workload.num_tasks
        self._task_left = [0] * workload.num_tasks
        self._call_first = workload.task_first_call.tolist()
        self._calls_per_step = [
            workload.spec.classes[c].parallel_branches for c in workload.class_names
        ]
        self._join_first = [
            workload.spec.classes[c].branch_join == "first" for c in workload.class_names
        ]
        self._task_class = workload.task_class.tolist()
        self._task_steps = workload.task_num_steps.tolist()
        self._call_task = workload.call_task.tolist()
        self._call_in = workload.call_input_tokens.tolist()
        self._call_out = workload.call_output_tokens.tolist()
        self._call_prefix_row = workload.call_prefix_row.tolist()
        self._call_tool = workload.call_tool_after_s.tolist()
        self._call_prio = workload.task_priority[workload.call_task].tolist()
        self._itl_hist = np.zeros(_ITL_EDGES.size - 1, dtype=np.int64)
        self._itl_values: list[float] = []
        self._itl_weights: list[float] = []
        self._num_steps = 0
        self._num_skipped = 0
        self._needs_kv = router.kind == "kv_aware"
        self._skip_decode = self.options.skip_decode
        self._paranoid = self.options.check_invariants
        self._block_size = replicas[0].config.block_size
        self._outstanding = [0] * len(replicas)
        """``drivers[i].outstanding_requests`` for every ``i``, kept in step with them."""
        self._least_outstanding = router.kind == "least_outstanding_requests"
        """Route with ``Router.route_all_eligible`` over ``_outstanding``: valid because the
        simulator never marks a replica unready nor pins a revision, so every replica is
        always eligible (with ``check_invariants`` the full ``route`` decides and the two
        are checked against each other)."""
        self.gateway = gateway
        if gateway is not None:
            self._init_gateway(workload)
        self.faults = list(faults)
        self.autoscaler = autoscaler
        if autoscaler is not None and new_replica is None:
            raise ValueError("an autoscaler needs new_replica to build the replicas it adds")
        self._new_replica = new_replica
        self._initial_replicas = len(replicas)
        self._all_eligible = True
        """Every replica is ready (no fault, no scaling yet): the router's shortcut holds."""
        self._slowdown = 1.0
        self._num_lost_calls = 0
        self._scale_events: list[tuple[float, int]] = []
        """(time, replicas provisioned) after every change of the pool."""
        self._window_wait_s = 0.0
        self._window_admitted = 0
        self._window_tokens = 0
        self._window_finished = 0
        self._window_missed = 0
        """Calls completed, and of them past their class's ``e2e_s``, since the last
        autoscaler evaluation."""
        self._services = [
            DownstreamService(DownstreamConfig.from_service(workload.spec.services[name]))
            for name in workload.service_names
        ]
        self._call_service = workload.call_tool_service.tolist()
        self._num_tool_failures = 0
        self._tool_retries = 0
        self._init_duplicates(workload)
        self._disagg = disaggregation
        self._num_prefill = 0 if disaggregation is None else disaggregation.prefill_replicas
        """Replicas ``0..n-1`` only prefill (0: not disaggregated)."""
        self._decode_router = Router(kind=router.kind, affinity_slack=router.affinity_slack)
        """Picks among the decode replicas (its own turn and affinity memory)."""
        self._kv_transfer_s = [math.nan] * len(self._call_in)
        self._transferring: dict[int, int] = {}
        """Rows whose prompt KV is on its way to their decode replica: the transfer's number
        (a ``_KV_ARRIVED`` event for another number is void)."""
        self._prefill_void: set[tuple[int, int]] = set()
        """``(row, prefill replica)`` of attempts withdrawn while the step that ends their
        prefill ran: no transfer follows (the row may meanwhile retry elsewhere)."""
        self._on_decode: set[int] = set()
        """Rows added to their decode replica (its request counts the tokens after the
        first: the prefill replica emitted that one)."""
        self._num_transfers = 0
        self._transfer_s_total = 0.0

    # ------------------------------------------------------------------ main loop

    def run(self) -> SimOutcome:
        """Simulate until every call has finished or been cancelled."""
        w = self.w
        arrivals = w.task_arrival_s.tolist()
        events = self.events
        horizon = max(w.duration_s, arrivals[-1] if arrivals else 0.0)
        samples = self.options.sample_points
        sample_times = np.linspace(0.0, horizon, samples) if samples > 0 else np.empty(0)
        for t in sample_times.tolist():
            events.push(t, SAMPLE, _SAMPLE)
        for i, fault in enumerate(self.faults):
            events.push(fault.at_s, DISPATCH, _FAULT, i)
            if isinstance(fault, Slowdown):
                events.push(fault.until_s, DISPATCH, _FAULT, i, 1)
        if self.autoscaler is not None:
            events.push(0.0, DISPATCH, _AUTOSCALE)
        self._horizon_s = horizon
        self._timeline: list[tuple[float, int, int, float]] = []
        self._boundary_samples: list[tuple[int, int, int]] = []
        next_task = 0
        num_tasks = len(arrivals)
        num_events = 0
        now = 0.0
        heap = events._heap  # the loop peeks at the top without a method call
        while True:
            if next_task < num_tasks and (
                not heap or (arrivals[next_task], DISPATCH) < (heap[0][0], heap[0][1])
            ):
                now = arrivals[next_task]
                self._dispatch_step(next_task, 0, now)
                next_task += 1
                num_events += 1
                continue
            if not heap:
                break
            now, _, _, kind, a, b = events.pop()
            num_events += 1
            if kind == _BOUNDARY:
                driver = self.drivers[a]
                if b == driver.version:
                    self._boundary(driver, now)
            elif kind == _STEP_DISPATCH:
                self._dispatch_step(a, b, now)
            elif kind == _SAMPLE:
                self._sample(now)
            elif kind == _GATEWAY_EXPIRY:
                self._pump(now)
            elif kind == _RETRY:
                self._backing_off.discard(a)
                if self._outcome[a] == _IN_FLIGHT:  # not cancelled while it backed off
                    if self.gateway is None:
                        self._dispatch_call(a, now)
                    else:
                        self._offer(a, now)
            elif kind == _PATIENCE:
                self._patience_over(a, now)
            elif kind == _ATTEMPT_TIMEOUT:
                self._attempt_timed_out(a, b, now)
            elif kind == _FAULT:
                self._fault(a, b, now)
            elif kind == _AUTOSCALE:
                self._autoscale(now)
            elif kind == _REPLICA_READY:
                self._replica_ready(a, now)
            elif kind == _TOOL_CALL:
                self._tool_call(a, b, now)
            elif kind == _TOOL_FAILED:
                self._tool_failed(a, b, now)
            elif kind == _DUPLICATE:
                self._duplicate(a, now)
            elif kind == _KV_ARRIVED:
                self._kv_arrived(a, b, now)
        self._flush_itl()
        self._settle_output_tokens()
        timeline = np.array(self._timeline) if self._timeline else np.zeros((0, 4))
        at = np.array(self._boundary_samples) if self._boundary_samples else np.zeros((0, 3))
        return SimOutcome(
            calls=self._call_records(),
            task_finish_s=self.task_finish_s,
            timeline_s=timeline[:, 0].astype(np.float64),
            timeline_running=timeline[:, 1].astype(np.int64),
            timeline_waiting=timeline[:, 2].astype(np.int64),
            timeline_kv_usage=timeline[:, 3].astype(np.float64),
            itl_histogram=self._itl_hist,
            itl_edges_s=_ITL_EDGES,
            num_steps=self._num_steps,
            num_skipped_steps=self._num_skipped,
            num_events=num_events,
            end_s=now,
            replica_num_blocks=self.drivers[0].model.scheduler.pool.num_blocks,
            replica_block_size=self._block_size,
            gateway_preset="fifo-unbounded" if self.gateway is None else "headway-default",
            cancelled_by_patience=self._num_impatient,
            prefix_queried_tokens=sum(
                d.model.scheduler.num_prefix_queried_tokens for d in self.drivers
            ),
            prefix_hit_tokens=sum(d.model.scheduler.num_prefix_hit_tokens for d in self.drivers),
            replica_s=sum(
                (now if d.stopped_s is None else d.stopped_s) - d.started_s for d in self.drivers
            ),
            replicas_provisioned_max=max(
                [self._initial_replicas] + [n for _, n in self._scale_events]
            ),
            calls_lost_with_replicas=self._num_lost_calls,
            tool_failures=self._num_tool_failures,
            tool_retries=self._tool_retries,
            duplicates_sent=self._duplicates_sent,
            duplicates_coalesced=self._duplicates_coalesced,
            duplicate_output_tokens=self._duplicate_tokens,
            task_end_s=np.array(self._task_end_s, dtype=np.float64),
            timeline_tasks=at[:, 0].astype(np.int64),
            timeline_calls=at[:, 1].astype(np.int64),
            timeline_kv_blocks=at[:, 2].astype(np.int64),
            kv_transfers=self._num_transfers,
            kv_transfer_s_total=self._transfer_s_total,
        )

    def _call_records(self) -> CallRecords:
        """The per-call lists as the arrays of :class:`CallRecords`: one row per call of
        the workload; a call its client's duplicate answered takes the duplicate's
        timings (the user saw that copy), keeping its own arrival."""
        n = self.w.num_calls
        dispatch_s, admitted_s = self._dispatch_s, self._admitted_s
        first_token_s, itl_max_s, replica = self._first_token_s, self._itl_max_s, self._replica
        for j, d in self._answered_by.items():
            dispatch_s[j], admitted_s[j] = dispatch_s[d], admitted_s[d]
            first_token_s[j], itl_max_s[j], replica[j] = first_token_s[d], itl_max_s[d], replica[d]
            self._num_output_tokens[j] = self._num_output_tokens[d]
            self._kv_transfer_s[j] = self._kv_transfer_s[d]
        return CallRecords(
            dispatch_s=np.array(dispatch_s[:n], dtype=np.float64),
            admitted_s=np.array(admitted_s[:n], dtype=np.float64),
            first_token_s=np.array(first_token_s[:n], dtype=np.float64),
            finish_s=np.array(self._finish_s[:n], dtype=np.float64),
            num_output_tokens=np.array(self._num_output_tokens[:n], dtype=np.int64),
            itl_max_s=np.array(itl_max_s[:n], dtype=np.float64),
            num_preemptions=np.array(self._num_preemptions[:n], dtype=np.int64),
            replica=np.array(replica[:n], dtype=np.int64),
            cancelled=np.array(self._cancelled[:n], dtype=np.bool_),
            arrival_s=np.array(self._arrival_s[:n], dtype=np.float64),
            outcome=np.array(
                [_FAILED if o == _IN_FLIGHT else o for o in self._outcome[:n]], dtype=np.int8
            ),
            shed_reason=np.array(self._shed_reason[:n], dtype=np.int8),
            retry_after_s=np.array(self._retry_after_s[:n], dtype=np.float64),
            attempts=np.array(self._attempts[:n], dtype=np.int64),
            kv_transfer_s=np.array(self._kv_transfer_s[:n], dtype=np.float64),
        )

    # ------------------------------------------------------------------ tasks and calls

    def _dispatch_step(self, task: int, step: int, now: float) -> None:
        """Send the calls of a task's step to the router."""
        if step == 0:
            self._live_tasks += 1
        branches = self._calls_per_step[self._task_class[task]]
        first = self._call_first[task] + step * branches
        self._task_step[task] = step
        self._task_left[task] = branches
        if self.gateway is None:
            for j in range(first, first + branches):
                self._dispatch_call(j, now)
        else:
            for j in range(first, first + branches):
                self._offer(j, now)

    def _dispatch_call(self, j: int, now: float) -> None:
        """Without a gateway: the attempt is offered and dispatched at once."""
        self._attempts[j] += 1
        if self._attempts[j] == 1:
            self._first_attempt(j, now)
        choice = self._route(j, now)
        if choice < 0:
            self._retry_or_end(j, now, FailureKind.CONNECT_ERROR, _FAILED)
            return
        self._start_attempt_timer(j, now)
        self._send(j, choice, now)

    def _first_attempt(self, j: int, now: float) -> None:
        """Call ``j`` is offered for the first time: it is in flight, its client counts
        one original request against the retry budget, and its patience starts."""
        self._arrival_s[j] = now
        self._outcome[j] = _IN_FLIGHT
        self._live_calls += 1
        self._retry_policy.record_request(now)
        if self._patience_s is not None:
            self.events.push(now + self._patience_s[j], DISPATCH, _PATIENCE, j)
        if j in self._dup_row:
            self.events.push(now + self._duplicate_after_s, DISPATCH, _DUPLICATE, j)

    def _duplicate(self, j: int, now: float) -> None:
        """Call ``j``'s client has waited ``duplicate_after_s`` without a token and submits
        the same call again (seed 000). A gateway recognises the idempotency key and
        attaches it to the call in flight; without one it is new work for the replicas."""
        if self._outcome[j] != _IN_FLIGHT or self._first_token_s[j] <= now:
            return
        if self.gateway is not None:
            self._duplicates_coalesced += 1
            return
        d = self._dup_row[j]
        choice = self._route(d, now)
        if choice < 0:
            return
        self._duplicates_sent += 1
        self._arrival_s[d] = now
        self._outcome[d] = _IN_FLIGHT
        self._send(d, choice, now)

    def _route(self, j: int, now: float) -> int:
        """The replica the router picks for call ``j`` at ``now`` (disaggregated: among
        the prefill replicas)."""
        if self._num_prefill:
            return self._route_pool(j, now, 0, self._num_prefill, self.router)
        prompt, output = self._call_in[j], self._call_out[j]
        if self._least_outstanding and self._all_eligible and not self._paranoid:
            choice = self.router.route_all_eligible(self._outstanding)
        else:
            request = RouteRequest(
                prompt_tokens=prompt,
                expected_output_tokens=output,
                projected_kv_blocks=-(-(prompt + output) // self._block_size),
            )
            if self._needs_kv:
                for d in self.drivers:
                    self._materialize(d, now)
            picked = self.router.route(now, request, self.drivers)
            if picked is None:
                return -1  # every replica is lost, starting or draining
            if (
                self._least_outstanding
                and self._all_eligible
                and picked != self.router.route_all_eligible(self._outstanding)
            ):
                raise RuntimeError(f"call {j}: the router picked {picked}, the shortcut not")
            choice = picked
        return choice

    def _route_pool(self, r: int, now: float, lo: int, hi: int, router: Router) -> int:
        """Disaggregated: the replica in ``lo..hi - 1`` that ``router`` picks for row ``r``
        (every replica is eligible: no faults nor autoscaler with disaggregation)."""
        if self._least_outstanding and not self._paranoid:
            return lo + router.route_all_eligible(self._outstanding[lo:hi])
        prompt, output = self._call_in[r], self._call_out[r]
        request = RouteRequest(
            prompt_tokens=prompt,
            expected_output_tokens=output,
            projected_kv_blocks=-(-(prompt + output) // self._block_size),
        )
        pool = self.drivers[lo:hi]
        if self._needs_kv:
            for d in pool:
                self._materialize(d, now)
        picked = router.route(now, request, pool)
        if picked is None:
            return -1
        if self._least_outstanding and picked != router.route_all_eligible(
            self._outstanding[lo:hi]
        ):
            raise RuntimeError(f"row {r}: the router picked {lo + picked}, the shortcut not")
        return lo + picked

    def _send(self, j: int, choice: int, now: float) -> None:
        """Add call ``j`` to replica ``choice`` at ``now`` (disaggregated: to a prefill
        replica, for its first token only)."""
        prompt, output = self._call_in[j], self._call_out[j]
        driver = self.drivers[choice]
        self._materialize(driver, now)
        req = EngineRequest(
            j,
            num_prompt_tokens=prompt,
            max_output_tokens=1 if self._num_prefill else output,
            priority=self._call_prio[j],
            block_hashes=self._block_hashes(j),
        )
        driver.model.add_request(req, now)
        driver.outstanding_requests += 1
        self._outstanding[choice] += 1
        driver.outstanding_tokens += prompt + (1 if self._num_prefill else output)
        if self.gateway is not None:
            driver.reserved_kv_blocks += self._projected_kv_blocks(j)
        self._dispatch_s[j] = now
        self._replica[j] = choice
        if driver.state == _IDLE:
            driver.state = _STEP
            driver.step_result = None
            driver.version += 1
            self.events.push(now, BOUNDARY, _BOUNDARY, choice, driver.version)

    def _block_hashes(self, j: int) -> list[int]:
        """Prefix-block hashes of call ``j`` at the engine's block size: from its replayed
        trace row's ``hash_ids`` (Mooncake), so calls sharing a prefix share KV blocks;
        none for calls without them (their blocks get request-unique hashes)."""
        row = self._call_prefix_row[j]
        if row < 0:
            return []
        ids, block_tokens = self.w.prefix_hash_ids[row]
        return expand_block_hashes(
            ids.tolist(),
            self._call_in[j],
            block_size=self._block_size,
            source_block_tokens=block_tokens,
        )

    def _call_finished(self, r: int, now: float, driver: _Driver) -> None:
        """Engine request ``r`` finished: a call, or a client's duplicate of one. The first
        copy to finish answers the call; a copy finishing after it was wasted work."""
        if self._num_prefill:
            if driver.index < self._num_prefill:
                if self._call_out[r] > 1:
                    self._prefill_finished(r, now, driver)
                    return  # its output is 1: the call ends here, counted as below
            else:
                self._on_decode.discard(r)
        self._finish_s[r] = now
        self._num_output_tokens[r] = self._call_out[r]  # a finished call emitted all
        driver.outstanding_requests -= 1
        self._outstanding[driver.index] -= 1
        driver.outstanding_tokens -= self._call_in[r] + self._call_out[r]
        if self.gateway is not None:
            self._measure_speeds(r, now)
            self._left_replicas(r)
            self._pump(now)
        j = r
        if r >= self.w.num_calls:
            j = self._dup_of[r - self.w.num_calls]
            self._outcome[r] = _COMPLETED
            if self._outcome[j] == _IN_FLIGHT:
                self._answered_by[j] = r
                self._finish_s[j] = now
            else:
                self._duplicate_tokens += self._call_out[r]
        elif self._outcome[j] != _IN_FLIGHT:
            self._duplicate_tokens += self._call_out[r]  # its duplicate answered first
            return
        if self._outcome[j] != _IN_FLIGHT:
            return
        self._outcome[j] = _COMPLETED
        self._live_calls -= 1
        task = self._call_task[j]
        if self.autoscaler is not None:
            bound_s = self._class_e2e_s[self._task_class[task]]
            self._window_finished += 1
            if bound_s is not None and now - self._arrival_s[j] > bound_s:
                self._window_missed += 1
        if self._task_left[task] <= 0:  # a losing branch finishing after the winner
            return
        if self._join_first[self._task_class[task]]:
            self._task_left[task] = 0
            self._cancel_siblings(task, j, now)
        else:
            self._task_left[task] -= 1
            if self._task_left[task] > 0:
                return
        step = self._task_step[task]
        if step + 1 >= self._task_steps[task]:
            self.task_finish_s[task] = now
            self._task_ended(task, now)
            return
        if self._call_service[j] >= 0 and self.w.call_tool_count[j] > 0:
            self._tool_call(j, 0, now)
            return
        tool_s = self._call_tool[j]
        self.events.push(now + tool_s, DISPATCH, _STEP_DISPATCH, task, step + 1)

    def _tool_call(self, j: int, code: int, now: float) -> None:
        """A tool call after call ``j``'s step goes to its downstream service at ``now``
        (``code``: the tool call's index × ``_ATTEMPT_CODES`` + its attempt, 0 for the
        first); its response starts the next tool call, or the task's next step. A call
        that times out or is refused is retried by the agent under the clients' retry
        policy (the abandoned work still holds its connection: seed 000's pool), or ends
        the task (its later calls are not offered)."""
        w = self.w
        index = code // _ATTEMPT_CODES
        service = self._services[self._call_service[j]]
        service_s = float(w.tool_service_s[int(w.call_tool_first[j]) + index])
        result = service.submit(now, service_s)
        if result.timed_out or result.refused:
            self._num_tool_failures += 1
            self.events.push(result.response_s, DISPATCH, _TOOL_FAILED, j, code)
            return
        if index + 1 < int(w.call_tool_count[j]):
            self.events.push(
                result.response_s, DISPATCH, _TOOL_CALL, j, (index + 1) * _ATTEMPT_CODES
            )
            return
        task = self._call_task[j]
        self.events.push(
            result.response_s, DISPATCH, _STEP_DISPATCH, task, self._task_step[task] + 1
        )

    def _tool_failed(self, j: int, code: int, now: float) -> None:
        """The agent of call ``j``'s task sees tool call ``code`` time out (or refused)."""
        attempt = code % _ATTEMPT_CODES + 1
        k = self._task_class[self._call_task[j]]
        outcome = AttemptOutcome(kind=FailureKind.TIMEOUT, idempotent=self._class_idempotent[k])
        retry = self._retry_policy.next_attempt(now, attempt, outcome, None, self._retry_rng)
        if isinstance(retry, RetryAfter):
            self._tool_retries += 1
            self.events.push(now + retry.delay_s, DISPATCH, _TOOL_CALL, j, code + 1)
            return
        self._task_ended(self._call_task[j], now)

    def _cancel_siblings(self, task: int, winner: int, now: float) -> None:
        branches = self._calls_per_step[self._task_class[task]]
        first = self._call_first[task] + self._task_step[task] * branches
        for j in range(first, first + branches):
            if j == winner or self._outcome[j] != _IN_FLIGHT:
                continue
            self._cancel_call(j, now)
        if self.gateway is not None:
            self._pump(now)

    def _cancel_call(self, j: int, now: float) -> bool:
        """Cancel live call ``j`` wherever it is: in a replica (aborted, its KV blocks
        freed at once), queued at the gateway (it leaves when it reaches the head), or
        waiting to retry. False when its replica had already finished it."""
        if not self._withdraw(j, now):
            return False
        d = self._dup_row.get(j, -1)
        if d >= 0 and self._outcome[d] == _IN_FLIGHT and self._withdraw(d, now):
            self._outcome[d] = _CANCELLED
        self._cancelled[j] = True
        self._outcome[j] = _CANCELLED
        self._live_calls -= 1
        self._finish_s[j] = now
        return True

    def _withdraw(self, j: int, now: float) -> bool:
        """Take live call ``j``'s current attempt out of wherever it is (a replica, the
        gateway's queues, or nowhere while it backs off); False when its replica had
        already finished it."""
        replica = self._replica[j]
        if replica < 0:
            if j in self._queued:
                self._queued.discard(j)
                self._gateway_ended(j)
            return True
        if self._num_prefill and self._withdraw_disaggregated(j, now):
            return True
        driver = self.drivers[replica]
        self._materialize(driver, now)
        req = driver.model.scheduler.get_request(j)
        if req is None or not driver.model.abort(j):
            return False
        self._num_output_tokens[j] = req.num_output_tokens
        driver.outstanding_requests -= 1
        self._outstanding[replica] -= 1
        tokens = self._call_in[j] + self._call_out[j]
        if replica < self._num_prefill:
            tokens = self._call_in[j] + 1
        elif j in self._on_decode:
            self._on_decode.discard(j)
            self._num_output_tokens[j] += 1  # the first token came from the prefill replica
        driver.outstanding_tokens -= tokens
        if self.gateway is not None:
            self._left_replicas(j)
        return True

    # ------------------------------------------------------------------ disaggregation

    def _prefill_finished(self, r: int, now: float, driver: _Driver) -> None:
        """Row ``r`` emitted its first token on prefill replica ``driver``: pick its decode
        replica (the decode pool's router) and start moving its prompt KV there."""
        driver.outstanding_requests -= 1
        self._outstanding[driver.index] -= 1
        driver.outstanding_tokens -= self._call_in[r] + 1
        if (r, driver.index) in self._prefill_void:  # withdrawn during its last prefill step
            self._prefill_void.discard((r, driver.index))
            return
        disagg = self._disagg
        assert disagg is not None
        choice = self._route_pool(r, now, self._num_prefill, len(self.drivers), self._decode_router)
        assert choice >= 0  # every decode replica is always eligible
        target = self.drivers[choice]
        target.outstanding_requests += 1
        self._outstanding[choice] += 1
        target.outstanding_tokens += self._call_in[r] + self._call_out[r]
        self._replica[r] = choice
        prompt = self._call_in[r]
        transfer_s = disagg.kv_transfer_latency_s + prompt * disagg.kv_transfer_s_per_token
        self._kv_transfer_s[r] = transfer_s
        self._num_transfers += 1
        self._transfer_s_total += transfer_s
        self._transferring[r] = self._num_transfers
        self.events.push(now + transfer_s, DISPATCH, _KV_ARRIVED, r, self._num_transfers)

    def _kv_arrived(self, r: int, transfer: int, now: float) -> None:
        """Row ``r``'s prompt KV reached its decode replica: it joins that replica's queue
        with the prompt and the first token known, the prompt's KV computed (external),
        and its other ``output - 1`` tokens to generate."""
        if self._transferring.get(r) != transfer:
            return  # withdrawn during the transfer
        del self._transferring[r]
        choice = self._replica[r]
        driver = self.drivers[choice]
        self._materialize(driver, now)
        prompt = self._call_in[r]
        req = EngineRequest(
            r,
            num_prompt_tokens=prompt + 1,
            max_output_tokens=self._call_out[r] - 1,
            priority=self._call_prio[r],
            num_external_computed_tokens=prompt,
        )
        driver.model.add_request(req, now)
        self._on_decode.add(r)
        if driver.state == _IDLE:
            driver.state = _STEP
            driver.step_result = None
            driver.version += 1
            self.events.push(now, BOUNDARY, _BOUNDARY, choice, driver.version)

    def _withdraw_disaggregated(self, j: int, now: float) -> bool:
        """:meth:`_withdraw` for a row between the pools: its KV in transfer (cancelled;
        the decode replica's count given back), or its prefill done in the step in flight
        (the transfer that step's end would start is void). False for the others."""
        if j in self._transferring:
            del self._transferring[j]
            driver = self.drivers[self._replica[j]]
            driver.outstanding_requests -= 1
            self._outstanding[driver.index] -= 1
            driver.outstanding_tokens -= self._call_in[j] + self._call_out[j]
            self._num_output_tokens[j] = 1
            return True
        replica = self._replica[j]
        if replica >= self._num_prefill or self._call_out[j] <= 1:
            return False
        driver = self.drivers[replica]
        self._materialize(driver, now)
        if driver.model.scheduler.get_request(j) is not None:
            return False  # still prefilling: aborted there as usual
        # Its last prefill step is in flight: the step ends, the call does not go on.
        self._prefill_void.add((j, replica))
        self._num_output_tokens[j] = 1
        return True

    def _patience_over(self, j: int, now: float) -> None:
        """Call ``j``'s client stops waiting: no token by ``now``, so it cancels."""
        if self._outcome[j] != _IN_FLIGHT or self._first_token_s[j] <= now:
            return
        if not self._cancel_call(j, now):
            return
        self._num_impatient += 1
        if self.gateway is not None:
            self._pump(now)
        self._call_unserved(j, now)

    # ------------------------------------------------------------------ faults and scaling

    def _fault(self, index: int, ending: int, now: float) -> None:
        """Apply fault ``index`` at ``now`` (``ending``: a slowdown's end)."""
        fault = self.faults[index]
        if isinstance(fault, Slowdown):
            factor = fault.factor if not ending else 1.0 / fault.factor
            self._slowdown *= factor
            for d in self.drivers:
                if d.alive:
                    self._materialize(d, now)  # steps begun before now keep their speed
                    d.model.set_time_scale(self._slowdown)
        elif isinstance(fault, CacheFlush):
            for d in self.drivers:
                if d.alive:
                    self._materialize(d, now)
                    d.model.scheduler.pool.drop_cached()
        else:
            live = [d for d in self.drivers if d.alive and d.pending_loss is None]
            for d in live[::-1][: fault.replicas]:
                if fault.phase == "any":
                    self._lose(d, now)
                else:
                    d.pending_loss = fault.phase

    def _lose(self, driver: _Driver, now: float) -> None:
        """Replica ``driver`` fails at ``now``: the attempts on it fail (their clients may
        retry them elsewhere), and the router never chooses it again."""
        self._materialize(driver, now)
        sched = driver.model.scheduler
        live = [cast("int", r.request_id) for r in (*sched.running, *sched.waiting())]
        # Requests that finish in the step (or run) in flight: that step never ends.
        in_flight_step = driver.pending_finished
        if driver.step_result is not None:
            in_flight_step = cast("tuple[int, ...]", driver.step_result.finished_ids)
        driver.alive = driver.ready = False
        driver.pending_loss = None
        driver.state = _IDLE
        driver.version += 1  # its pending boundary is void
        driver.stopped_s = now
        self._all_eligible = False
        self._provisioned_changed(now)
        for j in (*live, *in_flight_step):
            if self._first_token_s[j] > now:  # emitted at the end of the lost step
                self._first_token_s[j] = math.nan
            driver.model.abort(j)
            driver.outstanding_requests -= 1
            self._outstanding[driver.index] -= 1
            driver.outstanding_tokens -= self._call_in[j] + self._call_out[j]
            if j >= self.w.num_calls:  # a client's duplicate: its call is still waiting
                self._outcome[j] = _FAILED
                continue
            if self.gateway is not None:
                self._left_replicas(j)
            self._num_lost_calls += 1
            self._retry_or_end(j, now, FailureKind.UPSTREAM_ERROR, _FAILED)
        if self.gateway is not None:
            self._set_gateway_replicas(now)

    def _strike_pending_loss(self, driver: _Driver, now: float, prefill: bool) -> bool:
        """Lose ``driver`` now if a loss waits for a step of the phase it starts."""
        phase = driver.pending_loss
        if phase is None or (phase == "prefill") != prefill:
            return False
        self._lose(driver, now)
        return True

    def _provisioned_changed(self, now: float) -> None:
        up = sum(1 for d in self.drivers if d.stopped_s is None)
        self._scale_events.append((now, up))

    def _set_gateway_replicas(self, now: float) -> None:
        """The gateway's dispatch slots follow the ready replicas."""
        assert self.gateway is not None
        self.gateway.set_replicas(sum(1 for d in self.drivers if d.ready))
        self._pump(now)

    def _autoscale(self, now: float) -> None:
        """The autoscaler reads its signals over the last interval and acts."""
        scaler = self.autoscaler
        assert scaler is not None
        interval_s = scaler.config.evaluation_interval_s
        ready = [d for d in self.drivers if d.ready]
        starting = sum(1 for d in self.drivers if d.alive and not d.ready and not d.draining)
        signals = AutoscalerSignals(
            ready_replicas=len(ready),
            starting_replicas=starting,
            queue_delay_s=(
                self._window_wait_s / self._window_admitted if self._window_admitted else 0.0
            ),
            admitted_tokens_per_s=self._window_tokens / interval_s,
            kv_occupancy=(sum(d.model.kv_usage for d in ready) / len(ready)) if ready else 1.0,
            deadline_miss_ratio=(
                self._window_missed / self._window_finished if self._window_finished else 0.0
            ),
        )
        self._window_wait_s, self._window_admitted, self._window_tokens = 0.0, 0, 0
        self._window_finished = self._window_missed = 0
        decision = scaler.decide(now, signals)
        if isinstance(decision, ScaleUp):
            assert self._new_replica is not None
            for _ in range(decision.count):
                driver = _Driver(len(self.drivers), self._new_replica())
                driver.ready = False
                driver.started_s = now
                self.drivers.append(driver)
                self._outstanding.append(0)
                self.events.push(decision.ready_at_s, DISPATCH, _REPLICA_READY, driver.index)
            self._all_eligible = False
            self._provisioned_changed(now)
        elif isinstance(decision, ScaleDown):
            for d in ready[::-1][: decision.count]:
                d.ready = False
                d.draining = True
                self._all_eligible = False
                if not d.model.scheduler.has_unfinished_requests:
                    d.alive = False
                    d.stopped_s = now
            self._provisioned_changed(now)
            if self.gateway is not None:
                self._set_gateway_replicas(now)
        busy = any(d.model.scheduler.has_unfinished_requests for d in self.drivers)
        if now + interval_s <= self._horizon_s or busy:
            self.events.push(now + interval_s, DISPATCH, _AUTOSCALE)

    def _replica_ready(self, index: int, now: float) -> None:
        """A replica the autoscaler started is ready for traffic."""
        driver = self.drivers[index]
        if not driver.alive or driver.draining:
            return
        driver.ready = True
        if self.gateway is not None:
            self._set_gateway_replicas(now)

    # ------------------------------------------------------------------ the gateway

    def _init_gateway(self, workload: CompiledWorkload) -> None:
        """Per-call inputs of admission: tenant, band, deadline budgets, p95 output."""
        spec = workload.spec
        self._call_tenant = [
            workload.tenant_names[t] for t in workload.task_tenant[workload.call_task].tolist()
        ]
        call_class = workload.task_class[workload.call_task]
        outputs = workload.call_output_tokens
        self._class_p95_output = [
            int(np.percentile(outputs[call_class == k], 95)) if (call_class == k).any() else 0
            for k in range(len(workload.class_names))
        ]
        self._class_max_tokens = [spec.classes[c].max_tokens for c in workload.class_names]
        self._prefill_tokens_per_s: float | None = None
        self._tpot_s: float | None = None
        self._ticket: dict[int, int] = {}
        """Per call: the retry ticket of its last shed, presented with its next retry."""

    def _init_clients(self, workload: CompiledWorkload) -> None:
        """The clients' retry policy (the workload's ``clients.retries`` and its budget),
        per-attempt timeout and the per-class inputs of deadlines and retries."""
        spec = workload.spec
        retries = spec.clients.retries
        self._retry_policy = RetryPolicy(
            RetryConfig(
                max_attempts=retries.max_attempts,
                backoff_base_s=retries.backoff_base_s,
                backoff_max_s=max(retries.backoff_max_s, retries.backoff_base_s),
                jitter=retries.jitter,
                honour_retry_after=retries.honour_retry_after,
                budget=retries.budget_ratio is not None,
                budget_ratio=0.1 if retries.budget_ratio is None else retries.budget_ratio,
                budget_window_s=retries.budget_window_s,
            )
        )
        self._retry_rng = np.random.default_rng([workload.seed, _RETRY_STREAM])
        self._attempt_timeout_s = retries.timeout_s
        classes = [spec.classes[c] for c in workload.class_names]
        self._class_idempotent = [c.idempotent for c in classes]
        self._task_arrival = workload.task_arrival_s.tolist()
        self._class_e2e_s = [c.slo.e2e_s for c in classes]
        self._class_task_deadline_s = [c.slo.task_deadline_s for c in classes]

    def _init_duplicates(self, workload: CompiledWorkload) -> None:
        """Rows for the duplicates clients may submit: each call's client is drawn once
        (``duplicate_probability``, seeded) to resubmit if still waiting after
        ``duplicate_after_s``; a drawn call gets a row past the workload's calls, a copy of
        its inputs, used only if the duplicate is sent."""
        clients = workload.spec.clients
        self._dup_of: list[int] = []
        self._dup_row: dict[int, int] = {}
        self._answered_by: dict[int, int] = {}
        self._duplicates_sent = self._duplicates_coalesced = self._duplicate_tokens = 0
        self._duplicate_after_s = clients.duplicate_after_s or 0.0
        if clients.duplicate_after_s is None or clients.duplicate_probability <= 0:
            return
        n = workload.num_calls
        rng = np.random.default_rng([workload.seed, _DUPLICATE_STREAM])
        chosen = np.flatnonzero(rng.random(n) < clients.duplicate_probability).tolist()
        self._dup_of = chosen
        self._dup_row = {j: n + k for k, j in enumerate(chosen)}
        for inputs in (
            self._call_in,
            self._call_out,
            self._call_prio,
            self._call_prefix_row,
            self._call_task,
            self._call_tool,
            self._call_service,
        ):
            inputs.extend([inputs[j] for j in chosen])
        m = len(chosen)
        nan = math.nan
        for column in (
            self._dispatch_s,
            self._admitted_s,
            self._first_token_s,
            self._finish_s,
            self._last_token_s,
            self._arrival_s,
            self._retry_after_s,
        ):
            column.extend([nan] * m)
        self._num_output_tokens.extend([0] * m)
        self._itl_max_s.extend([0.0] * m)
        self._num_preemptions.extend([0] * m)
        self._replica.extend([-1] * m)
        self._cancelled.extend([False] * m)
        self._outcome.extend([_NOT_OFFERED] * m)
        self._shed_reason.extend([-1] * m)
        self._attempts.extend([0] * m)

    def _start_attempt_timer(self, j: int, now: float) -> None:
        """The client's per-attempt timeout for the attempt of call ``j`` sent at ``now``."""
        if self._attempt_timeout_s is not None:
            self.events.push(
                now + self._attempt_timeout_s, DISPATCH, _ATTEMPT_TIMEOUT, j, self._attempts[j]
            )

    def _attempt_timed_out(self, j: int, attempt: int, now: float) -> None:
        """The client's timeout for attempt ``attempt`` of call ``j`` fires: with no first
        token yet, the client abandons the attempt (cancelled where it is) and retries it
        under its retry policy, or gives up (``timed_out``)."""
        if (
            self._outcome[j] != _IN_FLIGHT
            or self._attempts[j] != attempt
            or j in self._backing_off  # that attempt already failed otherwise
            or self._first_token_s[j] <= now
        ):
            return
        if not self._withdraw(j, now):
            return
        if self.gateway is not None:
            self._pump(now)
        self._retry_or_end(j, now, FailureKind.TIMEOUT, _TIMED_OUT)

    def _retry_or_end(self, j: int, now: float, kind: FailureKind, final: int) -> None:
        """Call ``j``'s current attempt failed (``kind``) and is out of every replica and
        queue: its client retries it under the retry policy, or the call ends ``final``."""
        deadline_s, renews = self._deadline(j, now)
        outcome = AttemptOutcome(
            kind=kind,
            first_token_received=self._first_token_s[j] <= now,
            idempotent=self._class_idempotent[self._task_class[self._call_task[j]]],
            deadline_s=None if renews else deadline_s,
        )
        retry = self._retry_policy.next_attempt(
            now, self._attempts[j], outcome, None, self._retry_rng
        )
        if isinstance(retry, RetryAfter):
            self._replica[j] = -1
            self._admitted_s[j] = math.nan
            self._dispatch_s[j] = math.nan
            self._first_token_s[j] = math.nan
            self._last_token_s[j] = math.nan
            self._itl_max_s[j] = 0.0
            self._backing_off.add(j)
            self.events.push(now + retry.delay_s, DISPATCH, _RETRY, j)
            return
        self._outcome[j] = final
        self._live_calls -= 1
        self._finish_s[j] = now
        self._call_unserved(j, now)

    def _deadline(self, j: int, now: float) -> tuple[float | None, bool]:
        """The call's absolute deadline and whether a retry renews it: the earlier of its
        task's deadline (fixed) and ``now`` + its class's e2e bound (per call)."""
        task = self._call_task[j]
        k = self._task_class[task]
        task_s = self._class_task_deadline_s[k]
        e2e_s = self._class_e2e_s[k]
        fixed = None if task_s is None else self._task_arrival[task] + task_s
        per_call = None if e2e_s is None else now + e2e_s
        if fixed is None:
            return per_call, True
        if per_call is None or fixed <= per_call:
            return fixed, False
        return per_call, True

    def _offer(self, j: int, now: float) -> None:
        """Offer call ``j`` to the gateway: dispatch, queue or shed it."""
        gateway = self.gateway
        assert gateway is not None
        self._attempts[j] += 1
        if self._attempts[j] == 1:
            self._first_attempt(j, now)
        choice = self._route(j, now)
        if choice < 0:
            self._retry_or_end(j, now, FailureKind.CONNECT_ERROR, _FAILED)
            return
        driver = self.drivers[choice]
        self._materialize(driver, now)
        deadline_s, renews = self._deadline(j, now)
        k = self._task_class[self._call_task[j]]
        request = AdmissionRequest(
            tenant=self._call_tenant[j],
            prompt_tokens=self._call_in[j],
            p95_output_tokens=self._class_p95_output[k],
            max_tokens=self._class_max_tokens[k],
            expected_output_tokens=self._call_out[j],
            priority=BANDS[self._call_prio[j]],
            deadline_s=deadline_s,
            deadline_renews_on_retry=renews,
            ticket=self._ticket.get(j),
        )
        load = gateway.snapshot(
            now,
            free_kv_blocks=max(0, min(driver.free_kv_blocks, self._unpromised_kv_blocks(driver))),
            total_kv_blocks=driver.model.scheduler.pool.num_blocks,
            prefill_tokens_per_s=self._prefill_tokens_per_s,
            tpot_s=self._tpot_s,
        )
        decision = gateway.offer(now, j * _ATTEMPT_CODES + self._attempts[j], request, load)
        if isinstance(decision, Admit):
            gateway.dispatched(request.priority)
            self._start_attempt_timer(j, now)
            self._send(j, choice, now)
        elif isinstance(decision, Enqueue):
            self._queued.add(j)
            self._start_attempt_timer(j, now)
            if deadline_s is not None:
                self.events.push(deadline_s, DISPATCH, _GATEWAY_EXPIRY)
            self._pump(now)
        else:
            retry_after_s = decision.retry_after_s
            self._retry_after_s[j] = math.nan if retry_after_s is None else retry_after_s
            if decision.ticket is not None:
                self._ticket[j] = decision.ticket
            attempt = AttemptOutcome(
                kind=FailureKind.REFUSED,
                idempotent=self._class_idempotent[k],
                deadline_s=None if renews else deadline_s,
            )
            retry = self._retry_policy.next_attempt(
                now, self._attempts[j], attempt, retry_after_s, self._retry_rng
            )
            if isinstance(retry, RetryAfter):
                self._backing_off.add(j)
                self.events.push(now + retry.delay_s, DISPATCH, _RETRY, j)
                return
            self._outcome[j] = _SHED
            self._live_calls -= 1
            self._finish_s[j] = now
            self._shed_reason[j] = _SHED_CODE[decision.reason]
            self._call_unserved(j, now)

    def _projected_kv_blocks(self, j: int) -> int:
        """KV blocks the gateway projects for call ``j``: its prompt plus its ``max_tokens``,
        or its class's p95 output when it sends none (the admission policy's rule)."""
        k = self._task_class[self._call_task[j]]
        max_tokens = self._class_max_tokens[k]
        output: int = self._class_p95_output[k] if max_tokens is None else max_tokens
        tokens: int = self._call_in[j] + output
        return -(-tokens // self._block_size)

    def _unpromised_kv_blocks(self, driver: _Driver) -> int:
        """Blocks of ``driver``'s pool that no dispatched call has been projected to need."""
        num_blocks: int = driver.model.scheduler.pool.num_blocks
        return num_blocks - driver.reserved_kv_blocks

    def _pump(self, now: float) -> None:
        """Dispatch queued calls into free slots, then end the calls that expired.

        Token-aware dispatch: a queued call goes only when the replica the router picks for
        it has unpromised KV blocks for its projection (or nothing is running there, so
        that a call larger than a whole pool still runs); otherwise it keeps its place.
        """
        gateway = self.gateway
        assert gateway is not None
        chosen: list[int] = []

        def fits(queued: Queued[int]) -> bool:
            j = self._live_queued(queued.item)
            if j < 0:
                return True  # cancelled or abandoned while it waited: pop it to drop it
            choice = self._route(j, now)
            if choice < 0:
                return False  # no replica may take it now: it keeps its place
            chosen.append(choice)
            driver = self.drivers[choice]
            return driver.outstanding_requests == 0 or self._projected_kv_blocks(
                j
            ) <= self._unpromised_kv_blocks(driver)

        while (got := gateway.pop(now, fits)) is not None:
            j = self._live_queued(got.item)
            if j < 0:  # cancelled or abandoned while it waited
                gateway.release(got.band)
                continue
            self._queued.discard(j)
            self._send(j, chosen[-1], now)
        for gone in gateway.expire(now):
            j = self._live_queued(gone.item)
            if j < 0:
                continue
            self._queued.discard(j)
            self._outcome[j] = _TIMED_OUT
            self._live_calls -= 1
            self._finish_s[j] = now
            self._gateway_ended(j)
            self._call_unserved(j, now)

    def _live_queued(self, item: int) -> int:
        """The call of a gateway queue item, or -1 when the attempt it queued is over
        (the call was cancelled, or its client abandoned that attempt)."""
        j, attempt = divmod(item, _ATTEMPT_CODES)
        if self._outcome[j] != _IN_FLIGHT or self._attempts[j] != attempt or j not in self._queued:
            return -1
        return j

    def _left_replicas(self, j: int) -> None:
        """A dispatched call finished or was cancelled: free its gateway slot and the KV
        blocks the gateway projected for it."""
        assert self.gateway is not None
        self.gateway.release(BANDS[self._call_prio[j]])
        self.drivers[self._replica[j]].reserved_kv_blocks -= self._projected_kv_blocks(j)
        self._gateway_ended(j)

    def _gateway_ended(self, j: int) -> None:
        assert self.gateway is not None
        self.gateway.ended(self._call_tenant[j])

    def _measure_speeds(self, j: int, now: float) -> None:
        """Fold a completed call into the measured prefill speed and TPOT (EWMAs) that
        admission uses to predict service times."""
        weight = _SPEED_EWMA_WEIGHT
        first_s, admitted_s = self._first_token_s[j], self._admitted_s[j]
        if first_s > admitted_s:
            speed = self._call_in[j] / (first_s - admitted_s)
            old = self._prefill_tokens_per_s
            self._prefill_tokens_per_s = speed if old is None else old + weight * (speed - old)
        out = self._call_out[j]
        if out > 1 and now >= first_s:
            tpot = (now - first_s) / (out - 1)
            prev = self._tpot_s
            self._tpot_s = tpot if prev is None else prev + weight * (tpot - prev)

    def _call_unserved(self, j: int, now: float) -> None:
        """Call ``j`` ended without being served (shed or timed out): its step cannot
        complete (``all``) or has one branch fewer (``first``); a task whose step cannot
        complete ends there, unfinished, and its later calls are never offered."""
        task = self._call_task[j]
        if self._task_left[task] <= 0:
            return
        if self._join_first[self._task_class[task]]:
            self._task_left[task] -= 1
        else:
            self._task_left[task] = 0
        if self._task_left[task] == 0:
            self._task_ended(task, now)

    def _task_ended(self, task: int, now: float) -> None:
        """Task ``task`` left the system at ``now``: finished, or failed (a call or tool
        call it needed ended unserved)."""
        self._task_end_s[task] = now
        self._live_tasks -= 1

    # ------------------------------------------------------------------ replicas

    def _materialize(self, driver: _Driver, now: float) -> None:
        """Apply the steps of a pending decode run that started before ``now``."""
        if driver.state != _RUN:
            return
        start_s, num_steps = driver.run_start_s, driver.run_steps
        # The run's first step started when it was planned; a later step that starts
        # exactly at `now` has not (its boundary would come after this dispatch).
        m = driver.model.decode_steps_starting_before(start_s, now, num_steps)
        m = min(max(m, 1), num_steps)
        applied = driver.model.advance_decode_steps(start_s, m)
        self._record_run(applied)
        self._num_skipped += m - 1
        driver.state = _STEP
        driver.step_result = None
        driver.pending_finished = cast("tuple[int, ...]", applied.finished_ids)
        driver.version += 1
        self.events.push(applied.end_s, BOUNDARY, _BOUNDARY, driver.index, driver.version)

    def _boundary(self, driver: _Driver, now: float) -> None:
        """A step or run ended at ``now``: deliver it, then start the next."""
        model = driver.model
        if driver.state == _RUN:
            run = model.advance_decode_steps(driver.run_start_s, driver.run_steps)
            self._record_run(run)
            self._num_skipped += run.num_steps - 1
            finished = cast("tuple[int, ...]", run.finished_ids)
        elif driver.step_result is not None:
            finished = cast("tuple[int, ...]", driver.step_result.finished_ids)
        else:
            finished = driver.pending_finished
        driver.state = _STEP  # nothing pending: a cancellation below must not re-apply
        driver.step_result = None
        driver.pending_finished = ()
        for j in finished:
            self._call_finished(j, now, driver)
        if self._paranoid:
            model.check_invariants()
        if not model.scheduler.has_unfinished_requests:
            driver.state = _IDLE
            if driver.draining and driver.alive:
                driver.alive = False
                driver.stopped_s = now
                self._provisioned_changed(now)
            return
        if driver.pending_loss is not None and self._strike_pending_loss(
            driver, now, prefill=model.max_identical_decode_steps() < 1
        ):
            return
        steps = model.max_identical_decode_steps() if self._skip_decode else 0
        driver.version += 1
        if steps >= 2:
            driver.state = _RUN
            driver.run_start_s = now
            driver.run_steps = steps
            end_s = model.decode_run_end_s(now, steps)
            self.events.push(end_s, BOUNDARY, _BOUNDARY, driver.index, driver.version)
            return
        result = model.step(now)
        self._num_steps += 1
        self._record_step(result)
        driver.state = _STEP
        driver.step_result = result
        if result.is_empty and not model.num_running:
            # Nothing can run until something changes (a cancellation or an arrival).
            driver.state = _IDLE
            return
        self.events.push(result.end_s, BOUNDARY, _BOUNDARY, driver.index, driver.version)

    # ------------------------------------------------------------------ records

    def _record_step(self, result: StepResult) -> None:
        """Record a step's admissions, preemptions and tokens.

        Requests that emitted their previous token together have the same gap now: each
        such group goes into the ITL histogram as one value weighted by its size (integer
        weights sum exactly, so the histogram is the same as with one value per token).
        Token counts are not kept per step: see :meth:`_settle_output_tokens`.
        """
        end = result.end_s
        admitted_s = self._admitted_s
        for j in cast("tuple[int, ...]", result.admitted_ids):
            if admitted_s[j] != admitted_s[j]:  # NaN: the first admission
                admitted_s[j] = result.start_s
                if self.autoscaler is not None:
                    self._window_wait_s += result.start_s - self._arrival_s[j]
                    self._window_admitted += 1
                    self._window_tokens += self._call_in[j] + self._call_out[j]
        for j in cast("tuple[int, ...]", result.preempted_ids):
            self._num_preemptions[j] += 1
        last = self._last_token_s
        itl_max = self._itl_max_s
        values, weights = self._itl_values, self._itl_weights
        group_t, gap, count = math.nan, 0.0, 0
        for j in cast("Mapping[int, int]", result.tokens):
            previous = last[j]
            if previous != previous:  # NaN: the first token
                self._first_token_s[j] = end
            else:
                if previous != group_t:
                    if count:
                        values.append(gap)
                        weights.append(float(count))
                    group_t, gap, count = previous, end - previous, 0
                count += 1
                if gap > itl_max[j]:
                    itl_max[j] = gap
            last[j] = end
        if count:
            values.append(gap)
            weights.append(float(count))
        if len(values) > 262144:
            self._flush_itl()

    def _record_run(self, run: DecodeRun) -> None:
        """Record ``run.num_steps`` tokens per request of a decode run.

        Step ``k`` of the run lasts ``base + per_kv (KV + (k - 1) R)``: the gaps inside the
        run form an arithmetic progression, summarised for the ITL histogram by a few
        equal chunks (their mean gap, weighted by tokens) instead of one value per token.
        The first gap of each request (since its previous token) is grouped as in
        :meth:`_record_step`.
        """
        self._num_steps += run.num_steps
        m = run.num_steps
        r = run.num_seqs
        base, per_kv, kv = run.base_s, run.per_kv_token_s, run.kv_tokens_first_step
        first_end = run.start_s + base + per_kv * kv
        last_end = run.end_s
        inner_max = base + per_kv * (kv + (m - 1) * r) if m > 1 else 0.0
        last = self._last_token_s
        itl_max = self._itl_max_s
        values, weights = self._itl_values, self._itl_weights
        group_t, gap, peak, count = math.nan, 0.0, 0.0, 0
        for j in cast("tuple[int, ...]", run.request_ids):
            previous = last[j]
            if previous != group_t:
                if count:
                    values.append(gap)
                    weights.append(float(count))
                group_t, gap, count = previous, first_end - previous, 0
                peak = gap if gap > inner_max else inner_max
            count += 1
            if peak > itl_max[j]:
                itl_max[j] = peak
            last[j] = last_end
        if count:
            values.append(gap)
            weights.append(float(count))
        if m > 1:
            # Gaps d_k for k = 2..m; chunk c covers k in [lo, hi).
            chunks = min(m - 1, 4)
            lo = 2
            for c in range(1, chunks + 1):
                hi = 2 + (m - 1) * c // chunks
                mid_k = (lo + hi - 1) / 2
                values.append(base + per_kv * (kv + (mid_k - 1) * r))
                weights.append(float((hi - lo) * r))
                lo = hi
        if len(values) > 262144:
            self._flush_itl()

    def _settle_output_tokens(self) -> None:
        """Fill in the output tokens of calls still live in a replica (none, normally).

        Tokens are not counted step by step: a call that finishes emitted all of its
        output (set in :meth:`_call_finished`), a cancelled one what its engine request
        had emitted (:meth:`_cancel_siblings`); this covers any other at the end.
        """
        for d in self.drivers:
            sched = d.model.scheduler
            for req in (*sched.running, *sched.waiting()):
                r = cast("int", req.request_id)
                self._num_output_tokens[r] = req.num_output_tokens + (r in self._on_decode)

    def _flush_itl(self) -> None:
        if self._itl_values:
            counts, _ = np.histogram(
                np.asarray(self._itl_values), _ITL_EDGES, weights=np.asarray(self._itl_weights)
            )
            self._itl_hist += np.rint(counts).astype(np.int64)
            self._itl_values.clear()
            self._itl_weights.clear()

    def _sample(self, now: float) -> None:
        running = waiting = blocks = 0
        used = 0.0
        alive = 0
        for d in self.drivers:
            if not d.alive:
                continue
            alive += 1
            running += d.model.num_running
            waiting += d.model.num_waiting
            used += d.model.kv_usage
            blocks += d.model.scheduler.pool.num_used
        self._timeline.append((now, running, waiting, used / max(alive, 1)))
        self._boundary_samples.append((self._live_tasks, self._live_calls, blocks))


def _check_disaggregation(
    disagg: Disaggregation,
    num_replicas: int,
    gateway: SimGateway | None,
    faults: Sequence[Fault],
    autoscaler: Autoscaler | None,
) -> None:
    """Raise ``ValueError`` for a disaggregated run the simulator does not support."""
    if not disagg.prefill_replicas < num_replicas:
        raise ValueError(
            f"disaggregation.prefill_replicas must be < replicas ({num_replicas}) "
            f"(got {disagg.prefill_replicas}); at least one replica must decode"
        )
    unsupported = [
        name
        for name, used in (
            ("gateway", gateway is not None),
            ("faults", bool(faults)),
            ("autoscaler", autoscaler is not None),
        )
        if used
    ]
    if unsupported:
        raise ValueError(
            f"disaggregation is not simulated together with {', '.join(unsupported)} yet; "
            "remove those or the disaggregation"
        )


def prefix_hashes(ids: list[int]) -> list[int]:
    """Chained block hashes of a request's prefix ids (for workloads with shared prefixes)."""
    return chain_block_hashes(ids)
