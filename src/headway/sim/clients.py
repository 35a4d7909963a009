"""The clients' behaviour: attempts, timeouts, retries, patience, deadlines, duplicates.

A call's client offers it (first attempt), times each attempt out, retries a failed or
shed attempt under the core ``RetryPolicy`` (renewing or keeping its deadline), gives up
after ``patience_s`` without a first token, and may submit a duplicate of a call still
waiting. Each random draw has its own stream of the workload's seed.
"""

from __future__ import annotations

import math

import numpy as np

from headway.core.policy.charges import Phase
from headway.core.policy.retries import (
    AttemptOutcome,
    FailureKind,
    RetryAfter,
    RetryConfig,
    RetryPolicy,
)
from headway.core.workload.compile import CompiledWorkload
from headway.core.workload.distributions import sample
from headway.sim.events import EV_ATTEMPT_TIMEOUT, EV_DUPLICATE, EV_PATIENCE, EV_RETRY
from headway.sim.kernel import DISPATCH
from headway.sim.offers import GatewayOffers
from headway.sim.outcome import CANCELLED, FAILED, IN_FLIGHT, NOT_OFFERED, TIMED_OUT
from headway.sim.recording import processed_tokens

# Random streams (with the workload's seed) of the clients' draws.
_PATIENCE_STREAM, _RETRY_STREAM, _DUPLICATE_STREAM = 101, 102, 103


