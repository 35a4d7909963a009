"""The GPU and model catalogs: lookups, derived sizes and validation messages."""

from __future__ import annotations

import pytest

from headway.core.engine.catalog import (
    GPU_ALIASES,
    GPUS,
    MODEL_ALIASES,
    MODELS,
    GpuSpec,
    ModelSpec,
    get_gpu,
    get_model,
    parse_catalog_mapping,
)
from headway.core.errors import ConfigError

# serving-numbers.md, section 5.2: KV bytes per token (BF16) and parameter counts.
KV_BYTES_PER_TOKEN = {
    "llama-3-8b": 131_072,
    "llama-3-70b": 327_680,
    "qwen2.5-7b": 57_344,
    "qwen3-8b": 147_456,
    "llama-2-7b": 524_288,
    "llama-2-70b": 327_680,
}
PARAMS_BILLIONS = {
    "llama-3-8b": 8.03,
    "llama-3-70b": 70.6,
    "qwen2.5-7b": 7.62,
    "qwen3-8b": 8.19,
    "llama-2-7b": 6.74,
    "llama-2-70b": 69.0,
}
TINY = {
    "num_layers": 2,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_kv_heads": 2,
    "head_dim": 64,
    "ffn_hidden_size": 512,
    "vocab_size": 1000,
}
WEIGHT_GB = {
    "llama-3-8b": 16.1,
    "llama-3-70b": 141.1,
    "qwen2.5-7b": 15.2,
    "qwen3-8b": 16.4,
    "llama-2-7b": 13.5,
    "llama-2-70b": 138.0,
}


@pytest.mark.parametrize(("name", "expected"), sorted(KV_BYTES_PER_TOKEN.items()))
def test_kv_bytes_per_token_match_the_reference_table(name: str, expected: int) -> None:
    assert get_model(name).kv_bytes_per_token() == expected


@pytest.mark.parametrize(("name", "billions"), sorted(PARAMS_BILLIONS.items()))
def test_parameter_counts_match_the_reference_table(name: str, billions: float) -> None:
    assert get_model(name).params / 1e9 == pytest.approx(billions, rel=0.005)


@pytest.mark.parametrize(("name", "gigabytes"), sorted(WEIGHT_GB.items()))
def test_weight_bytes_match_the_reference_table(name: str, gigabytes: float) -> None:
    assert get_model(name).weight_bytes / 1e9 == pytest.approx(gigabytes, rel=0.005)


def test_mixtral_counts_all_experts_but_activates_two() -> None:
    mixtral = get_model("mixtral-8x7b")
    # Mistral AI: 46.7B parameters in total, 12.9B used per token.
    assert mixtral.params / 1e9 == pytest.approx(46.7, rel=0.01)
    assert mixtral.active_params / 1e9 == pytest.approx(12.9, rel=0.02)
    assert mixtral.kv_bytes_per_token() == 131_072


def test_bloom_is_mha_with_tied_embeddings() -> None:
    bloom = get_model("bigscience/bloom")
    assert bloom.num_kv_heads == bloom.num_attention_heads == 112
    assert not bloom.gated_mlp
    assert bloom.params / 1e9 == pytest.approx(176.2, rel=0.01)


def test_kv_bytes_per_gpu_shard_then_replicate() -> None:
    llama = get_model("llama-3-8b")  # 8 KV heads
    assert llama.kv_bytes_per_token(2) == 65_536
    assert llama.kv_bytes_per_token(8) == 16_384
    # Beyond 8 GPUs each GPU still holds one whole KV head.
    assert llama.kv_bytes_per_token(16) == 16_384
    assert llama.weight_bytes_per_gpu(4) == pytest.approx(llama.weight_bytes / 4)


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [
        ("h100", "h100-sxm"),
        ("H100-SXM", "h100-sxm"),
        ("  a100  ", "a100-80gb"),
        ("L40S", "l40s"),
        ("b200", "b200"),
        ("h200", "h200"),
    ],
)
def test_gpu_aliases(alias: str, canonical: str) -> None:
    assert get_gpu(alias) is GPUS[canonical]


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [
        ("meta-llama/Meta-Llama-3-8B", "llama-3-8b"),
        ("Llama-3-8B", "llama-3-8b"),
        ("meta-llama/Llama-2-70b-hf", "llama-2-70b"),
        ("llama2-70b", "llama-2-70b"),
        ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"),
        ("Qwen/Qwen3-8B", "qwen3-8b"),
        ("mistralai/Mixtral-8x7B-v0.1", "mixtral-8x7b"),
    ],
)
def test_model_aliases(alias: str, canonical: str) -> None:
    assert get_model(alias) is MODELS[canonical]


def test_every_alias_points_at_a_builtin() -> None:
    assert set(GPU_ALIASES.values()) <= set(GPUS)
    assert set(MODEL_ALIASES.values()) <= set(MODELS)
    assert not set(GPU_ALIASES) & set(GPUS)
    assert not set(MODEL_ALIASES) & set(MODELS)


def test_required_catalog_entries_exist() -> None:
    assert {"a100-80gb", "h100-sxm", "h200", "l40s", "b200"} <= set(GPUS)
    assert {
        "llama-3-8b", "llama-3-70b", "llama-2-7b", "llama-2-70b", "qwen2.5-7b", "qwen3-8b",
        "mixtral-8x7b",
    } <= set(MODELS)  # fmt: skip


