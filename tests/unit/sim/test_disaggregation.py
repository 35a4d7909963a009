"""Prefill/decode disaggregation: separate pools, the prompt KV moved between them."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headway.core.engine.catalog import get_gpu, get_model
from headway.core.engine.replica import ReplicaModel
from headway.core.engine.scheduler import SchedulerConfig
from headway.core.engine.steptime import AffineStepTime
from headway.core.errors import ConfigError
from headway.core.policy.routing import Router, RouterKind
from headway.core.workload.compile import compile_workload
from headway.files.workload import parse_workload
from headway.sim.cluster import parse_cluster
from headway.sim.faults import Slowdown
from headway.sim.results import build_result
from headway.sim.run import simulate
from headway.sim.simulator import OUTCOMES, Disaggregation, SimOptions, SimOutcome, Simulator

_STEP = AffineStepTime(
    overhead_s=0.003,
    per_prefill_token_s=4e-5,
    per_prefill_pair_s=1e-9,
    per_decode_seq_s=5e-5,
    per_decode_kv_token_s=3e-8,
)
_DISAGG = Disaggregation(
    prefill_replicas=1, kv_transfer_s_per_token=2e-6, kv_transfer_latency_s=1e-4
)
_CODE = {name: i for i, name in enumerate(OUTCOMES)}


def _workload(classes: dict[str, Any], rate_per_s: float, **extra: Any) -> dict[str, Any]:
    return {
        "name": "pd",
        "duration_s": 20,
        "classes": classes,
        "sources": [
            {
                "name": "s",
                "arrivals": {"process": "poisson", "rate_per_s": rate_per_s},
                "mix": dict.fromkeys(classes, 1.0),
            }
        ],
        **extra,
    }


def _simulator(
    data: dict[str, Any],
    *,
    skip: bool = True,
    replicas: int = 3,
    blocks: int = 4000,
    router: RouterKind = "least_outstanding_requests",
    disagg: Disaggregation | None = _DISAGG,
    seed: int = 1,
    paranoid: bool = False,
) -> Simulator:
    w = compile_workload(parse_workload(data), seed=seed)
    models = [ReplicaModel(SchedulerConfig(), blocks, _STEP) for _ in range(replicas)]
    options = SimOptions(skip_decode=skip, check_invariants=paranoid)
    return Simulator(w, models, Router(kind=router), options, disaggregation=disagg)


def _assert_drained(sim: Simulator, out: SimOutcome) -> None:
    """Every call ended; every replica, count and transfer is back to nothing."""
    assert not (out.calls.outcome == _CODE["in_flight"]).any()
    assert not sim._transferring and not sim._prefill_void and not sim._on_decode
    for d in sim.drivers:
        assert not d.model.scheduler.has_unfinished_requests
        assert d.model.scheduler.pool.num_used == 0
        assert d.outstanding_requests == 0 and d.outstanding_tokens == 0
    assert sim._outstanding == [0] * len(sim.drivers)


# ------------------------------------------------------------------ the cluster file


def test_cluster_file_validates_disaggregation() -> None:
    spec = parse_cluster({"replicas": 4, "disaggregation": {"prefill_replicas": 1}})
    assert spec.disaggregation is not None and spec.disaggregation.prefill_replicas == 1
    with pytest.raises(ConfigError, match=r"prefill_replicas.*< `replicas` \(2\).*got 2"):
        parse_cluster({"replicas": 2, "disaggregation": {"prefill_replicas": 2}})
    with pytest.raises(ConfigError, match="prefill_replicas` must be >= 1"):
        parse_cluster({"replicas": 2, "disaggregation": {"prefill_replicas": 0}})
    with pytest.raises(ConfigError, match="kv_transfer_bandwidth_bytes_per_s"):
        parse_cluster(
            {
                "replicas": 2,
                "disaggregation": {"prefill_replicas": 1, "kv_transfer_bandwidth_bytes_per_s": 0},
            }
        )
    with pytest.raises(ConfigError, match=r"headway-default.*fifo-unbounded"):
        parse_cluster(
            {
                "replicas": 2,
                "gateway": {"preset": "headway-default"},
                "disaggregation": {"prefill_replicas": 1},
            }
        )
    with pytest.raises(ConfigError, match="`faults`"):
        parse_cluster(
            {
                "replicas": 2,
                "faults": [{"kind": "slowdown", "at_s": 1, "until_s": 2, "factor": 2}],
                "disaggregation": {"prefill_replicas": 1},
            }
        )


def test_simulator_rejects_what_it_does_not_simulate_with_disaggregation() -> None:
    data = _workload({"c": {"input_tokens": 100, "output_tokens": 10}}, 1.0)
    w = compile_workload(parse_workload(data), seed=1)
    models = [ReplicaModel(SchedulerConfig(), 100, _STEP) for _ in range(2)]
    with pytest.raises(ValueError, match="faults"):
        Simulator(
            w,
            models,
            Router(kind="round_robin"),
            faults=[Slowdown(at_s=1, until_s=2, factor=2)],
            disaggregation=_DISAGG,
        )
    with pytest.raises(ValueError, match=r"prefill_replicas must be < replicas \(1\)"):
        Simulator(w, models[:1], Router(kind="round_robin"), disaggregation=_DISAGG)


# ------------------------------------------------------------------ one call, idle cluster


def _one_call(cluster: dict[str, Any], output_tokens: int) -> SimOutcome:
    data = {
        "name": "one",
        "duration_s": 1,
        "classes": {"c": {"input_tokens": 3000, "output_tokens": output_tokens}},
        "sources": [{"name": "s", "arrivals": {"process": "constant", "rate_per_s": 1.5}}],
    }
    _, out, w = simulate(parse_workload(data), parse_cluster(cluster), seed=1)
    assert w.num_calls == 1
    return out


@pytest.mark.parametrize("bandwidth", [None, 50e9])
def test_transfer_time_of_one_call_on_an_idle_cluster_is_the_formula(
    bandwidth: float | None,
) -> None:
    colocated = {"replicas": 2, "model": "llama-3-70b", "gpu": "h100", "tensor_parallel": 4}
    disagg: dict[str, Any] = {"prefill_replicas": 1}
    if bandwidth is not None:
        disagg["kv_transfer_bandwidth_bytes_per_s"] = bandwidth
    out = _one_call({**colocated, "disaggregation": disagg}, 40)
    gpu, model = get_gpu("h100"), get_model("llama-3-70b")
    per_gpu_one_way = gpu.interconnect_bandwidth_bytes_per_s / 2 if bandwidth is None else bandwidth
    expected = gpu.interconnect_latency_s + 3000 * model.kv_bytes_per_token(4) / per_gpu_one_way
    c = out.calls
    assert c.kv_transfer_s[0] == pytest.approx(expected, rel=1e-12)
    assert out.kv_transfers == 1 and out.kv_transfer_s_total == pytest.approx(expected)
    assert c.replica[0] == 1  # the decode replica
    assert c.num_output_tokens[0] == 40 and c.outcome[0] == _CODE["completed"]
    # The first token comes from the prefill replica: as early as on a colocated replica.
    base = _one_call(colocated, 40).calls
    assert c.first_token_s[0] == base.first_token_s[0]
    # The second token comes at least one transfer after it.
    assert c.itl_max_s[0] > expected
    assert c.finish_s[0] > base.finish_s[0] + expected * 0.999


def test_a_call_of_one_output_token_finishes_on_its_prefill_replica() -> None:
    cluster = {"replicas": 2, "disaggregation": {"prefill_replicas": 1}}
    c = _one_call(cluster, 1).calls
    assert c.replica[0] == 0 and c.outcome[0] == _CODE["completed"]
    assert np.isnan(c.kv_transfer_s[0]) and c.finish_s[0] == c.first_token_s[0]


# ------------------------------------------------------------------ skipping, accounting

_SCENARIOS: dict[str, dict[str, Any]] = {
    "plain": {
        "data": _workload(
            {
                "chat": {
                    "input_tokens": {"dist": "lognormal", "mean": 800, "cv": 1.0, "max": 6000},
                    "output_tokens": {"dist": "lognormal", "mean": 150, "cv": 1.0, "max": 1500},
                }
            },
            6.0,
        ),
    },
    "decode-preemption": {
        "blocks": 500,
        "paranoid": True,
        "data": _workload(
            {
                "long": {
                    "input_tokens": {"dist": "lognormal", "mean": 900, "cv": 1.0, "max": 3000},
                    "output_tokens": {"dist": "lognormal", "mean": 400, "cv": 1.0, "max": 1500},
                }
            },
            5.0,
        ),
    },
    "branches-patience-rr": {
        "replicas": 4,
        "router": "round_robin",
        "disagg": Disaggregation(
            prefill_replicas=2, kv_transfer_s_per_token=2e-5, kv_transfer_latency_s=1e-3
        ),
        "data": _workload(
            {
                "agent": {
                    "calls": 2,
                    "parallel_branches": 3,
                    "branch_join": "first",
                    # Not constant: identical branches on identical idle replicas tie to
                    # the last bit, where closed-form and stepped sums may round apart.
                    "input_tokens": {"dist": "gamma", "mean": 600, "cv": 0.5},
                    "output_tokens": {"dist": "gamma", "mean": 60, "cv": 1.0},
                },
                "chat": {
                    "input_tokens": 2000,
                    "output_tokens": {"dist": "gamma", "mean": 100, "cv": 1.0},
                },
            },
            8.0,
            clients={"patience_s": {"dist": "exponential", "mean": 0.5}},
        ),
    },
    "kv-aware": {"router": "kv_aware", "replicas": 4},
}


@pytest.mark.parametrize("name", sorted(_SCENARIOS))
def test_skipping_equals_stepping_with_disaggregation(name: str) -> None:
    cfg = dict(_SCENARIOS[name])
    data = cfg.pop("data", None) or _SCENARIOS["plain"]["data"]
    fast_sim = _simulator(copy.deepcopy(data), skip=True, **cfg)
    slow_sim = _simulator(copy.deepcopy(data), skip=False, **cfg)
    fast, slow = fast_sim.run(), slow_sim.run()
    assert fast.num_skipped_steps > 0 and slow.num_skipped_steps == 0
    assert fast.kv_transfers > 0
    for column in ("first_token_s", "finish_s", "admitted_s", "itl_max_s", "kv_transfer_s"):
        a, b = getattr(fast.calls, column), getattr(slow.calls, column)
        assert np.array_equal(np.isnan(a), np.isnan(b)), column
        ok = ~np.isnan(a)
        np.testing.assert_allclose(a[ok], b[ok], rtol=1e-9, atol=1e-12, err_msg=column)
    for column in ("num_output_tokens", "num_preemptions", "replica", "cancelled", "outcome"):
        assert np.array_equal(getattr(fast.calls, column), getattr(slow.calls, column)), column
    assert fast.num_steps == slow.num_steps
    _assert_drained(fast_sim, fast)
    _assert_drained(slow_sim, slow)
    c = fast.calls
    done = c.outcome == _CODE["completed"]
    transferred = ~np.isnan(c.kv_transfer_s)
    # Completed calls of more than one token decoded on a decode replica, the others not.
    assert (c.replica[done & transferred] >= cfg.get("disagg", _DISAGG).prefill_replicas).all()
    if name == "decode-preemption":
        assert c.num_preemptions.sum() > 0
    if name == "branches-patience-rr":
        assert c.cancelled.sum() > 0


@settings(max_examples=25, deadline=None)
@given(
    rate_per_s=st.floats(2.0, 40.0),
    replicas=st.integers(2, 4),
    prefill_share=st.floats(0.0, 1.0),
    join=st.sampled_from(["all", "first"]),
    patience_s=st.none() | st.floats(0.05, 2.0),
    timeout_s=st.none() | st.floats(0.1, 2.0),
    duplicate_after_s=st.none() | st.floats(0.1, 2.0),
    transfer_s_per_token=st.floats(0.0, 1e-4),
    router=st.sampled_from(["least_outstanding_requests", "round_robin", "kv_aware"]),
    seed=st.integers(0, 2**16),
)
def test_every_call_ends_and_everything_is_freed(
    rate_per_s: float,
    replicas: int,
    prefill_share: float,
    join: str,
    patience_s: float | None,
    timeout_s: float | None,
    duplicate_after_s: float | None,
    transfer_s_per_token: float,
    router: RouterKind,
    seed: int,
) -> None:
    classes = {
        "agent": {
            "calls": 2,
            "parallel_branches": 2,
            "branch_join": join,
            "input_tokens": {"dist": "gamma", "mean": 500, "cv": 1.0, "max": 3000},
            "output_tokens": {"dist": "gamma", "mean": 40, "cv": 1.5, "max": 400},
        }
    }
    data = _workload(
        classes,
        rate_per_s,
        clients={
            "retries": {"max_attempts": 2, "backoff_base_s": 0.1, "timeout_s": timeout_s},
            "patience_s": patience_s,
            "duplicate_after_s": duplicate_after_s,
            "duplicate_probability": 0.5,
        },
    )
    data["duration_s"] = 6
    prefill = 1 + int(prefill_share * (replicas - 2) + 0.5)
    disagg = Disaggregation(
        prefill_replicas=prefill,
        kv_transfer_s_per_token=transfer_s_per_token,
        kv_transfer_latency_s=1e-3,
    )
    sim = _simulator(
        data, replicas=replicas, blocks=600, router=router, disagg=disagg, seed=seed, paranoid=True
    )
    out = sim.run()
    _assert_drained(sim, out)
    result = build_result(sim.w, out, replicas)
    acc = result.accounting
    assert acc.balanced and acc.failed == 0
    c = out.calls
    completed = c.outcome == _CODE["completed"]
    assert np.array_equal(c.num_output_tokens[completed], sim.w.call_output_tokens[completed])
    assert (c.num_output_tokens <= sim.w.call_output_tokens).all()


# ------------------------------------------------------------------ the point of it


def test_disaggregation_steadies_decode_on_long_prompts() -> None:
    """Long prompts, decode-heavy outputs, 4 replicas of Llama-3-8B on H100: colocated,
    every decode step that shares its batch with a prefill chunk is slow; with one
    prefill and three decode replicas no decode step ever does, so TPOT p99 falls (at the
    price of TTFT: one replica now does all the prefills)."""
    data = _workload(
        {
            "rag": {
                "input_tokens": {"dist": "lognormal", "mean": 6000, "cv": 0.3, "max": 12000},
                "output_tokens": {"dist": "lognormal", "mean": 400, "cv": 0.3, "max": 1500},
            }
        },
        4.0,
    )
    data["duration_s"] = 120
    spec = parse_workload(data)
    cluster: dict[str, Any] = {"replicas": 4, "model": "llama-3-8b", "gpu": "h100"}
    colo, colo_out, w = simulate(spec, parse_cluster(cluster), seed=1)
    cluster["disaggregation"] = {"prefill_replicas": 1}
    pd, pd_out, _ = simulate(spec, parse_cluster(cluster), seed=1)
    for result in (colo, pd):
        assert result.accounting.balanced and result.completed_calls == w.num_calls
    assert colo.latencies.tpot.p99_s is not None and pd.latencies.tpot.p99_s is not None
    assert pd.latencies.tpot.p99_s < 0.85 * colo.latencies.tpot.p99_s
    assert pd_out.kv_transfers == w.num_calls
    assert colo_out.kv_transfers == 0 and np.isnan(colo_out.calls.kv_transfer_s).all()
