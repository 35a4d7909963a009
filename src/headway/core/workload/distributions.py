"""Sampling, means and quantiles of the workload's distributions.

Sampling is vectorised (one call draws ``n`` values) and always takes an injected
generator. Means and quantiles are exact for the capped (clipped) distribution, because
the analytic plan multiplies them into token rates and a cap changes the mean.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import msgspec
import numpy as np
import numpy.typing as npt

from headway.core.errors import WorkloadError
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

FloatArray = npt.NDArray[np.float64]


def _lognormal_params(mean: float, cv: float) -> tuple[float, float]:
    sigma2 = math.log1p(cv * cv)
    return math.log(mean) - sigma2 / 2, math.sqrt(sigma2)


def _empirical_values(dist: Empirical) -> tuple[FloatArray, FloatArray]:
    if dist.values is None:
        raise WorkloadError(
            "an empirical distribution still refers to a trace file; load the workload with "
            "headway.files.workload.load_workload, which reads it"
        )
    values = np.asarray(dist.values, dtype=np.float64)
    if dist.weights is None:
        weights = np.full(values.size, 1.0 / values.size)
    else:
        weights = np.asarray(dist.weights, dtype=np.float64)
        weights = weights / weights.sum()
    return values, weights


def _clip(values: FloatArray, dist: Distribution) -> FloatArray:
    if isinstance(dist, float | int):
        return values
    lo = -np.inf if dist.min is None else dist.min
    hi = np.inf if dist.max is None else dist.max
    if lo == -np.inf and hi == np.inf:
        return values
    return np.clip(values, lo, hi)


def sample(dist: Distribution, n: int, rng: np.random.Generator) -> FloatArray:
    """Draw ``n`` values (caps applied)."""
    if isinstance(dist, float | int):
        return np.full(n, float(dist))
    if isinstance(dist, Fixed):
        raw = np.full(n, dist.value)
    elif isinstance(dist, Lognormal):
        if dist.cv == 0:
            raw = np.full(n, dist.mean)
        else:
            mu, sigma = _lognormal_params(dist.mean, dist.cv)
            raw = rng.lognormal(mu, sigma, n)
    elif isinstance(dist, Gamma):
        shape = 1.0 / (dist.cv * dist.cv)
        raw = rng.gamma(shape, dist.mean / shape, n)
    elif isinstance(dist, Exponential):
        raw = rng.exponential(dist.mean, n)
    elif isinstance(dist, Uniform):
        raw = rng.uniform(dist.low, dist.high, n)
    elif isinstance(dist, Poisson):
        raw = rng.poisson(dist.mean, n).astype(np.float64)
    else:
        values, weights = _empirical_values(dist)
        raw = values[rng.choice(values.size, size=n, p=weights)]
    return _clip(raw, dist)


def _clipped_mean_continuous(
    cdf: Callable[[float], float],
    partial_mean: Callable[[float], float],
    lo: float,
    hi: float,
    full_mean: float,
) -> float:
    """E[clip(X, lo, hi)] = lo F(lo) + (m(hi) - m(lo)) + hi (1 - F(hi)).

    ``F`` is the CDF and ``m(x) = E[X; X <= x]`` the partial mean of X >= 0.
    """
    below = lo * cdf(lo) - partial_mean(lo) if lo > 0 else 0.0
    above = partial_mean(hi) + hi * (1.0 - cdf(hi)) if math.isfinite(hi) else full_mean
    return float(below + above)


def mean(dist: Distribution) -> float:
    """The exact mean of the (capped) distribution."""
    if isinstance(dist, float | int):
        return float(dist)
    lo = 0.0 if dist.min is None else dist.min
    hi = math.inf if dist.max is None else dist.max
    if isinstance(dist, Fixed):
        return float(min(max(dist.value, lo), hi))
    if isinstance(dist, Uniform):
        return _uniform_mean(dist.low, dist.high, lo, hi)
    if isinstance(dist, Empirical):
        values, weights = _empirical_values(dist)
        return float(np.dot(np.clip(values, lo, hi), weights))
    if isinstance(dist, Poisson):
        ks = np.arange(0, int(dist.mean + 40 * math.sqrt(dist.mean + 1) + 50))
        from scipy import stats  # lazily: importing scipy.stats costs ~0.3 s at start-up

        pmf = stats.poisson.pmf(ks, dist.mean)
        return float(np.dot(np.clip(ks, lo, hi), pmf))
    if isinstance(dist, Lognormal):
        if dist.cv == 0:
            return float(min(max(dist.mean, lo), hi))
        from scipy import special  # lazily, as stats: ~0.2 s that `workload check` skips

        mu, sigma = _lognormal_params(dist.mean, dist.cv)
        full = dist.mean

        def cdf_ln(x: float) -> float:
            return float(special.ndtr((math.log(x) - mu) / sigma))

        def pm_ln(x: float) -> float:
            return full * float(special.ndtr((math.log(x) - mu - sigma * sigma) / sigma))

        return _clipped_mean_continuous(cdf_ln, pm_ln, lo, hi, full)
    # Gamma and Exponential
    from scipy import special

    cv = 1.0 if isinstance(dist, Exponential) else dist.cv
    shape = 1.0 / (cv * cv)
    scale = dist.mean / shape
    full = dist.mean

    def cdf_g(x: float) -> float:
        return float(special.gammainc(shape, x / scale))

    def pm_g(x: float) -> float:
        return full * float(special.gammainc(shape + 1, x / scale))

    return _clipped_mean_continuous(cdf_g, pm_g, lo, hi, full)


def _uniform_mean(low: float, high: float, lo: float, hi: float) -> float:
    """E[clip(U, lo, hi)] for U uniform on [low, high], in closed form."""
    if high == low:
        return float(min(max(low, lo), hi))
    a, b = min(max(lo, low), high), min(max(hi, low), high)  # the caps, inside [low, high]
    integral = lo * (a - low) + (b * b - a * a) / 2 + hi * (high - b)
    return float(integral / (high - low))


def quantile(dist: Distribution, q: float) -> float:
    """The ``q`` quantile (0..1) of the capped distribution."""
    if not 0 <= q <= 1:
        raise ValueError(f"quantile q must be in [0, 1] (got {q})")
    if isinstance(dist, float | int):
        return float(dist)
    lo = 0.0 if dist.min is None else dist.min
    hi = math.inf if dist.max is None else dist.max
    if isinstance(dist, Fixed):
        value = dist.value
    elif isinstance(dist, Uniform):
        value = dist.low + q * (dist.high - dist.low)
    elif isinstance(dist, Empirical):
        values, weights = _empirical_values(dist)
        order = np.argsort(values, kind="stable")
        cum = np.cumsum(weights[order])
        idx = int(np.searchsorted(cum, q * cum[-1], side="left"))
        value = float(values[order][min(idx, values.size - 1)])
    elif isinstance(dist, Poisson):
        from scipy import stats

        value = float(stats.poisson.ppf(q, dist.mean))
    elif isinstance(dist, Lognormal):
        if dist.cv == 0:
            value = dist.mean
        else:
            from scipy import special

            mu, sigma = _lognormal_params(dist.mean, dist.cv)
            value = (
                float(math.exp(mu + sigma * float(special.ndtri(q))))
                if 0 < q < 1
                else (0.0 if q == 0 else math.inf)
            )
    else:
        from scipy import special

        cv = 1.0 if isinstance(dist, Exponential) else dist.cv
        shape = 1.0 / (cv * cv)
        value = float(special.gammaincinv(shape, q)) * dist.mean / shape
    return float(min(max(value, lo), hi))


def whole_counts(dist: Distribution, n: int, rng: np.random.Generator, minimum: int) -> np.ndarray:
    """Draw ``n`` whole numbers, at least ``minimum``.

    A fractional fixed value is a mean: 7.5 gives 7 or 8 with equal chance, so the mean is
    kept exactly. Other distributions are rounded to the nearest whole number.
    """
    if isinstance(dist, float | int | Fixed):
        value = float(dist) if isinstance(dist, float | int) else mean(dist)
        base = math.floor(value)
        frac = value - base
        counts = np.full(n, base, dtype=np.int64)
        if frac > 0:
            counts += (rng.random(n) < frac).astype(np.int64)
    else:
        counts = np.rint(sample(dist, n, rng)).astype(np.int64)
    return np.maximum(counts, minimum)


def whole_mean(dist: Distribution, minimum: int) -> float:
    """The mean of :func:`whole_counts` (exact for fixed values and Poisson counts)."""
    if isinstance(dist, float | int | Fixed):
        value = float(dist) if isinstance(dist, float | int) else mean(dist)
        return max(value, float(minimum))
    if isinstance(dist, Poisson | Empirical):
        clipped_min = minimum if dist.min is None else max(minimum, dist.min)
        return mean(msgspec_replace_min(dist, float(clipped_min)))
    return max(mean(dist), float(minimum))


def msgspec_replace_min(dist: Poisson | Empirical, new_min: float) -> Distribution:
    """A copy of ``dist`` whose lower cap is ``new_min``."""
    return msgspec.structs.replace(dist, min=new_min)
