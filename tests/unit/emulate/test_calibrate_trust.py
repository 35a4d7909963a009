"""A calibration judges itself: probes interleaved in rounds, a confidence interval for
every coefficient, a drift check, and a failure naming what cannot be trusted."""

from __future__ import annotations

from pathlib import Path

import pytest

from headway.calibrate.fit import (
    ProbeSamples,
    bootstrap_intervals,
    fit_step_time,
    pool,
    probe_samples,
)
from headway.calibrate.plan import DEFAULT_PLAN, ProbeShape
from headway.calibrate.probe import ProbeResult, StreamTiming
from headway.calibrate.trust import TrustLimits, ci_impacts, problems, reference_drift
from headway.cli import main
from headway.core.engine.steptime import AffineStepTime

TRUTH = AffineStepTime(
    overhead_s=0.005, per_prefill_token_s=6e-5, per_prefill_pair_s=2e-9,
    per_decode_seq_s=2.5e-4, per_decode_kv_token_s=3e-7, per_prefill_seq_s=0.003,
)  # fmt: skip


def _probes(rounds: int = 3, slower: dict[int, float] | None = None) -> list[ProbeSamples]:
    """Clean probes of TRUTH; ``slower[r]`` multiplies every time measured in round r."""
    t = TRUTH
    out: list[ProbeSamples] = []
    for r in range(rounds):
        f = (slower or {}).get(r, 1.0)
        # a little deterministic jitter, so that resamples differ
        jitter = 1.0 + 0.002 * ((r * 7) % 3 - 1)
        for p in (256, 1024, 4096, 8192):
            prefill = p * t.per_prefill_token_s + p * (p + 1) / 2 * t.per_prefill_pair_s
            ttft = (t.overhead_s + t.per_prefill_seq_s + prefill) * f * jitter
            out.append(ProbeSamples(
                shape=ProbeShape(kind="prefill", prompt_tokens=p, concurrency=1,
                                 output_tokens=25, round=r),
                ttft=(p, 1, ttft),
            ))  # fmt: skip
        for b in (1, 2, 8, 32):
            for ctx in (128, 2048):
                gaps = []
                for i in range(0, 32, 8):
                    kv = b * (ctx + i + 3.5)
                    step = t.overhead_s + b * t.per_decode_seq_s + kv * t.per_decode_kv_token_s
                    step *= f * jitter
                    gaps.append((b, kv, step, 1.0 / b, step, 0))
                out.append(ProbeSamples(
                    shape=ProbeShape(kind="decode", prompt_tokens=ctx, concurrency=b,
                                     output_tokens=33, round=r),
                    gaps=gaps, typical_gap_s=gaps[0][2],
                ))  # fmt: skip
    return out


def _judge(probes: list[ProbeSamples], limits: TrustLimits) -> list[str]:
    fit = fit_step_time(pool(probes))
    intervals = bootstrap_intervals(probes, resamples=100)
    values = fit.coefficients
    steps, drift = reference_drift(probes)
    return problems(
        steps_s=steps, drift=drift, intervals=intervals,
        impacts=ci_impacts(intervals, fit.leverage), values=values, limits=limits,
    )  # fmt: skip


def test_the_plan_interleaves_rounds_between_reference_probes() -> None:
    shapes = DEFAULT_PLAN.shapes(max_model_len=2048)
    kinds = [s.kind for s in shapes]
    assert kinds.count("reference") == DEFAULT_PLAN.rounds + 1
    assert kinds[0] == kinds[-1] == "reference"
    first_round = [s for s in shapes if s.round == 0 and s.kind != "reference"]
    # prefill and decode alternate within a round, not one block after the other
    assert [s.kind for s in first_round[:4]] == ["prefill", "decode", "prefill", "decode"]
    second_round = [s.key for s in shapes if s.round == 1 and s.kind != "reference"]
    assert second_round == [s.key for s in first_round][::-1]
    assert {s.key for s in shapes if s.kind == "reference"} == {DEFAULT_PLAN.reference(2048).key}


def test_consistent_rounds_give_narrow_intervals_and_no_problem() -> None:
    probes = _probes()
    intervals = bootstrap_intervals(probes, resamples=100)
    for name in ("overhead_s", "per_prefill_token_s", "per_decode_seq_s"):
        lo, hi = intervals[name]
        assert lo <= getattr(TRUTH, name) * 1.02 and hi >= getattr(TRUTH, name) * 0.98
        assert (hi - lo) / getattr(TRUTH, name) < 0.05, (name, lo, hi)
    assert _judge(probes, TrustLimits()) == []


def test_rounds_that_disagree_fail_naming_the_parameter() -> None:
    # one round ran on a host twice as slow: the coefficients have no single value
    probes = _probes(slower={1: 2.0})
    found = _judge(probes, TrustLimits(max_ci_impact=0.10))
    assert found and all("--max-ci-impact 10%" in line for line in found)
    assert any(line.startswith("overhead_s: ") for line in found)
    # a looser limit accepts the same probes
    assert _judge(probes, TrustLimits(max_ci_impact=10.0)) == []


