"""The roofline step-time model: roofline bound, decode affinity, monotonicity, fit quality."""

from __future__ import annotations

import csv
import gzip
import itertools
import time
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from headway.core.engine.catalog import GPUS, MODELS, GpuSpec, ModelSpec, get_gpu, get_model
from headway.core.engine.efficiency import EfficiencyTable, GemmEfficiency, parse_efficiency_table
from headway.core.engine.roofline import (
    EAGER_LAUNCH_PER_LAYER_S,
    PIECEWISE_LAUNCH_PER_LAYER_S,
    RooflineStepTime,
    blend,
    gemm_time_s,
)
from headway.core.engine.steptime import BatchShape, StepTimeModel, prefill_pairs
from headway.core.errors import ConfigError
from headway.data import load_efficiency_table
from shared_data import CALIBRATION, require_shared

TABLE = load_efficiency_table()


def _calibration_dir() -> Path:
    """The shared calibration data: FAIL under CI when missing, skip otherwise."""
    return require_shared(CALIBRATION)


def _step(model: str, gpu: str, tp: int = 1, **kwargs: float | str) -> RooflineStepTime:
    g = get_gpu(gpu)
    return RooflineStepTime(
        model=get_model(model),
        gpu=g,
        efficiency=TABLE.profile_for(g),
        tensor_parallel=tp,
        **kwargs,  # type: ignore[arg-type]
    )


CONFIGS = [
    ("llama-3-8b", "h100-sxm", 1),
    ("llama-3-8b", "l40s", 2),
    ("llama-3-70b", "h100-sxm", 4),
    ("llama-3-70b", "b200", 2),
    ("llama-2-7b", "a100-80gb", 1),
    ("llama-2-70b", "a100-80gb", 8),
    ("qwen2.5-7b", "h200", 1),
    ("qwen3-8b", "a100-80gb", 2),
    ("mixtral-8x7b", "h100-sxm", 2),
    ("bloom-176b", "h100-sxm", 8),
]
STEPS = {config: _step(*config) for config in CONFIGS}
# The same properties hold for every way an engine launches its kernels.
MODED = {
    f"{'-'.join(map(str, config))}-{mode}": _step(*config, cuda_graphs=mode)
    for config in (CONFIGS[0], CONFIGS[5], CONFIGS[8])
    for mode in ("eager", "piecewise")
}
ALL_STEPS = {"-".join(map(str, c)): s for c, s in STEPS.items()} | MODED


@st.composite
def batches(draw: st.DrawFn) -> BatchShape:
    """Random mixed batches: prefill chunks after some prior context, plus decodes."""
    chunks = draw(
        st.lists(st.tuples(st.integers(1, 4096), st.integers(0, 32768)), min_size=0, max_size=4)
    )
    decode_seqs = draw(st.integers(0, 1024))
    kv = draw(st.integers(0, 64 * 1024)) * decode_seqs if decode_seqs else 0
    if not chunks and not decode_seqs:
        decode_seqs, kv = 1, draw(st.integers(0, 100_000))
    return BatchShape(
        num_prefill_tokens=sum(c for c, _ in chunks),
        prefill_attention_pairs=sum(prefill_pairs(c, p) for c, p in chunks),
        num_prefill_seqs=len(chunks),
        num_decode_seqs=decode_seqs,
        decode_kv_tokens=kv,
    )


def _independent_roofline_s(step: RooflineStepTime, batch: BatchShape) -> float:
    """max(FLOPs / peak, bytes / bandwidth) computed from the model's published counts.

    GEMM FLOPs ``2 × tokens × active parameters``, attention ``4 × heads × head_dim`` per
    query-key pair and per decoded KV token, all split over TP; bytes: the weights each
    GPU holds that any token needs (at least the active experts) and the KV read.
    """
    m, tp = step.model, step.tensor_parallel
    layers = m.num_layers
    n = batch.num_tokens
    rows = batch.num_decode_seqs + batch.num_prefill_seqs
    attn = m.attention_params_per_layer
    active_mlp = m.num_active_experts * m.expert_params
    flops = 2.0 * n * layers * (attn + active_mlp) / tp
    flops += (
        4.0
        * m.num_attention_heads
        * m.head_dim
        * layers
        * (batch.prefill_attention_pairs + batch.decode_kv_tokens)
        / tp
    )
    flops += 2.0 * rows * m.hidden_size * m.vocab_size / tp
    nbytes = layers * (attn + active_mlp) * m.dtype_bytes / tp
    nbytes += batch.decode_kv_tokens * m.kv_bytes_per_token(tp)
    if rows:
        nbytes += m.vocab_size * m.hidden_size * m.dtype_bytes / tp
    peak = step.gpu.peak_flops_per_s(m.dtype_bytes)
    return max(flops / peak, nbytes / step.gpu.hbm_bandwidth_bytes_per_s)


