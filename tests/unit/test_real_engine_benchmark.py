"""The pure parts of ``benchmarks/real_engine.py``: errors, the knee by interpolation, the
summary's shape, and workloads that headway accepts."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from headway.calibrate.ttft_split import SERIES, TTFT_HISTOGRAMS, histogram_totals
from headway.core.workload.compile import compile_workload
from headway.files.workload import parse_workload
from headway.trace.readers import read_trace

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "real_engine.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("real_engine_benchmark", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_relative_errors_and_medians(bench: ModuleType) -> None:
    assert bench.relative_error(1.5, 1.0) == pytest.approx(0.5)
    assert bench.relative_error(0.5, 2.0) == pytest.approx(-0.75)
    assert bench.relative_error(1.0, 0.0) is None
    assert bench.relative_error(None, 1.0) is None
    assert bench.relative_error(float("nan"), 1.0) is None
    assert bench.median_abs([-0.4, 0.1, None, 0.2]) == pytest.approx(0.2)
    assert bench.median_abs([None]) is None


def test_the_step_scale_that_explains_a_tail_is_found_by_bisection(bench: ModuleType) -> None:
    """A tail as steep as near the knee (here p99 ∝ scale⁸): the scale at which the
    simulated p99 meets the real one, within the tolerance; None outside the bracket or
    when a simulation gives no p99."""
    calls: list[float] = []

    def p99_at(scale: float) -> float:
        calls.append(scale)
        return 2.0 * scale**8

    found = bench.matching_scale(p99_at, 2.0 * 1.05**8)
    assert found == pytest.approx(1.05, abs=0.002)
    assert len(calls) <= 2 + 10  # the bracket, then halvings down to the tolerance
    assert bench.matching_scale(p99_at, 2.0 * 0.9**8, lo=0.92) is None  # below the bracket
    assert bench.matching_scale(p99_at, 2.0 * 1.3**8) is None  # above it
    assert bench.matching_scale(lambda scale: None, 1.0) is None


def test_the_knee_is_where_attainment_crosses_the_target(bench: ModuleType) -> None:
    points = [(3.0, 0.5), (0.3, 1.0), (0.7, 0.98)]  # any order
    assert bench.crossing_load(points, 0.9) == pytest.approx(0.7 + (0.08 / 0.48) * 2.3)
    assert bench.crossing_load([(1.0, 1.0), (2.0, 0.95)], 0.9) is None  # never below
    assert bench.crossing_load([(1.0, 0.5), (2.0, 0.4)], 0.9) is None  # below from the start


def test_the_summary_has_every_headline_field(bench: ModuleType) -> None:
    lat = {"ttft": {"p50_s": 1.0, "p99_s": 2.0}, "tpot": {"p50_s": 0.5, "p99_s": 0.6},
           "e2e": {"p50_s": 10.0, "p99_s": 20.0}}  # fmt: skip
    real = {**bench.latency_figures(lat), "throughput": 100.0, "preemptions": 4,
            "prefix_hit_rate": 0.5}  # fmt: skip
    sim_lat = {k: {p: v * 1.1 for p, v in d.items()} for k, d in lat.items()}
    sim = {**bench.latency_figures(sim_lat), "throughput": 90.0, "preemptions": 1,
           "prefix_hit_rate": 0.6}  # fmt: skip
    one = bench.compare(real, sim)
    assert one["ttft_p50_error"] == pytest.approx(0.1)
    assert one["throughput_error"] == pytest.approx(-0.1)
    other = bench.compare(real, {**sim, "ttft_p50": 0.5})
    out = bench.summarize({"a": one, "b": other, "c": one}, knee_real=2.0, knee_sim=1.8,
                          step_drift=0.05)  # fmt: skip
    for key in ("ttft_p50_error", "ttft_p99_error", "tpot_p50_error", "tpot_p99_error",
                "e2e_p50_error", "e2e_p99_error", "throughput_error", "knee_error",
                "preemptions_real", "preemptions_sim", "step_drift", "per_workload"):  # fmt: skip
        assert key in out, key
    assert out["ttft_p50_error"] == pytest.approx(0.1)  # median of |0.1|, |-0.5|, |0.1|
    assert out["knee_error"] == pytest.approx(-0.1)
    assert (out["preemptions_real"], out["preemptions_sim"]) == (12, 3)
    assert set(out["per_workload"]) == {"a", "b", "c"}
    json.dumps(out)  # one JSON line


def test_the_host_speed_scales_every_step_time_coefficient(bench: ModuleType) -> None:
    # The reference steps beside a run against the mean of calibrate's references.
    assert bench.host_speed([0.022, 0.030, 0.024], [0.020, 0.020]) == pytest.approx(1.2)
    cluster = {"profile": "profile.json", "num_kv_blocks": 100}
    step_time = {"overhead_s": 0.01, "per_prefill_token_s": 2e-4}
    scaled = bench.scaled_cluster(cluster, step_time, 1.5)
    assert scaled["profile"] == {"overhead_s": pytest.approx(0.015),
                                 "per_prefill_token_s": pytest.approx(3e-4)}  # fmt: skip
    assert scaled["step_time"] == "profile" and scaled["num_kv_blocks"] == 100
    assert cluster["profile"] == "profile.json"  # not changed in place


def test_the_summary_gives_host_normalised_medians_beside_the_raw_ones(
    bench: ModuleType,
) -> None:
    def workload(raw: float, normalised: float | None) -> dict[str, object]:
        w: dict[str, object] = {"ttft_p50_error": raw}
        if normalised is not None:
            w["host_normalised"] = {"ttft_p50_error": normalised}
        return w

    out = bench.summarize({"a": workload(0.3, -0.05), "b": workload(-0.2, 0.01),
                           "c": workload(0.1, None)},
                          knee_real=1.0, knee_sim=1.0, step_drift=0.0)  # fmt: skip
    assert out["ttft_p50_error"] == pytest.approx(0.2)  # the raw headline, all three
    assert out["host_normalised"]["ttft_p50_error"] == pytest.approx(0.03)  # a and b
    assert out["host_normalised"]["tpot_p50_error"] is None
    bare = bench.summarize({"c": workload(0.1, None)}, knee_real=1.0, knee_sim=1.0,
                           step_drift=0.0)  # fmt: skip
    assert "host_normalised" not in bare


def test_the_workloads_compile(bench: ModuleType, tmp_path: Path) -> None:
    for spec in (bench.poisson_workload(1.0, 30, 1), bench.long_prompt_workload(0.2, 30, 1),
                 bench.preempt_workload(30, 1)):  # fmt: skip
        w = compile_workload(parse_workload(spec))
        assert w.num_calls > 0
    long = compile_workload(parse_workload(bench.long_prompt_workload(0.5, 60, 1)))
    assert long.call_input_tokens.max() > bench.STEP_BUDGET_TOKENS  # chunked prefill
    assert long.call_input_tokens.max() + 24 <= bench.CONTEXT_TOKENS
    (tmp_path / "b.csv").write_text(bench.bursty_trace(30, 1))
    assert read_trace(tmp_path / "b.csv").arrival_s.size > 20
    (tmp_path / "p.jsonl").write_text(bench.shared_prefix_trace(30, 1.0, 1))
    shared = read_trace(tmp_path / "p.jsonl")
    assert shared.hash_ids is not None
    firsts = {int(ids[0]) for ids in shared.hash_ids}
    assert firsts <= {0, 2, 4, 6}  # four shared system prompts


def test_vllms_ttft_is_split_into_the_engine_cores_part_and_the_frontends(
    bench: ModuleType,
) -> None:
    """Means per request from the histograms' sums and counts over a run; the simulated
    mean TTFT is held to the engine core's part, and the frontend's share is reported."""
    names = TTFT_HISTOGRAMS
    before = dict.fromkeys(SERIES, 1.0)
    after = {
        f"{names['ttft']}_sum": 11.0, f"{names['ttft']}_count": 21.0,
        f"{names['queue']}_sum": 3.0, f"{names['queue']}_count": 21.0,
        f"{names['prefill']}_sum": 7.0, f"{names['prefill']}_count": 21.0,
    }  # fmt: skip
    split = bench.ttft_figures(before, after)
    assert split["vllm_ttft_mean_s"] == pytest.approx(0.5)
    assert split["engine_ttft_mean_s"] == pytest.approx(0.4)
    assert split["frontend_s"] == pytest.approx(0.1)
    assert split["prefill_mean_s"] == pytest.approx(0.3)  # scheduled to first token
    assert bench.ttft_figures(before, before)["frontend_s"] is None  # nothing counted
    real = {"ttft_mean": 0.52, **split}
    errors = bench.engine_part_errors(real, {"ttft_mean": 0.42, "prefill_mean": 0.27})
    assert errors["engine_ttft_error"] == pytest.approx(0.05)
    # Like for like: the simulated first token less the admission, against vLLM's prefill.
    assert errors["engine_prefill_error"] == pytest.approx(-0.1)
    assert errors["ttft_mean_error"] == pytest.approx(-0.1 / 0.52)
    assert errors["frontend_share"] == pytest.approx(0.1 / 0.52)
    summary = bench.summarize(
        {"a": errors, "b": {**errors, "engine_ttft_error": -0.15, "frontend_share": 0.3}},
        knee_real=None, knee_sim=None, step_drift=None,
    )  # fmt: skip
    assert summary["engine_ttft_error"] == pytest.approx(0.1)
    assert summary["engine_prefill_error"] == pytest.approx(0.1)
    assert summary["frontend_share"] == pytest.approx((0.1 / 0.52 + 0.3) / 2)


def test_the_split_reads_vllms_exposition_and_needs_all_three_histograms() -> None:
    """Summed over label sets; an engine without one of them (the emulator has no prefill
    histogram) gives no split rather than a wrong one."""
    lines = [f'{name}{{engine="{e}"}} {v}' for name in SERIES for e, v in (("0", 1.5), ("1", 2))]
    text = "\n".join(["# HELP x", *lines, "vllm:num_requests_running 3"])
    totals = histogram_totals(text)
    assert totals == dict.fromkeys(SERIES, 3.5)
    partial = "\n".join(line for line in lines if "prefill" not in line)
    assert histogram_totals(partial) is None
