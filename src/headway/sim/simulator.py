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
import time
from collections.abc import Callable, Sequence
from typing import Final

import numpy as np

from headway.core.engine.kv import chain_block_hashes
from headway.core.engine.replica import ReplicaModel
from headway.core.policy.autoscaler import Autoscaler
from headway.core.policy.routing import Router
from headway.core.workload.compile import CompiledWorkload
from headway.sim.disaggregation import Disaggregation, check_disaggregation
from headway.sim.driver import ReplicaDriver
from headway.sim.events import (
    EV_ATTEMPT_TIMEOUT,
    EV_AUTOSCALE,
    EV_BOUNDARY,
    EV_CALL_DEADLINE,
    EV_CANCEL_LOSERS,
    EV_DUPLICATE,
    EV_FAULT,
    EV_GATEWAY_EXPIRY,
    EV_KV_ARRIVED,
    EV_PATIENCE,
    EV_REPLICA_READY,
    EV_RETRY,
    EV_STEP_DISPATCH,
    EV_TOOL_CALL,
    EV_TOOL_FAILED,
)
from headway.sim.faults import Fault
from headway.sim.gateway import SimGateway
from headway.sim.kernel import DISPATCH, EventQueue
from headway.sim.options import SimOptions
from headway.sim.outcome import (
    IN_FLIGHT,
    OUTCOMES,
    SHED_REASONS,
    CallRecords,
    SimOutcome,
)
from headway.sim.pools import RoutePools
from headway.sim.tasks import TaskFlow

__all__ = [
    "OUTCOMES",
    "SHED_REASONS",
    "CallRecords",
    "Disaggregation",
    "SimOptions",
    "SimOutcome",
    "Simulator",
    "prefix_hashes",
]