@pytest.mark.parametrize("step_id", list(ALL_STEPS))
@given(batch=batches())
def test_no_prediction_beats_the_roofline(step_id: str, batch: BatchShape) -> None:
    step = ALL_STEPS[step_id]
    predicted = step.step_time_s(batch)
    assert predicted > 0
    assert predicted >= step.roofline_bound_s(batch)
    assert predicted >= _independent_roofline_s(step, batch) * (1 - 1e-12)
    assert step.roofline_bound_s(batch) >= _independent_roofline_s(step, batch) * (1 - 1e-12)


@pytest.mark.parametrize("step_id", list(ALL_STEPS))
@given(seqs=st.integers(1, 2048), kv_per_seq=st.integers(0, 128 * 1024))
def test_decode_steps_are_exactly_affine(step_id: str, seqs: int, kv_per_seq: int) -> None:
    step = ALL_STEPS[step_id]
    base, per_kv = step.decode_step_affine(seqs)
    kv = seqs * kv_per_seq
    predicted = step.step_time_s(BatchShape(num_decode_seqs=seqs, decode_kv_tokens=kv))
    assert predicted == pytest.approx(base + per_kv * kv, rel=1e-12, abs=0)
    assert base > 0
    assert per_kv > 0


@pytest.mark.parametrize("step_id", list(ALL_STEPS))
@given(
    batch=batches(),
    extra_prefill=st.integers(0, 4096),
    extra_decode=st.integers(0, 256),
    extra_kv=st.integers(0, 1_000_000),
)
def test_more_work_is_never_faster(
    step_id: str,
    batch: BatchShape,
    extra_prefill: int,
    extra_decode: int,
    extra_kv: int,
) -> None:
    step = ALL_STEPS[step_id]
    more = BatchShape(
        num_prefill_tokens=batch.num_prefill_tokens + extra_prefill,
        prefill_attention_pairs=batch.prefill_attention_pairs
        + prefill_pairs(extra_prefill, batch.num_prefill_tokens),
        num_prefill_seqs=batch.num_prefill_seqs + (1 if extra_prefill else 0),
        num_decode_seqs=batch.num_decode_seqs + extra_decode,
        decode_kv_tokens=batch.decode_kv_tokens + extra_kv,
    )
    assert step.step_time_s(more) >= step.step_time_s(batch)


@pytest.mark.parametrize("config", CONFIGS, ids=["-".join(map(str, c)) for c in CONFIGS])
def test_prefill_time_grows_with_every_token(config: tuple[str, str, int]) -> None:
    step = STEPS[config]
    times = [
        step.step_time_s(
            BatchShape(
                num_prefill_tokens=n,
                prefill_attention_pairs=prefill_pairs(n, 0),
                num_prefill_seqs=1,
            )
        )
        for n in range(1, 9000, 7)
    ]
    assert all(b >= a for a, b in itertools.pairwise(times))


def test_empty_batch_takes_no_time() -> None:
    step = STEPS[("llama-3-8b", "h100-sxm", 1)]
    assert step.step_time_s(BatchShape()) == 0.0
    assert step.decode_step_affine(0) == (0.0, 0.0)
    assert step.breakdown(BatchShape()).total_s == 0.0


def test_breakdown_sums_to_the_step_time() -> None:
    step = STEPS[("llama-3-70b", "h100-sxm", 4)]
    batch = BatchShape(
        num_prefill_tokens=2048,
        prefill_attention_pairs=prefill_pairs(2048, 1000),
        num_prefill_seqs=2,
        num_decode_seqs=64,
        decode_kv_tokens=64 * 3000,
    )
    parts = step.breakdown(batch)
    assert parts.total_s == pytest.approx(step.step_time_s(batch), rel=1e-12)
    assert parts.all_reduce_s > 0
    assert parts.prefill_attention_s > 0
    assert parts.decode_attention_s > 0
    assert STEPS[("llama-3-8b", "h100-sxm", 1)].breakdown(batch).all_reduce_s == 0.0
    eager = _step("llama-2-70b", "h100-sxm", 8, cuda_graphs="eager")
    one = BatchShape(num_decode_seqs=1, decode_kv_tokens=1000)
    assert eager.breakdown(one).total_s == pytest.approx(eager.step_time_s(one), rel=1e-12)


