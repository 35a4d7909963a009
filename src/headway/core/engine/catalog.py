"""Hardware and model catalogs: the numbers a roofline step-time model starts from.

A :class:`GpuSpec` carries a GPU's public datasheet figures (dense tensor-core FLOP/s, HBM
capacity and bandwidth, interconnect bandwidth and latency); a :class:`ModelSpec` carries a
transformer's shape as published in its ``config.json``. From a shape the model derives
what the engine model needs: parameter counts, weight bytes and KV-cache bytes per token.

Built-in entries live in :data:`GPUS` and :data:`MODELS`, keyed by canonical lower-case
names; :func:`get_gpu` / :func:`get_model` also accept the aliases in :data:`GPU_ALIASES` /
:data:`MODEL_ALIASES` (for example ``"h100"`` or ``"meta-llama/Meta-Llama-3-8B"``). Users
add their own entries in YAML; a driver parses the file and hands the mapping to
:func:`parse_catalog_mapping`, which validates it and reports errors with their key path.

Sources (see also ``../shared/reference/serving-numbers.md``, section 5.1-5.2):

- A100 SXM4 80 GB, H100 SXM5 80 GB, H200 SXM 141 GB: NVIDIA datasheets as tabulated in
  serving-numbers.md (dense = without 2:4 sparsity; H200 has the H100's die and clocks).
- L40S: NVIDIA L40S datasheet (BF16 362.05 TFLOP/s dense, 733 with sparsity; FP8 733 dense;
  48 GB GDDR6, 864 GB/s; PCIe Gen4 x16 "64 GB/s bidirectional", no NVLink).
- B200 (HGX, 1,000 W): 2.25 PFLOP/s dense BF16, 4.5 dense FP8, 192 GB HBM3e at 8 TB/s,
  NVLink 5 at 1.8 TB/s per GPU (glennklockwood.com/garden/processors/B200, NVIDIA HGX
  specifications). HGX/DGX B200 systems expose about 180 GB of the 192 GB to software.
- Model shapes: the Hugging Face ``config.json`` of each model and ``microsoft/vidur``
  ``vidur/config/model_config.py``; Mixtral-8x7B from ``mistralai/Mixtral-8x7B-v0.1``;
  BLOOM-176B from ``bigscience/bloom`` (used by the splitwise-sim calibration data).
- Interconnect latency: the all-reduce latency floor fitted to NCCL timings on an 8×H100
  DGX (``vidur_h100_dgx_all_reduce.csv.gz``; ``scripts/fit_efficiency.py`` prints the fit).
  The same value is used for the other parts, for which no measurement is at hand.

Interconnect bandwidth is the per-GPU *bidirectional* figure as marketed (NVLink 900 GB/s on
H100 = 450 GB/s each way; PCIe Gen4 x16 = 32 GB/s each way = 64 GB/s bidirectional). The
step-time model divides it by two for the per-direction rate that a ring all-reduce uses.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import msgspec

from headway.core.errors import ConfigError

__all__ = [
    "GPUS",
    "GPU_ALIASES",
    "MODELS",
    "MODEL_ALIASES",
    "GpuSpec",
    "ModelSpec",
    "canonical_name",
    "get_gpu",
    "get_model",
    "parse_catalog_mapping",
]

_T = TypeVar("_T")
_S = TypeVar("_S", bound=msgspec.Struct)

_NVLINK_LATENCY_S = 30e-6
"""All-reduce latency floor from the H100 DGX NCCL measurements (see the module docstring)."""


def _require_positive(owner: str, field: str, value: float, fix: str) -> None:
    """Raise a ValueError naming ``owner.field`` unless ``value`` is a finite number > 0."""
    if not (value > 0 and value != float("inf")):
        raise ValueError(f"{owner}.{field} must be a finite number > 0 (got {value!r}); {fix}")


class GpuSpec(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """One GPU's public specifications, per GPU (not per node).

    All rates are *dense* (without 2:4 structured sparsity): a datasheet figure marked
    "with sparsity" must be halved before it goes here.
    """

    name: str
    """Display name, e.g. ``"H100-SXM"``."""

    dense_bf16_flops_per_s: float
    """Dense BF16/FP16 tensor-core peak, FLOP/s."""

    hbm_bytes: float
    """Device memory capacity in bytes (decimal, as marketed: 80 GB = 80e9)."""

    hbm_bandwidth_bytes_per_s: float
    """Device memory bandwidth, bytes/s."""

    interconnect_bandwidth_bytes_per_s: float
    """Per-GPU GPU-to-GPU bandwidth, bidirectional as marketed (NVLink; PCIe where no NVLink)."""

    interconnect_latency_s: float = _NVLINK_LATENCY_S
    """Latency floor of one small all-reduce across the tensor-parallel group, seconds."""

    dense_fp8_flops_per_s: float | None = None
    """Dense FP8 tensor-core peak, FLOP/s; ``None`` if the GPU has no FP8 tensor cores."""

    price_per_hour: float | None = None
    """Optional rental price per GPU-hour (any currency), for cost reports."""

    efficiency_profile: str = "default"
    """Which fitted efficiency profile in ``headway/data/efficiency.json`` applies."""

    max_power_w: float | None = None
    """Board power at full load (the datasheet's maximum TDP), watts; None: unknown, no
    energy figures."""

    idle_power_w: float | None = None
    """Draw when idle, watts (None: :data:`IDLE_POWER_FRACTION` of ``max_power_w``; no
    datasheet gives it: measure it with ``nvidia-smi`` and set it in a cluster file's
    ``gpu_power_w``)."""

    def __post_init__(self) -> None:
        owner = f"GpuSpec({self.name!r})"
        if not self.name.strip():
            raise ValueError("GpuSpec.name must be a non-empty string; give the GPU a name")
        _require_positive(
            owner, "dense_bf16_flops_per_s", self.dense_bf16_flops_per_s,
            "give the dense (not sparse) BF16 peak in FLOP/s, e.g. 989.4e12 for an H100",
        )  # fmt: skip
        _require_positive(owner, "hbm_bytes", self.hbm_bytes, "give bytes, e.g. 80e9")
        _require_positive(
            owner, "hbm_bandwidth_bytes_per_s", self.hbm_bandwidth_bytes_per_s,
            "give bytes/s, e.g. 3.35e12",
        )  # fmt: skip
        _require_positive(
            owner, "interconnect_bandwidth_bytes_per_s", self.interconnect_bandwidth_bytes_per_s,
            "give the bidirectional per-GPU NVLink or PCIe rate in bytes/s, e.g. 900e9",
        )  # fmt: skip
        if not (0 <= self.interconnect_latency_s < 1):
            raise ValueError(
                f"{owner}.interconnect_latency_s must be in [0, 1) seconds "
                f"(got {self.interconnect_latency_s!r}); a typical NVLink value is 30e-6"
            )
        if self.dense_fp8_flops_per_s is not None:
            _require_positive(
                owner, "dense_fp8_flops_per_s", self.dense_fp8_flops_per_s,
                "give the dense FP8 peak in FLOP/s, or leave it out",
            )  # fmt: skip
        if self.price_per_hour is not None and not self.price_per_hour >= 0:
            raise ValueError(
                f"{owner}.price_per_hour must be >= 0 (got {self.price_per_hour!r}); "
                "leave it out if unknown"
            )
        if not self.efficiency_profile.strip():
            raise ValueError(f"{owner}.efficiency_profile must be a non-empty name; use 'default'")
        for name in ("max_power_w", "idle_power_w"):
            value = getattr(self, name)
            if value is not None:
                _require_positive(owner, name, value, "give watts, e.g. 700 for an H100 SXM")
        if (
            self.max_power_w is not None
            and self.idle_power_w is not None
            and self.idle_power_w > self.max_power_w
        ):
            raise ValueError(
                f"{owner}.idle_power_w ({self.idle_power_w}) must be <= max_power_w "
                f"({self.max_power_w}); swap them"
            )

    @property
    def power_w(self) -> tuple[float, float] | None:
        """``(idle, full load)`` watts of one GPU (None: its power is not known)."""
        if self.max_power_w is None:
            return None
        idle = self.idle_power_w
        return (IDLE_POWER_FRACTION * self.max_power_w if idle is None else idle), self.max_power_w

    @property
    def ridge_point_flop_per_byte(self) -> float:
        """Arithmetic intensity (BF16 FLOP per HBM byte) where compute and memory balance."""
        return self.dense_bf16_flops_per_s / self.hbm_bandwidth_bytes_per_s

    def peak_flops_per_s(self, dtype_bytes: int) -> float:
        """Dense tensor-core peak for weights of ``dtype_bytes`` (1 = FP8 where supported)."""
        if dtype_bytes == 1 and self.dense_fp8_flops_per_s is not None:
            return self.dense_fp8_flops_per_s
        return self.dense_bf16_flops_per_s


class ModelSpec(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """A decoder-only transformer's shape, as in its ``config.json``.

    ``num_experts`` > 1 makes the MLP a mixture of experts of which ``num_active_experts``
    run per token; each expert has the dense MLP's shape (``ffn_hidden_size``). Biases,
    norms' weights and rotary tables are ignored: they are well under 0.1 % of the bytes.
    """

    name: str
    """Display name, e.g. ``"Llama-3-8B"``."""

    num_layers: int
    """Transformer blocks (``num_hidden_layers``)."""

    hidden_size: int
    """Model width (``hidden_size``)."""

    num_attention_heads: int
    """Query heads (``num_attention_heads``)."""

    num_kv_heads: int
    """Key/value heads (``num_key_value_heads``; equal to the query heads for MHA)."""

    head_dim: int
    """Width of one attention head (``head_dim``, usually hidden / heads)."""

    ffn_hidden_size: int
    """MLP inner width (``intermediate_size``), per expert for MoE models."""

    vocab_size: int
    """Vocabulary size (rows of the embedding and of the LM head)."""

    num_experts: int = 1
    """MLP experts per layer (1 = dense)."""

    num_active_experts: int = 1
    """Experts each token is routed to (``num_experts_per_tok``)."""

    gated_mlp: bool = True
    """SwiGLU-style MLP with gate and up projections (False: one up projection, e.g. GELU)."""

    tied_embeddings: bool = False
    """The LM head shares the input embedding's weights (``tie_word_embeddings``)."""

    dtype_bytes: int = 2
    """Bytes per weight and per KV element: 2 for BF16/FP16, 1 for FP8."""

    max_position_embeddings: int | None = None
    """Context length in tokens (``max_position_embeddings``): vLLM's default
    ``max_model_len``, the longest prompt + output it takes (None: not known)."""

    def __post_init__(self) -> None:
        owner = f"ModelSpec({self.name!r})"
        if self.max_position_embeddings is not None and not self.max_position_embeddings >= 1:
            raise ValueError(
                f"{owner}.max_position_embeddings must be an integer >= 1 (got "
                f"{self.max_position_embeddings!r}); copy it from the model's config.json"
            )
        if not self.name.strip():
            raise ValueError("ModelSpec.name must be a non-empty string; give the model a name")
        for field in (
            "num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim",
            "ffn_hidden_size", "vocab_size", "num_experts", "num_active_experts",
        ):  # fmt: skip
            value = getattr(self, field)
            if not value >= 1:
                raise ValueError(
                    f"{owner}.{field} must be an integer >= 1 (got {value!r}); "
                    "copy it from the model's config.json"
                )
        if self.num_attention_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"{owner}.num_kv_heads must divide num_attention_heads "
                f"(got {self.num_kv_heads} KV heads for {self.num_attention_heads} query heads); "
                "use num_key_value_heads from config.json"
            )
        if self.num_active_experts > self.num_experts:
            raise ValueError(
                f"{owner}.num_active_experts must be <= num_experts "
                f"(got {self.num_active_experts} of {self.num_experts}); "
                "use num_experts_per_tok and num_local_experts from config.json"
            )
        if self.dtype_bytes not in (1, 2, 4):
            raise ValueError(
                f"{owner}.dtype_bytes must be 1 (FP8), 2 (BF16/FP16) or 4 (FP32) "
                f"(got {self.dtype_bytes!r})"
            )

    # -- parameter counts -----------------------------------------------------------------

    @property
    def attention_params_per_layer(self) -> int:
        """Weights of the QKV and output projections of one layer."""
        q_width = self.num_attention_heads * self.head_dim
        kv_width = self.num_kv_heads * self.head_dim
        return self.hidden_size * (q_width + 2 * kv_width) + q_width * self.hidden_size

    @property
    def expert_params(self) -> int:
        """Weights of one MLP (one expert): gate+up+down, or up+down when not gated."""
        projections = 3 if self.gated_mlp else 2
        return projections * self.hidden_size * self.ffn_hidden_size

    @property
    def router_params_per_layer(self) -> int:
        """Weights of the MoE router of one layer (0 for a dense model)."""
        return self.hidden_size * self.num_experts if self.num_experts > 1 else 0

    @property
    def embedding_params(self) -> int:
        """Input embedding plus LM head (counted once when tied)."""
        table = self.vocab_size * self.hidden_size
        return table if self.tied_embeddings else 2 * table

    @property
    def params(self) -> int:
        """Total parameters (all experts)."""
        per_layer = (
            self.attention_params_per_layer
            + self.num_experts * self.expert_params
            + self.router_params_per_layer
        )
        return self.num_layers * per_layer + self.embedding_params

    @property
    def active_params(self) -> int:
        """Parameters used per token (active experts only; the input embedding is a lookup).

        ``2 * active_params`` is the GEMM FLOPs per token, including the LM head.
        """
        per_layer = (
            self.attention_params_per_layer
            + self.num_active_experts * self.expert_params
            + self.router_params_per_layer
        )
        return self.num_layers * per_layer + self.vocab_size * self.hidden_size

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights at ``dtype_bytes`` per parameter."""
        return self.params * self.dtype_bytes

    def weight_bytes_per_gpu(self, tensor_parallel: int = 1) -> float:
        """Weight bytes each GPU holds under tensor parallelism (everything is sharded)."""
        _check_tp(tensor_parallel)
        return self.weight_bytes / tensor_parallel

    # -- KV cache ------------------------------------------------------------------------

    def kv_heads_per_gpu(self, tensor_parallel: int = 1) -> int:
        """KV heads each GPU stores: sharded, but replicated once TP exceeds the KV heads."""
        _check_tp(tensor_parallel)
        return -(-self.num_kv_heads // tensor_parallel)

    def kv_bytes_per_token(self, tensor_parallel: int = 1) -> int:
        """KV-cache bytes one token occupies on each GPU: 2 (K, V) × layers × heads × dim × dtype.

        With ``tensor_parallel=1`` this is the whole model's KV per token (131,072 B for
        Llama-3-8B in BF16).
        """
        heads = self.kv_heads_per_gpu(tensor_parallel)
        return 2 * self.num_layers * heads * self.head_dim * self.dtype_bytes


def _check_tp(tensor_parallel: int) -> None:
    if not tensor_parallel >= 1:
        raise ValueError(f"tensor_parallel must be an integer >= 1 (got {tensor_parallel!r})")


# -- built-in catalogs -----------------------------------------------------------------------

IDLE_POWER_FRACTION = 0.15
"""An idle GPU's draw as a share of its maximum board power when the catalog gives none
(an assumption, not a datasheet figure: data-centre GPUs idle at roughly a tenth to a
fifth of their TDP with the engine loaded)."""

GPUS: dict[str, GpuSpec] = {
    "a100-80gb": GpuSpec(
        name="A100-80GB",
        dense_bf16_flops_per_s=312e12,
        hbm_bytes=80e9,
        hbm_bandwidth_bytes_per_s=2.039e12,
        interconnect_bandwidth_bytes_per_s=600e9,
        efficiency_profile="a100",
        max_power_w=400,
    ),
    "h100-sxm": GpuSpec(
        name="H100-SXM",
        dense_bf16_flops_per_s=989.4e12,
        dense_fp8_flops_per_s=1979e12,
        hbm_bytes=80e9,
        hbm_bandwidth_bytes_per_s=3.35e12,
        interconnect_bandwidth_bytes_per_s=900e9,
        efficiency_profile="h100",
        max_power_w=700,
    ),
    "h200": GpuSpec(
        name="H200",
        dense_bf16_flops_per_s=989.4e12,
        dense_fp8_flops_per_s=1979e12,
        hbm_bytes=141e9,
        hbm_bandwidth_bytes_per_s=4.8e12,
        interconnect_bandwidth_bytes_per_s=900e9,
        efficiency_profile="h100",
        max_power_w=700,
    ),
    "l40s": GpuSpec(
        name="L40S",
        dense_bf16_flops_per_s=362.05e12,
        dense_fp8_flops_per_s=733e12,
        hbm_bytes=48e9,
        hbm_bandwidth_bytes_per_s=864e9,
        interconnect_bandwidth_bytes_per_s=64e9,
        efficiency_profile="default",
        max_power_w=350,
    ),
    "b200": GpuSpec(
        name="B200",
        dense_bf16_flops_per_s=2.25e15,
        dense_fp8_flops_per_s=4.5e15,
        hbm_bytes=192e9,
        hbm_bandwidth_bytes_per_s=8e12,
        interconnect_bandwidth_bytes_per_s=1.8e12,
        efficiency_profile="h100",
        max_power_w=1000,
    ),
}
"""Built-in GPUs by canonical name. H200 and B200 borrow the H100's fitted efficiencies and
L40S the joint fit ("default"): no GEMM timings of those parts are at hand."""

GPU_ALIASES: dict[str, str] = {
    "a100": "a100-80gb",
    "a100-sxm": "a100-80gb",
    "a100-sxm4-80gb": "a100-80gb",
    "nvidia-a100-80gb": "a100-80gb",
    "h100": "h100-sxm",
    "h100-80gb": "h100-sxm",
    "h100-sxm5": "h100-sxm",
    "h100-sxm5-80gb": "h100-sxm",
    "nvidia-h100-80gb-hbm3": "h100-sxm",
    "h200-sxm": "h200",
    "h200-141gb": "h200",
    "l40s-48gb": "l40s",
    "nvidia-l40s": "l40s",
    "b200-sxm": "b200",
    "hgx-b200": "b200",
}
"""Other spellings of the built-in GPU names (all compared lower-case)."""

MODELS: dict[str, ModelSpec] = {
    "llama-3-8b": ModelSpec(
        name="Llama-3-8B", num_layers=32, hidden_size=4096, num_attention_heads=32,
        num_kv_heads=8, head_dim=128, ffn_hidden_size=14336, vocab_size=128256,
        max_position_embeddings=8192,
    ),
    "llama-3-70b": ModelSpec(
        name="Llama-3-70B", num_layers=80, hidden_size=8192, num_attention_heads=64,
        num_kv_heads=8, head_dim=128, ffn_hidden_size=28672, vocab_size=128256,
        max_position_embeddings=8192,
    ),
    "llama-2-7b": ModelSpec(
        name="Llama-2-7B", num_layers=32, hidden_size=4096, num_attention_heads=32,
        num_kv_heads=32, head_dim=128, ffn_hidden_size=11008, vocab_size=32000,
        max_position_embeddings=4096,
    ),
    "llama-2-70b": ModelSpec(
        name="Llama-2-70B", num_layers=80, hidden_size=8192, num_attention_heads=64,
        num_kv_heads=8, head_dim=128, ffn_hidden_size=28672, vocab_size=32000,
        max_position_embeddings=4096,
    ),
    "qwen2.5-7b": ModelSpec(
        name="Qwen2.5-7B", num_layers=28, hidden_size=3584, num_attention_heads=28,
        num_kv_heads=4, head_dim=128, ffn_hidden_size=18944, vocab_size=152064,
        max_position_embeddings=32768,
    ),
    "qwen3-8b": ModelSpec(
        name="Qwen3-8B", num_layers=36, hidden_size=4096, num_attention_heads=32,
        num_kv_heads=8, head_dim=128, ffn_hidden_size=12288, vocab_size=151936,
        max_position_embeddings=40960,
    ),
    "mixtral-8x7b": ModelSpec(
        name="Mixtral-8x7B", num_layers=32, hidden_size=4096, num_attention_heads=32,
        num_kv_heads=8, head_dim=128, ffn_hidden_size=14336, vocab_size=32000,
        num_experts=8, num_active_experts=2, max_position_embeddings=32768,
    ),
    "bloom-176b": ModelSpec(
        name="BLOOM-176B", num_layers=70, hidden_size=14336, num_attention_heads=112,
        num_kv_heads=112, head_dim=128, ffn_hidden_size=57344, vocab_size=250880,
        gated_mlp=False, tied_embeddings=True, max_position_embeddings=2048,
    ),
}  # fmt: skip
"""Built-in models by canonical name (BF16 weights and KV cache)."""

MODEL_ALIASES: dict[str, str] = {
    "meta-llama/meta-llama-3-8b": "llama-3-8b",
    "meta-llama/meta-llama-3-8b-instruct": "llama-3-8b",
    "meta-llama/llama-3.1-8b": "llama-3-8b",
    "meta-llama/llama-3.1-8b-instruct": "llama-3-8b",
    "llama-3.1-8b": "llama-3-8b",
    "llama3-8b": "llama-3-8b",
    "meta-llama/meta-llama-3-70b": "llama-3-70b",
    "meta-llama/meta-llama-3-70b-instruct": "llama-3-70b",
    "meta-llama/llama-3.1-70b": "llama-3-70b",
    "meta-llama/llama-3.3-70b-instruct": "llama-3-70b",
    "llama-3.1-70b": "llama-3-70b",
    "llama-3.3-70b": "llama-3-70b",
    "llama3-70b": "llama-3-70b",
    "meta-llama/llama-2-7b-hf": "llama-2-7b",
    "meta-llama/llama-2-7b-chat-hf": "llama-2-7b",
    "llama2-7b": "llama-2-7b",
    "meta-llama/llama-2-70b-hf": "llama-2-70b",
    "meta-llama/llama-2-70b-chat-hf": "llama-2-70b",
    "llama2-70b": "llama-2-70b",
    "qwen/qwen2.5-7b": "qwen2.5-7b",
    "qwen/qwen2.5-7b-instruct": "qwen2.5-7b",
    "qwen2-7b": "qwen2.5-7b",
    "qwen/qwen3-8b": "qwen3-8b",
    "mistralai/mixtral-8x7b-v0.1": "mixtral-8x7b",
    "mistralai/mixtral-8x7b-instruct-v0.1": "mixtral-8x7b",
    "bigscience/bloom": "bloom-176b",
    "bloom": "bloom-176b",
}
"""Other spellings of the built-in model names (Hugging Face ids, splitwise-sim names)."""


def canonical_name(name: str) -> str:
    """The lookup key for ``name``: stripped and lower-cased."""
    return name.strip().lower()


def get_gpu(name: str, extra: Mapping[str, GpuSpec] | None = None) -> GpuSpec:
    """The GPU called ``name`` (canonical name or alias), searching ``extra`` first.

    Raises :class:`~headway.core.errors.ConfigError` listing the known names.
    """
    key = canonical_name(name)
    found = _lookup(key, extra, GPUS, GPU_ALIASES)
    if found is None:
        known = sorted({*GPUS, *(extra or {})})
        raise ConfigError(
            f"unknown GPU {name!r}; known GPUs: {', '.join(known)} "
            f"(aliases: {', '.join(sorted(GPU_ALIASES))}); add your own under 'gpus:' "
            "in a catalog file",
            path="$.gpu",
        )
    return found


def get_model(name: str, extra: Mapping[str, ModelSpec] | None = None) -> ModelSpec:
    """The model called ``name`` (canonical name, alias or Hugging Face id), ``extra`` first.

    Raises :class:`~headway.core.errors.ConfigError` listing the known names.
    """
    key = canonical_name(name)
    found = _lookup(key, extra, MODELS, MODEL_ALIASES)
    if found is None:
        known = sorted({*MODELS, *(extra or {})})
        raise ConfigError(
            f"unknown model {name!r}; known models: {', '.join(known)} "
            "(Hugging Face ids of these also work); add your own under 'models:' "
            "in a catalog file",
            path="$.model",
        )
    return found


def _lookup(
    key: str, extra: Mapping[str, _T] | None, builtin: Mapping[str, _T], aliases: Mapping[str, str]
) -> _T | None:
    if extra:
        lowered = {canonical_name(k): v for k, v in extra.items()}
        if key in lowered:
            return lowered[key]
    if key in builtin:
        return builtin[key]
    target = aliases.get(key)
    return builtin[target] if target is not None else None


# -- user catalogs -------------------------------------------------------------------------


def parse_catalog_mapping(
    data: Mapping[str, Any],
) -> tuple[dict[str, GpuSpec], dict[str, ModelSpec]]:
    """Decode a user catalog (already-parsed YAML/JSON) into GPU and model entries.

    The expected shape::

        gpus:
          my-gpu: {name: My-GPU, dense_bf16_flops_per_s: 4.0e14, hbm_bytes: 9.6e10, ...}
        models:
          my-model: {name: My-Model, num_layers: 40, hidden_size: 5120, ...}

    Both sections are optional. Keys become canonical (lower-case) names. Errors raise
    :class:`~headway.core.errors.ConfigError` with the key path (``$.models.my-model.head_dim``),
    the bad value and how to fix it.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"$: a catalog must be a mapping with 'gpus' and/or 'models' "
            f"(got {type(data).__name__})",
            path="$",
        )
    unknown = sorted(str(k) for k in data if k not in ("gpus", "models"))
    if unknown:
        raise ConfigError(
            f"$.{unknown[0]}: unknown catalog section(s) {', '.join(unknown)}; "
            "use 'gpus' and/or 'models'",
            path=f"$.{unknown[0]}",
        )
    gpus = _parse_section(data.get("gpus"), "gpus", GpuSpec)
    models = _parse_section(data.get("models"), "models", ModelSpec)
    return gpus, models