class Simulator(TaskFlow):
    """Runs one compiled workload on a list of replicas behind a router.

    Its bases form one chain, a concern each (:mod:`.tasks`, :mod:`.clients`,
    :mod:`.offers`, :mod:`.fleet`, :mod:`.disaggregation`, :mod:`.replicas`,
    :mod:`.recording`) over the shared state of :class:`~headway.sim.state.SimState`; this
    class builds that state and runs the loop.
    """

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
        pools: RoutePools | None = None,
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
            check_disaggregation(disaggregation, len(replicas), gateway, faults, autoscaler)
        self.w = workload
        self.options = options or SimOptions()
        self.router = router
        self.drivers = [ReplicaDriver(i, r) for i, r in enumerate(replicas)]
        self.events = EventQueue()
        self._init_records(workload.num_calls)
        self._init_tasks(workload)
        self._init_routing(
            router,
            replicas,
            skip_decode=self.options.skip_decode,
            check_invariants=self.options.check_invariants,
        )
        self._init_pools(pools, router, workload.call_route.tolist())
        self._init_clients(workload)
        self.gateway = gateway
        if gateway is not None:
            self._init_gateway(workload)
        self._init_fleet(faults, autoscaler, new_replica, len(replicas))
        self._init_duplicates(workload)  # extends the per-call inputs and records
        self._init_disaggregation(disaggregation, router)

    # ------------------------------------------------------------------ main loop

    def run(self) -> SimOutcome:
        """Simulate until every call has finished or been cancelled."""
        w = self.w
        arrivals = w.task_arrival_s.tolist()
        events = self.events
        horizon = max(w.duration_s, arrivals[-1] if arrivals else 0.0)
        samples = self.options.sample_points
        # Timeline samples rank after anything else at their time; the loop merges
        # them in, like the arrivals, which keeps the queue small.
        sample_at = np.linspace(0.0, horizon, samples).tolist() if samples > 0 else []
        num_samples = len(sample_at)
        next_sample = 0
        sample_s = sample_at[0] if num_samples else math.inf
        self._schedule_fleet_changes()
        self._horizon_s = horizon
        self._kv_window_s = sample_at[-1] if sample_at else horizon
        self._timeline = []
        self._boundary_samples = []
        next_task = 0
        num_tasks = len(arrivals)
        num_events = 0
        now = 0.0
        heap = events._heap  # the loop peeks at the top without a method call
        handlers = self._event_handlers()
        outcome = self._outcome
        call_timer = [kind in CALL_TIMERS for kind in range(len(handlers))]
        started = time.perf_counter()
        while True:
            # Next: the arrival, the top event or the sample, in (time, rank) order.
            if next_task < num_tasks:
                arrival_s = arrivals[next_task]
                if heap:
                    top = heap[0]
                    arrives = arrival_s < top[0] or (arrival_s == top[0] and top[1] > DISPATCH)
                else:
                    arrives = True
                if arrives and arrival_s <= sample_s:
                    now = arrival_s
                    self._dispatch_step(next_task, 0, now)
                    next_task += 1
                    num_events += 1
                    continue
            else:
                arrives = False
            if not arrives and heap and heap[0][0] <= sample_s:
                at, _, _, kind, a, b = events.pop()
                num_events += 1
                if call_timer[kind] and outcome[a] != IN_FLIGHT:
                    continue  # a timer of a call that has ended: no-op, and no time passes
                now = at
                if kind == EV_BOUNDARY:
                    driver = self.drivers[a]
                    if b == driver.version:
                        self._boundary(driver, now)
                else:
                    handlers[kind](a, b, now)
                continue
            if next_sample == num_samples:
                break  # no arrival, no event and no sample left
            now = sample_s
            self._sample(now)
            num_events += 1
            next_sample += 1
            sample_s = sample_at[next_sample] if next_sample < num_samples else math.inf
        loop_wall_s = time.perf_counter() - started
        self._settle_output_tokens()
        return self._sim_outcome(now, num_events, loop_wall_s)

    def _event_handlers(self) -> list[Callable[[int, int, float], None]]:
        """Per event kind, its handler, called as ``handler(a, b, now)`` (``EV_BOUNDARY``, the
        hottest, is handled in :meth:`run` itself; tasks arrive without events)."""
        handlers: list[Callable[[int, int, float], None]] = [_ignore] * (EV_CANCEL_LOSERS + 1)
        handlers[EV_STEP_DISPATCH] = self._dispatch_step
        handlers[EV_GATEWAY_EXPIRY] = lambda a, b, now: self._gateway_expiry(now)
        handlers[EV_RETRY] = lambda a, b, now: self._retry(a, now)
        handlers[EV_PATIENCE] = lambda a, b, now: self._patience_over(a, now)
        handlers[EV_ATTEMPT_TIMEOUT] = self._attempt_timed_out
        handlers[EV_FAULT] = self._fault
        handlers[EV_AUTOSCALE] = lambda a, b, now: self._autoscale(now)
        handlers[EV_REPLICA_READY] = lambda a, b, now: self._replica_ready(a, now)
        handlers[EV_TOOL_CALL] = self._tool_call
        handlers[EV_TOOL_FAILED] = self._tool_failed
        handlers[EV_DUPLICATE] = lambda a, b, now: self._duplicate(a, now)
        handlers[EV_KV_ARRIVED] = self._kv_arrived
        handlers[EV_CALL_DEADLINE] = self._deadline_passed
        handlers[EV_CANCEL_LOSERS] = self._cancel_losers
        return handlers


CALL_TIMERS: Final = frozenset({EV_PATIENCE, EV_ATTEMPT_TIMEOUT, EV_DUPLICATE, EV_CALL_DEADLINE})
"""The event kinds that are one call's timers (``a``: the call): each does nothing once
the call has ended, so the loop drops them without moving its clock. Run to the end, a
completed call's deadline timer set the end of the run (and the replica-hours, and the
cost per task) up to one ``e2e_s`` past the last answer: the headway-default rows of
docs/overload.md's bad days cost twice the fifo-unbounded ones."""


def _ignore(a: int, b: int, now: float) -> None:
    """The handler of the kinds never queued (``EV_TASK_ARRIVAL``, ``EV_BOUNDARY``)."""


def prefix_hashes(ids: list[int]) -> list[int]:
    """Chained block hashes of a request's prefix ids (for workloads with shared prefixes)."""
    return chain_block_hashes(ids)