def test_an_eager_engines_decode_floor_does_not_fall_with_tensor_parallelism() -> None:
    """Launched layer by layer from Python, a small batch's step waits on the host: from
    TP4 to TP8 the GPU's share halves but the step does not (the shape of the 2023
    engine's timings in splitwise-sim); with CUDA graphs it falls."""
    one = BatchShape(num_decode_seqs=1, decode_kv_tokens=600)
    eager = [_step("llama-2-70b", "h100-sxm", tp, cuda_graphs="eager") for tp in (4, 8)]
    graphed = [_step("llama-2-70b", "h100-sxm", tp) for tp in (4, 8)]
    floor_s = get_model("llama-2-70b").num_layers * EAGER_LAUNCH_PER_LAYER_S
    assert all(s.step_time_s(one) >= floor_s for s in eager)
    assert eager[1].step_time_s(one) > 0.9 * eager[0].step_time_s(one)
    assert graphed[1].step_time_s(one) < 0.75 * graphed[0].step_time_s(one)
    assert eager[1].breakdown(one).launch_s > 0
    assert graphed[1].breakdown(one).launch_s == 0.0
    # A large batch hides the launches under its GPU time: every mode agrees.
    big = BatchShape(num_prefill_tokens=4000, prefill_attention_pairs=prefill_pairs(4000, 0),
                     num_prefill_seqs=1)  # fmt: skip
    assert eager[1].step_time_s(big) == graphed[1].step_time_s(big)


def test_batches_larger_than_the_captured_graphs_run_eager() -> None:
    """A batch of more tokens than ``cuda_graph_max_tokens`` has no graph; a mixed batch
    within it runs piecewise (attention launched between the pieces) in ``full`` mode."""
    batches = [
        BatchShape(num_decode_seqs=4, decode_kv_tokens=4000),
        BatchShape(num_prefill_tokens=100, prefill_attention_pairs=prefill_pairs(100, 0),
                   num_prefill_seqs=1, num_decode_seqs=4, decode_kv_tokens=4000),
    ]  # fmt: skip
    none_captured = _step("llama-2-70b", "h100-sxm", 8, cuda_graph_max_tokens=0)
    eager = _step("llama-2-70b", "h100-sxm", 8, cuda_graphs="eager")
    full = _step("llama-2-70b", "h100-sxm", 8)
    layers = get_model("llama-2-70b").num_layers
    for batch in batches:
        assert none_captured.step_time_s(batch) == eager.step_time_s(batch)
    assert full.launch_time_s(batches[0]) == 0.0
    assert full.launch_time_s(batches[1]) == pytest.approx(layers * PIECEWISE_LAUNCH_PER_LAYER_S)
    assert eager.launch_time_s(batches[0]) == pytest.approx(layers * EAGER_LAUNCH_PER_LAYER_S)


def test_decode_respects_the_published_weight_bounds() -> None:
    # serving-numbers.md 5.2: Llama-3-8B decode step >= 7.9 ms (A100), 4.8 ms (H100),
    # 3.35 ms (H200), reading all 16.1 GB of weights. Decode reads all but the input
    # embedding (0.5 GB, a row lookup), so our pure bound is ~7 % lower.
    one = BatchShape(num_decode_seqs=1, decode_kv_tokens=100)
    for gpu, bound_ms in (("a100-80gb", 7.9), ("h100-sxm", 4.8), ("h200", 3.35)):
        step = _step("llama-3-8b", gpu)
        assert 0.9 * bound_ms <= step.roofline_bound_s(one) * 1e3 <= bound_ms
        assert step.step_time_s(one) * 1e3 >= bound_ms
        # GEMMs stream weights at 77-86 % of HBM bandwidth (Vidur's 1-token rows); kernel
        # overheads and the 1 ms per-step engine overhead come on top.
        assert 1.1 < step.step_time_s(one) / step.roofline_bound_s(one) < 2.0


def test_tensor_parallelism_speeds_up_large_steps() -> None:
    batch = BatchShape(
        num_prefill_tokens=8192, prefill_attention_pairs=prefill_pairs(8192, 0), num_prefill_seqs=1
    )
    times = [_step("llama-3-70b", "h100-sxm", tp).step_time_s(batch) for tp in (2, 4, 8)]
    assert times[0] > times[1] > times[2]


