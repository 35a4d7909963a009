"""Calls offered to the simulated gateway (``headway-default``) and its queue pumped.

Each attempt is offered with the load of the replica the router would pick: admitted
attempts go there at once, queued ones when :meth:`GatewayOffers._pump` finds them a slot
and unpromised KV blocks, shed ones go back to their client. Completed calls feed the
speeds (:class:`~headway.core.policy.speeds.ServiceSpeeds`) admission predicts with. When
an admitted or queued attempt ends, its tenant's budget is settled by the core's charging
rule (:mod:`~headway.core.policy.charges`), as the live gateway settles it.
"""

from __future__ import annotations

import math

import numpy as np

from headway.core.policy.admission import AdmissionRequest
from headway.core.policy.charges import Phase
from headway.core.policy.decisions import Admit, Enqueue, Shed
from headway.core.policy.queues import BANDS, Queued
from headway.core.policy.retries import AttemptOutcome, FailureKind, RetryAfter
from headway.core.workload.compile import CompiledWorkload
from headway.sim.driver import ReplicaDriver
from headway.sim.events import ATTEMPT_CODES, EV_CALL_DEADLINE, EV_GATEWAY_EXPIRY, EV_RETRY
from headway.sim.fleet import FleetChanges
from headway.sim.kernel import DISPATCH
from headway.sim.outcome import IN_FLIGHT, SHED, SHED_CODE, TIMED_OUT


class GatewayOffers(FleetChanges):
    """The simulator's side of the gateway: offer, queue, dispatch, expire, release."""

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
        self._charged: dict[int, tuple[int, int]] = {}
        """Per offered call: the tokens admission charges it and the KV blocks it projects."""
        self._ticket: dict[int, int] = {}
        """Per call: the retry ticket of its last shed, presented with its next retry."""

    def _offer(self, j: int, now: float) -> None:
        """Offer call ``j`` to the gateway: dispatch, queue or shed it."""
        gateway = self.gateway
        assert gateway is not None
        choice = self._routed_attempt(j, now)
        if choice < 0:
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
        )
        self._charged[j] = (request.cost_tokens, gateway.admission.projected_kv_blocks(request))
        decision = gateway.offer(now, j * ATTEMPT_CODES + self._attempts[j], request, load)
        if not isinstance(decision, Admit | Enqueue):
            self._shed(j, now, decision, renews, deadline_s)
            return
        if deadline_s is not None and gateway.config.cancel_at_deadline:
            self.events.push(deadline_s, DISPATCH, EV_CALL_DEADLINE, j, self._attempts[j])
        if isinstance(decision, Admit):
            gateway.dispatched(request.priority, request.tenant)
            self._start_attempt_timer(j, now)
            self._send(j, choice, now)
        else:
            self._queued.add(j)
            self._start_attempt_timer(j, now)
            if deadline_s is not None:
                self.events.push(deadline_s, DISPATCH, EV_GATEWAY_EXPIRY)
            self._pump(now)

    def _shed(
        self, j: int, now: float, decision: Shed, renews: bool, deadline_s: float | None
    ) -> None:
        """Call ``j`` was refused: its client retries it after the Retry-After under its
        policy, or it ends ``shed``."""
        k = self._task_class[self._call_task[j]]
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
            self.events.push(now + retry.delay_s, DISPATCH, EV_RETRY, j)
            return
        self._outcome[j] = SHED
        self._live_calls -= 1
        self._finish_s[j] = now
        self._shed_reason[j] = SHED_CODE[decision.reason]
        self._call_unserved(j, now)

    def _cost_tokens(self, j: int) -> int:
        """What admission charged call ``j`` when it was offered (its request's
        ``cost_tokens``: the admission policy's rule, not a copy of it)."""
        return self._charged[j][0]

    def _projected_kv_blocks(self, j: int) -> int:
        """KV blocks admission projected for call ``j``
        (:meth:`~headway.core.policy.admission.AdmissionPolicy.projected_kv_blocks`)."""
        return self._charged[j][1]

    def _unpromised_kv_blocks(self, driver: ReplicaDriver) -> int:
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
                gateway.release(got.band, got.tenant)
                continue
            self._queued.discard(j)
            self._send(j, chosen[-1], now)
        for gone in gateway.expire(now):
            j = self._live_queued(gone.item)
            if j < 0:
                continue
            self._queued.discard(j)
            self._outcome[j] = TIMED_OUT
            self._live_calls -= 1
            self._finish_s[j] = now
            self._settle(j, now, Phase.UNSENT, 0)
            self._gateway_ended(j, now)
            self._call_unserved(j, now)

    def _live_queued(self, item: int) -> int:
        """The call of a gateway queue item, or -1 when the attempt it queued is over
        (the call was cancelled, or its client abandoned that attempt)."""
        j, attempt = divmod(item, ATTEMPT_CODES)
        if self._outcome[j] != IN_FLIGHT or self._attempts[j] != attempt or j not in self._queued:
            return -1
        return j

    def _left_replicas(self, j: int, now: float, phase: Phase, output_tokens: int) -> None:
        """A dispatched call finished, was cancelled or lost its replica (in ``phase``,
        having generated ``output_tokens``): free its gateway slot and the KV blocks the
        gateway projected for it, and settle its tenant's charge."""
        assert self.gateway is not None
        self.gateway.release(BANDS[self._call_prio[j]], self._call_tenant[j])
        self.drivers[self._replica[j]].reserved_kv_blocks -= self._projected_kv_blocks(j)
        self._settle(j, now, phase, output_tokens)
        self._gateway_ended(j, now, completed=phase is Phase.COMPLETED)

    def _settle(self, j: int, now: float, phase: Phase, output_tokens: int) -> None:
        """Give call ``j``'s tenant back what the charging rule says it did not use."""
        assert self.gateway is not None
        self.gateway.settle(
            now,
            self._call_tenant[j],
            phase,
            cost_tokens=self._cost_tokens(j),
            prompt_tokens=self._call_in[j],
            output_tokens=output_tokens,
        )

    def _gateway_ended(self, j: int, now: float, *, completed: bool = False) -> None:
        assert self.gateway is not None
        self.gateway.ended(now, self._call_tenant[j], completed=completed)

    def _measure_speeds(self, j: int, now: float) -> None:
        """Fold a completed call into the speeds admission predicts service times with
        (its time to first token and its decode, from its dispatch)."""
        gateway = self.gateway
        assert gateway is not None
        admitted_s = self._admitted_s[j]
        gateway.speeds.observe_stream(
            self._call_in[j], self._call_out[j], self._first_token_s[j] - admitted_s,
            now - admitted_s,
        )  # fmt: skip
