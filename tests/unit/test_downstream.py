"""Downstream services as queues of their own: exact FIFO start times on one and many
connections, rate-limit spacing, timeouts that keep holding the connection, the queue
limit, Little's law and the M/M/c and M/D/1 waits over long random runs, config errors."""

from __future__ import annotations

import math
from pathlib import Path

import msgspec
import numpy as np
import pytest

from headway.core.downstream import (
    DownstreamConfig,
    DownstreamOutcome,
    DownstreamService,
)
from headway.core.errors import ConfigError
from headway.core.workload.spec import Service


def _service(**overrides: object) -> DownstreamService:
    return DownstreamService(DownstreamConfig(**overrides))  # type: ignore[arg-type]


def test_one_connection_serves_in_arrival_order() -> None:
    pool = _service(servers=1)
    results = [pool.submit(t, 1.0) for t in (0.0, 0.5, 0.6, 3.0)]
    assert [r.start_s for r in results] == [0.0, 1.0, 2.0, 3.0]
    assert [r.finish_s for r in results] == [1.0, 2.0, 3.0, 4.0]
    assert [r.wait_s for r in results] == pytest.approx([0.0, 0.5, 1.4, 0.0])
    assert all(r.outcome is DownstreamOutcome.COMPLETED for r in results)
    assert [r.response_s for r in results] == [1.0, 2.0, 3.0, 4.0]


def test_many_connections_take_the_earliest_free_one() -> None:
    pool = _service(servers=2)
    starts = [pool.submit(0.0, s).start_s for s in (3.0, 1.0, 1.0, 1.0)]
    # A holds 0-3; B holds 0-1, then 1-2, then 2-3.
    assert starts == [0.0, 0.0, 1.0, 2.0]
    late = pool.submit(0.5, 0.25)
    assert late.start_s == 3.0  # both connections busy until 3 (FIFO: after the 2.0 start)


def test_fifo_never_lets_a_later_call_start_first() -> None:
    pool = _service(servers=3)
    results = [pool.submit(0.1 * i, s) for i, s in enumerate([5.0, 0.1, 5.0, 0.1, 0.1, 2.0])]
    starts = [r.start_s for r in results if r.start_s is not None]
    assert len(starts) == len(results) and starts == sorted(starts)


def test_rate_limit_spaces_calls_beyond_the_burst() -> None:
    api = _service(servers=100, rate_limit_per_s=2.0, burst=3.0)
    starts = [api.submit(0.0, 0.1).start_s for _ in range(7)]
    # The first `burst` start at once; call i beyond it starts at (i - burst + 1) / rate.
    assert starts == pytest.approx([0.0, 0.0, 0.0, 0.5, 1.0, 1.5, 2.0])
    # After a long idle spell the bucket is full again, but never above `burst`.
    later = [api.submit(100.0, 0.1).start_s for _ in range(4)]
    assert later == pytest.approx([100.0, 100.0, 100.0, 100.5])


def test_rate_limit_and_connections_together() -> None:
    api = _service(servers=1, rate_limit_per_s=1.0, burst=1.0)
    results = [api.submit(0.0, s) for s in (0.2, 2.0, 0.2)]
    # Token at 0, 1, 2; the connection is busy 1-3, so the third starts at 3.
    assert [r.start_s for r in results] == pytest.approx([0.0, 1.0, 3.0])


def test_a_timed_out_call_keeps_its_connection_until_its_work_finishes() -> None:
    pool = _service(servers=1, timeout_s=2.5)
    first = pool.submit(0.0, 5.0)
    assert first.outcome is DownstreamOutcome.TIMED_OUT and first.timed_out
    assert (first.response_s, first.start_s, first.finish_s) == (2.5, 0.0, 5.0)
    # The caller gave up at 2.5, but the query runs on: a retry at 3 waits until 5.
    retry = pool.submit(3.0, 1.0)
    assert retry.start_s == 5.0 and retry.finish_s == 6.0
    assert retry.timed_out and retry.response_s == 5.5
    stats = pool.statistics(6.0)
    assert stats.busy_s == pytest.approx(6.0) and stats.utilisation == pytest.approx(1.0)
    assert stats.wasted_busy_s == pytest.approx((5.0 - 2.5) + (6.0 - 5.5))
    assert (stats.completed, stats.timed_out, stats.abandoned) == (0, 2, 0)


