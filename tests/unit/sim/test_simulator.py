"""The simulator: skipping equals stepping, determinism, task flow, routing, accounting."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

from headway.core.engine.replica import ReplicaModel
from headway.core.engine.scheduler import SchedulerConfig
from headway.core.engine.steptime import AffineStepTime
from headway.core.policy.routing import Router
from headway.core.workload.compile import CompiledWorkload, compile_workload
from headway.files.workload import parse_workload
from headway.sim.cluster import ClusterSpec
from headway.sim.run import simulate_compiled
from headway.sim.simulator import SimOptions, SimOutcome, Simulator


def _workload(**classes: Any) -> dict[str, Any]:
    return {
        "name": "t",
        "duration_s": 30,
        "classes": classes or {
            "chat": {"input_tokens": {"dist": "lognormal", "mean": 600, "cv": 1.0, "max": 6000},
                     "output_tokens": {"dist": "lognormal", "mean": 150, "cv": 1.0, "max": 1500},
                     "slo": {"ttft_s": 1.0, "tpot_s": 0.05}},
        },
        "sources": [{"name": "s", "arrivals": {"process": "poisson", "rate_per_s": 4}}],
    }  # fmt: skip


def _run(
    data: dict[str, Any],
    *,
    skip: bool,
    replicas: int = 2,
    blocks: int | None = None,
    router: str = "least_outstanding_requests",
    engine: dict[str, Any] | None = None,
    seed: int = 1,
    rate_per_s: float = 4.0,
    paranoid: bool = False,
) -> tuple[CompiledWorkload, SimOutcome]:
    data["sources"][0]["arrivals"]["rate_per_s"] = rate_per_s
    if "mix" not in data["sources"][0] and len(data["classes"]) > 1:
        data["sources"][0]["mix"] = dict.fromkeys(data["classes"], 1.0)
    spec = parse_workload(data)
    w = compile_workload(spec, seed=seed)
    config = SchedulerConfig(**(engine or {}))
    step = AffineStepTime(
        overhead_s=0.003, per_prefill_token_s=4e-5, per_prefill_pair_s=1e-9,
        per_decode_seq_s=5e-5, per_decode_kv_token_s=3e-8,
    )  # fmt: skip
    models = [ReplicaModel(config, blocks or 4000, step) for _ in range(replicas)]
    out = Simulator(
        w, models, Router(kind=router), SimOptions(skip_decode=skip, check_invariants=paranoid)
    ).run()
    return w, out


SCENARIOS: dict[str, dict[str, Any]] = {
    "plain": {},
    "preemption": {"blocks": 400, "replicas": 1, "rate_per_s": 6.0, "paranoid": True,
                   "data": _workload(chat={"input_tokens": {"dist": "lognormal", "mean": 800,
                                                            "cv": 1.0, "max": 3000},
                                           "output_tokens": {"dist": "lognormal", "mean": 300,
                                                             "cv": 1.0, "max": 1000}})},
    "branches-first": {
        "data": _workload(agent={"calls": 3, "parallel_branches": 3, "branch_join": "first",
                                 "tools_per_call": 1, "tool_latency_s": 0.2,
                                 "input_tokens": 300, "output_tokens": {"dist": "gamma",
                                                                       "mean": 80, "cv": 1}})
    },
    "priority-policy": {
        "data": _workload(
            hi={"priority": "critical", "input_tokens": 200, "output_tokens": 100},
            lo={"priority": "background", "input_tokens": 3000, "output_tokens": 300},
        ),
        "engine": {"policy": "priority", "max_num_seqs": 16},
        "blocks": 1500,
    },
    "no-chunking-rr": {"engine": {"enable_chunked_prefill": False}, "router": "round_robin"},
    "kv-aware": {"router": "kv_aware", "replicas": 3},
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_skipping_equals_stepping(name: str) -> None:
    cfg = dict(SCENARIOS[name])
    data = cfg.pop("data", None) or _workload()

    _, fast = _run(copy.deepcopy(data), skip=True, **cfg)
    _, slow = _run(copy.deepcopy(data), skip=False, **cfg)
    assert fast.num_skipped_steps > 0
    assert slow.num_skipped_steps == 0
    for column in ("first_token_s", "finish_s", "admitted_s", "itl_max_s", "dispatch_s"):
        a, b = getattr(fast.calls, column), getattr(slow.calls, column)
        assert np.array_equal(np.isnan(a), np.isnan(b)), column
        ok = ~np.isnan(a)
        np.testing.assert_allclose(a[ok], b[ok], rtol=1e-9, atol=1e-12, err_msg=column)
    for column in ("num_output_tokens", "num_preemptions", "replica", "cancelled"):
        assert np.array_equal(getattr(fast.calls, column), getattr(slow.calls, column)), column
    assert fast.num_steps == slow.num_steps
    np.testing.assert_allclose(fast.task_finish_s, slow.task_finish_s, rtol=1e-9)
    if name == "preemption":
        assert slow.calls.num_preemptions.sum() > 0
    if name == "branches-first":
        assert slow.calls.cancelled.sum() > 0


def test_every_call_accounted_and_tasks_follow_their_steps() -> None:
    agent = {"calls": 3, "parallel_branches": 2, "tools_per_call": 1, "tool_latency_s": 0.5,
             "input_tokens": 400, "output_tokens": 60}  # fmt: skip
    data = _workload(agent=agent)
    w, out = _run(data, skip=True)
    c = out.calls
    assert np.isfinite(c.finish_s).all() and not c.cancelled.any()
    assert np.array_equal(c.num_output_tokens, w.call_output_tokens)
    assert (c.first_token_s >= c.dispatch_s).all() and (c.finish_s >= c.first_token_s).all()
    for t in range(min(w.num_tasks, 50)):
        calls = range(int(w.task_first_call[t]), int(w.task_first_call[t] + w.task_num_calls[t]))
        steps: dict[int, list[int]] = {}
        for j in calls:
            steps.setdefault(int(w.call_step[j]), []).append(j)
        for s in range(1, len(steps)):
            prev_done = max(c.finish_s[j] for j in steps[s - 1])
            tool = w.call_tool_after_s[steps[s - 1][0]]
            for j in steps[s]:
                assert c.dispatch_s[j] == pytest.approx(prev_done + tool, abs=1e-9)
        assert out.task_finish_s[t] == pytest.approx(max(c.finish_s[j] for j in calls))


def test_same_seed_same_records_other_seed_differs() -> None:
    _, a = _run(_workload(), skip=True, seed=3)
    _, b = _run(_workload(), skip=True, seed=3)
    _, c = _run(_workload(), skip=True, seed=4)
    assert np.array_equal(a.calls.first_token_s, b.calls.first_token_s)
    assert np.array_equal(a.calls.finish_s, b.calls.finish_s)
    assert a.calls.finish_s.size != c.calls.finish_s.size or not np.array_equal(
        a.calls.finish_s, c.calls.finish_s
    )


def test_round_robin_spreads_evenly_and_least_loaded_balances() -> None:
    w, rr = _run(_workload(), skip=True, replicas=4, router="round_robin")
    counts = np.bincount(rr.calls.replica, minlength=4)
    assert counts.max() - counts.min() <= 1
    _, lor = _run(_workload(), skip=True, replicas=4)
    assert np.bincount(lor.calls.replica, minlength=4).min() > 0.15 * w.num_calls


def test_roofline_cluster_result_and_littles_law() -> None:
    data = _workload()
    data["duration_s"] = 240
    w = compile_workload(parse_workload(data), seed=2)
    result, _ = simulate_compiled(w, ClusterSpec(replicas=1, model="llama-3-8b", gpu="h100"))
    assert result.completed_calls == w.num_calls
    assert result.little.relative_mismatch < 0.05
    assert 0 <= result.slo.attainment <= 1
    assert result.latencies.ttft.p50_s is not None and result.latencies.ttft.p50_s > 0
    # an H100 decodes Llama-3-8B at a few ms to tens of ms per step, never faster than HBM
    assert result.itl.p50_s is not None and 0.004 < result.itl.p50_s < 0.1
    assert result.by_length[0].name == "0-512"
    assert sum(g.calls for g in result.by_class) == w.num_calls
