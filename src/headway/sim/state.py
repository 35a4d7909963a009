"""The state the simulator's parts share, declared once.

:class:`~headway.sim.simulator.Simulator` is assembled from one part per concern, each a
class in its own module, stacked as one chain of single inheritance over
:class:`SimState` (recording, replica stepping, disaggregation, fleet changes, gateway
offers, clients, tasks, then the simulator). :class:`SimState` declares the attributes
more than one part reads and the methods they call across each other (each defined by
exactly one part). One chain, not mixins: the compiled build (``pyproject.toml``,
``[tool.hatch.build.hooks.custom]``) lays a chain out as one native class, and plain
attributes on one object keep the event loop's hot paths free of indirection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

    from headway.core.downstream import DownstreamService
    from headway.core.engine.replica import DecodeRun, StepResult
    from headway.core.policy.autoscaler import Autoscaler
    from headway.core.policy.charges import Phase
    from headway.core.policy.retries import FailureKind, RetryPolicy
    from headway.core.policy.routing import Router
    from headway.core.workload.compile import CompiledWorkload
    from headway.sim.driver import ReplicaDriver
    from headway.sim.gateway import SimGateway
    from headway.sim.kernel import EventQueue
    from headway.sim.outcome import FloatArray
    from headway.sim.pools import RoutePools


class SimState:
    """Attributes and cross-part methods of the simulator (see the module docstring).

    The methods here only declare: the part named above each group defines it.
    """

    # The run's inputs and machinery.
    w: CompiledWorkload
    router: Router
    drivers: list[ReplicaDriver]
    events: EventQueue
    gateway: SimGateway | None
    """The ``headway-default`` gateway; None: every call goes to the router at once."""
    autoscaler: Autoscaler | None

    # Per-call inputs (one row per call, then one per client duplicate).
    _call_in: list[int]
    _call_out: list[int]
    _call_prio: list[int]
    _call_task: list[int]
    _call_prefix_row: list[int]
    _call_tool: list[float]
    _call_pool: list[int]
    """Per row: the pool of its route (empty without pools)."""
    _call_route: list[int]
    """Per row: its route (the compiled workload's index; empty without pools)."""
    _pools: RoutePools | None
    _pool_lo: list[int]
    _pool_hi: list[int]
    """Per pool: its replicas, ``lo`` to ``hi - 1``."""
    _pool_routers: list[Router]
    _call_service: list[int]

    # Per-call records (same rows), Python lists while the run goes (a list item is
    # cheaper to read and write than a numpy element); CallRecords arrays at the end.
    _dispatch_s: list[float]
    _replica_enter_s: list[float]
    """When each row's request last entered a replica's engine (a disaggregated one's
    decode replica too)."""
    _replica_stays: list[float]
    """Every stay of a request in an engine (attempts, duplicates and losing copies
    included), flat rows of :data:`~headway.sim.outcome.STAY_COLUMNS`: the records of the
    replica and KV boundaries' Little's-law checks."""
    _kv_held: list[int]
    """Per row: KV blocks its request holds in its engine now, as the engine's steps and
    runs reported them (0 outside an engine, and from a preemption to its next step)."""
    _kv_blocks: list[int]
    """Per row: blocks given to it in its current stay before :attr:`_kv_window_s`."""
    _kv_block_s: list[float]
    """Per row: the block-seconds its current stay held inside ``[0, _kv_window_s]``:
    each block given at ``t`` adds ``window - t``, each given back at ``t`` takes it
    away again (``t`` past the window: nothing)."""
    _kv_window_s: float
    """The end of the window the timeline samples (its last sample; inf: none)."""
    _admitted_s: list[float]
    _first_token_s: list[float]
    _finish_s: list[float]
    _last_token_s: list[float]
    _num_output_tokens: list[int]
    _itl_max_s: list[float]
    _num_preemptions: list[int]
    _replica: list[int]
    _cancelled: list[bool]
    _lost_race: list[bool]
    _fell_back: list[bool]
    _degraded: list[bool]
    _deferred: list[bool]
    """Per row: shed, and deferred instead (a receipt; ``gateway.receipts``)."""
    """Per row: a losing branch of a ``branch_join: first`` step."""
    _cancel_losers_after_s: list[float]
    """Per class: how long losing branches keep running after their step's winner."""
    _arrival_s: list[float]
    _outcome: list[int]
    _shed_reason: list[int]
    _retry_after_s: list[float]
    _first_retry_after_s: list[float]
    _attempts: list[int]
    _kv_transfer_s: list[float]
    _cached_prompt_tokens: list[int]
    """Per row: prompt tokens its engine found in the prefix cache at the call's first
    admission (-1: never admitted)."""

    _num_calls: int
    """Calls of the workload; rows from ``_num_calls`` on are clients' duplicates."""

    # Per task.
    task_finish_s: FloatArray
    _task_end_s: list[float]
    _task_class: list[int]
    _live_tasks: int
    _live_calls: int
    """Tasks and calls in the system now (for the Little's-law checks)."""

    # Replicas and routing.
    _outstanding: list[int]
    """``drivers[i].outstanding_requests`` for every ``i``, kept in step with them."""
    _block_size: int
    _all_eligible: bool
    """Every replica is ready (no fault, no scaling yet): the router's shortcut holds."""
    _horizon_s: float
    """The workload's end (its duration, or its last arrival if later)."""

    # Clients.
    _retry_policy: RetryPolicy
    _retry_rng: np.random.Generator
    _class_idempotent: list[bool]
    _class_optional: list[bool]
    _class_e2e_s: list[float | None]
    _queued: set[int]
    """Calls waiting in the gateway's queues (not those backing off to retry)."""
    _gateway_timer_s: float
    """When the gateway's timer event is armed for (-1: none): the core's
    ``next_timer_s``, as the live driver arms its one timer."""
    _backing_off: set[int]
    _deferred_open: set[int]
    _deferred_until_s: dict[int, float]
    """Per deferred call: when its receipt's retention ends (its fixed deadline)."""
    """Calls deferred and perhaps not yet ended (pruned when it reaches ``max_queued``)."""
    """Calls whose last attempt failed and whose client waits to retry them."""
    _num_impatient: int
    _dup_of: list[int]
    """Per duplicate row (past the workload's calls): the call it duplicates."""
    _answered_by: dict[int, int]
    """Per call a duplicate answered: that duplicate's row."""
    _duplicates_sent: int
    _duplicates_coalesced: int
    _duplicate_tokens: int

    # Fleet changes.
    _window_wait_s: float
    _window_admitted: int
    _window_tokens: int
    _window_offered: int
    """Tokens (prompt + output) of the calls first offered since the last evaluation."""
    _window_finished: int
    _window_missed: int
    """Calls completed, and of them past their class's ``e2e_s``, since the last
    autoscaler evaluation."""
    _num_lost_calls: int
    _scale_events: list[tuple[float, int]]
    """(time, replicas provisioned) after every change of the pool."""
    _initial_replicas: int
    _cache_emptied: list[tuple[int, float]]
    """(replica, time) whenever a replica's prefix cache became empty and it could serve:
    its start (an autoscaled one's: when it became ready) and every cache flush."""

    # Disaggregation.
    _num_prefill: int
    """Replicas ``0..n-1`` only prefill (0: not disaggregated)."""
    _on_decode: set[int]
    """Rows added to their decode replica (its request counts the tokens after the
    first: the prefill replica emitted that one)."""
    _num_transfers: int
    _transfer_s_total: float

    # Tool calls.
    _num_tool_failures: int
    _tool_retries: int

    # Records.
    _num_steps: int
    _num_skipped: int
    _timeline: list[tuple[float, int, int, float]]
    _boundary_samples: list[tuple[int, int, int, int]]
    _services: list[DownstreamService]
    """The workload's downstream services (``services``), each its exact FIFO schedule."""
    _tool_stays: list[float]
    """Every tool call in a downstream service, flat ``enter, leave`` pairs (a refused one
    never entered; an abandoned one left at its timeout)."""

    # headway.sim.replicas
    def _route(self, j: int, now: float) -> int:
        raise NotImplementedError

    def _route_pool(self, r: int, now: float, lo: int, hi: int, router: Router) -> int:
        raise NotImplementedError

    def _send(self, j: int, choice: int, now: float) -> None:
        raise NotImplementedError

    # headway.sim.recording
    def _record_stay(
        self, j: int, now: float, prompt_tokens: int, output_tokens: int, computed_tokens: int,
        aborted: bool,
    ) -> None:  # fmt: skip
        raise NotImplementedError

    def _materialize(self, driver: ReplicaDriver, now: float) -> None:
        raise NotImplementedError

    # headway.sim.tasks
    def _call_finished(self, r: int, now: float, driver: ReplicaDriver) -> None:
        raise NotImplementedError

    def _call_unserved(self, j: int, now: float) -> None:
        raise NotImplementedError

    # headway.sim.clients
    def _dispatch_call(self, j: int, now: float) -> None:
        raise NotImplementedError

    def _first_attempt(self, j: int, now: float) -> None:
        raise NotImplementedError

    def _routed_attempt(self, j: int, now: float) -> int:
        raise NotImplementedError

    def _start_attempt_timer(self, j: int, now: float) -> None:
        raise NotImplementedError

    def _retry_or_end(self, j: int, now: float, kind: FailureKind, final: int) -> None:
        raise NotImplementedError

    def _deadline(self, j: int, now: float) -> tuple[float | None, bool]:
        raise NotImplementedError

    def _cancel_call(self, j: int, now: float) -> bool:
        raise NotImplementedError

    def _deadline_passed(self, j: int, attempt: int, now: float) -> None:
        raise NotImplementedError

    # headway.sim.offers
    def _offer(self, j: int, now: float) -> None:
        raise NotImplementedError

    def _pump(self, now: float) -> None:
        raise NotImplementedError

    def _gateway_expiry(self, now: float) -> None:
        raise NotImplementedError

    def _withdraw_queued(self, j: int, now: float) -> None:
        raise NotImplementedError

    def _left_replicas(self, j: int, now: float, phase: Phase, output_tokens: int) -> None:
        raise NotImplementedError

    def _measure_speeds(self, j: int, now: float) -> None:
        raise NotImplementedError

    # headway.sim.fleet
    def _strike_pending_loss(self, driver: ReplicaDriver, now: float, prefill: bool) -> bool:
        raise NotImplementedError

    def _provisioned_changed(self, now: float) -> None:
        raise NotImplementedError

    # headway.sim.disaggregation
    def _prefill_finished(self, r: int, now: float, driver: ReplicaDriver) -> None:
        raise NotImplementedError

    def _withdraw_disaggregated(self, j: int, now: float) -> bool:
        raise NotImplementedError

    # headway.sim.recording
    def _record_step(self, result: StepResult) -> None:
        raise NotImplementedError

    def _record_run(self, run: DecodeRun) -> None:
        raise NotImplementedError