def test_gpu_specs_are_dense_datasheet_figures() -> None:
    assert get_gpu("l40s").dense_bf16_flops_per_s == pytest.approx(362.05e12)
    assert get_gpu("b200").dense_bf16_flops_per_s == pytest.approx(2.25e15)
    assert get_gpu("h200").dense_bf16_flops_per_s == get_gpu("h100").dense_bf16_flops_per_s
    h100 = get_gpu("h100")
    assert h100.peak_flops_per_s(1) == pytest.approx(1979e12)
    assert h100.peak_flops_per_s(2) == pytest.approx(989.4e12)
    assert get_gpu("a100").peak_flops_per_s(1) == pytest.approx(312e12)  # no FP8 on A100
    assert h100.ridge_point_flop_per_byte == pytest.approx(295, rel=0.01)


def test_unknown_names_list_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown GPU 'tpu-v5'.*h100-sxm") as gpu_error:
        get_gpu("tpu-v5")
    assert gpu_error.value.path == "$.gpu"
    with pytest.raises(ConfigError, match=r"unknown model 'gpt-5'.*llama-3-8b"):
        get_model("gpt-5")


def test_extra_entries_are_searched_first() -> None:
    mine = ModelSpec(
        name="Mine", num_layers=2, hidden_size=256, num_attention_heads=4, num_kv_heads=2,
        head_dim=64, ffn_hidden_size=512, vocab_size=1000,
    )  # fmt: skip
    assert get_model("MINE", extra={"mine": mine}) is mine
    assert get_model("llama-3-8b", extra={"mine": mine}) is MODELS["llama-3-8b"]


def test_model_validation_names_field_value_and_fix() -> None:
    with pytest.raises(ValueError, match=r"ModelSpec\('X'\)\.num_layers must be .*got 0"):
        ModelSpec(
            name="X", num_layers=0, hidden_size=256, num_attention_heads=4, num_kv_heads=2,
            head_dim=64, ffn_hidden_size=512, vocab_size=1000,
        )  # fmt: skip
    with pytest.raises(ValueError, match=r"num_kv_heads must divide.*3 KV heads.*config.json"):
        ModelSpec(
            name="X", num_layers=2, hidden_size=256, num_attention_heads=4, num_kv_heads=3,
            head_dim=64, ffn_hidden_size=512, vocab_size=1000,
        )  # fmt: skip
    with pytest.raises(ValueError, match=r"num_active_experts must be <= num_experts"):
        ModelSpec(
            name="X", num_layers=2, hidden_size=256, num_attention_heads=4, num_kv_heads=2,
            head_dim=64, ffn_hidden_size=512, vocab_size=1000, num_experts=2,
            num_active_experts=4,
        )  # fmt: skip


def test_gpu_validation_names_field_value_and_fix() -> None:
    with pytest.raises(ValueError, match=r"hbm_bandwidth_bytes_per_s must be .*got -1.*3.35e12"):
        GpuSpec(
            name="G", dense_bf16_flops_per_s=1e15, hbm_bytes=80e9,
            hbm_bandwidth_bytes_per_s=-1, interconnect_bandwidth_bytes_per_s=900e9,
        )  # fmt: skip


def test_parse_catalog_mapping_decodes_user_entries() -> None:
    gpus, models = parse_catalog_mapping(
        {
            "gpus": {
                "My-GPU": {
                    "dense_bf16_flops_per_s": 5e14,
                    "hbm_bytes": 96e9,
                    "hbm_bandwidth_bytes_per_s": 4e12,
                    "interconnect_bandwidth_bytes_per_s": 9e11,
                    "efficiency_profile": "h100",
                }
            },
            "models": {"tiny": TINY},
        }
    )
    assert gpus["my-gpu"].name == "My-GPU"
    assert gpus["my-gpu"].efficiency_profile == "h100"
    assert models["tiny"].kv_bytes_per_token() == 2 * 2 * 2 * 64 * 2
    assert get_model("Tiny", extra=models) is models["tiny"]


@pytest.mark.parametrize(
    ("data", "path", "message"),
    [
        (
            {"models": {"m": {"num_layers": "many"}}},
            "$.models.m.num_layers",
            "Expected `int`, got `str`",
        ),
        (
            {"models": {"m": {"num_layers": 2, "hidden": 3}}},
            "$.models.m",
            "unknown field `hidden`",
        ),
        (
            {
                "gpus": {
                    "g": {
                        "dense_bf16_flops_per_s": 0,
                        "hbm_bytes": 1e9,
                        "hbm_bandwidth_bytes_per_s": 1e12,
                        "interconnect_bandwidth_bytes_per_s": 1e11,
                    }
                }
            },
            "$.gpus.g",
            "dense_bf16_flops_per_s must be a finite number > 0",
        ),
        ({"gpus": ["h100"]}, "$.gpus", "'gpus' must map names to entries"),
        ({"accelerators": {}}, "$.accelerators", "unknown catalog section"),
        ({"models": {"A": TINY, "a": TINY}}, "$.models.a", "duplicate models entry"),
    ],
)
def test_parse_catalog_mapping_errors_carry_the_key_path(
    data: dict[str, object], path: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        parse_catalog_mapping(data)
    assert info.value.path == path
    assert str(info.value).startswith(path)
