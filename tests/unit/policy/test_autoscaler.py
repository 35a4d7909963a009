"""The autoscaler: detection delay, cooldowns, bounds, starting replicas, start-up delay,
scale-down after sustained low load, and config errors that name field, value and fix."""

from __future__ import annotations

import ast
import inspect
import itertools
import textwrap
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from headway.core.errors import ConfigError
from headway.core.policy.autoscaler import (
    Autoscaler,
    AutoscalerConfig,
    AutoscalerSignals,
    Hold,
    PredictiveConfig,
    ScaleDown,
    ScaleUp,
    window_queue_delay_s,
)


def _config(**overrides: object) -> AutoscalerConfig:
    base: dict[str, object] = {
        "signal": "queue_delay_s",
        "target": 1.0,
        "evaluation_interval_s": 10.0,
        "detection_delay_s": 30.0,
        "startup_delay_s": 90.0,
        "min_replicas": 1,
        "max_replicas": 10,
        "scale_up_cooldown_s": 0.0,
        "scale_down_cooldown_s": 0.0,
        "max_step": 4,
    }
    base.update(overrides)
    return AutoscalerConfig(**base)  # type: ignore[arg-type]


def _signals(ready: int, delay_s: float | None, starting: int = 0) -> AutoscalerSignals:
    return AutoscalerSignals(
        ready_replicas=ready, starting_replicas=starting, queue_delay_s=delay_s
    )


def test_a_breach_shorter_than_the_detection_delay_does_nothing() -> None:
    scaler = Autoscaler(_config())
    decisions = [scaler.decide(t, _signals(2, 3.0)) for t in (0.0, 10.0, 20.0)]
    assert all(isinstance(d, Hold) for d in decisions)
    # The spike ends before 30 s: the breach resets, and a new one starts from scratch.
    assert isinstance(scaler.decide(30.0, _signals(2, 1.0)), Hold)
    assert all(isinstance(scaler.decide(t, _signals(2, 3.0)), Hold) for t in (40.0, 50.0, 60.0))
    up = scaler.decide(70.0, _signals(2, 3.0))
    assert isinstance(up, ScaleUp)


def test_sustained_breach_scales_up_by_the_hpa_ratio_with_startup_delay() -> None:
    scaler = Autoscaler(_config())
    for t in (0.0, 10.0, 20.0):
        assert isinstance(scaler.decide(t, _signals(2, 2.2)), Hold)
    up = scaler.decide(30.0, _signals(2, 2.2))
    # desired = ceil(2 * 2.2 / 1.0) = 5, so 3 more, ready 90 s after the decision.
    assert isinstance(up, ScaleUp)
    assert (up.count, up.ready_at_s) == (3, 120.0)
    assert "queue_delay_s" in up.reason


def test_scale_up_takes_the_smallest_recommendation_of_the_window() -> None:
    scaler = Autoscaler(_config())
    for t, delay in ((0.0, 5.0), (10.0, 1.6), (20.0, 5.0)):
        scaler.decide(t, _signals(2, delay))
    up = scaler.decide(30.0, _signals(2, 5.0))
    assert isinstance(up, ScaleUp) and up.count == 2  # ceil(2 * 1.6) = 4 = 2 + 2


def test_within_tolerance_nothing_happens() -> None:
    scaler = Autoscaler(_config(detection_delay_s=0.0, tolerance=0.1))
    assert isinstance(scaler.decide(0.0, _signals(4, 1.09)), Hold)
    assert isinstance(scaler.decide(10.0, _signals(4, 0.91)), Hold)
    assert isinstance(scaler.decide(20.0, _signals(4, 1.3)), ScaleUp)


def test_starting_replicas_count_so_a_booting_one_is_not_added_twice() -> None:
    scaler = Autoscaler(_config(detection_delay_s=0.0))
    up = scaler.decide(0.0, _signals(2, 1.5))
    assert isinstance(up, ScaleUp) and up.count == 1  # ceil(2 * 1.5) = 3
    # The same load while that replica boots: 2 ready + 1 starting already make 3.
    for t in (10.0, 20.0, 30.0, 80.0):
        assert isinstance(scaler.decide(t, _signals(2, 1.5, starting=1)), Hold)


