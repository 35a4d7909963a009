"""Statistical tests of the arrival processes (fixed seeds, so deterministic)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from headway.core.seeding import stream
from headway.core.trace_data import TraceData
from headway.core.workload import arrivals
from headway.core.workload.spec import (
    Burst,
    Constant,
    Exponential,
    Fixed,
    GammaArrivals,
    OnOff,
    PoissonArrivals,
    Schedule,
    Step,
    TraceReplay,
    Window,
)

FloatArray = npt.NDArray[np.float64]


def _cv(times: FloatArray) -> float:
    gaps = np.diff(times)
    return float(gaps.std() / gaps.mean())


def _dispersion(times: FloatArray, horizon_s: float, bin_s: float) -> float:
    counts = np.bincount((times // bin_s).astype(int), minlength=int(horizon_s // bin_s))
    counts = counts[: int(horizon_s // bin_s)]
    return float(counts.var() / counts.mean())


def test_constant_is_evenly_spaced() -> None:
    t = arrivals.generate(Constant(rate_per_s=4.0), 100.0, stream(1, "a"))
    assert t.size in (399, 400)
    assert np.allclose(np.diff(t), 0.25)
    assert 0 <= t[0] < 0.25  # random phase, no artificial arrival at 0


def test_poisson_rate_cv_and_dispersion() -> None:
    horizon = 20_000.0
    t = arrivals.generate(PoissonArrivals(rate_per_s=5.0), horizon, stream(2, "a"))
    assert t.size / horizon == pytest.approx(5.0, rel=0.02)
    assert _cv(t) == pytest.approx(1.0, abs=0.03)
    assert _dispersion(t, horizon, 1.0) == pytest.approx(1.0, abs=0.06)
    assert np.all(np.diff(t) >= 0) and t.max() < horizon


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_keeps_rate_and_cv(cv: float) -> None:
    horizon = 40_000.0
    t = arrivals.generate(GammaArrivals(rate_per_s=2.0, cv=cv), horizon, stream(3, "a"))
    assert t.size / horizon == pytest.approx(2.0, rel=0.04)
    assert _cv(t) == pytest.approx(cv, rel=0.08)
    dispersion = _dispersion(t, horizon, 10.0)
    # A renewal process's index of dispersion over long windows tends to cv².
    assert dispersion == pytest.approx(cv * cv, rel=0.3)


def test_schedule_follows_each_step_and_repeats() -> None:
    spec = Schedule(
        steps=[Step(duration_s=300, rate_per_s=35), Step(duration_s=60, rate_per_s=180)],
        repeat=True,
    )
    t = arrivals.generate(spec, 3600.0, stream(4, "a"))
    phase = t % 360
    low = np.count_nonzero(phase < 300) / (10 * 300)
    high = np.count_nonzero(phase >= 300) / (10 * 60)
    assert low == pytest.approx(35, rel=0.03)
    assert high == pytest.approx(180, rel=0.03)


def test_schedule_without_repeat_holds_last_rate() -> None:
    spec = Schedule(
        steps=[Step(duration_s=10, rate_per_s=0), Step(duration_s=10, rate_per_s=50)],
        repeat=False,
        cv=0,
    )
    t = arrivals.generate(spec, 1000.0, stream(5, "a"))
    assert t.min() >= 10.0
    assert t.size == pytest.approx(50 * 990, abs=2)


def test_bursts_replace_add_and_multiply() -> None:
    base = PoissonArrivals(
        rate_per_s=2.0,
        bursts=[
            Burst(start_s=100, duration_s=100, rate_per_s=20),
            Burst(start_s=300, duration_s=100, add_rate_per_s=8),
            Burst(start_s=500, duration_s=100, multiplier=3),
        ],
    )
    profile = arrivals.rate_profile(base, 700.0)
    assert [profile.rate_at(t) for t in (50, 150, 250, 350, 550, 650)] == [2, 20, 2, 10, 6, 2]
    t = arrivals.generate(base, 700.0, stream(6, "a"))
    in_burst = np.count_nonzero((t >= 100) & (t < 200))
    assert in_burst == pytest.approx(2000, rel=0.08)


def test_repeating_burst() -> None:
    spec = Constant(
        rate_per_s=1, bursts=[Burst(start_s=0, duration_s=10, rate_per_s=5, every_s=60)]
    )
    profile = arrivals.rate_profile(spec, 180.0)
    assert [profile.rate_at(t) for t in (5, 30, 65, 125, 170)] == [5, 1, 5, 5, 1]
    assert profile.mean_rate_per_s() == pytest.approx((3 * 50 + 3 * 10 * 5) / 180)


def test_on_off_mean_rate_and_burstiness() -> None:
    spec = OnOff(on_rate_per_s=10, on_s=Exponential(mean=20), off_s=Exponential(mean=60))
    horizon = 100_000.0
    t = arrivals.generate(spec, horizon, stream(7, "a"))
    assert t.size / horizon == pytest.approx(10 * 20 / 80, rel=0.08)
    assert _cv(t) > 1.5  # far burstier than Poisson
    assert _dispersion(t, horizon, 60.0) > 10


def test_on_off_fixed_periods_are_exact() -> None:
    spec = OnOff(on_rate_per_s=4, on_s=Fixed(value=10), off_s=10.0, cv=0)
    t = arrivals.generate(spec, 100.0, stream(8, "a"))
    assert np.all((t % 20) < 10)
    assert t.size == pytest.approx(200, abs=5)


def _trace(times: list[float]) -> TraceData:
    n = len(times)
    return TraceData(
        name="t",
        kind="generic",
        arrival_s=np.asarray(times, dtype=np.float64),
        input_tokens=np.full(n, 100, dtype=np.int64),
        output_tokens=np.full(n, 10, dtype=np.int64),
    )


def test_replay_time_scale_window_and_thinning() -> None:
    trace = _trace([float(i) for i in range(1000)])
    spec = TraceReplay(path="x", time_scale=0.5, window=Window(start_s=100, end_s=300))
    out = arrivals.replay(spec, trace, 1e9, stream(9, "a"))
    assert out.arrival_s.size == 200
    assert out.arrival_s[0] == 0.0 and out.arrival_s[-1] == pytest.approx(99.5)
    assert out.row[0] == 100
    thin = arrivals.replay(TraceReplay(path="x", rate_scale=0.25), trace, 1e9, stream(9, "b"))
    assert thin.arrival_s.size == pytest.approx(250, abs=40)


def test_replay_keeps_rows_stamped_at_the_end_of_the_run() -> None:
    """A trace exported as [0, 600 s] stamps its last rows at 600: a run of duration_s 600
    replays them (it dropped them)."""
    trace = _trace([0.0, 100.0, 599.0, 600.0, 600.0, 600.5])
    spec = TraceReplay(path="x", tick_policy="literal")
    out = arrivals.replay(spec, trace, 600.0, stream(9, "end"))
    assert out.arrival_s.tolist() == [0.0, 100.0, 599.0, 600.0, 600.0]


def test_replay_replication_spreads_copies() -> None:
    trace = _trace([float(i) for i in range(1000)])
    out = arrivals.replay(TraceReplay(path="x", rate_scale=2.5), trace, 1e9, stream(10, "a"))
    assert out.arrival_s.size == pytest.approx(2500, rel=0.05)
    assert np.unique(out.arrival_s).size > 0.95 * out.arrival_s.size  # copies are not synchronous
    assert np.all(np.diff(out.arrival_s) >= 0)


def test_replay_tick_policy() -> None:
    ticks = np.repeat(np.arange(0, 300, 3.0), 10)  # 10 requests on each 3 s tick
    trace = _trace(ticks.tolist())
    literal = arrivals.replay(
        TraceReplay(path="x", tick_policy="literal"), trace, 1e9, stream(1, "a")
    )
    assert np.unique(literal.arrival_s).size == 100
    spread = arrivals.replay(TraceReplay(path="x"), trace, 1e9, stream(1, "a"))
    assert spread.tick_s == pytest.approx(3.0)
    assert np.unique(spread.arrival_s).size == ticks.size
    assert _cv(spread.arrival_s) == pytest.approx(1.0, abs=0.15)  # spread ticks look Poisson


def test_horizon_crops_everything() -> None:
    t = arrivals.generate(PoissonArrivals(rate_per_s=100), 1.5, stream(11, "a"))
    assert t.max() < 1.5
