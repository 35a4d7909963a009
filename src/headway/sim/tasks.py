"""Tasks moving through their steps: calls sent, joined, tool calls, the next step.

A task's step sends one call per branch; when the step's calls are done (all of them, or
the first for ``branch_join: first``, which cancels the rest) the task runs its tool calls
or waits its tool time and sends the next step. A call that ends unserved ends its task.
"""

from __future__ import annotations

import math

import numpy as np

from headway.core.downstream import DownstreamConfig, DownstreamService
from headway.core.policy.charges import Phase
from headway.core.policy.retries import AttemptOutcome, FailureKind, RetryAfter
from headway.core.workload.compile import CompiledWorkload
from headway.sim.clients import ClientBehaviour
from headway.sim.driver import ReplicaDriver
from headway.sim.events import (
    ATTEMPT_CODES,
    EV_CANCEL_LOSERS,
    EV_STEP_DISPATCH,
    EV_TOOL_CALL,
    EV_TOOL_FAILED,
)
from headway.sim.kernel import DISPATCH
from headway.sim.outcome import COMPLETED, IN_FLIGHT


class TaskFlow(ClientBehaviour):
    """The simulator's tasks: their steps, calls finishing, tool calls, tasks ending."""

    def _init_tasks(self, workload: CompiledWorkload) -> None:
        """Per-task progress, the per-call inputs, and the tool calls' downstream services."""
        self.task_finish_s = np.full(workload.num_tasks, np.nan)
        self._num_calls = workload.num_calls
        """Calls of the workload; rows from here on are clients' duplicates."""
        self._task_end_s = [math.nan] * workload.num_tasks
        self._live_tasks = 0
        self._live_calls = 0
        self._task_step = [0] * workload.num_tasks
        """Per task: the index of its current step."""
        self._task_left = [0] * workload.num_tasks
        """Per task: calls of its current step still running."""
        self._call_first = workload.task_first_call.tolist()
        self._calls_per_step = [
            workload.spec.classes[c].parallel_branches for c in workload.class_names
        ]
        self._join_first = [
            workload.spec.classes[c].branch_join == "first" for c in workload.class_names
        ]
        self._cancel_losers_after_s = [
            workload.spec.classes[c].cancel_losers_after_s for c in workload.class_names
        ]
        self._task_class = workload.task_class.tolist()
        self._task_steps = workload.task_num_steps.tolist()
        self._call_task = workload.call_task.tolist()
        self._call_in = workload.call_input_tokens.tolist()
        self._call_out = workload.call_output_tokens.tolist()
        self._call_prefix_row = workload.call_prefix_row.tolist()
        self._call_tool = workload.call_tool_after_s.tolist()
        self._call_prio = workload.task_priority[workload.call_task].tolist()
        self._services = [
            DownstreamService(DownstreamConfig.from_service(workload.spec.services[name]))
            for name in workload.service_names
        ]
        self._call_service = workload.call_tool_service.tolist()
        self._num_tool_failures = 0
        self._tool_retries = 0
        self._tool_stays = []

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

    def _call_finished(self, r: int, now: float, driver: ReplicaDriver) -> None:
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
        if self._num_prefill and driver.index >= self._num_prefill:  # its decode stay
            out = self._call_out[r]
            self._record_stay(r, now, self._call_in[r] + 1, out - 1, out, False)
        else:
            tokens = self._call_in[r] + self._call_out[r]
            self._record_stay(r, now, self._call_in[r], self._call_out[r], tokens, False)
        driver.outstanding_requests -= 1
        self._outstanding[driver.index] -= 1
        driver.outstanding_tokens -= self._call_in[r] + self._call_out[r]
        if self.gateway is not None:
            self._measure_speeds(r, now)
            self._left_replicas(r, now, Phase.COMPLETED, self._call_out[r])
            self._pump(now)
        j = r
        if r >= self._num_calls:
            j = self._dup_of[r - self._num_calls]
            self._outcome[r] = COMPLETED
            if self._outcome[j] == IN_FLIGHT:
                self._answered_by[j] = r
                self._finish_s[j] = now
            else:
                self._duplicate_tokens += self._call_out[r]
        elif self._outcome[j] != IN_FLIGHT:
            self._duplicate_tokens += self._call_out[r]  # its duplicate answered first
            return
        if self._outcome[j] != IN_FLIGHT:
            return
        self._outcome[j] = COMPLETED
        self._live_calls -= 1
        task = self._call_task[j]
        if self.autoscaler is not None:
            bound_s = self._class_e2e_s[self._task_class[task]]
            self._window_finished += 1
            if bound_s is not None and now - self._arrival_s[j] > bound_s:
                self._window_missed += 1
        if self._lost_race[j] or self._task_left[task] <= 0:  # its step's winner came first
            return
        if self._join_first[self._task_class[task]]:
            self._task_left[task] = 0
            self._siblings_lost(task, j, now)
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
        self.events.push(now + tool_s, DISPATCH, EV_STEP_DISPATCH, task, step + 1)

    def _tool_call(self, j: int, code: int, now: float) -> None:
        """A tool call after call ``j``'s step goes to its downstream service at ``now``
        (``code``: the tool call's index × ``ATTEMPT_CODES`` + its attempt, 0 for the
        first); its response starts the next tool call, or the task's next step. A call
        that times out or is refused is retried by the agent under the clients' retry
        policy (the abandoned work still holds its connection: seed 000's pool), or ends
        the task (its later calls are not offered)."""
        w = self.w
        index = code // ATTEMPT_CODES
        service = self._services[self._call_service[j]]
        service_s = float(w.tool_service_s[int(w.call_tool_first[j]) + index])
        result = service.submit(now, service_s)
        if not result.refused:
            left = result.finish_s if result.finish_s is not None else result.response_s
            self._tool_stays.extend((now, left))
        if result.timed_out or result.refused:
            self._num_tool_failures += 1
            self.events.push(result.response_s, DISPATCH, EV_TOOL_FAILED, j, code)
            return
        if index + 1 < int(w.call_tool_count[j]):
            self.events.push(
                result.response_s, DISPATCH, EV_TOOL_CALL, j, (index + 1) * ATTEMPT_CODES
            )
            return
        task = self._call_task[j]
        self.events.push(
            result.response_s, DISPATCH, EV_STEP_DISPATCH, task, self._task_step[task] + 1
        )

    def _tool_failed(self, j: int, code: int, now: float) -> None:
        """The agent of call ``j``'s task sees tool call ``code`` time out (or refused)."""
        attempt = code % ATTEMPT_CODES + 1
        k = self._task_class[self._call_task[j]]
        outcome = AttemptOutcome(kind=FailureKind.TIMEOUT, idempotent=self._class_idempotent[k])
        retry = self._retry_policy.next_attempt(now, attempt, outcome, None, self._retry_rng)
        if isinstance(retry, RetryAfter):
            self._tool_retries += 1
            self.events.push(now + retry.delay_s, DISPATCH, EV_TOOL_CALL, j, code + 1)
            return
        self._task_ended(self._call_task[j], now)

    def _siblings_lost(self, task: int, winner: int, now: float) -> None:
        """``winner`` answered its ``branch_join: first`` step: the step's other calls still
        running lost the race; the task cancels them now, or after its class's
        ``cancel_losers_after_s`` (an orchestrator that cancels late keeps them burning
        capacity after the user has an answer: seed 002)."""
        k = self._task_class[task]
        branches = self._calls_per_step[k]
        step = self._task_step[task]
        first = self._call_first[task] + step * branches
        for j in range(first, first + branches):
            if j != winner and self._outcome[j] == IN_FLIGHT:
                self._lost_race[j] = True
        delay_s = self._cancel_losers_after_s[k]
        if delay_s > 0:
            self.events.push(now + delay_s, DISPATCH, EV_CANCEL_LOSERS, task, step)
        else:
            self._cancel_losers(task, step, now)

    def _cancel_losers(self, task: int, step: int, now: float) -> None:
        """Cancel the losing branches of ``task``'s step ``step`` still running."""
        branches = self._calls_per_step[self._task_class[task]]
        first = self._call_first[task] + step * branches
        for j in range(first, first + branches):
            if self._lost_race[j] and self._outcome[j] == IN_FLIGHT:
                self._cancel_call(j, now)
        if self.gateway is not None:
            self._pump(now)

    def _call_unserved(self, j: int, now: float) -> None:
        """Call ``j`` ended without being served (shed or timed out): its step cannot
        complete (``all``) or has one branch fewer (``first``); a task whose step cannot
        complete ends there, unfinished, and its later calls are never offered."""
        task = self._call_task[j]
        if self._lost_race[j] or self._task_left[task] <= 0:
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