def test_a_call_still_waiting_at_its_timeout_never_runs() -> None:
    pool = _service(servers=1, timeout_s=1.0)
    pool.submit(0.0, 3.0)
    gave_up = pool.submit(0.5, 1.0)
    assert gave_up.timed_out and not gave_up.ran
    assert gave_up.response_s == 1.5 and gave_up.wait_s == 1.0
    # It left the queue, so the next call takes the connection at 3 as if it never came.
    assert pool.submit(2.5, 0.5).start_s == 3.0
    assert pool.statistics(4.0).abandoned == 1


def test_without_cancelling_a_waiting_call_runs_for_nobody() -> None:
    pool = _service(servers=1, timeout_s=1.0, cancel_waiting_on_timeout=False)
    pool.submit(0.0, 3.0)
    ghost = pool.submit(0.5, 1.0)
    assert ghost.timed_out and ghost.ran and ghost.start_s == 3.0
    assert pool.submit(2.0, 0.5).start_s == 4.0
    # Work after each caller's timeout: 1-3, 1.5 s after the ghost's, 3-4 and 4-4.5.
    assert pool.statistics(4.5).wasted_busy_s == pytest.approx(2.0 + 1.0 + 0.5)


def test_queue_limit_refuses_at_once() -> None:
    pool = _service(servers=1, queue_limit=2)
    results = [pool.submit(0.0, 1.0) for _ in range(4)]
    assert [r.outcome for r in results] == [DownstreamOutcome.COMPLETED] * 3 + [
        DownstreamOutcome.REFUSED
    ]
    refused = results[3]
    assert refused.refused and refused.response_s == 0.0 and refused.start_s is None
    # At 1.0 the second call starts, so one place frees.
    assert not pool.submit(1.0, 1.0).refused
    assert pool.submit(1.0, 1.0).refused
    stats = pool.statistics(1.0)
    assert (stats.refused, stats.waiting, stats.in_service) == (2, 2, 1)


def test_queue_limit_zero_means_never_wait() -> None:
    pool = _service(servers=2, queue_limit=0)
    outcomes = [pool.submit(0.0, 1.0).outcome for _ in range(3)]
    assert outcomes[2] is DownstreamOutcome.REFUSED and outcomes[0] is outcomes[1]


def test_predicted_wait_is_the_wait_the_next_call_sees() -> None:
    rng = np.random.default_rng(3)
    pool = _service(servers=2, rate_limit_per_s=3.0, burst=2.0)
    now = 0.0
    for _ in range(300):
        now += float(rng.exponential(0.3))
        predicted = pool.predicted_wait_s(now)
        assert pool.submit(now, float(rng.exponential(0.7))).wait_s == pytest.approx(predicted)


def test_calls_must_come_in_time_order() -> None:
    pool = _service()
    pool.submit(5.0, 1.0)
    with pytest.raises(ValueError, match="time order"):
        pool.submit(4.0, 1.0)
    with pytest.raises(ValueError, match="service_s"):
        pool.submit(6.0, -1.0)


def _poisson_run(
    pool: DownstreamService, rate_per_s: float, service: np.ndarray, seed: int
) -> tuple[float, float, float, float]:
    """Submit Poisson arrivals, probing the number in system on a grid between them.

    Returns the time-average number in system, arrival rate * mean time in system, the
    mean wait, and the last arrival time.
    """
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate_per_s, service.size))
    horizon = float(arrivals[-1])
    probes = iter(np.arange(0.0, horizon, 0.05))
    probe = next(probes)
    counts: list[int] = []
    in_system_s = []
    waits = []
    for t, s in zip(arrivals.tolist(), service.tolist(), strict=True):
        while probe is not None and probe < t:
            counts.append(pool.in_system(float(probe)))
            probe = next(probes, None)
        result = pool.submit(t, s)
        end = result.finish_s if result.finish_s is not None else result.response_s
        in_system_s.append(end - t)
        waits.append(result.wait_s)
    mean_l = float(np.mean(counts))
    little = service.size / horizon * float(np.mean(in_system_s))
    return mean_l, little, float(np.mean(waits)), horizon


