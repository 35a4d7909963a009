"""Calls offered to the simulated gateway (``headway-default``), and its outcomes delivered.

Each attempt is offered to the gateway's :class:`~headway.core.gateway_core.GatewayCore`:
one it dispatches goes to that replica at once; one it queues waits for the core's
outcome (dispatched when a slot and unpromised KV blocks free, or expired at its
deadline); one it sheds goes back to its client. Completed calls feed the core's speed
estimate. When an admitted or queued attempt ends, :meth:`GatewayCore.end
<headway.core.gateway_core.GatewayCore.end>` settles its tenant's charge by the core's
charging rule, as the live gateway's handler does. This module carries the core's
decisions out on the simulator's events; it decides nothing.
"""

from __future__ import annotations

import math

import numpy as np

from headway.core.gateway_core import Lease
from headway.core.policy.admission import AdmissionRequest
from headway.core.policy.charges import Phase
from headway.core.policy.decisions import Shed
from headway.core.policy.deferral import should_defer
from headway.core.policy.queues import BANDS
from headway.core.policy.retries import AttemptOutcome, RetryAfter, refusal_kind
from headway.core.workload.compile import CompiledWorkload
from headway.sim.events import ATTEMPT_CODES, EV_CALL_DEADLINE, EV_GATEWAY_EXPIRY, EV_RETRY
from headway.sim.fleet import FleetChanges
from headway.sim.kernel import DISPATCH
from headway.sim.outcome import IN_FLIGHT, SHED, SHED_CODE, TIMED_OUT

_BACKGROUND = BANDS.index("background")


