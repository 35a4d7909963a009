"""Parity: one workload through `headway simulate` and through `headway emulate` +
`headway bench` gives the same latencies and throughput (the same engine model)."""

from __future__ import annotations

import pytest

from headway.core.engine.steptime import AffineStepTime
from headway.emulate.parity import compare_simulate_emulate
from headway.files.workload import parse_workload

PROFILE = AffineStepTime(
    overhead_s=0.005, per_prefill_token_s=6e-05, per_prefill_pair_s=2e-09,
    per_decode_seq_s=0.00025, per_decode_kv_token_s=3e-07,
)  # fmt: skip
WORKLOAD = {
    "name": "parity",
    "duration_s": 20,
    "seed": 3,
    "classes": {
        "chat": {
            "input_tokens": {"dist": "lognormal", "mean": 2000, "cv": 0.5, "max": 8000},
            "output_tokens": {"dist": "lognormal", "mean": 100, "cv": 0.5, "max": 300},
        }
    },
    "sources": [{"name": "users", "arrivals": {"process": "poisson", "rate_per_s": 3}}],
}


MAX_LAG_S = 0.03
"""Wall seconds the emulator may fall behind real time for the comparison to hold."""


@pytest.mark.slow
def test_simulate_and_emulate_plus_bench_agree() -> None:
    spec = parse_workload(WORKLOAD, "<parity>")
    # In real time: the wall clock's jitter (the bench's send lateness, about 1 ms; the
    # emulator's delivery lag) counts × the speed-up in engine time, and at a speed-up
    # of 2 it alone moved the TTFT median by 1.8-10.4% over six runs on the idle 2-core
    # host (the bound below is 10%); at 1, by 0.4-3.5% over five.
    result = compare_simulate_emulate(spec, PROFILE, speedup=1)
    if result.emulator_lag_max_s > MAX_LAG_S:  # the machine was busy: once more
        result = compare_simulate_emulate(spec, PROFILE, speedup=1)
    if result.emulator_lag_max_s > MAX_LAG_S:
        pytest.skip(
            f"the emulator fell {result.emulator_lag_max_s * 1000:.0f} ms behind real time "
            "twice (a busy machine): its latencies are not the model's"
        )
    errors = result.relative_error
    assert result.calls > 40
    # TTFT over HTTP also holds about a millisecond of client and server time (× the
    # speed-up), which the simulator does not model: a looser bound on its median.
    assert errors["ttft_p50_s"] <= 0.10, result
    for name in ("ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "throughput_requests_per_s"):
        assert errors[name] <= 0.05, (name, result)
