"""Short-horizon offered load: Holt's linear trend, damped, over evenly spaced samples.

The predictive autoscaler (:mod:`.autoscaler`, ``kind: predictive``) asks what the offered
load will be when a replica started now is ready. Why this predictor:

* Two numbers an operator can read and check by hand: a *level* (the smoothed load) and a
  *slope* (its change per sample). The forecast ``h`` samples ahead is
  ``level + slope × (φ + φ² + … + φʰ)``; there is nothing else in it.
* It follows a ramp one sample after the ramp starts: exponential smoothing alone (or
  HPA's stabilised current value) lags a ramp by its whole window, which is the lateness
  seed 003 complains of.
* It needs no history to fit: ARIMA and Prophet (the Dynamo planner's options) need many
  periods of data and hide their reasoning in fitted coefficients, and a minutes-long
  horizon has no daily season to model.
* The damping ``φ < 1`` (Gardner and McKenzie's damped trend) bounds how far a slope is
  carried: at most ``slope × φ / (1 − φ)`` whatever the horizon. A burst's steep first
  minutes are not extrapolated across a ten-minute start-up.

Equations (Holt 1957, with damping), for a sample ``y`` every ``interval``::

    level' = α y + (1 − α)(level + φ slope)
    slope' = β (level' − level) + (1 − β) φ slope

Sans-I/O: :meth:`HoltForecast.observe` takes a sample, :meth:`HoltForecast.forecast` a
number of samples ahead; the caller owns the clock.
"""

from __future__ import annotations

import math

__all__ = ["HoltForecast"]


class HoltForecast:
    """Holt's damped linear trend over one series (see the module docstring)."""

    def __init__(self, alpha: float, beta: float, damping: float) -> None:
        for name, value in (("alpha", alpha), ("beta", beta), ("damping", damping)):
            if not (math.isfinite(value) and 0.0 < value <= 1.0):
                raise ValueError(
                    f"Holt's {name} must be in (0, 1] (got {value}); e.g. alpha 0.5, "
                    "beta 0.3, damping 0.9"
                )
        self.alpha = alpha
        self.beta = beta
        self.damping = damping
        self.level: float | None = None
        """The smoothed load (None before the first sample)."""
        self.slope = 0.0
        """The smoothed change per sample."""
        self.samples = 0

    def observe(self, value: float) -> None:
        """Add the next sample (evenly spaced after the previous one).

        Raises:
            ValueError: for a sample that is not a finite number >= 0.
        """
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"a load sample must be a finite number >= 0 (got {value})")
        self.samples += 1
        if self.level is None:
            self.level = value
            return
        phi = self.damping
        previous = self.level
        self.level = self.alpha * value + (1 - self.alpha) * (previous + phi * self.slope)
        self.slope = self.beta * (self.level - previous) + (1 - self.beta) * phi * self.slope

    def forecast(self, steps: float) -> float | None:
        """The load ``steps`` samples ahead (>= 0, fractional allowed), never below 0;
        None before the first sample."""
        if self.level is None:
            return None
        phi = self.damping
        # φ + φ² + … + φ^steps, continued to fractional steps (steps itself undamped)
        carried = steps if phi == 1.0 else phi * (1 - phi**steps) / (1 - phi)
        return max(0.0, self.level + self.slope * carried)
