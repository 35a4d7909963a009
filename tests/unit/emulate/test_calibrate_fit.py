"""The calibration fit recovers a known step-time model from clean samples and ignores
stalls."""

from __future__ import annotations

import math

import pytest

from headway.calibrate.fit import Samples, fit_step_time
from headway.calibrate.plan import DEFAULT_PLAN, ProbePlan
from headway.core.engine.steptime import AffineStepTime

TRUTH = AffineStepTime(
    overhead_s=0.005, per_prefill_token_s=6e-5, per_prefill_pair_s=2e-9,
    per_decode_seq_s=2.5e-4, per_decode_kv_token_s=3e-7, per_prefill_seq_s=0.003,
)  # fmt: skip


def _samples(stall_every: int = 0) -> Samples:
    t = TRUTH
    ttft = []
    for p in (256, 1024, 4096, 8192, 16384):
        chunks = math.ceil(p / 8192)
        prefill = p * t.per_prefill_token_s + p * (p + 1) / 2 * t.per_prefill_pair_s
        ttft.append((p, chunks, chunks * (t.overhead_s + t.per_prefill_seq_s) + prefill))
    gaps = []
    n = 0
    for b in (1, 2, 4, 8, 16):
        for ctx in (128, 2048):
            for i in range(0, 64, 8):
                kv = b * (ctx + i + 3.5)
                step = t.overhead_s + b * t.per_decode_seq_s + kv * t.per_decode_kv_token_s
                n += 1
                if stall_every and n % stall_every == 0:
                    step *= 1.5  # a stalled segment, still inside its probe's band
                gaps.append((b, kv, step, 1.0 / b, step))
    return Samples(ttft=ttft, gaps=gaps)


@pytest.mark.parametrize("stall_every", [0, 9])
def test_fit_recovers_the_truth(stall_every: int) -> None:
    fit = fit_step_time(_samples(stall_every))
    for name in TRUTH.__dataclass_fields__:
        assert getattr(fit.step_time, name) == pytest.approx(getattr(TRUTH, name), rel=1e-3)


def test_too_few_samples_is_an_error() -> None:
    with pytest.raises(ValueError, match="too few samples"):
        fit_step_time(Samples(ttft=[(10, 1, 0.01)], gaps=[]))


def test_plan_drops_probes_longer_than_the_model() -> None:
    shapes = DEFAULT_PLAN.shapes(max_model_len=8192)
    assert shapes and all(s.prompt_tokens + s.output_tokens <= 8192 for s in shapes)
    with pytest.raises(ValueError, match="3 distinct lengths"):
        ProbePlan(prefill_prompt_tokens=(128, 256))
    with pytest.raises(ValueError, match="only 2 of the prefill prompt lengths"):
        ProbePlan(prefill_prompt_tokens=(128, 256, 4096)).shapes(max_model_len=2048)
