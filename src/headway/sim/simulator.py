"""The discrete-event simulator: tasks and calls through a router onto replicas.

A compiled workload's tasks arrive at their times; each task step sends its calls (one
per branch) to the router, which picks a replica; each replica is a core
:class:`~headway.core.engine.replica.ReplicaModel` advanced on virtual time. When all of a
step's calls finish (or the first, for ``branch_join: first``, which cancels the rest),
the task waits its tool time and sends the next step. Everything is deterministic for a
given compiled workload: the event order is ``(time, priority, seq)`` (:mod:`.kernel`).

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
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from headway.core.engine.kv import chain_block_hashes
from headway.core.engine.replica import DecodeRun, ReplicaModel, StepResult
from headway.core.engine.scheduler import EngineRequest
from headway.core.policy.routing import Router, RouteRequest
from headway.core.workload.compile import CompiledWorkload
from headway.sim.kernel import BOUNDARY, DISPATCH, SAMPLE, EventQueue

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# Event kinds.
_TASK_ARRIVAL = 0  # a: task
_STEP_DISPATCH = 1  # a: task, b: step
_BOUNDARY = 2  # a: replica, b: version
_SAMPLE = 3

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
    extra: dict[str, float] = field(default_factory=dict)


class _Driver:
    """One replica and what the simulator knows about it.

    It is also the router's view of the replica (``routing.LoadView``): outstanding
    requests and tokens as the dispatcher counts them (dispatched, not yet finished), and
    the engine's KV and queue state for KV-aware routing.
    """

    __slots__ = (
        "index",
        "model",
        "outstanding_requests",
        "outstanding_tokens",
        "pending_finished",
        "ready",
        "revision",
        "run",
        "state",
        "step_result",
        "version",
    )

    def __init__(self, index: int, model: ReplicaModel) -> None:
        self.index = index
        self.model = model
        self.state = _IDLE
        self.version = 0
        self.step_result: StepResult | None = None
        self.run: DecodeRun | None = None
        self.pending_finished: tuple[str, ...] = ()
        self.outstanding_requests = 0
        self.outstanding_tokens = 0
        self.revision: str | None = None
        self.ready = True

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
    ) -> None:
        if not replicas:
            raise ValueError("a simulation needs at least one replica")
        self.w = workload
        self.options = options or SimOptions()
        self.router = router
        self.drivers = [_Driver(i, r) for i, r in enumerate(replicas)]
        self.events = EventQueue()
        n = workload.num_calls
        self.rec = CallRecords.empty(n)
        self._last_token_s = np.full(n, np.nan).tolist()
        self.task_finish_s = np.full(workload.num_tasks, np.nan)
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
        self._call_tool = workload.call_tool_after_s.tolist()
        self._call_prio = workload.task_priority[workload.call_task].tolist()
        self._itl_hist = np.zeros(_ITL_EDGES.size - 1, dtype=np.int64)
        self._itl_values: list[float] = []
        self._itl_weights: list[float] = []
        self._num_steps = 0
        self._num_skipped = 0
        self._needs_kv = router.kind == "kv_aware"
        self._block_size = replicas[0].config.block_size

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
        self._timeline: list[tuple[float, int, int, float]] = []
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
        self._flush_itl()
        timeline = np.array(self._timeline) if self._timeline else np.zeros((0, 4))
        return SimOutcome(
            calls=self.rec,
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
        )

    # ------------------------------------------------------------------ tasks and calls

    def _dispatch_step(self, task: int, step: int, now: float) -> None:
        """Send the calls of a task's step to the router."""
        branches = self._calls_per_step[self._task_class[task]]
        first = self._call_first[task] + step * branches
        self._task_step[task] = step
        self._task_left[task] = branches
        for j in range(first, first + branches):
            self._dispatch_call(j, now)

    def _dispatch_call(self, j: int, now: float) -> None:
        prompt, output = self._call_in[j], self._call_out[j]
        request = RouteRequest(
            prompt_tokens=prompt,
            expected_output_tokens=output,
            projected_kv_blocks=-(-(prompt + output) // self._block_size),
        )
        if self._needs_kv:
            for d in self.drivers:
                self._materialize(d, now)
        choice = self.router.route(now, request, self.drivers)
        if choice is None:  # no eligible replica: cannot happen without revisions or faults
            raise RuntimeError(f"no replica may take call {j}")
        driver = self.drivers[choice]
        self._materialize(driver, now)
        req = EngineRequest(
            str(j),
            num_prompt_tokens=prompt,
            max_output_tokens=output,
            priority=self._call_prio[j],
            block_hashes=self._block_hashes(j),
        )
        driver.model.add_request(req, now)
        driver.outstanding_requests += 1
        driver.outstanding_tokens += prompt + output
        self.rec.dispatch_s[j] = now
        self.rec.replica[j] = choice
        if driver.state == _IDLE:
            driver.state = _STEP
            driver.step_result = None
            driver.version += 1
            self.events.push(now, BOUNDARY, _BOUNDARY, choice, driver.version)

    def _block_hashes(self, j: int) -> list[int]:
        del j  # prefix groups arrive with the simulated gateway (issue 4)
        return []

    def _call_finished(self, j: int, now: float, driver: _Driver) -> None:
        rec = self.rec
        rec.finish_s[j] = now
        driver.outstanding_requests -= 1
        driver.outstanding_tokens -= self._call_in[j] + self._call_out[j]
        task = self._call_task[j]
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
            return
        tool_s = self._call_tool[j]
        self.events.push(now + tool_s, DISPATCH, _STEP_DISPATCH, task, step + 1)

    def _cancel_siblings(self, task: int, winner: int, now: float) -> None:
        branches = self._calls_per_step[self._task_class[task]]
        first = self._call_first[task] + self._task_step[task] * branches
        for j in range(first, first + branches):
            if j == winner or not math.isnan(self.rec.finish_s[j]):
                continue
            replica = int(self.rec.replica[j])
            driver = self.drivers[replica]
            self._materialize(driver, now)
            if driver.model.abort(str(j)):
                self.rec.cancelled[j] = True
                self.rec.finish_s[j] = now
                driver.outstanding_requests -= 1
                driver.outstanding_tokens -= self._call_in[j] + self._call_out[j]

    # ------------------------------------------------------------------ replicas

    def _materialize(self, driver: _Driver, now: float) -> None:
        """Apply the steps of a pending decode run that started before ``now``."""
        run = driver.run
        if driver.state != _RUN or run is None:
            return
        # The run's first step started when it was planned; a later step that starts
        # exactly at `now` has not (its boundary would come after this dispatch).
        m = driver.model.decode_steps_starting_before(run.start_s, now, run.num_steps)
        m = min(max(m, 1), run.num_steps)
        applied = driver.model.advance_decode_steps(run.start_s, m)
        self._record_run(applied)
        self._num_skipped += m - 1
        driver.run = None
        driver.state = _STEP
        driver.step_result = None
        driver.pending_finished = applied.finished_ids
        driver.version += 1
        self.events.push(applied.end_s, BOUNDARY, _BOUNDARY, driver.index, driver.version)

    def _boundary(self, driver: _Driver, now: float) -> None:
        """A step or run ended at ``now``: deliver it, then start the next."""
        model = driver.model
        if driver.state == _RUN and driver.run is not None:
            run = model.advance_decode_steps(driver.run.start_s, driver.run.num_steps)
            self._record_run(run)
            self._num_skipped += run.num_steps - 1
            finished: tuple[str, ...] = run.finished_ids
        elif driver.step_result is not None:
            finished = driver.step_result.finished_ids
        else:
            finished = driver.pending_finished
        driver.run = None
        driver.step_result = None
        driver.pending_finished = ()
        for rid in finished:
            self._call_finished(int(rid), now, driver)
        if self.options.check_invariants:
            model.check_invariants()
        if not model.has_work:
            driver.state = _IDLE
            return
        steps = model.max_identical_decode_steps() if self.options.skip_decode else 0
        driver.version += 1
        if steps >= 2:
            run = model.preview_decode_run(now, steps)
            driver.state = _RUN
            driver.run = run
            self.events.push(run.end_s, BOUNDARY, _BOUNDARY, driver.index, driver.version)
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
        rec = self.rec
        end = result.end_s
        last = self._last_token_s
        values, weights = self._itl_values, self._itl_weights
        for rid in result.admitted_ids:
            j = int(rid)
            if math.isnan(rec.admitted_s[j]):
                rec.admitted_s[j] = result.start_s
        for rid in result.preempted_ids:
            rec.num_preemptions[int(rid)] += 1
        for rid, n in result.tokens.items():
            j = int(rid)
            previous = last[j]
            if previous != previous:  # NaN: the first token
                rec.first_token_s[j] = end
            else:
                gap = end - previous
                values.append(gap)
                weights.append(1.0)
                if gap > rec.itl_max_s[j]:
                    rec.itl_max_s[j] = gap
            last[j] = end
            rec.num_output_tokens[j] += n
        if len(values) > 262144:
            self._flush_itl()

    def _record_run(self, run: DecodeRun) -> None:
        """Record ``run.num_steps`` tokens per request of a decode run.

        Step ``k`` of the run lasts ``base + per_kv (KV + (k - 1) R)``: the gaps inside the
        run form an arithmetic progression, summarised for the ITL histogram by a few
        equal chunks (their mean gap, weighted by tokens) instead of one value per token.
        """
        self._num_steps += run.num_steps
        m = run.num_steps
        r = run.num_seqs
        base, per_kv, kv = run.base_s, run.per_kv_token_s, run.kv_tokens_first_step
        first_end = run.start_s + base + per_kv * kv
        last_end = run.end_s
        inner_max = base + per_kv * (kv + (m - 1) * r) if m > 1 else 0.0
        rec = self.rec
        last = self._last_token_s
        itl_max = rec.itl_max_s
        num_tokens = rec.num_output_tokens
        values, weights = self._itl_values, self._itl_weights
        for rid in run.request_ids:
            j = int(rid)
            gap = first_end - last[j]
            values.append(gap)
            weights.append(1.0)
            peak = gap if gap > inner_max else inner_max
            if peak > itl_max[j]:
                itl_max[j] = peak
            last[j] = last_end
            num_tokens[j] += m
        if m > 1:
            # Gaps d_k for k = 2..m; chunk c covers k in [lo, hi).
            chunks = min(m - 1, 4)
            for c in range(chunks):
                lo = 2 + (m - 1) * c // chunks
                hi = 2 + (m - 1) * (c + 1) // chunks
                mid_k = (lo + hi - 1) / 2
                values.append(base + per_kv * (kv + (mid_k - 1) * r))
                weights.append(float((hi - lo) * r))
        if len(values) > 262144:
            self._flush_itl()

    def _flush_itl(self) -> None:
        if self._itl_values:
            counts, _ = np.histogram(
                np.asarray(self._itl_values), _ITL_EDGES, weights=np.asarray(self._itl_weights)
            )
            self._itl_hist += np.rint(counts).astype(np.int64)
            self._itl_values.clear()
            self._itl_weights.clear()

    def _sample(self, now: float) -> None:
        running = waiting = 0
        used = 0.0
        for d in self.drivers:
            running += d.model.num_running
            waiting += d.model.num_waiting
            used += d.model.kv_usage
        self._timeline.append((now, running, waiting, used / len(self.drivers)))


def prefix_hashes(ids: list[int]) -> list[int]:
    """Chained block hashes of a request's prefix ids (for workloads with shared prefixes)."""
    return chain_block_hashes(ids)
