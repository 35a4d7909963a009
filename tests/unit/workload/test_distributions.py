"""Means, quantiles and samples of the workload distributions agree."""

from __future__ import annotations

import numpy as np
import pytest

from headway.core.seeding import stream
from headway.core.workload import distributions as d
from headway.core.workload.spec import (
    Distribution,
    Empirical,
    Exponential,
    Fixed,
    Gamma,
    Lognormal,
    Poisson,
    Uniform,
)

CASES: list[Distribution] = [
    250.0,
    Fixed(value=3.0, max=2.0),
    Lognormal(mean=2500, cv=1.0),
    Lognormal(mean=2500, cv=1.0, min=100, max=8000),
    Gamma(mean=400, cv=0.8, min=50, max=1000),
    Gamma(mean=30, cv=3.0),
    Exponential(mean=3, max=5),
    Uniform(low=1, high=5, min=2, max=4),
    Poisson(mean=2, min=1),
    Empirical(values=[1, 2, 3, 10], weights=[1, 1, 2, 0.5], max=8),
]


@pytest.mark.parametrize("dist", CASES, ids=lambda x: type(x).__name__)
def test_mean_and_quantiles_match_samples(dist: Distribution) -> None:
    x = d.sample(dist, 400_000, stream(1, "test"))
    assert d.mean(dist) == pytest.approx(float(x.mean()), rel=0.01, abs=1e-9)
    for q in (0.5, 0.95):
        expected = float(np.quantile(x, q))
        assert d.quantile(dist, q) == pytest.approx(expected, rel=0.03, abs=1.0)


def test_lognormal_has_requested_mean_and_cv() -> None:
    x = d.sample(Lognormal(mean=1000, cv=0.5), 400_000, stream(2, "t"))
    assert x.mean() == pytest.approx(1000, rel=0.01)
    assert x.std() / x.mean() == pytest.approx(0.5, rel=0.02)


def test_whole_counts_keep_fractional_means() -> None:
    counts = d.whole_counts(7.5, 100_000, stream(3, "t"), minimum=1)
    assert set(np.unique(counts)) == {7, 8}
    assert counts.mean() == pytest.approx(7.5, abs=0.01)
    assert d.whole_mean(7.5, 1) == 7.5
    zero_floor = d.whole_counts(Poisson(mean=0.5), 100_000, stream(4, "t"), minimum=1)
    assert zero_floor.min() == 1
    assert d.whole_mean(Poisson(mean=0.5), 1) == pytest.approx(zero_floor.mean(), rel=0.01)


def test_unresolved_trace_distribution_is_an_error() -> None:
    from headway.core.errors import WorkloadError

    with pytest.raises(WorkloadError, match="load_workload"):
        d.sample(Empirical(trace="x.csv"), 3, stream(0, "t"))