def test_scale_up_cooldown() -> None:
    scaler = Autoscaler(_config(detection_delay_s=0.0, scale_up_cooldown_s=60.0))
    assert isinstance(scaler.decide(0.0, _signals(2, 2.0)), ScaleUp)  # to 4
    held = scaler.decide(10.0, _signals(4, 2.0))
    assert isinstance(held, Hold) and "cooldown" in held.reason
    assert isinstance(scaler.decide(60.0, _signals(4, 2.0)), ScaleUp)


def test_max_step_and_max_replicas_bound_a_scale_up() -> None:
    scaler = Autoscaler(_config(detection_delay_s=0.0, max_step=2, max_replicas=5))
    up = scaler.decide(0.0, _signals(2, 10.0))  # desired 20
    assert isinstance(up, ScaleUp) and up.count == 2
    up = scaler.decide(10.0, _signals(4, 10.0))
    assert isinstance(up, ScaleUp) and up.count == 1  # only one below max_replicas
    held = scaler.decide(20.0, _signals(5, 10.0))
    assert isinstance(held, Hold)


def test_below_min_or_above_max_is_corrected_at_once() -> None:
    scaler = Autoscaler(_config(min_replicas=3, max_replicas=6))
    up = scaler.decide(0.0, _signals(1, None))  # replicas lost, no signal at all
    assert isinstance(up, ScaleUp) and up.count == 2 and up.ready_at_s == 90.0
    down = scaler.decide(1.0, _signals(8, 1.0))
    assert isinstance(down, ScaleDown) and down.count == 2


def test_scale_down_after_sustained_low_load_one_step_at_a_time() -> None:
    scaler = Autoscaler(_config(scale_down_cooldown_s=60.0))
    # ratio 0.25 with 8 ready: desired ceil(2.0) = 2.
    decisions = [scaler.decide(t, _signals(8, 0.25)) for t in (0.0, 10.0, 20.0)]
    assert all(isinstance(d, Hold) for d in decisions)
    down = scaler.decide(30.0, _signals(8, 0.25))
    assert isinstance(down, ScaleDown) and down.count == 1
    held = scaler.decide(40.0, _signals(7, 0.25))
    assert isinstance(held, Hold)  # cooling down, and a new breach must last again


def test_scale_down_never_below_min_and_never_while_starting() -> None:
    scaler = Autoscaler(_config(detection_delay_s=0.0, min_replicas=2, max_step_down=10))
    held = scaler.decide(0.0, _signals(3, 0.0, starting=1))
    assert isinstance(held, Hold) and "starting" in held.reason
    down = scaler.decide(10.0, _signals(4, 0.0))
    assert isinstance(down, ScaleDown) and down.count == 2
    assert isinstance(scaler.decide(20.0, _signals(2, 0.0)), Hold)


def test_scale_down_waits_for_the_cooldown_after_a_scale_up() -> None:
    scaler = Autoscaler(_config(detection_delay_s=0.0, scale_down_cooldown_s=300.0))
    assert isinstance(scaler.decide(0.0, _signals(2, 2.0)), ScaleUp)
    held = scaler.decide(100.0, _signals(4, 0.1))
    assert isinstance(held, Hold) and "cooldown" in held.reason
    assert isinstance(scaler.decide(300.0, _signals(4, 0.1)), ScaleDown)


def test_calls_between_evaluations_hold_without_counting() -> None:
    scaler = Autoscaler(_config(detection_delay_s=0.0))
    assert isinstance(scaler.decide(0.0, _signals(2, 1.0)), Hold)
    held = scaler.decide(5.0, _signals(2, 9.0))
    assert isinstance(held, Hold) and "next evaluation" in held.reason
    assert isinstance(scaler.decide(10.0, _signals(2, 9.0)), ScaleUp)


def test_admitted_tokens_per_replica_sizes_to_total_over_target() -> None:
    cfg = _config(signal="admitted_tokens_per_replica", target=1000.0, detection_delay_s=0.0)
    scaler = Autoscaler(cfg)
    signals = AutoscalerSignals(ready_replicas=2, admitted_tokens_per_s=4500.0)
    assert scaler.signal_value(signals) == 2250.0
    up = scaler.decide(0.0, signals)
    assert isinstance(up, ScaleUp) and up.count == 3  # ceil(4500 / 1000) = 5


