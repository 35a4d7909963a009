"""Holt's damped trend: flat stays flat, a ramp is predicted ahead, damping bounds the
slope's reach, and bad settings or samples fail naming the value."""

from __future__ import annotations

import pytest

from headway.core.policy.load_forecast import HoltForecast


def test_a_flat_series_forecasts_itself() -> None:
    f = HoltForecast(0.5, 0.3, 0.8)
    assert f.forecast(3) is None
    for _ in range(20):
        f.observe(1000.0)
    assert f.forecast(10) == pytest.approx(1000.0)


def test_a_ramp_is_predicted_ahead_of_its_last_sample() -> None:
    f = HoltForecast(0.5, 0.3, 1.0)  # undamped: the slope carries on
    for k in range(30):
        f.observe(100.0 + 10.0 * k)
    last = 100.0 + 10.0 * 29
    # Converged on the ramp: 8 samples ahead is the ramp's own value there.
    assert f.forecast(8) == pytest.approx(last + 80.0, rel=0.01)
    assert f.slope == pytest.approx(10.0, rel=0.01)


def test_damping_bounds_how_far_a_slope_is_carried() -> None:
    f = HoltForecast(0.5, 0.3, 0.8)
    for k in range(30):
        f.observe(100.0 + 10.0 * k)
    level, slope = f.level, f.slope
    assert level is not None and slope > 0
    near, far = f.forecast(1), f.forecast(1000)
    assert near is not None and far is not None
    assert near == pytest.approx(level + 0.8 * slope)
    assert far == pytest.approx(level + slope * 0.8 / 0.2, rel=1e-6)  # φ / (1 − φ)
    assert far < level + 10 * slope


def test_a_falling_series_never_forecasts_below_zero() -> None:
    f = HoltForecast(0.9, 0.9, 1.0)
    for value in (1000.0, 500.0, 0.0, 0.0):
        f.observe(value)
    assert f.forecast(50) == 0.0


@pytest.mark.parametrize("name", ["alpha", "beta", "damping"])
@pytest.mark.parametrize("bad", [0.0, 1.5, float("nan")])
def test_bad_settings_name_the_field(name: str, bad: float) -> None:
    kwargs = {"alpha": 0.5, "beta": 0.3, "damping": 0.8, name: bad}
    with pytest.raises(ValueError, match=f"{name} must be in"):
        HoltForecast(**kwargs)


def test_bad_samples_are_refused() -> None:
    with pytest.raises(ValueError, match="got -1"):
        HoltForecast(0.5, 0.3, 0.8).observe(-1.0)
