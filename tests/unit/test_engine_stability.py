"""The KV stability boundary μ = M / (b̄ · E[g]) and its place beside the plan's knee."""

from __future__ import annotations

import numpy as np
import pytest

from headway.core.engine.stability import kv_demand_token_steps, stability_boundary
from headway.core.engine.steptime import AffineStepTime

STEP = AffineStepTime(
    overhead_s=0.01, per_prefill_token_s=1e-5, per_decode_seq_s=1e-4, per_decode_kv_token_s=0.0
)


def test_a_requests_kv_demand_counts_every_decode_step() -> None:
    """A request of s prompt tokens holds s + k tokens at its k-th decode step."""
    for s, o in ((100, 1), (100, 10), (7, 3)):
        assert kv_demand_token_steps([s], [o])[0] == sum(s + k for k in range(1, o + 1))


def test_mu_is_the_pool_over_the_demand_per_second() -> None:
    boundary = stability_boundary(
        STEP, kv_capacity_tokens=100_000, input_tokens=[500] * 4, output_tokens=[100] * 4,
        max_num_seqs=10_000,
    )  # fmt: skip
    g = 100 * 500 + 100 * 101 / 2
    assert boundary.bound == "kv_cache"
    assert boundary.mean_kv_demand_token_steps == g
    assert boundary.mu_requests_per_s == pytest.approx(100_000 / (boundary.mean_step_s * g))
    # Little's law at the boundary: the pool's batch over the time one request runs.
    running_time_s = boundary.mean_step_s * 100
    assert boundary.mu_requests_per_s == pytest.approx(
        100_000 / (g / 100) / running_time_s, rel=0.02
    )


def test_long_outputs_weigh_quadratically() -> None:
    """A mix with the same mean lengths but spread outputs is unstable earlier than its
    mean request says: E[g] grows with the variance of the output length (the pool then
    holds a smaller, faster batch, which gives back only part of it)."""
    kwargs = {"kv_capacity_tokens": 200_000, "max_num_seqs": 10_000}
    even = stability_boundary(STEP, input_tokens=[500, 500], output_tokens=[200, 200], **kwargs)
    spread = stability_boundary(STEP, input_tokens=[500, 500], output_tokens=[20, 380], **kwargs)
    assert spread.mean_kv_demand_token_steps > even.mean_kv_demand_token_steps
    assert spread.mean_kv_demand_token_steps == even.mean_kv_demand_token_steps + 180**2 / 2
    assert spread.mu_requests_per_s < even.mu_requests_per_s


def test_a_sequence_limit_below_the_pool_is_named_and_caps_the_capacity() -> None:
    big_pool = stability_boundary(
        STEP, kv_capacity_tokens=10_000_000, input_tokens=[500], output_tokens=[100],
        max_num_seqs=64,
    )  # fmt: skip
    assert big_pool.bound == "max_num_seqs"
    assert big_pool.running_seqs == 64
    assert big_pool.capacity_requests_per_s < big_pool.mu_requests_per_s
    assert big_pool.capacity_requests_per_s == pytest.approx(64 / (big_pool.mean_step_s * 100))


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="non-empty and of one length"):
        stability_boundary(STEP, kv_capacity_tokens=10, input_tokens=[], output_tokens=[],
                           max_num_seqs=1)  # fmt: skip
    with pytest.raises(ValueError, match="kv_capacity_tokens and max_num_seqs must be >= 1"):
        stability_boundary(STEP, kv_capacity_tokens=0, input_tokens=[1], output_tokens=[1],
                           max_num_seqs=1)  # fmt: skip
    assert np.all(kv_demand_token_steps([1, 2], [0, 0]) == 0)
