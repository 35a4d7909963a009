"""Run a compiled workload against a target: shards, worker processes, one start time.

With one worker the schedule runs in this process. With more, each worker process
(forked, so it inherits the compiled schedule without copying) opens its own pool and
says it is ready; the parent then picks one start time ``t0`` on the monotonic clock
(shared by all processes on Linux) and every worker sends its shard relative to it. No
message passes between processes while the run lasts; each sends its records back at
the end. CPU time is measured with ``getrusage`` in every process.
"""

from __future__ import annotations

import asyncio
import gc
import math
import multiprocessing
import resource
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from multiprocessing.connection import Connection as Pipe
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from headway.bench.payloads import RequestEncoder, Target
from headway.bench.records import CallRecords
from headway.bench.schedule import ShardPlan
from headway.bench.sender import Sender, SendSettings, ShardStats

LoopKind = Literal["uvloop", "asyncio"]

START_LEAD_S = 0.02
"""Time between the pools being ready and ``t0``."""


def _cpu_s(who: int = resource.RUSAGE_SELF) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _new_loop(kind: LoopKind) -> asyncio.AbstractEventLoop:
    if kind == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def run_coroutine(kind: LoopKind, coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` to completion on a new loop of ``kind``."""
    loop = _new_loop(kind)
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


@dataclass(slots=True)
class ShardOutcome:
    """What one shard brings back."""

    arrays: dict[str, npt.NDArray[np.generic]]
    stats: ShardStats
    prefilled: int
    run_cpu_s: float


def _run_shard(
    plan: ShardPlan,
    target: Target,
    encoder: RequestEncoder,
    settings: SendSettings,
    kind: LoopKind,
    ready: Callable[[int], None],
    start_at: Callable[[], float],
) -> ShardOutcome:
    loop = _new_loop(kind)
    try:

        async def make() -> tuple[Sender, int]:
            sender = Sender(plan, target, encoder, settings)
            return sender, await sender.prefill()

        sender, prefilled = loop.run_until_complete(make())
        ready(prefilled)
        # Long-lived objects (modules, the schedule) leave the collector's view, so a
        # full collection during the run does not pause the pacer for milliseconds.
        gc.freeze()
        t0 = start_at()
        cpu0 = _cpu_s()
        cols = loop.run_until_complete(sender.run(t0))
        run_cpu = _cpu_s() - cpu0
    finally:
        gc.unfreeze()
        loop.close()
    return ShardOutcome(cols.to_arrays(t0), sender.stats, prefilled, run_cpu)


def _worker(
    pipe: Pipe,
    plan: ShardPlan,
    target: Target,
    encoder: RequestEncoder,
    settings: SendSettings,
    kind: LoopKind,
) -> None:
    try:
        outcome = _run_shard(
            plan, target, encoder, settings, kind, lambda n: pipe.send(("ready", n)), pipe.recv
        )
        pipe.send(("done", outcome))
    except BaseException as exc:  # reported to the parent, which raises it
        pipe.send(("error", repr(exc)))
        raise
    finally:
        pipe.close()


@dataclass(frozen=True, slots=True, eq=False)
class RunOutcome:
    """Every call's record and the run's own costs."""

    records: CallRecords
    workers: int
    connections_prefilled: int
    stats: ShardStats
    run_cpu_s: float
    """CPU of the sending processes from ``t0`` to their last response."""
    total_cpu_s: float
    """CPU of this process since it started plus its finished workers."""
    wall_s: float
    """From ``t0`` to the last worker's end."""
    t0: float
    """The monotonic time that schedule offset 0 mapped to."""


def _merge_stats(stats: list[ShardStats]) -> ShardStats:
    return ShardStats(
        connects=sum(s.connects for s in stats),
        connect_errors=sum(s.connect_errors for s in stats),
        resent=sum(s.resent for s in stats),
        max_open=sum(s.max_open for s in stats),
        in_flight_s=sum(s.in_flight_s for s in stats),
        sampled_s=max((s.sampled_s for s in stats), default=0.0),
    )


def run_plans(
    plans: list[ShardPlan],
    num_calls: int,
    target: Target,
    encoder: RequestEncoder,
    settings: SendSettings,
    kind: LoopKind = "uvloop",
) -> RunOutcome:
    """Send every shard (in this process when there is one) and gather the records."""
    records = CallRecords.empty(num_calls)
    if len(plans) == 1:
        started: list[float] = []

        def start_at() -> float:
            started.append(time.monotonic() + START_LEAD_S)
            return started[0]

        out = _run_shard(plans[0], target, encoder, settings, kind, lambda n: None, start_at)
        records.scatter(plans[0].calls, out.arrays)
        return RunOutcome(
            records=records,
            workers=1,
            connections_prefilled=out.prefilled,
            stats=out.stats,
            run_cpu_s=out.run_cpu_s,
            total_cpu_s=_cpu_s(),
            wall_s=time.monotonic() - started[0],
            t0=started[0],
        )
    return _run_workers(plans, records, target, encoder, settings, kind)


def _run_workers(
    plans: list[ShardPlan],
    records: CallRecords,
    target: Target,
    encoder: RequestEncoder,
    settings: SendSettings,
    kind: LoopKind,
) -> RunOutcome:
    ctx = multiprocessing.get_context("fork")
    pipes: list[Pipe] = []
    procs = []
    for plan in plans:
        parent, child = ctx.Pipe()
        proc = ctx.Process(
            target=_worker, args=(child, plan, target, encoder, settings, kind), daemon=True
        )
        proc.start()
        child.close()
        pipes.append(parent)
        procs.append(proc)
    try:
        prefilled = 0
        for pipe in pipes:
            _, value = _receive(pipe)
            prefilled += int(value)
        t0 = time.monotonic() + START_LEAD_S
        for pipe in pipes:
            pipe.send(t0)
        outcomes: list[ShardOutcome] = []
        for pipe in pipes:
            _, outcome = _receive(pipe)
            outcomes.append(outcome)
        wall = time.monotonic() - t0
    finally:
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()
    for plan, outcome in zip(plans, outcomes, strict=True):
        records.scatter(plan.calls, outcome.arrays)
    return RunOutcome(
        records=records,
        workers=len(plans),
        connections_prefilled=prefilled,
        stats=_merge_stats([o.stats for o in outcomes]),
        run_cpu_s=sum(o.run_cpu_s for o in outcomes),
        total_cpu_s=_cpu_s() + _cpu_s(resource.RUSAGE_CHILDREN),
        wall_s=wall,
        t0=t0,
    )


def _receive(pipe: Pipe) -> tuple[str, Any]:
    try:
        kind, value = pipe.recv()
    except EOFError:
        raise RuntimeError("a bench worker process died without a word") from None
    if kind == "error":
        raise RuntimeError(f"a bench worker process failed: {value}")
    return str(kind), value


def default_workers(peak_rate_per_s: float, cpus: int) -> int:
    """One worker per ~1,500 calls/s of peak rate, at most one per CPU."""
    return max(1, min(cpus, math.ceil(peak_rate_per_s / 1500.0)))
