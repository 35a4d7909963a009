"""Property tests of the autoscaler: driven by random signal sequences and a driver that
applies its decisions, the replica count stays within [min, max] and every decision is
well formed."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from headway.core.policy.autoscaler import (
    SIGNALS,
    Autoscaler,
    AutoscalerConfig,
    AutoscalerSignals,
    ScaleDown,
    ScaleUp,
)

FAST = settings(max_examples=150, deadline=None)

configs = st.builds(
    lambda signal, lo, span, step, step_down, detect, startup, up_cd, down_cd, interval, tol: (
        AutoscalerConfig(
            signal=signal,
            target=0.5,
            tolerance=tol,
            min_replicas=lo,
            max_replicas=lo + span,
            max_step=step,
            max_step_down=step_down,
            detection_delay_s=detect,
            startup_delay_s=startup,
            scale_up_cooldown_s=up_cd,
            scale_down_cooldown_s=down_cd,
            evaluation_interval_s=interval,
        )
    ),
    st.sampled_from(SIGNALS),
    st.integers(1, 5),
    st.integers(0, 8),
    st.integers(1, 5),
    st.integers(1, 3),
    st.sampled_from([0.0, 5.0, 30.0]),
    st.sampled_from([0.0, 7.0, 60.0]),
    st.sampled_from([0.0, 20.0]),
    st.sampled_from([0.0, 50.0]),
    st.sampled_from([1.0, 5.0, 15.0]),
    st.sampled_from([0.0, 0.1]),
)
values = st.one_of(st.none(), st.floats(0.0, 1.0), st.floats(0.0, 50.0))


def _signals(
    cfg: AutoscalerConfig, ready: int, starting: int, value: float | None
) -> AutoscalerSignals:
    kwargs: dict[str, object] = {"ready_replicas": ready, "starting_replicas": starting}
    if value is not None:
        if cfg.signal == "admitted_tokens_per_replica":
            kwargs["admitted_tokens_per_s"] = value * max(ready, 1)
        else:
            kwargs[cfg.signal] = min(value, 1.0) if "ratio" in cfg.signal else value
    return AutoscalerSignals(**kwargs)  # type: ignore[arg-type]


@FAST
@given(
    cfg=configs,
    start=st.integers(1, 14),
    steps=st.lists(st.tuples(st.floats(0.1, 30.0), values), min_size=1, max_size=80),
)
def test_replicas_stay_within_bounds_under_random_signals(
    cfg: AutoscalerConfig, start: int, steps: list[tuple[float, float | None]]
) -> None:
    scaler = Autoscaler(cfg)
    ready = start
    booting: list[float] = []  # ready_at_s of starting replicas
    now = 0.0
    for gap_s, value in steps:
        now += gap_s
        ready += sum(1 for t in booting if t <= now)
        booting = [t for t in booting if t > now]
        decision = scaler.decide(now, _signals(cfg, ready, len(booting), value))
        if isinstance(decision, ScaleUp):
            assert decision.count >= 1
            assert decision.ready_at_s == now + cfg.startup_delay_s
            booting += [decision.ready_at_s] * decision.count
        elif isinstance(decision, ScaleDown):
            assert 1 <= decision.count <= ready
            ready -= decision.count
        else:
            assert decision.reason
        # The first decision brings an out-of-bounds start back; after that, never out.
        total = ready + len(booting)
        assert cfg.min_replicas <= total <= cfg.max_replicas, (decision, total)


@FAST
@given(cfg=configs, steps=st.lists(values, min_size=1, max_size=40))
def test_same_inputs_same_decisions(cfg: AutoscalerConfig, steps: list[float | None]) -> None:
    def run() -> list[object]:
        scaler = Autoscaler(cfg)
        return [scaler.decide(10.0 * i, _signals(cfg, 3, 0, v)) for i, v in enumerate(steps)]

    assert run() == run()
