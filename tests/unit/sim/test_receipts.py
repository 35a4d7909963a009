"""Asynchronous receipts in the simulator: with ``gateway.receipts``, the calls of a
deferrable band that the gateway would shed are deferred and run later in
``background`` (the core's ``should_defer``, the live gateway's decision), each counted
once; an interactive class beside them is shed as before."""

from __future__ import annotations

from typing import Any

from headway.core.workload.compile import compile_workload
from headway.files.workload import parse_workload
from headway.sim.cluster import parse_cluster
from headway.sim.results import SimResult
from headway.sim.run import simulate_compiled
from headway.sim.simulator import OUTCOMES, SimOutcome

# One Llama-2-7B replica on an A100 completes about 14 of these calls per second.
_CAPACITY_PER_S = 14.0


def _workload() -> Any:
    """A minute at twice the capacity, half batch (background), half chat."""
    classes = {
        "batch": {"input_tokens": 512, "output_tokens": 128, "priority": "background"},
        "chat": {"input_tokens": 512, "output_tokens": 128, "priority": "interactive"},
    }
    sources = [
        {"name": name, "mix": {name: 1.0},
         "arrivals": {"process": "poisson", "rate_per_s": _CAPACITY_PER_S}}
        for name in classes
    ]  # fmt: skip
    return {"name": "burst", "duration_s": 60, "classes": classes, "sources": sources}


def _simulate(receipts: dict[str, Any] | None) -> tuple[Any, SimResult, SimOutcome]:
    gateway: dict[str, Any] = {"preset": "headway-default"}
    if receipts is not None:
        gateway["receipts"] = receipts
    cluster = {
        "replicas": 1, "model": "llama-2-7b", "gpu": "a100", "num_kv_blocks": 7424,
        "engine": {"max_num_seqs": 128, "max_num_batched_tokens": 4096,
                   "enable_chunked_prefill": False},
        "gateway": gateway,
    }  # fmt: skip
    w = compile_workload(parse_workload(_workload()), seed=5)
    result, out = simulate_compiled(w, parse_cluster(cluster))
    return w, result, out


def test_deferrable_sheds_become_receipts_that_complete_once_later() -> None:
    w, plain, plain_out = _simulate(None)
    _, deferred, out = _simulate({"deferrable": ["background"], "retention_s": 3600})
    batch = w.task_class[w.call_task] == w.class_names.index("batch")
    shed = OUTCOMES.index("shed")
    completed = OUTCOMES.index("completed")
    plain_batch_shed = int((batch & (plain_out.calls.outcome == shed)).sum())
    assert plain.deferred_calls == 0
    assert plain_batch_shed > 0.2 * batch.sum()  # without receipts, batch work is refused
    # With them: every deferred call is a batch call, none is shed, each completes once.
    calls = out.calls
    assert deferred.deferred_calls >= plain_batch_shed // 2
    assert not (calls.deferred & ~batch).any()
    assert deferred.deferred_completed == deferred.deferred_calls
    assert (calls.outcome[calls.deferred] == completed).all()
    assert int((batch & (calls.outcome == shed)).sum()) == 0
    assert deferred.accounting.balanced
    # They ran later: after their first refusal, so after the burst's queue had room.
    assert (calls.attempts[calls.deferred] >= 2).all()
    # The chat class beside them is still shed, truthfully (it is not deferrable).
    chat_shed = int((~batch & (calls.outcome == shed)).sum())
    assert chat_shed > 0
    segments = {(s.dimension, s.name): s for s in deferred.segments}
    assert segments["deferral", "deferred"].calls == deferred.deferred_calls


def test_a_short_retention_ends_deferred_calls_that_could_not_run() -> None:
    _, result, out = _simulate({"deferrable": ["background"], "retention_s": 1.0})
    assert result.deferred_calls > 0
    assert result.deferred_completed < result.deferred_calls
    assert result.accounting.balanced
    assert out.calls.deferred.sum() == result.deferred_calls