def _erlang_c_wait_s(servers: int, rate_per_s: float, mean_service_s: float) -> float:
    """Mean wait in M/M/c: P(wait) (Erlang C) / (c * mu - lambda)."""
    a = rate_per_s * mean_service_s
    top = a**servers / math.factorial(servers) / (1 - a / servers)
    p_wait = top / (sum(a**k / math.factorial(k) for k in range(servers)) + top)
    return p_wait / (servers / mean_service_s - rate_per_s)


def test_littles_law_and_erlang_c_over_a_long_mmc_run() -> None:
    servers, rate, mean_service = 3, 2.4, 1.0
    service = np.random.default_rng(11).exponential(mean_service, 100_000)
    pool = _service(servers=servers)
    mean_l, little, mean_wait, horizon = _poisson_run(pool, rate, service, seed=12)
    assert mean_l == pytest.approx(little, rel=0.03)
    assert mean_wait == pytest.approx(_erlang_c_wait_s(servers, rate, mean_service), rel=0.08)
    stats = pool.statistics(horizon)
    assert stats.utilisation == pytest.approx(rate * mean_service / servers, rel=0.03)


def test_md1_wait_matches_pollaczek_khinchine() -> None:
    rate, service_s = 0.7, 1.0
    pool = _service(servers=1)
    mean_l, little, mean_wait, _ = _poisson_run(pool, rate, np.full(60_000, service_s), seed=5)
    rho = rate * service_s
    assert mean_wait == pytest.approx(rho * service_s / (2 * (1 - rho)), rel=0.06)
    assert mean_l == pytest.approx(little, rel=0.03)


@pytest.mark.parametrize(
    ("overrides", "field", "fix"),
    [
        ({"servers": 0}, "servers", "1 or more"),
        ({"rate_limit_per_s": 0.0}, "rate_limit_per_s", "> 0"),
        ({"rate_limit_per_s": 1.0, "burst": 0.5}, "burst", "1 or more"),
        ({"queue_limit": -1}, "queue_limit", "null for no limit"),
        ({"timeout_s": float("inf")}, "timeout_s", "seconds > 0"),
    ],
)
def test_bad_configs_name_field_value_and_fix(
    overrides: dict[str, object], field: str, fix: str
) -> None:
    with pytest.raises(ConfigError) as info:
        DownstreamConfig(**overrides)  # type: ignore[arg-type]
    message = str(info.value)
    assert f"downstream.{field} is invalid (got {overrides[field]!r})" in message
    assert fix in message


def test_decoding_rejects_unknown_keys() -> None:
    with pytest.raises(msgspec.ValidationError, match="unknown field"):
        msgspec.json.decode(b'{"connections": 4}', type=DownstreamConfig)


def test_every_config_field_is_documented_in_the_policy_doc() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "overload-policies.md").read_text(
        encoding="utf-8"
    )
    missing = [f for f in DownstreamConfig.__struct_fields__ if f"| `{f}` |" not in doc]
    assert not missing, f"docs/overload-policies.md lacks DownstreamConfig fields {missing}"


def test_a_workload_service_gives_its_config() -> None:
    service = Service(servers=4, rate_limit_per_s=5.0, burst=2.0, queue_limit=9, timeout_s=3.0)
    assert DownstreamConfig.from_service(service) == DownstreamConfig(
        servers=4, rate_limit_per_s=5.0, burst=2.0, queue_limit=9, timeout_s=3.0
    )
