"""Energy beside cost (issue 19, deliverable 7; seed 002: "cost and power per
SLO-satisfying request"): each replica's GPUs draw their full power while it steps and
their idle power the rest of its provisioned time; the GPU catalog gives the board power,
a cluster file's ``gpu_power_w`` replaces it."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from headway.core.errors import ConfigError
from headway.files.workload import parse_workload
from headway.sim.cluster import ClusterSpec, parse_cluster
from headway.sim.run import simulate


def _spec(rate_per_s: float) -> Any:
    return parse_workload(
        {
            "name": "energy",
            "duration_s": 60,
            "seed": 2,
            "classes": {
                "chat": {
                    "input_tokens": 500,
                    "output_tokens": 100,
                    "slo": {"ttft_s": 5.0, "tpot_s": 0.2},
                }
            },
            "sources": [
                {"name": "u", "arrivals": {"process": "poisson", "rate_per_s": rate_per_s}}
            ],
        }
    )


def _cluster(**extra: Any) -> ClusterSpec:
    return msgspec.convert(
        {"replicas": 2, "model": "llama-3-8b", "gpu": "h100", **extra}, ClusterSpec
    )


def test_energy_is_idle_draw_plus_full_draw_while_stepping() -> None:
    result, out, _ = simulate(_spec(1.0), _cluster())
    energy = result.energy
    assert energy is not None and energy.joules_per_slo_request is not None
    idle_w, full_w = 0.15 * 700, 700.0  # the H100's board power, idle assumed at 15%
    expected = sum(
        idle_w * up + (full_w - idle_w) * busy
        for up, busy in zip(out.replica_up_s, out.replica_busy_s, strict=True)
    )
    assert energy.energy_j == pytest.approx(expected)
    assert 0 < sum(out.replica_busy_s) < sum(out.replica_up_s)
    assert energy.joules_per_slo_request == pytest.approx(energy.energy_j / result.slo.met)
    assert energy.joules_per_verified_outcome == pytest.approx(
        energy.energy_j / result.slo.tasks_verified
    )


def test_a_busier_cluster_draws_more_and_spends_less_per_request() -> None:
    light, _, _ = simulate(_spec(1.0), _cluster())
    busy, _, _ = simulate(_spec(12.0), _cluster())
    assert light.energy is not None and busy.energy is not None
    assert busy.energy.mean_power_w > 1.5 * light.energy.mean_power_w
    assert light.energy.mean_power_w >= 2 * 0.15 * 700 * 0.99  # at least the idle draw
    assert busy.energy.joules_per_slo_request < light.energy.joules_per_slo_request


def test_a_measured_power_draw_replaces_the_catalogs() -> None:
    base, _, _ = simulate(_spec(1.0), _cluster(gpu_power_w={"idle_w": 100, "max_w": 600}))
    doubled, _, _ = simulate(_spec(1.0), _cluster(gpu_power_w={"idle_w": 200, "max_w": 1200}))
    assert base.energy is not None and doubled.energy is not None
    assert doubled.energy.energy_j == pytest.approx(2 * base.energy.energy_j)


def test_bad_power_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"gpu_power_w\.idle_w"):
        parse_cluster({"gpu_power_w": {"idle_w": 800, "max_w": 700}})