def test_moe_decode_reads_only_the_touched_experts() -> None:
    mixtral = _step("mixtral-8x7b", "h100-sxm", 2)
    dense_equivalent = msgspec.structs.replace(
        get_model("mixtral-8x7b"), name="dense", num_experts=1, num_active_experts=1
    )
    g = get_gpu("h100-sxm")
    dense = RooflineStepTime(
        model=dense_equivalent, gpu=g, efficiency=TABLE.profile_for(g), tensor_parallel=2
    )
    one = BatchShape(num_decode_seqs=1, decode_kv_tokens=1000)
    many = BatchShape(num_decode_seqs=512, decode_kv_tokens=512 * 1000)
    # One token touches 2 of 8 experts: twice the dense MLP's weight reads (plus attention
    # and LM head, which both read once).
    assert 1.5 < mixtral.roofline_bound_s(one) / dense.roofline_bound_s(one) < 2.0
    assert 1.2 < mixtral.step_time_s(one) / dense.step_time_s(one) < 2.0
    # Hundreds of tokens touch all 8.
    assert mixtral.roofline_bound_s(many) > mixtral.roofline_bound_s(one) * 2.5


def test_fp8_weights_use_the_fp8_peak_and_halve_weight_reads() -> None:
    g = get_gpu("h100-sxm")
    fp8_model = msgspec.structs.replace(get_model("llama-3-8b"), dtype_bytes=1)
    fp8 = RooflineStepTime(model=fp8_model, gpu=g, efficiency=TABLE.profile_for(g))
    bf16 = STEPS[("llama-3-8b", "h100-sxm", 1)]
    one = BatchShape(num_decode_seqs=1, decode_kv_tokens=128)
    assert fp8.roofline_bound_s(one) == pytest.approx(bf16.roofline_bound_s(one) / 2, rel=0.01)
    big = BatchShape(
        num_prefill_tokens=8192, prefill_attention_pairs=prefill_pairs(8192, 0), num_prefill_seqs=1
    )
    assert fp8.roofline_bound_s(big) == pytest.approx(bf16.roofline_bound_s(big) / 2, rel=0.01)


def test_constructor_validation() -> None:
    with pytest.raises(ValueError, match="tensor_parallel=3 must divide the 32 attention heads"):
        _step("llama-3-8b", "h100-sxm", 3)
    with pytest.raises(ValueError, match="tensor_parallel must be an integer >= 1"):
        _step("llama-3-8b", "h100-sxm", 0)
    with pytest.raises(ValueError, match=r"step_overhead_s must be in \[0, 1\)"):
        _step("llama-3-8b", "h100-sxm", 1, step_overhead_s=-1.0)
    with pytest.raises(ValueError, match="cuda_graphs must be one of full, piecewise, eager"):
        _step("llama-3-8b", "h100-sxm", 1, cuda_graphs="sometimes")
    with pytest.raises(ValueError, match="cuda_graph_max_tokens must be >= 0"):
        _step("llama-3-8b", "h100-sxm", 1, cuda_graph_max_tokens=-1)


def test_step_time_model_protocol() -> None:
    model: StepTimeModel = STEPS[("llama-3-8b", "h100-sxm", 1)]
    assert model.step_time_s(BatchShape(num_decode_seqs=1)) > 0


def test_first_prediction_for_a_new_model_and_gpu_is_fast() -> None:
    load_efficiency_table.cache_clear()
    start = time.perf_counter()
    gpu = GpuSpec(
        name="new-gpu", dense_bf16_flops_per_s=7e14, hbm_bytes=1.2e11,
        hbm_bandwidth_bytes_per_s=5e12, interconnect_bandwidth_bytes_per_s=1e12,
    )  # fmt: skip
    model = ModelSpec(
        name="new-model", num_layers=48, hidden_size=6144, num_attention_heads=48,
        num_kv_heads=8, head_dim=128, ffn_hidden_size=16384, vocab_size=150000,
    )  # fmt: skip
    step = RooflineStepTime(
        model=model, gpu=gpu, efficiency=load_efficiency_table().profile_for(gpu), tensor_parallel=2
    )
    assert step.step_time_s(BatchShape(num_decode_seqs=8, decode_kv_tokens=8000)) > 0
    assert time.perf_counter() - start < 1.0


# -- efficiency table -------------------------------------------------------------------------


def test_shipped_table_has_a_profile_for_every_builtin_gpu() -> None:
    assert {"a100", "h100", "default"} <= set(TABLE.profiles)
    for gpu in GPUS.values():
        assert TABLE.profile_for(gpu) is TABLE.profiles[gpu.efficiency_profile]
    assert "splitwise" not in TABLE.comment.replace("The splitwise-sim data is not used", "")


def test_unknown_profile_is_a_config_error() -> None:
    gpu = msgspec.structs.replace(GPUS["h100-sxm"], efficiency_profile="tpu")
    with pytest.raises(ConfigError, match=r"efficiency profile 'tpu'.*known profiles: a100"):
        TABLE.profile_for(gpu)


