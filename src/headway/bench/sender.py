"""Send one shard's schedule open-loop over a pre-opened keep-alive pool (one event loop).

The pacer sleeps until the next scheduled time on the monotonic clock and then sends
every call that is due, at most ``catchup_batch`` per turn of the event loop before it
lets responses be read (bounded catch-up: a late sender catches up in bursts of that
size, never by skipping or re-timing calls; the lateness is recorded). A call waits for
a free connection when all are busy; the pool grows on demand up to
``max_connections``, opening at most ``max_connecting`` at once (a connect-storm guard).
A connection that the server closed while idle is replaced; a call sent on a reused
connection that closes before any byte of the response arrives is sent once more.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from dataclasses import dataclass

from headway.bench.connection import Connection
from headway.bench.payloads import RequestEncoder, Target
from headway.bench.records import ABANDONED, CONNECT, OK, PROTOCOL, TIMEOUT, Columns
from headway.bench.schedule import FollowUps, ShardPlan

_now = time.monotonic


@dataclass(frozen=True, slots=True, kw_only=True)
class SendSettings:
    """How a shard sends (see ``docs/bench.md``)."""

    connections: int = 64
    """Connections opened before the start."""
    max_connections: int = 4096
    """Upper bound of the pool."""
    max_connecting: int = 64
    """Connects in progress at once."""
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0
    """A call whose server stays silent this long times out."""
    request_timeout_s: float = 600.0
    """A call still unfinished this long after its scheduled time times out."""
    catchup_batch: int = 64
    """Calls sent per event-loop turn when the sender is behind."""
    timer_slack_s: float = 0.0
    """Added to each pacer sleep; event loops with millisecond timers (uvloop) may fire
    early, which would make the pacer spin until the due time."""


IN_FLIGHT_SAMPLE_S = 0.05
"""How often a sender samples its calls in flight (for the Little's-law check)."""


@dataclass(slots=True)
class ShardStats:
    """Counters of one shard's connections."""

    connects: int = 0
    connect_errors: int = 0
    resent: int = 0
    max_open: int = 0
    in_flight_s: float = 0.0
    """Calls on the wire (sent, not ended) integrated over the run, from the sender's own
    count sampled every :data:`IN_FLIGHT_SAMPLE_S`: Little's L, independent of the records."""
    sampled_s: float = 0.0
    """The span those samples cover, from ``t0``."""


class Sender:
    """Runs one :class:`ShardPlan` (see the module docstring)."""

    def __init__(
        self,
        plan: ShardPlan,
        target: Target,
        encoder: RequestEncoder,
        settings: SendSettings,
    ) -> None:
        self.plan = plan
        self.target = target
        self.encoder = encoder
        self.settings = settings
        self.cols = Columns(plan.num_calls)
        self.stats = ShardStats()
        self.loop = asyncio.get_running_loop()
        self.idle: list[Connection] = []
        self.busy: set[Connection] = set()
        self.waiting: deque[int] = deque()
        self.open = 0
        self.connecting = 0
        self.unfinished = plan.num_calls
        self.done = self.loop.create_future()
        self.resent: set[int] = set()
        self.t0 = math.nan
        self._tasks: set[asyncio.Task[None]] = set()
        fu = plan.follow_ups
        self.pending = [0] * (fu.num_tasks if fu else 0)
        self.failed = [False] * (fu.num_tasks if fu else 0)
        if fu is not None:
            for j in plan.static_calls:
                self.pending[fu.task[j]] = fu.group_size[j]
        self._ssl = target.ssl_context()

    # -- the pool --------------------------------------------------------------------

    async def _connect(self) -> Connection | None:
        """Open one connection; the caller has counted it in ``connecting``."""
        try:
            _, conn = await asyncio.wait_for(
                self.loop.create_connection(
                    lambda: Connection(self), self.target.host, self.target.port, ssl=self._ssl
                ),
                self.settings.connect_timeout_s,
            )
        except (TimeoutError, OSError):
            self.stats.connect_errors += 1
            return None
        finally:
            self.connecting -= 1
        self.open += 1
        self.stats.connects += 1
        self.stats.max_open = max(self.stats.max_open, self.open)
        return conn

    async def prefill(self) -> int:
        """Open the initial pool (in batches of ``max_connecting``); returns its size."""
        want = min(self.settings.connections, self.settings.max_connections)
        while len(self.idle) < want:
            batch = min(self.settings.max_connecting, want - len(self.idle))
            self.connecting += batch
            conns = await asyncio.gather(*(self._connect() for _ in range(batch)))
            ok = [c for c in conns if c is not None]
            self.idle.extend(ok)
            if len(ok) < batch:
                break
        return len(self.idle)

    def _grow(self) -> None:
        """Open connections for waiting calls, within the limits."""
        s = self.settings
        while (
            len(self.waiting) > self.connecting
            and self.open + self.connecting < s.max_connections
            and self.connecting < s.max_connecting
        ):
            self.connecting += 1
            task = self.loop.create_task(self._open_for_waiting())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _open_for_waiting(self) -> None:
        conn = await self._connect()
        if conn is None:
            if self.waiting:  # the server refuses: fail the oldest waiting call
                j = self.waiting.popleft()
                self.cols.end_s[j] = _now()
                self._finished(j, CONNECT)
            self._grow()
            return
        self._reuse(conn)

    def _reuse(self, conn: Connection) -> None:
        if self.waiting:
            self._send_on(conn, self.waiting.popleft())
        else:
            self.idle.append(conn)

    def _send_on(self, conn: Connection, j: int) -> None:
        if conn.transport is None or conn.transport.is_closing():  # closed meanwhile
            self.waiting.appendleft(j)
            self._grow()
            return
        plan = self.plan
        data = self.encoder.encode(int(plan.calls[j]), plan.input_tokens[j], plan.output_tokens[j])
        self.busy.add(conn)
        conn.send(j, data)

    def dispatch(self, j: int, scheduled_s: float) -> None:
        """Send call ``j`` now (its scheduled time was ``scheduled_s``) or queue it."""
        self.cols.scheduled_s[j] = scheduled_s
        if self.idle:
            self._send_on(self.idle.pop(), j)
        else:
            self.waiting.append(j)
            self._grow()

    # -- callbacks from connections --------------------------------------------------

    def release(self, conn: Connection, j: int, error: int) -> None:
        """``conn`` finished call ``j`` with ``error``."""
        self.busy.discard(conn)
        if conn.keep_alive and conn.transport is not None and error != PROTOCOL:
            self._reuse(conn)
        else:
            if conn.transport is not None:
                conn.transport.close()
            # connection_lost will not report a call: conn.j is -1 now
        if j >= 0:
            self._finished(j, error)

    def lost(self, conn: Connection, j: int, got_bytes: bool) -> None:
        """``conn`` closed; ``j`` was in flight on it (-1: it was idle)."""
        self.open -= 1
        self.busy.discard(conn)
        if j < 0:
            if conn in self.idle:
                self.idle.remove(conn)
            self._grow()
            return
        conn.j = -1
        if not got_bytes and conn.served > 0 and j not in self.resent:
            # A reused connection the server had closed: send once more, same schedule.
            self.resent.add(j)
            self.stats.resent += 1
            self.waiting.appendleft(j)
            self._grow()
            return
        self.cols.end_s[j] = _now()
        self._finished(j, PROTOCOL if got_bytes else CONNECT)
        self._grow()

    def _finished(self, j: int, error: int) -> None:
        self.cols.error[j] = error
        self.unfinished -= 1
        fu = self.plan.follow_ups
        if fu is not None:
            self._advance(fu.task[j], j, error, fu)
        if self.unfinished <= 0 and not self.done.done():
            self.done.set_result(None)

    def _advance(self, task: int, j: int, error: int, fu: FollowUps) -> None:
        """Start the task's next step when its current step has finished."""
        if error != OK:
            self.failed[task] = True
        self.pending[task] -= 1
        if self.pending[task] > 0:
            return
        nxt = fu.group_end[j]
        end = fu.task_end[j]
        if nxt >= end:
            return
        if self.failed[task]:  # an earlier call failed: the rest of the task is abandoned
            for k in range(nxt, end):
                self.cols.error[k] = ABANDONED
            self.unfinished -= end - nxt
            return
        self.pending[task] = fu.group_size[nxt]
        self._dispatch_group(nxt, fu.group_end[nxt], _now() + fu.tool_after_s[j])

    def _dispatch_group(self, first: int, end: int, due: float) -> None:
        """Send a step's calls at ``due`` (timers may fire early: then wait again)."""
        now = _now()
        if now < due:
            delay = due - now + self.settings.timer_slack_s
            self.loop.call_later(delay, self._dispatch_group, first, end, due)
            return
        for k in range(first, end):
            self.dispatch(k, due)

    # -- timing ----------------------------------------------------------------------

    async def _pace(self) -> None:
        plan = self.plan
        calls = plan.static_calls
        t0 = self.t0
        times = [t0 + x for x in plan.static_offset_s]
        n = len(times)
        batch = self.settings.catchup_batch
        slack = self.settings.timer_slack_s
        sleep = asyncio.sleep
        dispatch = self.dispatch
        i = 0
        while i < n:
            now = _now()
            due = times[i]
            if due > now:
                await sleep(due - now + slack)
                continue
            sent = 0
            while i < n and times[i] <= now and sent < batch:
                dispatch(calls[i], times[i])
                i += 1
                sent += 1
            if sent == batch:
                await sleep(0)

    async def _watch_timeouts(self) -> None:
        s = self.settings
        cols = self.cols
        while not self.done.done():
            await asyncio.sleep(min(0.25, s.read_timeout_s / 4))
            now = _now()
            for conn in list(self.busy):
                j = conn.j
                if j < 0:
                    continue
                if (
                    now - conn.last_io_s > s.read_timeout_s
                    or now - cols.scheduled_s[j] > s.request_timeout_s
                ):
                    conn.j = -1
                    self.busy.discard(conn)
                    if conn.transport is not None:
                        conn.transport.abort()
                    self._finished(j, TIMEOUT)
            while self.waiting and now - cols.scheduled_s[self.waiting[0]] > s.request_timeout_s:
                self._finished(self.waiting.popleft(), TIMEOUT)

    async def _sample_in_flight(self) -> None:
        """Integrate the calls on the wire (busy connections) over time, in steps of
        :data:`IN_FLIGHT_SAMPLE_S` (each sample holds until the next)."""
        stats = self.stats
        await asyncio.sleep(max(self.t0 - _now(), 0.0))
        last = self.t0
        while True:
            now = _now()
            stats.in_flight_s += len(self.busy) * (now - last)
            stats.sampled_s = now - self.t0
            last = now
            await asyncio.sleep(IN_FLIGHT_SAMPLE_S)

    async def run(self, t0: float) -> Columns:
        """Send the shard's schedule, starting at monotonic time ``t0``; wait for the end."""
        self.t0 = t0
        if self.unfinished == 0:
            return self.cols
        watcher = self.loop.create_task(self._watch_timeouts())
        sampler = self.loop.create_task(self._sample_in_flight())
        try:
            await self._pace()
            await self.done
        finally:
            watcher.cancel()
            sampler.cancel()
            for conn in [*self.idle, *self.busy]:
                if conn.transport is not None:
                    conn.transport.abort()
        return self.cols