def test_missing_signal_holds_and_resets_the_breach() -> None:
    scaler = Autoscaler(_config(signal="kv_occupancy", target=0.8))
    scaler.decide(0.0, AutoscalerSignals(ready_replicas=2, kv_occupancy=1.0))
    scaler.decide(10.0, AutoscalerSignals(ready_replicas=2, kv_occupancy=1.0))
    assert isinstance(scaler.decide(20.0, AutoscalerSignals(ready_replicas=2)), Hold)
    # The breach restarted at 30 s, so 50 s is still within the 30 s detection delay.
    for t in (30.0, 40.0, 50.0):
        decision = scaler.decide(t, AutoscalerSignals(ready_replicas=2, kv_occupancy=1.0))
        assert isinstance(decision, Hold)
    decision = scaler.decide(60.0, AutoscalerSignals(ready_replicas=2, kv_occupancy=1.0))
    assert isinstance(decision, ScaleUp)


def test_deterministic() -> None:
    def run() -> list[object]:
        scaler = Autoscaler(_config(detection_delay_s=20.0))
        return [scaler.decide(10.0 * i, _signals(3, (i % 7) * 0.5)) for i in range(40)]

    assert run() == run()


@pytest.mark.parametrize(
    ("overrides", "field", "fix"),
    [
        ({"signal": "gpu_util"}, "signal", "queue_delay_s"),
        ({"target": 0.0}, "target", "> 0"),
        ({"signal": "kv_occupancy", "target": 80.0}, "target", "(0, 1]"),
        ({"tolerance": 1.0}, "tolerance", "[0, 1)"),
        ({"evaluation_interval_s": 0.0}, "evaluation_interval_s", "> 0"),
        ({"detection_delay_s": -1.0}, "detection_delay_s", ">= 0"),
        ({"startup_delay_s": float("inf")}, "startup_delay_s", ">= 0"),
        ({"min_replicas": 0}, "min_replicas", "1 or more"),
        ({"min_replicas": 4, "max_replicas": 3}, "max_replicas", "min_replicas (4)"),
        ({"max_step": 0}, "max_step", "1 or more"),
        ({"scale_down_cooldown_s": float("nan")}, "scale_down_cooldown_s", ">= 0"),
    ],
)
def test_bad_configs_name_field_value_and_fix(
    overrides: dict[str, object], field: str, fix: str
) -> None:
    with pytest.raises(ConfigError) as info:
        _config(**overrides)
    message = str(info.value)
    assert f"autoscaler.{field} is invalid" in message
    assert repr(overrides[field]) in message
    assert fix in message


def test_decoding_a_config_file_gives_the_key_path() -> None:
    with pytest.raises(msgspec.ValidationError, match=r"autoscaler\.max_step is invalid \(got 0\)"):
        msgspec.json.decode(b'{"max_step": 0}', type=AutoscalerConfig)
    with pytest.raises(msgspec.ValidationError, match="unknown field"):
        msgspec.json.decode(b'{"max_stepp": 2}', type=AutoscalerConfig)


def test_bad_signals_are_refused() -> None:
    with pytest.raises(ValueError, match="replica counts"):
        AutoscalerSignals(ready_replicas=-1)
    with pytest.raises(ValueError, match="queue_delay_s"):
        AutoscalerSignals(ready_replicas=1, queue_delay_s=float("nan"))


