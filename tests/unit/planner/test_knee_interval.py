"""The knee's interval over seeds is honest: each seed's knee is where its attainment
crosses the target, interpolated inside its bracket, not the bracket's lower end, which
every seed tends to share (a plan printed a 95% interval of 616-616 over 3 seeds)."""

from __future__ import annotations

import math

import pytest

from headway.planner.simulated import crossing_load_factor
from headway.sim.sweep import Knee, SweepPoint


def _point(load_factor: float, attainment: float) -> SweepPoint:
    return SweepPoint(
        load_factor=load_factor, seed=0, offered_tasks_per_s=load_factor * 10,
        offered_calls_per_s=load_factor * 10, slo_attainment=attainment, goodput_per_s=0.0,
        task_attainment=attainment, ttft_p99_s=None, tpot_p99_s=None, e2e_p99_s=None,
        throughput_requests_per_s=0.0, output_tokens_per_s=0.0, preemptions=0,
    )  # fmt: skip


def _knee(low: float, high: float, **fields: object) -> Knee:
    base: dict[str, object] = {"target": 0.9, "load_factor": low, "upper_load_factor": high,
                               "offered_tasks_per_s": low * 10, "offered_calls_per_s": low * 10,
                               "found": True}  # fmt: skip
    base.update(fields)
    return Knee(**base)  # type: ignore[arg-type]


def test_seeds_on_one_grid_bracket_get_their_own_crossings() -> None:
    # Three seeds whose searches all end on the bracket [1.0, 1.25]: the same lower end,
    # different attainments on either side.
    crossings = []
    for low_att, high_att in ((0.95, 0.85), (0.92, 0.80), (0.99, 0.89)):
        points = [_point(0.5, 1.0), _point(1.0, low_att), _point(1.25, high_att)]
        crossings.append(crossing_load_factor(_knee(1.0, 1.25), points))
    assert crossings == pytest.approx([1.125, 1.0 + 0.25 * 2 / 12, 1.0 + 0.25 * 0.9])
    assert len(set(crossings)) == 3  # the interval over them has a width


@pytest.mark.parametrize(
    "knee",
    [_knee(1.0, math.inf, stopped="saturated"), _knee(0.1, 0.2, found=False)],
)
def test_an_open_bracket_keeps_its_lower_end(knee: Knee) -> None:
    points = [_point(knee.load_factor, 0.95)]
    assert crossing_load_factor(knee, points) == knee.load_factor
