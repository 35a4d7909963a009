"""The core engine model driven by the wall clock: one ReplicaModel, paced in real time.

The emulated engine's time is ``v = (wall - start) × speedup``. Like SimPy's real-time
environment, the loop runs the core :class:`~headway.core.engine.replica.ReplicaModel`
exactly as the simulator does (``step(now)`` at the end of the previous step, requests
added between steps at their arrival time) and sleeps until each step's ``end_s`` before
releasing its tokens. The model's timeline never depends on how late the loop wakes: a
step starts at the previous step's ``end_s`` (or at the arrival that woke an idle
engine), so lateness delays delivery but not the model. When delivery is late the lag
metrics say so (``headway_emulator_lag_seconds``), and the loop catches up as fast as
the CPU allows.

Requests that arrive while a step runs join the next step (they were not there when it
was scheduled), as in the simulator. A request is added to the model only when the
model's time has reached its arrival, so a late loop cannot put a request into a step
that started before it arrived.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Final

from headway.core.engine.replica import ReplicaModel, StepResult
from headway.core.engine.scheduler import EngineRequest, RequestId
from headway.emulate.faults import FaultState
from headway.metrics_catalog import FINISHED_REASONS, Metrics

__all__ = ["Generation", "WallClockEngine"]

_log = logging.getLogger("headway.emulate")

_COARSE_MARGIN_S: Final = 0.0015
"""Sleep on asyncio's (millisecond) timer until this long before a step ends."""

LAG_WARNING_S: Final = 0.05
"""Wall seconds of delivery lag that get a warning in the log (at most every 10 s)."""


class Generation:
    """One request's progress as the engine emits it; its HTTP handler reads it."""

    __slots__ = (
        "_event",
        "arrival_v",
        "done",
        "finish_reason",
        "first_token_v",
        "last_token_v",
        "max_output_tokens",
        "num_emitted",
        "num_prompt_tokens",
        "request_id",
        "scheduled_v",
        "stop_reason",
    )

    def __init__(
        self, request_id: int, num_prompt_tokens: int, max_output_tokens: int, stop_reason: str
    ) -> None:
        self.request_id = request_id
        self.num_prompt_tokens = num_prompt_tokens
        self.max_output_tokens = max_output_tokens
        self.stop_reason = stop_reason
        """The finish reason when the last token is out: ``length`` (``max_tokens``
        reached) or ``stop`` (the emulated end of sequence)."""
        self.num_emitted = 0
        """Tokens the engine has emitted so far."""
        self.done = False
        """True once the last token is out or the request was aborted."""
        self.finish_reason = ""
        """Set when done: ``stop_reason``, or ``abort``."""
        self.arrival_v = math.nan
        """Engine time of arrival."""
        self.scheduled_v = math.nan
        """Engine time of the first step that computed it (queue time ends)."""
        self.first_token_v = math.nan
        self.last_token_v = math.nan
        self._event = asyncio.Event()

    async def wait(self) -> None:
        """Return when new tokens were emitted (or the request ended) since the last call."""
        await self._event.wait()
        self._event.clear()

    def _notify(self) -> None:
        self._event.set()


