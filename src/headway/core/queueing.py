"""Closed-form queueing models for a route: M/M/1, M/M/c (Erlang C) and M/G/1.

They are first-order checks, not forecasts of an LLM engine (which batches, preempts and
has two phases). Each function takes an arrival rate ``arrival_per_s`` and a service rate
and returns a :class:`QueueFigures`; an unstable queue (utilization >= 1) has no steady
state, so its latencies are ``None``. Formulas are written out in ``docs/planning.md``.
"""

from __future__ import annotations

import math

import msgspec
from scipy import optimize, special


class QueueFigures(msgspec.Struct, frozen=True, kw_only=True):
    """Steady-state figures of one queueing model."""

    model: str
    utilization: float
    stable: bool
    wait_probability: float | None
    """Chance an arrival waits at all."""
    mean_wait_s: float | None
    mean_s: float | None
    """Mean response time (wait + service)."""
    p95_s: float | None
    p99_s: float | None


def _unstable(model: str, rho: float) -> QueueFigures:
    return QueueFigures(
        model=model,
        utilization=rho,
        stable=False,
        wait_probability=1.0,
        mean_wait_s=None,
        mean_s=None,
        p95_s=None,
        p99_s=None,
    )


def _check(arrival_per_s: float, service_per_s: float) -> None:
    if not arrival_per_s >= 0:
        raise ValueError(f"arrival_per_s must be >= 0 (got {arrival_per_s})")
    if not service_per_s > 0:
        raise ValueError(f"service_per_s must be > 0 (got {service_per_s})")


def mm1(arrival_per_s: float, service_per_s: float) -> QueueFigures:
    """M/M/1: response time is exponential with rate ``mu - lambda``.

    ``W = 1 / (mu - lambda)``, ``p_q = -ln(1 - q) / (mu - lambda)``.
    """
    _check(arrival_per_s, service_per_s)
    rho = arrival_per_s / service_per_s
    if rho >= 1:
        return _unstable("M/M/1", rho)
    slack = service_per_s - arrival_per_s
    return QueueFigures(
        model="M/M/1",
        utilization=rho,
        stable=True,
        wait_probability=rho,
        mean_wait_s=rho / slack,
        mean_s=1 / slack,
        p95_s=-math.log(0.05) / slack,
        p99_s=-math.log(0.01) / slack,
    )


def erlang_c(servers: int, offered_erlangs: float) -> float:
    """Probability that an arrival waits in M/M/c (Erlang C), computed stably.

    Uses the Erlang B recursion ``B(k) = a B(k-1) / (k + a B(k-1))`` and
    ``C = c B / (c - a (1 - B))``.
    """
    if servers < 1:
        raise ValueError(f"servers must be >= 1 (got {servers})")
    a = offered_erlangs
    if a >= servers:
        return 1.0
    b = 1.0
    for k in range(1, servers + 1):
        b = a * b / (k + a * b)
    return servers * b / (servers - a * (1 - b))


def _response_quantile_mmc(q: float, p_wait: float, theta: float, mu: float) -> float:
    """Quantile of W + S for M/M/c: W is 0 w.p. 1 - p_wait, else Exp(theta); S ~ Exp(mu)."""

    def survival(t: float) -> float:
        # P(S > t) + P(W > 0) P(W' + S > t) - P(W > 0) P(S > t), with W' ~ Exp(theta).
        if abs(theta - mu) < 1e-12 * mu:
            conv = math.exp(-mu * t) * (1 + mu * t)
        else:
            conv = (theta * math.exp(-mu * t) - mu * math.exp(-theta * t)) / (theta - mu)
        return (1 - p_wait) * math.exp(-mu * t) + p_wait * conv

    hi = 1.0 / min(theta, mu)
    while survival(hi) > 1 - q:
        hi *= 2
    return float(optimize.brentq(lambda t: survival(t) - (1 - q), 0.0, hi, xtol=1e-12))


