"""Little's law at every boundary of a simulated run, over one window (issue 19, result
1): the occupancy the run sampled (its live counters, the engines' block pools) against
λW from its records, both over the sampled window. At 3c8fc1a L was averaged over the
run's duration and λ counted over its end, a 12% mismatch on the healthy reference run;
then the replica boundary's records missed retried attempts, clients' duplicates and
losing copies, and the sampler read engines in the middle of a lazily applied decode run.

Every boundary (tasks, gateway calls, requests in engines, KV blocks) balances to within
1% on a stable run that its samples resolve (stays long against the samples' spacing, a
few items inside on average: otherwise the sampled mean itself is noise). Until the
records carried the blocks each stay's engine gave it (chunk by chunk, a block per
``block_size`` tokens of output, all given back at a preemption) the KV boundary was off
by up to 2%: its records knew only a stay's admission and first token."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from headway.files.workload import load_workload, parse_workload
from headway.sim.cluster import ClusterSpec
from headway.sim.options import SimOptions
from headway.sim.results import SimResult
from headway.sim.run import simulate

REFERENCE = Path(__file__).resolve().parents[2] / "examples" / "reference-assistant.yaml"
COUNT_BOUNDARIES = ("tasks", "gateway", "replicas")
SAMPLES = 2000


def _mismatches(result: SimResult) -> dict[str, float]:
    return {b.boundary.split(" ")[0]: b.relative_mismatch for b in result.little_boundaries}


def test_the_healthy_reference_run_balances_at_every_boundary() -> None:
    """The bundled reference workload as written (patience, retries, clients'
    duplicates) on its default cluster: every boundary within 1%."""
    result, _, _ = simulate(load_workload(str(REFERENCE)).spec, ClusterSpec())
    mismatches = _mismatches(result)
    assert set(mismatches) == {"tasks", "gateway", "replicas", "KV"}
    for boundary in result.little_boundaries:
        assert boundary.mean_in_system > 0, boundary
        assert boundary.relative_mismatch <= 0.01, boundary


def _workload(rate: float, prompt: int, output: int, seed: int, duplicates: bool) -> Any:
    clients: dict[str, Any] = {"patience_s": {"dist": "lognormal", "mean": 30, "cv": 0.5}}
    if duplicates:
        clients |= {"duplicate_after_s": 5, "duplicate_probability": 0.3}
    return parse_workload(
        {
            "name": "little",
            "duration_s": 90,
            "seed": seed,
            "classes": {
                "chat": {
                    "input_tokens": {"dist": "lognormal", "mean": prompt, "cv": 1.0},
                    "output_tokens": {"dist": "lognormal", "mean": output, "cv": 1.0},
                    "slo": {"ttft_s": 2.0, "tpot_s": 0.1},
                }
            },
            "sources": [{"name": "users", "arrivals": {"process": "poisson", "rate_per_s": rate}}],
            "clients": clients,
        }
    )


# A random search, derandomized (the same examples every run: CI stays deterministic),
# and the example a random search found at 2.05% while the records approximated a stay's
# blocks from its admission and first token (prompts chunked over steps): 0.04% now.
@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)  # fmt: skip
@example(
    rate=6.0, prompt=2207, output=85, replicas=2, seed=1, duplicates=False,
    gateway="headway-default",
)  # fmt: skip
@given(
    rate=st.floats(2.0, 30.0),
    prompt=st.integers(100, 3000),
    output=st.integers(50, 600),
    replicas=st.integers(1, 3),
    seed=st.integers(0, 10_000),
    duplicates=st.booleans(),
    gateway=st.sampled_from(["fifo-unbounded", "headway-default"]),
)
def test_random_stable_runs_balance_at_every_boundary(
    rate: float, prompt: int, output: int, replicas: int, seed: int, duplicates: bool,
    gateway: str,
) -> None:  # fmt: skip
    cluster = msgspec.convert({"replicas": replicas, "gateway": {"preset": gateway}}, ClusterSpec)
    options = SimOptions(sample_points=SAMPLES)
    result, _, _ = simulate(
        _workload(rate, prompt, output, seed, duplicates), cluster, options=options
    )
    # Stable: calls were served about as they came (no backlog to speak of); an
    # overloaded run's backlog is another test's subject.
    queue_p99_s = result.latencies.queue.p99_s
    assume(queue_p99_s is not None and queue_p99_s < 2.0)
    # Resolved by the samples: stays long against their spacing, and more than a few
    # items inside on average (a sampled mean of a mostly empty system is noise).
    spacing_s = result.duration_s / SAMPLES
    for b in result.little_boundaries:
        assume(b.mean_time_in_system_s > 10 * spacing_s and b.mean_in_system > 2.0)
    mismatches = _mismatches(result)
    for name in COUNT_BOUNDARIES:
        assert mismatches[name] < 0.01, (name, result.little_boundaries)
    assert mismatches["KV"] < 0.01, result.little_boundaries


# Where the records' approximation was furthest off before they carried each stay's blocks
# (figures then): prompts chunked 256 tokens a step (14.0%), a replica short of KV that
# preempts and recomputes (2.10%), and prefill handed over to decode replicas (3.70%).
@pytest.mark.parametrize(
    "cluster",
    [
        {"replicas": 2, "engine": {"long_prefill_token_threshold": 256}},
        {"replicas": 1, "num_kv_blocks": 2000},
        {"replicas": 3, "disaggregation": {"prefill_replicas": 1}},
    ],
    ids=["chunked", "preempting", "disaggregated"],
)
def test_the_kv_boundary_balances_through_chunks_preemptions_and_handoffs(
    cluster: dict[str, Any],
) -> None:
    rate, prompt, output = (8.0, 1500, 300) if "num_kv_blocks" in cluster else (6.0, 2207, 85)
    options = SimOptions(sample_points=SAMPLES)
    result, out, _ = simulate(
        _workload(rate, prompt, output, 1, False), msgspec.convert(cluster, ClusterSpec),
        options=options,
    )  # fmt: skip
    if "num_kv_blocks" in cluster:
        assert out.calls.num_preemptions.sum() > 50
    kv = [b for b in result.little_boundaries if b.boundary.startswith("KV")]
    assert kv[0].mean_in_system > 100 and kv[0].relative_mismatch < 0.01, kv
