"""The wall-clock driver runs the core replica model exactly as stepping it directly."""

from __future__ import annotations

import asyncio

import pytest

from headway.core.engine.replica import ReplicaModel
from headway.core.engine.scheduler import EngineRequest, SchedulerConfig
from headway.core.engine.steptime import AffineStepTime
from headway.emulate.faults import FaultState
from headway.emulate.wallclock import Generation, WallClockEngine
from headway.metrics_catalog import EMULATOR, Metrics

STEP = AffineStepTime(overhead_s=0.004, per_prefill_token_s=1e-5, per_decode_seq_s=1e-4)
CONFIG = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=256)
SHAPES = [(300, 7), (40, 12), (90, 3), (500, 9), (20, 15), (60, 5)]  # (prompt, output)


def _metrics() -> Metrics:
    return Metrics(EMULATOR, fixed={"model_name": "m"})


def _replica() -> ReplicaModel:
    return ReplicaModel(CONFIG, 400, STEP)


def _direct(arrivals: list[float]) -> dict[int, tuple[float, float]]:
    """(first token, last token) per request from stepping the replica by hand."""
    replica = _replica()
    pending = sorted(zip(arrivals, range(len(SHAPES)), strict=True))
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    now = pending[0][0]
    while pending or replica.has_work:
        if not replica.has_work:
            now = max(now, pending[0][0])
        while pending and pending[0][0] <= now:
            at, i = pending.pop(0)
            p, o = SHAPES[i]
            replica.add_request(EngineRequest(i, num_prompt_tokens=p, max_output_tokens=o), at)
        result = replica.step(now)
        for rid in result.tokens:
            first.setdefault(int(rid), result.end_s)
            last[int(rid)] = result.end_s
        now = result.end_s
    return {i: (first[i], last[i]) for i in first}


async def _emulated() -> tuple[list[float], dict[int, tuple[float, float]], list[Generation]]:
    engine = WallClockEngine(
        _replica(),
        speedup=200.0,
        faults=FaultState(),
        metrics=_metrics(),
    )
    task = asyncio.create_task(engine.run())
    gens = []
    for p, o in SHAPES:
        gens.append(engine.submit(p, o))
        await asyncio.sleep(0.0003)
    for g in gens:
        while not g.done:
            await g.wait()
    task.cancel()
    engine.close()
    arrivals = [g.arrival_v for g in gens]
    return arrivals, {g.request_id: (g.first_token_v, g.last_token_v) for g in gens}, gens


def test_emulator_timeline_equals_direct_stepping() -> None:
    arrivals, emulated, gens = asyncio.run(_emulated())
    direct = _direct(arrivals)
    assert emulated.keys() == direct.keys()
    for rid, (first, last) in emulated.items():
        assert first == pytest.approx(direct[rid][0], abs=1e-12)
        assert last == pytest.approx(direct[rid][1], abs=1e-12)
    for g, (_, out) in zip(gens, SHAPES, strict=True):
        assert g.num_emitted == out and g.finish_reason == "length"


def test_abort_frees_the_request_and_counts_it() -> None:
    async def scenario() -> tuple[int, str, float]:
        metrics = _metrics()
        engine = WallClockEngine(_replica(), speedup=1.0, faults=FaultState(), metrics=metrics)
        task = asyncio.create_task(engine.run())
        gen = engine.submit(200, 300)  # 300 steps of >= 4 ms: it cannot finish first
        await asyncio.sleep(0.02)
        engine.abort(gen)
        await asyncio.sleep(0.01)
        running = engine.replica.num_running + engine.replica.num_waiting
        task.cancel()
        engine.close()
        aborted = metrics.sample("vllm:request_success_total", finished_reason="abort")
        return running, gen.finish_reason, aborted

    running, reason, aborted = asyncio.run(scenario())
    assert (running, reason, aborted) == (0, "abort", 1)


def test_submit_rejects_what_can_never_fit() -> None:
    engine = WallClockEngine(
        _replica(),
        speedup=1.0,
        faults=FaultState(),
        metrics=_metrics(),
    )
    with pytest.raises(ValueError, match="max_model_len"):
        engine.submit(engine.max_model_len, 1)
    engine.close()