class WallClockEngine:
    """A :class:`ReplicaModel` paced by the wall clock; :meth:`run` is its loop."""

    def __init__(
        self,
        replica: ReplicaModel,
        *,
        speedup: float,
        faults: FaultState,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not (speedup > 0 and math.isfinite(speedup)):
            raise ValueError(f"speedup must be a finite number > 0 (got {speedup})")
        self.replica: Final = replica
        self.speedup: Final = speedup
        self.faults: Final = faults
        self.clock: Final = clock
        self._start_wall = clock()
        self._pending: deque[tuple[float, EngineRequest, Generation]] = deque()
        self._live: dict[RequestId, Generation] = {}
        self._next_id = 0
        self._wake = asyncio.Event()
        self._timer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="emulator-timer")
        """Sleeps the last moments before a step's end precisely (:meth:`_sleep_until`)."""
        self._resume_v = 0.0
        """The model may not start a step before this (set when a stall ends)."""
        self._last_lag_warning = -math.inf
        self.lag_s = 0.0
        """Wall seconds by which the last step's tokens went out after their due time."""
        self.max_lag_s = 0.0
        self.prefix_queried_tokens = 0
        """The scheduler's prefix-cache queries (tokens), as of the last step delivered."""
        self.prefix_hit_tokens = 0
        """The scheduler's prefix-cache hits (tokens), as of the last step delivered."""
        self.metrics: Final = metrics
        """Its registry (``EMULATOR`` of :mod:`headway.metrics_catalog`, ``model_name``
        fixed): the engine's series, updated as steps are delivered or read at scrape."""
        m = metrics
        m.read_value("vllm:num_requests_running", lambda: float(replica.num_running))
        m.read_value(
            "vllm:num_requests_waiting",
            lambda: float(replica.num_waiting + len(self._pending)),
        )
        m.read_value("vllm:kv_cache_usage_perc", lambda: replica.kv_usage)
        m.read_value("headway_emulator_lag_seconds", lambda: self.lag_s)
        m.read_value("headway_emulator_lag_max_seconds", lambda: self.max_lag_s)
        m.read_value("headway_emulator_speedup", lambda: speedup)
        m.read_value("vllm:prefix_cache_queries_total", lambda: self.prefix_queried_tokens)
        m.read_value("vllm:prefix_cache_hits_total", lambda: self.prefix_hit_tokens)
        self._prompt_tokens = m.counter("vllm:prompt_tokens_total")
        self._generation_tokens = m.counter("vllm:generation_tokens_total")
        self._preemptions = m.counter("vllm:num_preemptions_total")
        self._steps = m.counter("headway_emulator_steps_total")
        self._late_steps = m.counter("headway_emulator_late_steps_total")
        self._finished = {
            r: m.counter("vllm:request_success_total", finished_reason=r) for r in FINISHED_REASONS
        }
        self._ttft = m.histogram("vllm:time_to_first_token_seconds")
        self._itl = m.token_histogram("vllm:inter_token_latency_seconds")
        self._tpot = m.token_histogram("vllm:time_per_output_token_seconds")
        self._e2e = m.histogram("vllm:e2e_request_latency_seconds")
        self._queue = m.histogram("vllm:request_queue_time_seconds")
        self._lag = m.histogram("headway_emulator_step_lag_seconds")

    def _count_finished(self, reason: str) -> None:
        counter = self._finished.get(reason)
        if counter is None:  # a reason beyond vLLM's three: exposed from now on
            counter = self._finished[reason] = self.metrics.counter(
                "vllm:request_success_total", finished_reason=reason
            )
        counter.inc()

    # ----------------------------------------------------------------- time

    def now_v(self) -> float:
        """The emulated engine's current time."""
        return (self.clock() - self._start_wall) * self.speedup

    def _wall_of(self, t_v: float) -> float:
        return self._start_wall + t_v / self.speedup

    # ----------------------------------------------------------------- requests

    @property
    def max_model_len(self) -> int:
        """Longest prompt + output that fits the KV pool."""
        pool = self.replica.scheduler.pool
        return pool.num_blocks * self.replica.config.block_size

    def submit(
        self,
        num_prompt_tokens: int,
        max_output_tokens: int,
        stop_reason: str = "length",
        *,
        arrived_at: float | None = None,
        block_hashes: Sequence[int] = (),
    ) -> Generation:
        """Hand a request to the engine; it joins the next step.

        ``arrived_at`` is when the request reached the server (on :attr:`clock`; default
        now): the engine sees it then, so the time spent reading and checking its body
        (an emulator cost, not an engine cost) does not count against it.
        ``block_hashes``: the prompt's full blocks' hashes, for prefix-cache hits (none:
        every block is the request's own).

        Raises:
            ValueError: if it could never run (longer than :attr:`max_model_len`).
        """
        if num_prompt_tokens + max_output_tokens > self.max_model_len:
            raise ValueError(
                f"prompt ({num_prompt_tokens}) + max_tokens ({max_output_tokens}) exceeds "
                f"max_model_len ({self.max_model_len})"
            )
        rid = self._next_id
        self._next_id += 1
        gen = Generation(rid, num_prompt_tokens, max_output_tokens, stop_reason)
        now_v = self.now_v()
        if arrived_at is not None:
            now_v = min(now_v, (arrived_at - self._start_wall) * self.speedup)
        gen.arrival_v = now_v
        req = EngineRequest(
            rid, num_prompt_tokens=num_prompt_tokens, max_output_tokens=max_output_tokens,
            block_hashes=block_hashes,
        )  # fmt: skip
        pending = self._pending
        if pending and pending[-1][0] > now_v:  # keep arrival order
            at = len(pending)
            while at > 0 and pending[at - 1][0] > now_v:
                at -= 1
            pending.insert(at, (now_v, req, gen))
        else:
            pending.append((now_v, req, gen))
        self._live[rid] = gen
        self._wake.set()
        return gen

    def abort(self, gen: Generation) -> None:
        """Cancel a request (its client went away): free its KV blocks now."""
        if gen.done:
            return
        gen.done = True
        gen.finish_reason = "abort"
        self._live.pop(gen.request_id, None)
        for i, (_, _req, g) in enumerate(self._pending):
            if g is gen:
                del self._pending[i]
                break
        else:
            self.replica.abort(gen.request_id)
            self._wake.set()
        self._count_finished("abort")
        gen._notify()

    # ----------------------------------------------------------------- the loop

    def close(self) -> None:
        """Release the timer thread (after the loop task ended)."""
        self._timer.shutdown(wait=False, cancel_futures=True)

    async def run(self) -> None:
        """Step the model for as long as the server runs (cancel the task to stop)."""
        replica = self.replica
        faults = self.faults
        while True:
            if not replica.has_work and not self._pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            now = self.clock()
            if faults.is_stalled(now):
                await self._stall(faults.stalled_until - now)
                continue
            start_v = max(replica.busy_until_s, self._resume_v)
            if not replica.has_work:
                start_v = max(start_v, self._pending[0][0])
            self._admit(start_v)
            result = replica.step(start_v)
            if result.is_empty:
                # Nothing can run until a request ends or arrives.
                self._wake.clear()
                await self._wake.wait()
                continue
            await self._sleep_until(self._wall_of(result.end_s))
            self._deliver(result)

    async def _stall(self, for_s: float) -> None:
        self._wake.clear()
        timeout = None if for_s == math.inf else max(for_s, 0.0)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)
        if not self.faults.is_stalled(self.clock()):
            self._resume_v = self.now_v()

    def _admit(self, start_v: float) -> None:
        """Add the pending requests that arrived by ``start_v``."""
        pending = self._pending
        while pending and pending[0][0] <= start_v:
            arrival_v, req, _gen = pending.popleft()
            self.replica.add_request(req, arrival_v)
            self._prompt_tokens.inc(req.num_prompt_tokens)

    async def _sleep_until(self, wall: float) -> None:
        """Sleep until ``wall`` on :attr:`clock`, to within about 0.1 ms.

        asyncio's timers wake up to 1 ms late (epoll counts whole milliseconds), which
        at a speed-up of 10 is 10 ms of engine time. So the loop sleeps on its own timer
        until shortly before ``wall``, then the rest in a timer thread (``time.sleep`` is
        precise to tens of microseconds), which wakes the loop through its self-pipe.
        """
        delay = wall - self.clock()
        if delay > _COARSE_MARGIN_S:
            await asyncio.sleep(delay - _COARSE_MARGIN_S)
            delay = wall - self.clock()
        if delay > 0:
            await asyncio.get_running_loop().run_in_executor(self._timer, time.sleep, delay)
        else:
            await asyncio.sleep(0)  # late: catch up, but let the streams write meanwhile
        lag = self.clock() - wall
        if lag < 0:
            lag = 0.0
        self.lag_s = lag
        self._lag.observe(lag)
        if lag > self.max_lag_s:
            self.max_lag_s = lag
        if lag > 0.001:
            self._late_steps.inc()
            if lag > LAG_WARNING_S and self.clock() - self._last_lag_warning > 10:
                self._last_lag_warning = self.clock()
                _log.warning(
                    "the emulator is %.0f ms behind the wall clock (speedup %g): tokens go "
                    "out late; lower --speedup or the load",
                    lag * 1000,
                    self.speedup,
                )

    def _deliver(self, result: StepResult) -> None:
        """Release a step's tokens to their generations and record the metrics."""
        end_v = result.end_s
        live = self._live
        self._steps.inc()
        scheduler = self.replica.scheduler
        self.prefix_queried_tokens = scheduler.num_prefix_queried_tokens
        self.prefix_hit_tokens = scheduler.num_prefix_hit_tokens
        if result.preempted_ids:
            self._preemptions.inc(len(result.preempted_ids))
        for rid in result.admitted_ids:
            gen = live.get(rid)
            if gen is not None and gen.scheduled_v != gen.scheduled_v:
                gen.scheduled_v = result.start_s
                self._queue.observe(result.start_s - gen.arrival_v)
        emitted = 0
        gaps: dict[float, int] = {}  # tokens per gap: one weighted observation each
        for rid, n in result.tokens.items():
            gen = live.get(rid)
            if gen is None:
                continue
            emitted += n
            if gen.num_emitted == 0:
                gen.first_token_v = end_v
                self._ttft.observe(end_v - gen.arrival_v)
            else:
                gap = end_v - gen.last_token_v  # n tokens this step: n gaps of this length
                gaps[gap] = gaps.get(gap, 0) + n
            gen.last_token_v = end_v
            gen.num_emitted += n
            gen._notify()
        for gap, n in gaps.items():
            self._itl.observe(gap, n)
            self._tpot.observe(gap, n)
        self._generation_tokens.inc(emitted)
        for rid in result.finished_ids:
            gen = live.pop(rid, None)
            if gen is None:
                continue
            gen.done = True
            gen.finish_reason = gen.stop_reason
            self._e2e.observe(end_v - gen.arrival_v)
            self._count_finished(gen.stop_reason)
            gen._notify()