def _reference(step_s: float, r: int) -> ProbeSamples:
    shape = ProbeShape(kind="reference", prompt_tokens=128, concurrency=8, output_tokens=33,
                       round=r)  # fmt: skip
    return ProbeSamples(shape=shape, gaps=[(8, 1100.0, step_s, 0.125, step_s, 0)],
                        typical_gap_s=step_s)  # fmt: skip


def test_drift_of_the_reference_probe_fails_naming_the_drift() -> None:
    steps = [0.34, 0.45, 0.56]  # the host: 340 ms, then 560 ms minutes later
    probes = _probes() + [_reference(s, r) for r, s in enumerate(steps)]
    measured, drift = reference_drift(probes)
    assert measured == steps and drift == pytest.approx(0.56 / 0.34 - 1)
    found = _judge(probes, TrustLimits(max_drift=0.15, max_ci_impact=1e9))
    assert len(found) == 1 and found[0].startswith("drift: ")
    assert "340 ms to 560 ms (+65%)" in found[0] and "--max-drift 15%" in found[0]
    assert "the line through 340, 450, 560 ms" in found[0]
    assert _judge(probes, TrustLimits(max_drift=0.7, max_ci_impact=1e9)) == []


def test_one_slow_reference_is_noise_not_drift() -> None:
    """Four references of a real calibration of vLLM's CPU build on an idle host: one
    slow one (+25% against the first) and the last within 7% of the first. The host did
    not change speed; the line through them moves 1%. A host that slows step by step
    moves the line as much as its last reference."""
    steps = [0.0196, 0.0244, 0.0193, 0.0210]
    _, drift = reference_drift([_reference(s, r) for r, s in enumerate(steps)])
    assert drift == pytest.approx(0.013, abs=0.002)
    assert _judge(_probes() + [_reference(s, r) for r, s in enumerate(steps)],
                  TrustLimits(max_drift=0.15, max_ci_impact=1e9)) == []  # fmt: skip
    slowing = [0.020, 0.022, 0.024, 0.026]
    _, drift = reference_drift([_reference(s, r) for r, s in enumerate(slowing)])
    assert drift == pytest.approx(0.30)


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match=r"--max-drift must be a fraction > 0 \(got -1"):
        TrustLimits(max_drift=-1)


def test_bad_thresholds_are_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "p.json")
    for flag, value in (("--max-drift", "0"), ("--max-ci-impact", "nan"), ("--rounds", "0"),
                        ("--shared-prefix-tokens", "1000")):  # fmt: skip
        code = main(["calibrate", "--target", "http://127.0.0.1:9", "--out", out, flag, value])
        err = capsys.readouterr().err
        assert code == 2, (flag, err)
        assert flag.lstrip("-").replace("-", "_") in err or flag in err, err


def test_streams_that_never_decode_together_give_no_segment() -> None:
    # the second stream's first token came after the first stream ended (a busy host)
    shape = ProbeShape(kind="decode", prompt_tokens=128, concurrency=2, output_tokens=4)
    early = StreamTiming(prompt_tokens=128, sent_s=0.0, token_times_s=[1.0, 1.1, 1.2, 1.3])
    late = StreamTiming(prompt_tokens=128, sent_s=0.0, token_times_s=[2.0, 2.1, 2.2, 2.3])
    (probe,) = probe_samples([ProbeResult(shape=shape, streams=[early, late])], DEFAULT_PLAN, 1.0)
    assert probe.gaps == [] and probe.typical_gap_s is None


def test_tokens_read_in_one_burst_are_not_a_step_and_not_a_reference() -> None:
    """A client that could not read for a while (a loaded host) gets a run of tokens in
    one read, microseconds apart: that probe timed the client, not the engine. The fit
    leaves it out, and so does the drift check (a loaded CI host once measured a 6.7 µs
    reference step, a drift of -100%)."""
    shape = ProbeShape(kind="reference", prompt_tokens=128, concurrency=1, output_tokens=40)

    def stream(gap_s: float) -> StreamTiming:
        times = [1.0 + i * gap_s for i in range(40)]
        return StreamTiming(prompt_tokens=128, sent_s=0.9, token_times_s=times)

    results = [ProbeResult(shape=shape, streams=[stream(g)]) for g in (0.02, 7e-6, 0.021)]
    probes = probe_samples(results, DEFAULT_PLAN, 1.0)
    assert [p.discarded for p in probes] == [False, True, False]
    assert probes[1].gaps == []
    steps, drift = reference_drift(probes)
    assert steps == pytest.approx([0.02, 0.021]) and drift == pytest.approx(0.05)