def _parse_section(section: object, key: str, struct: type[_S]) -> dict[str, _S]:
    if section is None:
        return {}
    if not isinstance(section, Mapping):
        raise ConfigError(
            f"$.{key}: '{key}' must map names to entries (got {type(section).__name__})",
            path=f"$.{key}",
        )
    out: dict[str, _S] = {}
    for raw_name, entry in section.items():
        path = f"$.{key}.{raw_name}"
        if not isinstance(raw_name, str) or not raw_name.strip():
            raise ConfigError(
                f"{path}: entry names under '{key}' must be non-empty strings", path=path
            )
        name = canonical_name(raw_name)
        if name in out:
            raise ConfigError(
                f"{path}: duplicate {key} entry {raw_name!r} (names ignore case); rename one",
                path=path,
            )
        if isinstance(entry, Mapping) and "name" not in entry:
            entry = {"name": raw_name, **entry}
        try:
            out[name] = msgspec.convert(entry, struct)
        except msgspec.ValidationError as exc:
            message, sub = _split_msgspec_path(str(exc))
            raise ConfigError(f"{path}{sub}: {message}", path=path + sub) from exc
    return out


def _split_msgspec_path(message: str) -> tuple[str, str]:
    """Split msgspec's ``"... - at `$.field`"`` into the message and ``".field"``."""
    marker = " - at `$"
    if message.endswith("`") and marker in message:
        text, _, tail = message.rpartition(marker)
        return text, tail[:-1]
    return message, ""