class ClientBehaviour(GatewayOffers):
    """The simulator's clients: how each call is attempted, retried, abandoned."""

    def _init_clients(self, workload: CompiledWorkload) -> None:
        """The clients' retry policy (the workload's ``clients.retries`` and its budget),
        per-attempt timeout and the per-class inputs of deadlines and retries; and each
        call's patience, drawn once (seeded)."""
        self._queued = set()
        self._backing_off = set()
        self._deferred_open = set()
        self._deferred_until_s = {}
        self._num_impatient = 0
        self._patience_s: list[float] | None = None
        """Per call: how long its client waits for a first token (None: forever)."""
        patience = workload.spec.clients.patience_s
        if patience is not None:
            rng = np.random.default_rng([workload.seed, _PATIENCE_STREAM])
            self._patience_s = sample(patience, workload.num_calls, rng).tolist()
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
        self._count_requests = retries.max_attempts > 1 and retries.budget_ratio is not None
        """Count original requests for the retry budget: only read when there may be
        retries and a budget (with one attempt, a failure gives up before the budget)."""
        self._retry_rng = np.random.default_rng([workload.seed, _RETRY_STREAM])
        self._attempt_timeout_s = retries.timeout_s
        classes = [spec.classes[c] for c in workload.class_names]
        self._class_idempotent = [c.idempotent for c in classes]
        self._class_optional = [c.optional for c in classes]
        self._task_arrival = workload.task_arrival_s.tolist()
        self._class_e2e_s = [c.slo.e2e_s for c in classes]
        self._class_task_deadline_s = [c.slo.task_deadline_s for c in classes]

    def _init_duplicates(self, workload: CompiledWorkload) -> None:
        """Rows for the duplicates clients may submit: each call's client is drawn once
        (``duplicate_probability``, seeded) to resubmit if still waiting after
        ``duplicate_after_s``; a drawn call gets a row past the workload's calls, a copy of
        its inputs, used only if the duplicate is sent."""
        clients = workload.spec.clients
        self._dup_of = []
        self._dup_row: dict[int, int] = {}
        """Per call whose client may duplicate it: its duplicate's row."""
        self._answered_by = {}
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
            self._call_service,
        ):
            inputs.extend([inputs[j] for j in chosen])
        self._call_tool.extend([self._call_tool[j] for j in chosen])
        if self._call_pool:
            self._call_pool.extend([self._call_pool[j] for j in chosen])
            self._call_route.extend([self._call_route[j] for j in chosen])
        m = len(chosen)
        nan = math.nan
        for column in (
            self._dispatch_s,
            self._replica_enter_s,
            self._admitted_s,
            self._first_token_s,
            self._finish_s,
            self._last_token_s,
            self._arrival_s,
            self._retry_after_s,
            self._first_retry_after_s,
        ):
            column.extend([nan] * m)
        self._num_output_tokens.extend([0] * m)
        self._itl_max_s.extend([0.0] * m)
        self._num_preemptions.extend([0] * m)
        self._replica.extend([-1] * m)
        self._cancelled.extend([False] * m)
        self._lost_race.extend([False] * m)
        self._fell_back.extend([False] * m)
        self._degraded.extend([False] * m)
        self._deferred.extend([False] * m)
        self._outcome.extend([NOT_OFFERED] * m)
        self._shed_reason.extend([-1] * m)
        self._attempts.extend([0] * m)
        self._cached_prompt_tokens.extend([-1] * m)
        self._kv_held.extend([0] * m)
        self._kv_blocks.extend([0] * m)
        self._kv_block_s.extend([0.0] * m)

    def _routed_attempt(self, j: int, now: float) -> int:
        """Count an attempt of call ``j`` (its first starts the call) and route it: the
        replica, or -1 when none could take it (the failure went to the retry policy)."""
        self._attempts[j] += 1
        if self._attempts[j] == 1:
            self._first_attempt(j, now)
        choice = self._route(j, now)
        if choice < 0:
            self._retry_or_end(j, now, FailureKind.CONNECT_ERROR, FAILED)
        return choice

    def _dispatch_call(self, j: int, now: float) -> None:
        """Without a gateway: the attempt is offered and dispatched at once."""
        choice = self._routed_attempt(j, now)
        if choice < 0:
            return
        self._start_attempt_timer(j, now)
        self._send(j, choice, now)

    def _first_attempt(self, j: int, now: float) -> None:
        """Call ``j`` is offered for the first time: it is in flight, its client counts
        one original request against the retry budget, and its patience starts."""
        self._arrival_s[j] = now
        if self.autoscaler is not None:
            self._window_offered += self._call_in[j] + self._call_out[j]
        self._outcome[j] = IN_FLIGHT
        self._live_calls += 1
        if self._count_requests:
            self._retry_policy.record_request(now)
        if self._patience_s is not None:
            self.events.push(now + self._patience_s[j], DISPATCH, EV_PATIENCE, j)
        if j in self._dup_row:
            self.events.push(now + self._duplicate_after_s, DISPATCH, EV_DUPLICATE, j)

    def _duplicate(self, j: int, now: float) -> None:
        """Call ``j``'s client has waited ``duplicate_after_s`` without a token and submits
        the same call again (seed 000). A gateway recognises the idempotency key and
        attaches it to the call in flight; without one it is new work for the replicas."""
        if self._outcome[j] != IN_FLIGHT or self._first_token_s[j] <= now or self._deferred[j]:
            return  # (a deferred call's client holds a receipt: it waits on no connection)
        if self.gateway is not None:
            self._duplicates_coalesced += 1
            return
        d = self._dup_row[j]
        choice = self._route(d, now)
        if choice < 0:
            return
        self._duplicates_sent += 1
        self._arrival_s[d] = now
        self._outcome[d] = IN_FLIGHT
        self._send(d, choice, now)

    def _retry(self, j: int, now: float) -> None:
        """Call ``j``'s client, done backing off, offers it again (unless it was cancelled
        while it backed off)."""
        self._backing_off.discard(j)
        if self._outcome[j] == IN_FLIGHT:
            if self.gateway is None:
                self._dispatch_call(j, now)
            else:
                self._offer(j, now)

    def _patience_over(self, j: int, now: float) -> None:
        """Call ``j``'s client stops waiting: no token by ``now``, so it cancels."""
        if self._outcome[j] != IN_FLIGHT or self._first_token_s[j] <= now:
            return
        if not self._cancel_call(j, now):
            return
        self._num_impatient += 1
        if self.gateway is not None:
            self._pump(now)
        self._call_unserved(j, now)

    def _start_attempt_timer(self, j: int, now: float) -> None:
        """The client's per-attempt timeout for the attempt of call ``j`` sent at ``now``."""
        if self._attempt_timeout_s is not None:
            self.events.push(
                now + self._attempt_timeout_s, DISPATCH, EV_ATTEMPT_TIMEOUT, j, self._attempts[j]
            )

    def _attempt_timed_out(self, j: int, attempt: int, now: float) -> None:
        """The client's timeout for attempt ``attempt`` of call ``j`` fires: with no first
        token yet, the client abandons the attempt (cancelled where it is) and retries it
        under its retry policy, or gives up (``timed_out``)."""
        if (
            self._outcome[j] != IN_FLIGHT
            or self._attempts[j] != attempt
            or j in self._backing_off  # that attempt already failed otherwise
            or self._first_token_s[j] <= now
        ):
            return
        if not self._withdraw(j, now):
            return
        if self.gateway is not None:
            self._pump(now)
        self._retry_or_end(j, now, FailureKind.TIMEOUT, TIMED_OUT)

    def _deadline_passed(self, j: int, attempt: int, now: float) -> None:
        """Call ``j``'s deadline passes while attempt ``attempt`` runs in a replica: the
        gateway cancels it there (seed 003: "if deadline_expires: cancel scheduler state
        and release blocks"), so the engine stops spending steps on an answer already
        late. Its client retries it under its policy (a per-call deadline renews on
        retry) or it ends ``timed_out``. A queued call is the queues' to expire."""
        if (
            self._outcome[j] != IN_FLIGHT
            or self._attempts[j] != attempt
            or j in self._backing_off
            or self._replica[j] < 0
        ):
            return
        if not self._withdraw(j, now):
            return  # its replica had just finished it
        self._pump(now)
        self._retry_or_end(j, now, FailureKind.TIMEOUT, TIMED_OUT)

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
            self.events.push(now + retry.delay_s, DISPATCH, EV_RETRY, j)
            return
        self._outcome[j] = final
        self._live_calls -= 1
        self._finish_s[j] = now
        self._call_unserved(j, now)

    def _deadline(self, j: int, now: float) -> tuple[float | None, bool]:
        """The call's absolute deadline and whether a retry renews it: the earlier of its
        task's deadline (fixed) and ``now`` + its class's e2e bound (per call); a deferred
        call's is the end of its receipt's retention, fixed."""
        if self._deferred[j]:
            return self._deferred_until_s[j], False
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

    def _cancel_call(self, j: int, now: float) -> bool:
        """Cancel live call ``j`` wherever it is: in a replica (aborted, its KV blocks
        freed at once), queued at the gateway (it leaves when it reaches the head), or
        waiting to retry. False when its replica had already finished it."""
        if not self._withdraw(j, now):
            return False
        d = self._dup_row.get(j, -1)
        if d >= 0 and self._outcome[d] == IN_FLIGHT and self._withdraw(d, now):
            self._outcome[d] = CANCELLED
        self._cancelled[j] = True
        self._outcome[j] = CANCELLED
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
                self._withdraw_queued(j, now)
            return True
        if self._num_prefill and self._withdraw_disaggregated(j, now):
            return True
        driver = self.drivers[replica]
        self._materialize(driver, now)
        req = driver.model.scheduler.get_request(j)
        if req is None or not driver.model.abort(j):
            return False
        self._num_output_tokens[j] = req.num_output_tokens
        self._record_stay(
            j, now, req.num_prompt_tokens, req.num_output_tokens, processed_tokens(req), True
        )
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
            output = self._num_output_tokens[j]
            self._left_replicas(j, now, Phase.DECODE if output else Phase.PREFILL, output)
        return True
