"""Changes to the replica fleet: faults and the autoscaler.

Faults slow every replica down, flush their prefix caches, or lose replicas (the attempts
on a lost replica fail, and their clients may retry them elsewhere). The autoscaler reads
its signals every interval and starts replicas (ready after their start-up time) or drains
them. Every change of the provisioned count is recorded for the replica-seconds bill.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import cast

from headway.core.engine.replica import ReplicaModel
from headway.core.policy.autoscaler import (
    Autoscaler,
    AutoscalerSignals,
    ScaleDown,
    ScaleUp,
    window_queue_delay_s,
)
from headway.core.policy.charges import Phase
from headway.core.policy.retries import FailureKind
from headway.sim.disaggregation import DisaggregatedHandoff
from headway.sim.driver import IDLE, ReplicaDriver
from headway.sim.events import EV_AUTOSCALE, EV_FAULT, EV_REPLICA_READY
from headway.sim.faults import CacheFlush, Fault, Slowdown
from headway.sim.kernel import DISPATCH
from headway.sim.outcome import FAILED
from headway.sim.recording import processed_tokens


class FleetChanges(DisaggregatedHandoff):
    """The simulator's faults and autoscaling: replicas slowed, lost, added, drained."""

    def _init_fleet(
        self,
        faults: Sequence[Fault],
        autoscaler: Autoscaler | None,
        new_replica: Callable[[], ReplicaModel] | None,
        num_replicas: int,
    ) -> None:
        """The faults to inject, the autoscaler and its signal windows, the pool's history.

        Raises:
            ValueError: for an autoscaler without ``new_replica``.
        """
        self.faults = list(faults)
        self.autoscaler = autoscaler
        if autoscaler is not None and new_replica is None:
            raise ValueError("an autoscaler needs new_replica to build the replicas it adds")
        self._new_replica = new_replica
        self._initial_replicas = num_replicas
        self._all_eligible = True
        self._slowdown = 1.0
        self._num_lost_calls = 0
        self._scale_events = []
        self._cache_emptied = []
        self._window_wait_s = 0.0
        self._window_admitted = 0
        self._window_tokens = 0
        self._window_offered = 0
        self._window_finished = 0
        self._window_missed = 0

    def _schedule_fleet_changes(self) -> None:
        """Schedule the faults (a slowdown also at its end) and the autoscaler's first look."""
        events = self.events
        for i, fault in enumerate(self.faults):
            events.push(fault.at_s, DISPATCH, EV_FAULT, i)
            if isinstance(fault, Slowdown):
                events.push(fault.until_s, DISPATCH, EV_FAULT, i, 1)
        if self.autoscaler is not None:
            events.push(0.0, DISPATCH, EV_AUTOSCALE)

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
                    self._cache_emptied.append((d.index, now))
        else:
            live = [d for d in self.drivers if d.alive and d.pending_loss is None]
            for d in live[::-1][: fault.replicas]:
                if fault.phase == "any":
                    self._lose(d, now)
                else:
                    d.pending_loss = fault.phase

    def _lose(self, driver: ReplicaDriver, now: float) -> None:
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
        driver.state = IDLE
        driver.version += 1  # its pending boundary is void
        driver.stopped_s = now
        self._all_eligible = False
        self._provisioned_changed(now)
        if self.gateway is not None:  # before the releases below pump its queue
            self.gateway.set_ready([d.ready for d in self.drivers])
        for j in (*live, *in_flight_step):
            if self._first_token_s[j] > now:  # emitted at the end of the lost step
                self._first_token_s[j] = math.nan
            req = driver.model.scheduler.get_request(j)
            output = 0 if req is None else req.num_output_tokens
            driver.model.abort(j)
            if req is None:  # it finished in the step the loss cut short
                self._record_stay(j, now, self._call_in[j], 0, 0, True)
            else:
                self._record_stay(
                    j, now, req.num_prompt_tokens, output, processed_tokens(req), True
                )
            driver.outstanding_requests -= 1
            self._outstanding[driver.index] -= 1
            driver.outstanding_tokens -= self._call_in[j] + self._call_out[j]
            if j >= self._num_calls:  # a client's duplicate: its call is still waiting
                self._outcome[j] = FAILED
                continue
            if self.gateway is not None:
                # The engine failed it: nothing is charged before output (a retry is a new
                # attempt), the prompt and the output it streamed after (the live rule).
                phase = Phase.DECODE if output else Phase.UNSENT
                self._left_replicas(j, now, phase, output)
            self._num_lost_calls += 1
            self._retry_or_end(j, now, FailureKind.UPSTREAM_ERROR, FAILED)
        if self.gateway is not None:
            self._set_gateway_replicas(now)

    def _strike_pending_loss(self, driver: ReplicaDriver, now: float, prefill: bool) -> bool:
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
        self.gateway.set_ready([d.ready for d in self.drivers])
        self._pump(now)

    def _oldest_waiting_s(self, now: float) -> float:
        """How long the oldest call not yet admitted by an engine has waited since its
        arrival: in the gateway's queue or in an engine's waiting queue."""
        oldest_s = 0.0
        if self.gateway is not None:
            oldest_s = max(self.gateway.core.oldest_wait_by_route(now).values(), default=0.0)
        admitted_s, arrival_s = self._admitted_s, self._arrival_s
        for d in self.drivers:
            if not d.alive:
                continue
            for req in d.model.scheduler.waiting():
                j = cast("int", req.request_id)
                if admitted_s[j] != admitted_s[j]:  # NaN: never admitted
                    oldest_s = max(oldest_s, now - arrival_s[j])
        return oldest_s

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
            queue_delay_s=window_queue_delay_s(
                self._window_wait_s, self._window_admitted, self._oldest_waiting_s(now)
            ),
            admitted_tokens_per_s=self._window_tokens / interval_s,
            kv_occupancy=(sum(d.model.kv_usage for d in ready) / len(ready)) if ready else 1.0,
            deadline_miss_ratio=(
                self._window_missed / self._window_finished if self._window_finished else 0.0
            ),
            offered_tokens_per_s=self._window_offered / interval_s,
            active_sequences=float(sum(d.model.scheduler.num_running for d in ready)),
        )
        self._window_wait_s, self._window_admitted, self._window_tokens = 0.0, 0, 0
        self._window_offered = 0
        self._window_finished = self._window_missed = 0
        decision = scaler.decide(now, signals)
        if isinstance(decision, ScaleUp):
            assert self._new_replica is not None
            for _ in range(decision.count):
                driver = ReplicaDriver(len(self.drivers), self._new_replica())
                driver.ready = False
                driver.started_s = now
                self.drivers.append(driver)
                self._outstanding.append(0)
                self.events.push(decision.ready_at_s, DISPATCH, EV_REPLICA_READY, driver.index)
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
            self.events.push(now + interval_s, DISPATCH, EV_AUTOSCALE)

    def _replica_ready(self, index: int, now: float) -> None:
        """A replica the autoscaler started is ready for traffic."""
        driver = self.drivers[index]
        if not driver.alive or driver.draining:
            return
        driver.ready = True
        self._cache_emptied.append((driver.index, now))
        if self.gateway is not None:
            self._set_gateway_replicas(now)