def test_every_config_field_is_documented() -> None:
    tree = ast.parse(textwrap.dedent(inspect.getsource(AutoscalerConfig)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    documented = {
        prev.target.id
        for prev, node in itertools.pairwise(body)
        if isinstance(prev, ast.AnnAssign)
        and isinstance(prev.target, ast.Name)
        and isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
    }
    assert documented == set(AutoscalerConfig.__struct_fields__)


def test_every_config_field_is_in_the_policy_doc() -> None:
    doc = (Path(__file__).resolve().parents[3] / "docs" / "overload-policies.md").read_text(
        encoding="utf-8"
    )
    missing = [f for f in AutoscalerConfig.__struct_fields__ if f"| `{f}` |" not in doc]
    assert not missing, f"docs/overload-policies.md lacks AutoscalerConfig fields {missing}"


# ---------------------------------------------------------------- kind: predictive


def _fluid(
    config: AutoscalerConfig, load: Callable[[float], float], until_s: float, capacity: float
) -> list[tuple[float, ScaleUp | ScaleDown, float]]:
    """A fluid pool driven by ``config``: each replica carries ``capacity`` tokens/s; past
    it, requests queue (5 s of queue delay) and KV fills. (time, decision, load) of every
    scaling decision."""
    scaler = Autoscaler(config)
    ready, starting = config.min_replicas, []
    decisions: list[tuple[float, ScaleUp | ScaleDown, float]] = []
    now = 0.0
    while now <= until_s:
        ready += sum(1 for t in starting if t <= now)
        starting = [t for t in starting if t > now]
        offered = load(now)
        util = offered / (ready * capacity)
        signals = AutoscalerSignals(
            ready_replicas=ready,
            starting_replicas=len(starting),
            queue_delay_s=5.0 if util > 1 else 0.0,
            admitted_tokens_per_s=min(offered, ready * capacity),
            kv_occupancy=0.8 * min(1.0, util),
            deadline_miss_ratio=0.3 if util > 1 else 0.0,
            offered_tokens_per_s=offered,
        )
        decision = scaler.decide(now, signals)
        if isinstance(decision, ScaleUp):
            starting += [decision.ready_at_s] * decision.count
            decisions.append((now, decision, offered))
        elif isinstance(decision, ScaleDown):
            ready -= decision.count
            decisions.append((now, decision, offered))
        now += config.evaluation_interval_s
    return decisions


def _direction_changes(decisions: list[tuple[float, ScaleUp | ScaleDown, float]]) -> int:
    ups = [isinstance(d, ScaleUp) for _, d, _ in decisions]
    return sum(1 for a, b in itertools.pairwise(ups) if a != b)


def _timings(**overrides: object) -> dict[str, object]:
    base: dict[str, object] = {
        "evaluation_interval_s": 15.0,
        "detection_delay_s": 30.0,
        "startup_delay_s": 120.0,
        "scale_up_cooldown_s": 0.0,
        "scale_down_cooldown_s": 120.0,
        "min_replicas": 1,
        "max_replicas": 12,
    }
    base.update(overrides)
    return base


def test_a_square_wave_does_not_flap_the_predictive_pool() -> None:
    """180 s at 3.5 replicas' worth, 180 s at one, for two hours: HPA on the admitted
    work scales down in every low phase and back up in every high one; the predictive
    autoscaler holds the high phase's capacity through the low one (its peak hold is
    start-up + cooldown, 240 s), so it changes direction at most once."""

    def square(t: float) -> float:
        return 3500.0 if (t // 180) % 2 == 0 else 1000.0

    reactive = AutoscalerConfig(**_timings(), signal="admitted_tokens_per_replica", target=800.0)  # type: ignore[arg-type]
    predictive = AutoscalerConfig(
        **_timings(),  # type: ignore[arg-type]
        kind="predictive",
        predictive=PredictiveConfig(replica_tokens_per_s=1000.0),
    )
    flapping = _direction_changes(_fluid(reactive, square, 7200, 1000.0))
    steady = _fluid(predictive, square, 7200, 1000.0)
    assert flapping >= 20  # the wave is fast enough to flap HPA's rule
    assert _direction_changes(steady) <= 1
    assert steady and isinstance(steady[0][1], ScaleUp)


def test_the_predictive_autoscaler_scales_a_ramp_before_it_saturates() -> None:
    """A ramp of offered load, capacity declared, no warm term (start-up inside the
    recovery objective): the forecast start-up ahead asks for a replica earlier, at a lower
    load, than HPA on queue delay, which waits for the queue."""

    def ramp(t: float) -> float:
        return 500.0 + 4.0 * t

    common = _timings(scale_down_cooldown_s=300.0)
    predictive = AutoscalerConfig(
        **common,  # type: ignore[arg-type]
        kind="predictive",
        predictive=PredictiveConfig(replica_tokens_per_s=1000.0, recovery_objective_s=600.0),
    )
    reactive = AutoscalerConfig(**common, signal="queue_delay_s", target=1.0)  # type: ignore[arg-type]
    first_p = _fluid(predictive, ramp, 900, 1000.0)[0]
    first_r = _fluid(reactive, ramp, 900, 1000.0)[0]
    assert isinstance(first_p[1], ScaleUp) and isinstance(first_r[1], ScaleUp)
    assert first_p[0] < first_r[0]
    assert first_p[2] < first_r[2]
    assert "forecast" in first_p[1].reason


@pytest.mark.parametrize(("recovery_s", "shrinks"), [(60.0, False), (600.0, True)])
def test_capacity_is_kept_warm_only_when_start_up_exceeds_the_recovery_objective(
    recovery_s: float, shrinks: bool
) -> None:
    """Light load on four replicas, no capacity known: with a 120 s start-up past a 60 s
    recovery objective nothing is removed; inside a 600 s one it scales down as HPA would."""
    config = AutoscalerConfig(
        **_timings(min_replicas=1),  # type: ignore[arg-type]
        kind="predictive",
        predictive=PredictiveConfig(recovery_objective_s=recovery_s),
    )
    scaler = Autoscaler(config)
    ready, downs, last = 4, 0, Hold("")
    for k in range(80):
        last = scaler.decide(
            15.0 * k,
            AutoscalerSignals(
                ready_replicas=ready,
                queue_delay_s=0.01,
                admitted_tokens_per_s=400.0,
                kv_occupancy=0.05,
                deadline_miss_ratio=0.0,
                offered_tokens_per_s=400.0,
            ),
        )
        if isinstance(last, ScaleDown):
            ready -= last.count
            downs += 1
    assert (downs > 0) == shrinks
    if not shrinks:
        assert isinstance(last, Hold) and "kept warm" in last.reason


def test_predictive_settings_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"autoscaler\.predictive\.warm_surge.*got 0"):
        PredictiveConfig(warm_surge=0)
    with pytest.raises(ConfigError, match=r"kv_occupancy_target.*got 1\.5"):
        PredictiveConfig(kv_occupancy_target=1.5)
    with pytest.raises(msgspec.ValidationError, match="kind"):
        msgspec.convert({"kind": "oracle"}, AutoscalerConfig)


def test_a_burst_that_has_passed_starts_no_replica() -> None:
    """Capacity known (1,000 tokens/s a replica), start-up past the recovery objective:
    after a burst of 5,000 tokens/s on 3 replicas the load is back to 1,500 while the
    drained backlog still ends late (misses at 6× their target). The pool keeps what it
    has (the warm floor, 1.5× the peak, only keeps replicas) and starts none: one would be
    ready to serve a load the pool already carries."""
    config = AutoscalerConfig(
        **_timings(min_replicas=3, detection_delay_s=0.0),  # type: ignore[arg-type]
        kind="predictive",
        predictive=PredictiveConfig(replica_tokens_per_s=1000.0),
    )
    scaler = Autoscaler(config)
    for k, (offered, misses) in enumerate([(5000.0, 0.3)] + [(1500.0, 0.3)] * 12):
        decision = scaler.decide(
            15.0 * k,
            AutoscalerSignals(
                ready_replicas=3,
                starting_replicas=0 if k == 0 else 3,
                queue_delay_s=0.0 if k else 5.0,
                admitted_tokens_per_s=min(offered, 3000.0),
                kv_occupancy=0.3,
                deadline_miss_ratio=misses,
                offered_tokens_per_s=offered,
            ),
        )
        if k == 0:  # the burst itself: the forecast asks for more
            assert isinstance(decision, ScaleUp)
        else:
            assert isinstance(decision, Hold), (k, decision)


def test_a_full_window_that_admitted_nothing_teaches_no_capacity_of_zero() -> None:
    """Replicas full (queue delay past target) and nothing admitted in the window: the
    predictive rule must not learn a capacity of 0 tokens/s and divide by it."""
    scaler = Autoscaler(_config(kind="predictive", detection_delay_s=0.0))
    full = AutoscalerSignals(
        ready_replicas=1, queue_delay_s=5.0, admitted_tokens_per_s=0.0, offered_tokens_per_s=900.0
    )
    decision = scaler.decide(0.0, full)
    assert isinstance(decision, ScaleUp), decision
    assert scaler.capacity_tokens_per_s is None
    # A later full window that admitted work starts the estimate.
    busy = AutoscalerSignals(
        ready_replicas=1,
        starting_replicas=decision.count,
        queue_delay_s=5.0,
        admitted_tokens_per_s=400.0,
        offered_tokens_per_s=900.0,
    )
    scaler.decide(10.0, busy)
    assert scaler.capacity_tokens_per_s == 400.0


def test_window_queue_delay_is_at_least_the_oldest_wait() -> None:
    assert window_queue_delay_s(3.0, 2, 0.5) == 1.5
    assert window_queue_delay_s(0.0, 0, 2.0) == 2.0
    assert window_queue_delay_s(0.0, 0, 0.0) == 0.0
