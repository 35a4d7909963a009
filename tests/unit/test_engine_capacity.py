"""KV-cache capacity and steady-state max throughput against published figures."""

from __future__ import annotations

import msgspec
import pytest

from headway.core.engine.capacity import kv_capacity_tokens, max_throughput
from headway.core.engine.catalog import get_gpu, get_model
from headway.core.engine.roofline import RooflineStepTime
from headway.core.errors import ConfigError
from headway.data import load_efficiency_table

# TensorRT-LLM perf overview, Llama-3.1-8B FP8 on 1×H100, total output tok/s
# (serving-numbers.md 5.3).
TRTLLM_FP8_H100 = {(128, 128): 28312.0, (1000, 1000): 15220.0, (2048, 128): 3450.0}


def _step(model: str, gpu: str, tp: int = 1) -> RooflineStepTime:
    g = get_gpu(gpu)
    return RooflineStepTime(
        model=get_model(model),
        gpu=g,
        efficiency=load_efficiency_table().profile_for(g),
        tensor_parallel=tp,
    )


@pytest.mark.parametrize(
    ("model", "gpu", "thousands"),
    [("llama-3-8b", "h100-sxm", 427), ("llama-3-8b", "h200", 846), ("qwen2.5-7b", "a100", 990)],
)
def test_kv_capacity_matches_the_reference_arithmetic(model: str, gpu: str, thousands: int) -> None:
    # serving-numbers.md 5.2: 90 % of memory minus the weights, no activation reserve.
    tokens = kv_capacity_tokens(get_model(model), get_gpu(gpu), activation_reserve_bytes=0)
    assert tokens / 1000 == pytest.approx(thousands, rel=0.01)
    assert tokens % 16 == 0


def test_kv_capacity_shrinks_with_the_reserve_and_grows_with_tp() -> None:
    llama70 = get_model("llama-3-70b")
    h100 = get_gpu("h100")
    assert kv_capacity_tokens(llama70, h100, 1) == 0  # 141 GB of weights do not fit
    # TP2 leaves 72 - 70.6 GB per GPU, less than the 2 GiB reserve.
    assert kv_capacity_tokens(llama70, h100, 2) == 0
    assert kv_capacity_tokens(llama70, h100, 2, gpu_memory_utilization=0.95) > 0
    tp4 = kv_capacity_tokens(llama70, h100, 4)
    tp8 = kv_capacity_tokens(llama70, h100, 8)
    assert 0 < tp4 < tp8
    llama8 = get_model("llama-3-8b")
    assert kv_capacity_tokens(llama8, h100) < kv_capacity_tokens(
        llama8, h100, activation_reserve_bytes=0
    )


@pytest.mark.parametrize(("isl", "osl"), sorted(TRTLLM_FP8_H100))
def test_max_throughput_is_within_the_published_band(isl: int, osl: int) -> None:
    """BF16 prediction / TensorRT-LLM FP8 result lies in [0.4, 1.0].

    Our model is BF16 (BF16 peak, 2-byte weights and KV); the published figure is FP8,
    which an FP8 engine should beat, so the ratio must not exceed 1.
    """
    model, gpu = get_model("llama-3-8b"), get_gpu("h100-sxm")
    estimate = max_throughput(
        _step("llama-3-8b", "h100-sxm"), model=model, gpu=gpu, isl=isl, osl=osl
    )
    ratio = estimate.output_tokens_per_s / TRTLLM_FP8_H100[(isl, osl)]
    assert 0.4 <= ratio <= 1.0
    assert estimate.requests_per_s == pytest.approx(estimate.output_tokens_per_s / osl)


def test_fp8_prediction_stays_at_or_below_the_published_fp8_figure() -> None:
    gpu = get_gpu("h100-sxm")
    fp8 = msgspec.structs.replace(get_model("llama-3-8b"), dtype_bytes=1)
    step = RooflineStepTime(model=fp8, gpu=gpu, efficiency=load_efficiency_table().profile_for(gpu))
    for (isl, osl), published in TRTLLM_FP8_H100.items():
        estimate = max_throughput(step, model=fp8, gpu=gpu, isl=isl, osl=osl)
        assert 0.4 <= estimate.output_tokens_per_s / published <= 1.05


def test_limits_are_reported() -> None:
    model, gpu = get_model("llama-3-8b"), get_gpu("h100-sxm")
    step = _step("llama-3-8b", "h100-sxm")
    seqs = max_throughput(step, model=model, gpu=gpu, isl=128, osl=128, max_num_seqs=64)
    assert (seqs.limited_by, seqs.running_seqs) == ("max_num_seqs", 64)
    kv = max_throughput(step, model=model, gpu=gpu, isl=4000, osl=1000)
    assert kv.limited_by == "kv_cache"
    budget = max_throughput(step, model=model, gpu=gpu, isl=2048, osl=16, max_num_seqs=1024)
    assert budget.limited_by == "token_budget"
    assert budget.running_seqs * (1 + 2048 / 16) <= 8192
    # More sequences allowed never lowers the throughput estimate here.
    more = max_throughput(step, model=model, gpu=gpu, isl=128, osl=128, max_num_seqs=256)
    assert more.output_tokens_per_s > seqs.output_tokens_per_s


def test_a_model_that_does_not_fit_is_a_config_error() -> None:
    model, gpu = get_model("llama-3-70b"), get_gpu("h100-sxm")
    step = _step("llama-3-70b", "h100-sxm")
    with pytest.raises(ConfigError, match="no 128/128-token request fits Llama-3-70B"):
        max_throughput(step, model=model, gpu=gpu, isl=128, osl=128)


def test_argument_validation() -> None:
    model, gpu = get_model("llama-3-8b"), get_gpu("h100-sxm")
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        kv_capacity_tokens(model, gpu, gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="isl and osl must be >= 1"):
        max_throughput(_step("llama-3-8b", "h100-sxm"), model=model, gpu=gpu, isl=0, osl=1)