def _table_data() -> dict[str, object]:
    return msgspec.to_builtins(TABLE)  # type: ignore[no-any-return]


def test_efficiency_table_validation() -> None:
    data = _table_data()
    data["profiles"] = {"h100": data["profiles"]["h100"]}  # type: ignore[index]
    with pytest.raises(ConfigError, match="needs a 'default' profile"):
        parse_efficiency_table(data)
    data = _table_data()
    data["profiles"]["default"]["gemm"]["memory_efficiency"] = 1.2  # type: ignore[index]
    with pytest.raises(ConfigError, match=r"gemm.memory_efficiency must be in \(0, 1\]"):
        parse_efficiency_table(data)
    assert isinstance(parse_efficiency_table(_table_data()), EfficiencyTable)


def test_a_curve_that_would_make_more_tokens_faster_is_rejected() -> None:
    with pytest.raises(ValueError, match="rises faster than the token count"):
        GemmEfficiency(
            memory_efficiency=0.8,
            compute_tokens=(16.0, 64.0),
            compute_efficiency=(0.1, 0.5),
            blend_exponent=2.0,
            kernel_overhead_s=5e-6,
        )


@given(a=st.floats(0, 1), b=st.floats(0, 1), p=st.floats(1, 64))
def test_blend_lies_between_max_and_sum(a: float, b: float, p: float) -> None:
    value = blend(a, b, p)
    assert max(a, b) * (1 - 1e-12) <= value <= (a + b) * (1 + 1e-12)


def test_gemm_time_is_never_below_its_own_roofline() -> None:
    eff = TABLE.profiles["h100"].gemm
    for tokens in (1, 7, 64, 100, 1000, 5000, 40000):
        for k, n in ((4096, 6144), (8192, 28672 * 2 // 8)):
            t = gemm_time_s(
                tokens, k, n, eff=eff, peak_flops_per_s=989.4e12, bandwidth_bytes_per_s=3.35e12
            )
            assert t >= max(2 * tokens * k * n / 989.4e12, 2 * k * n / 3.35e12)  # fmt: skip


# -- in-sample fit quality ----------------------------------------------------------------------

VIDUR_FILES = {
    "vidur_a100_Meta-Llama-3-8B_mlp.csv.gz": "a100-80gb",
    "vidur_a100_Meta-Llama-3-70B_mlp.csv.gz": "a100-80gb",
    "vidur_h100_Llama-2-7b-hf_mlp.csv.gz": "h100-sxm",
    "vidur_h100_Llama-2-70b-hf_mlp.csv.gz": "h100-sxm",
}


def test_gemm_fit_is_within_five_percent_in_sample() -> None:
    """The shipped curves reproduce the Vidur GEMM timings they were fitted to (MAPE <= 5 %)."""
    directory = _calibration_dir()
    errors: list[float] = []
    for name, gpu_name in VIDUR_FILES.items():
        gpu = get_gpu(gpu_name)
        eff = TABLE.profile_for(gpu).gemm
        with gzip.open(directory / name, "rt", encoding="utf-8") as fh:
            for r in csv.DictReader(fh):
                h, heads = int(r["n_embd"]), int(r["n_head"])
                kv, ffn = int(r["n_kv_head"]), int(r["n_expanded_embd"])
                tp, tokens = int(r["num_tensor_parallel_workers"]), int(r["num_tokens"])
                hd, q, kvg = h // heads, heads / tp, -(-kv // tp)
                up = (2 if r["use_gated_mlp"] == "True" else 1) * ffn / tp
                shapes = ((h, (q + 2 * kvg) * hd), (q * hd, h), (h, up), (ffn / tp, h))
                predicted = sum(
                    gemm_time_s(
                        tokens, k, n, eff=eff, peak_flops_per_s=gpu.dense_bf16_flops_per_s,
                        bandwidth_bytes_per_s=gpu.hbm_bandwidth_bytes_per_s,
                    )
                    for k, n in shapes
                )  # fmt: skip
                measured = (
                    sum(
                        float(r[f"time_stats.{op}.median"])
                        for op in (
                            "attn_pre_proj",
                            "attn_post_proj",
                            "mlp_up_proj",
                            "mlp_down_proj",
                        )
                    )
                    * 1e-3
                )
                errors.append(abs(predicted / measured - 1))
    assert len(errors) == 5736
    assert sum(errors) / len(errors) <= 0.05


def test_builtin_models_all_run() -> None:
    for name in MODELS:
        step = _step(name, "b200", 8 if name == "bloom-176b" else 1)
        assert step.step_time_s(BatchShape(num_decode_seqs=4, decode_kv_tokens=4000)) > 0