def mmc(arrival_per_s: float, service_per_s_each: float, servers: int) -> QueueFigures:
    """M/M/c with ``servers`` servers of rate ``service_per_s_each`` each.

    ``P(wait) = C(c, a)`` with ``a = lambda / mu``; waiting time given a wait is
    exponential with rate ``c mu - lambda``; response = wait + Exp(mu), whose quantiles
    are found numerically from the exact survival function.
    """
    _check(arrival_per_s, service_per_s_each)
    a = arrival_per_s / service_per_s_each
    rho = a / servers
    if rho >= 1:
        return _unstable(f"M/M/{servers}", rho)
    p_wait = erlang_c(servers, a)
    theta = servers * service_per_s_each - arrival_per_s
    mean_wait = p_wait / theta
    return QueueFigures(
        model=f"M/M/{servers}",
        utilization=rho,
        stable=True,
        wait_probability=p_wait,
        mean_wait_s=mean_wait,
        mean_s=mean_wait + 1 / service_per_s_each,
        p95_s=_response_quantile_mmc(0.95, p_wait, theta, service_per_s_each),
        p99_s=_response_quantile_mmc(0.99, p_wait, theta, service_per_s_each),
    )


def mg1(arrival_per_s: float, service_per_s: float, service_cv: float) -> QueueFigures:
    """M/G/1 by Pollaczek-Khinchine: ``Wq = lambda E[S²] / (2 (1 - rho))``.

    ``E[S²] = (1 + cv²) / mu²``. Percentiles use the standard approximation of the wait
    as an atom at 0 (prob ``1 - rho``) plus an exponential tail with the exact mean, and
    a gamma service time with the given CV; exact when ``cv = 1`` (M/M/1).
    """
    _check(arrival_per_s, service_per_s)
    if not service_cv >= 0:
        raise ValueError(f"service_cv must be >= 0 (got {service_cv})")
    rho = arrival_per_s / service_per_s
    if rho >= 1:
        return _unstable("M/G/1", rho)
    es2 = (1 + service_cv**2) / service_per_s**2
    mean_wait = arrival_per_s * es2 / (2 * (1 - rho))
    mean_s = mean_wait + 1 / service_per_s
    p95, p99 = (_mg1_quantile(q, rho, mean_wait, service_per_s, service_cv) for q in (0.95, 0.99))
    return QueueFigures(
        model="M/G/1",
        utilization=rho,
        stable=True,
        wait_probability=rho,
        mean_wait_s=mean_wait,
        mean_s=mean_s,
        p95_s=p95,
        p99_s=p99,
    )


def _mg1_quantile(q: float, rho: float, mean_wait: float, mu: float, cv: float) -> float:
    if rho == 0:
        return _service_quantile(q, mu, cv)
    theta = rho / mean_wait  # rate of the conditional exponential wait
    if cv == 0:
        # Deterministic service D = 1/mu: P(R > t) = P(W > t - D).
        d = 1 / mu
        return d + (math.log(rho / (1 - q)) / theta if rho > 1 - q else 0.0)
    shape = 1 / cv**2
    scale = 1 / (mu * shape)

    def service_sf(t: float) -> float:
        return float(special.gammaincc(shape, max(t, 0.0) / scale))

    def survival(t: float) -> float:
        # (1 - rho) P(S > t) + rho P(E + S > t), integrated over the exponential E.
        grid = 400
        upper = t
        total = 0.0
        if upper > 0:
            h = upper / grid
            for i in range(grid):
                w = (i + 0.5) * h
                total += theta * math.exp(-theta * w) * service_sf(t - w) * h
        tail = math.exp(-theta * max(upper, 0.0))
        return (1 - rho) * service_sf(t) + rho * (total + tail)

    hi = 1 / mu + 1 / theta
    while survival(hi) > 1 - q:
        hi *= 2
    return float(optimize.brentq(lambda t: survival(t) - (1 - q), 0.0, hi, xtol=1e-9))


def _service_quantile(q: float, mu: float, cv: float) -> float:
    if cv == 0:
        return 1 / mu
    shape = 1 / cv**2
    return float(special.gammaincinv(shape, q)) / (mu * shape)