class GatewayOffers(FleetChanges):
    """The simulator's side of the gateway: offer, deliver outcomes, end."""

    def _init_gateway(self, workload: CompiledWorkload) -> None:
        """Per-call inputs of admission (tenant, band, deadline budgets, p95 output); the
        core routes with the cluster's router over one upstream per replica."""
        gateway = self.gateway
        assert gateway is not None
        gateway.core.router = self.router
        self._gateway_timer_s = -1.0
        gateway.set_ready([d.ready for d in self.drivers])
        spec = workload.spec
        self._call_tenant = [
            workload.tenant_names[t] for t in workload.task_tenant[workload.call_task].tolist()
        ]
        self._route_names = list(workload.route_names)
        call_class = workload.task_class[workload.call_task]
        outputs = workload.call_output_tokens
        self._class_p95_output = [
            int(np.percentile(outputs[call_class == k], 95)) if (call_class == k).any() else 0
            for k in range(len(workload.class_names))
        ]
        self._class_max_tokens = [spec.classes[c].max_tokens for c in workload.class_names]
        self._lease: dict[int, Lease] = {}
        """Per call: the core's lease of its current attempt, while queued or dispatched."""
        self._ticket: dict[int, int] = {}
        """Per call: the retry ticket of its last shed, presented with its next retry."""

    def _offer(self, j: int, now: float) -> None:
        """Offer call ``j``'s next attempt to the gateway: dispatched, queued or shed."""
        gateway = self.gateway
        assert gateway is not None
        self._attempts[j] += 1
        if self._attempts[j] == 1:
            self._first_attempt(j, now)
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
        if gateway.config.degraded is not None:
            degraded, how = gateway.core.degrade(now, request, optional=self._class_optional[k])
            if how is not None:
                self._degraded[j] = True
                if isinstance(degraded, Shed):
                    self._shed(j, now, degraded, renews, deadline_s)
                    return
                request = degraded
                self._call_out[j] = min(self._call_out[j], degraded.max_tokens or 1 << 62)
                if degraded.prompt_tokens < self._call_in[j]:  # trimmed: its prefix changed
                    self._call_in[j] = degraded.prompt_tokens
                    self._call_prefix_row[j] = -1
        route = self._route_names[self._call_route[j]] if self._call_route else None
        chosen, lease = gateway.offer(now, request, j * ATTEMPT_CODES + self._attempts[j], route)
        if chosen != route:
            self._fell_back[j] = True
        if isinstance(lease, Shed):
            self._shed(j, now, lease, renews, deadline_s)
            return
        self._lease[j] = lease
        if deadline_s is not None and gateway.config.cancel_at_deadline:
            self.events.push(deadline_s, DISPATCH, EV_CALL_DEADLINE, j, self._attempts[j])
        self._start_attempt_timer(j, now)
        if lease.upstream is not None:
            self._send(j, gateway.replica_of(lease.upstream), now)
        else:
            self._queued.add(j)
        self._deliver(now)

    def _shed(
        self, j: int, now: float, decision: Shed, renews: bool, deadline_s: float | None
    ) -> None:
        """Call ``j`` was refused: its client retries it after the Retry-After under its
        policy, or it ends ``shed``."""
        k = self._task_class[self._call_task[j]]
        retry_after_s = decision.retry_after_s
        if retry_after_s is not None and self._defer(j, now, decision, retry_after_s):
            return
        self._retry_after_s[j] = math.nan if retry_after_s is None else retry_after_s
        if self._attempts[j] == 1:
            self._first_retry_after_s[j] = self._retry_after_s[j]
        if decision.ticket is not None:
            self._ticket[j] = decision.ticket
        else:
            # Its client echoes the last answer's ticket, and this one had none.
            self._ticket.pop(j, None)
        attempt = AttemptOutcome(
            kind=refusal_kind(decision),
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

    def _defer(self, j: int, now: float, decision: Shed, retry_after_s: float) -> bool:
        """Call ``j``, shed, is deferred instead when the core's deferral decision says
        so (``gateway.receipts``): offered again in ``background`` after
        ``retry_after_s``, until its receipt's retention ends. True when deferred."""
        gateway = self.gateway
        assert gateway is not None
        receipts = gateway.config.receipts
        if receipts is None:
            return False
        open_calls = self._deferred_open
        if len(open_calls) >= receipts.max_queued:  # prune those that ended
            self._deferred_open = open_calls = {
                d for d in open_calls if self._outcome[d] == IN_FLIGHT
            }
        if not self._deferred[j]:
            band = BANDS[self._call_prio[j]]
            if not should_defer(
                decision, band, stream=False, queued=len(open_calls), config=receipts
            ):
                return False
            self._deferred[j] = True
            self._deferred_until_s[j] = now + receipts.retention_s
            self._call_prio[j] = _BACKGROUND
            open_calls.add(j)
        elif now + retry_after_s >= self._deferred_until_s[j]:
            return False  # its retention ends first: it ends shed (expired)
        self._backing_off.add(j)
        self.events.push(now + retry_after_s, DISPATCH, EV_RETRY, j)
        return True

    def _pump(self, now: float) -> None:
        """Let the core dispatch queued calls into free slots and expire those whose
        deadline passed, and carry out what it settled."""
        assert self.gateway is not None
        self.gateway.pump(now)
        self._deliver(now)

    def _gateway_expiry(self, now: float) -> None:
        """The gateway's timer (a queued call's deadline, or a slot cap or an ejection
        ending): the core expires and dispatches what the time lets go."""
        assert self.gateway is not None
        if now >= self._gateway_timer_s:
            self._gateway_timer_s = -1.0  # this one fired (an older one changes nothing)
        self.gateway.on_timer(now)
        self._deliver(now)

    def _deliver(self, now: float) -> None:
        """Carry out the core's settlements of queued calls, and of those they lead to:
        a dispatch goes to its replica; an expiry (its deadline passed while it waited,
        the core's ``expired`` shed) ends the call ``timed_out``, never sent."""
        gateway = self.gateway
        assert gateway is not None
        while settled := gateway.settled():
            for lease, outcome in settled:
                j = lease.item // ATTEMPT_CODES
                if self._lease.get(j) is not lease:
                    continue  # it ended (cancelled) between its settlement and now
                self._queued.discard(j)
                if isinstance(outcome, Shed):
                    del self._lease[j]
                    self._outcome[j] = TIMED_OUT
                    self._live_calls -= 1
                    self._finish_s[j] = now
                    gateway.end(now, lease, Phase.UNSENT, 0)
                    self._call_unserved(j, now)
                else:
                    self._send(j, outcome, now)
        at = gateway.next_timer_s(now)
        if at is not None and at != self._gateway_timer_s:
            # Events cannot be taken back: one armed earlier fires too, and finds nothing.
            self.events.push(at, DISPATCH, EV_GATEWAY_EXPIRY)
            self._gateway_timer_s = at

    def _withdraw_queued(self, j: int, now: float) -> None:
        """Call ``j``'s attempt leaves the gateway's line unsent (cancelled, abandoned)."""
        assert self.gateway is not None
        self._queued.discard(j)
        self.gateway.end(now, self._lease.pop(j), Phase.UNSENT, 0)

    def _left_replicas(self, j: int, now: float, phase: Phase, output_tokens: int) -> None:
        """A dispatched call finished, was cancelled or lost its replica (in ``phase``,
        having generated ``output_tokens``): the core frees its slot and its projected
        KV blocks and settles its tenant's charge."""
        assert self.gateway is not None
        self.gateway.end(now, self._lease.pop(j), phase, output_tokens)

    def _measure_speeds(self, j: int, now: float) -> None:
        """Fold a completed call into the speeds admission predicts service times with
        (its time to first token and its decode, from its dispatch)."""
        gateway = self.gateway
        assert gateway is not None
        admitted_s = self._admitted_s[j]
        gateway.core.observe_stream(
            self._call_in[j], self._call_out[j], self._first_token_s[j] - admitted_s,
            now - admitted_s,
        )  # fmt: skip
