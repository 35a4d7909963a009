"""The fitted efficiencies of the roofline step-time model, as read from files.

``scripts/fit_efficiency.py`` fits them and writes ``headway/data/efficiency.json``;
:func:`parse_efficiency_table` validates that file's parsed content. They live apart from
:mod:`headway.core.engine.roofline` because that module is compiled (``pyproject.toml``,
``[tool.hatch.build.hooks.custom]``) and a compiled module loses a ``msgspec.Struct``'s
class options (``frozen``, ``forbid_unknown_fields``).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Mapping
from typing import Any

import msgspec

from headway.core.engine.catalog import GpuSpec
from headway.core.errors import ConfigError

__all__ = [
    "AllReduceEfficiency",
    "AttentionEfficiency",
    "EfficiencyProfile",
    "EfficiencyTable",
    "ElementwiseEfficiency",
    "GemmEfficiency",
    "parse_efficiency_table",
]


# -- efficiency parameters -------------------------------------------------------------------


class GemmEfficiency(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """Efficiency of a dense GEMM ``[tokens × K] @ [K × N]`` as a function of ``tokens``.

    Compute efficiency follows a piecewise log-linear curve through
    ``(compute_tokens[i], compute_efficiency[i])``, flat beyond the end knots; memory
    efficiency is one number (the fraction of HBM bandwidth at which weights stream).
    """

    memory_efficiency: float
    """Fraction of HBM bandwidth reached when streaming weights and activations."""

    compute_tokens: tuple[float, ...]
    """Token counts of the compute-efficiency knots, strictly increasing."""

    compute_efficiency: tuple[float, ...]
    """Fraction of dense peak FLOP/s at each knot."""

    blend_exponent: float
    """p of the p-norm that joins the compute and memory times (1 = add them, ∞ = max)."""

    kernel_overhead_s: float
    """Fixed time per GEMM kernel (launch, prologue, tail), seconds."""

    def __post_init__(self) -> None:
        _check_fraction("gemm.memory_efficiency", self.memory_efficiency)
        knots, effs = self.compute_tokens, self.compute_efficiency
        if not knots or len(knots) != len(effs):
            raise ValueError(
                "gemm.compute_tokens and gemm.compute_efficiency must be non-empty and of "
                f"equal length (got {len(knots)} and {len(effs)})"
            )
        for i, (n, e) in enumerate(zip(knots, effs, strict=True)):
            if not n >= 1:
                raise ValueError(f"gemm.compute_tokens[{i}] must be >= 1 (got {n!r})")
            _check_fraction(f"gemm.compute_efficiency[{i}]", e)
        for i in range(1, len(knots)):
            if not knots[i] > knots[i - 1]:
                raise ValueError(
                    f"gemm.compute_tokens must increase strictly (got {knots[i - 1]!r} "
                    f"then {knots[i]!r} at index {i})"
                )
            # Compute time ∝ tokens / eff(tokens) must not fall as tokens grow.
            if effs[i] / effs[i - 1] > knots[i] / knots[i - 1] * (1 + 1e-12):
                raise ValueError(
                    f"gemm.compute_efficiency rises faster than the token count between knots "
                    f"{i - 1} and {i} ({effs[i - 1]!r} -> {effs[i]!r}), which would make more "
                    "tokens faster; refit the curve"
                )
        if not (self.blend_exponent >= 1 and math.isfinite(self.blend_exponent)):
            raise ValueError(f"gemm.blend_exponent must be >= 1 (got {self.blend_exponent!r})")
        _check_overhead("gemm.kernel_overhead_s", self.kernel_overhead_s)

    def compute_efficiency_at(self, tokens: float) -> float:
        """Compute efficiency at ``tokens`` (log-linear between knots, flat outside)."""
        knots, effs = self.compute_tokens, self.compute_efficiency
        if tokens <= knots[0]:
            return effs[0]
        if tokens >= knots[-1]:
            return effs[-1]
        i = bisect_right(knots, tokens)
        lo, hi = knots[i - 1], knots[i]
        w = math.log(tokens / lo) / math.log(hi / lo)
        return math.exp((1.0 - w) * math.log(effs[i - 1]) + w * math.log(effs[i]))


class ElementwiseEfficiency(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """Memory-bound per-layer kernels: norms, rotary embedding, activation, residual add."""

    memory_efficiency: float
    """Fraction of HBM bandwidth the element-wise kernels reach."""

    kernel_overhead_s: float
    """Fixed time per element-wise kernel, seconds."""

    kernels_per_layer: int = 5
    """Element-wise kernels per layer (2 norms, rotary, activation, add)."""

    def __post_init__(self) -> None:
        _check_fraction("elementwise.memory_efficiency", self.memory_efficiency)
        _check_overhead("elementwise.kernel_overhead_s", self.kernel_overhead_s)
        if not self.kernels_per_layer >= 0:
            raise ValueError(
                f"elementwise.kernels_per_layer must be >= 0 (got {self.kernels_per_layer!r})"
            )


class AttentionEfficiency(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """Attention kernels: prefill is compute-bound, decode streams the KV cache.

    Decode time per layer is ``decode_kernel_overhead_s + decode_per_seq_kv_head_s × seqs ×
    KV heads per GPU + KV bytes / (bandwidth × decode_memory_efficiency)``: the middle term
    is the fixed work of each (sequence, KV head) block of a paged decode kernel, which
    dominates at short contexts.
    """

    prefill_compute_efficiency: float
    """Fraction of dense peak FLOP/s reached by prefill attention."""

    prefill_kernel_overhead_s: float
    """Fixed time of the prefill attention kernel of one layer, seconds."""

    decode_memory_efficiency: float
    """Fraction of HBM bandwidth reached when decode attention reads the KV cache."""

    decode_kernel_overhead_s: float
    """Fixed time of the decode attention kernel of one layer, seconds."""

    decode_per_seq_kv_head_s: float
    """Time per decoding sequence per KV head on the GPU, per layer, seconds."""

    def __post_init__(self) -> None:
        _check_fraction("attention.prefill_compute_efficiency", self.prefill_compute_efficiency)
        _check_fraction("attention.decode_memory_efficiency", self.decode_memory_efficiency)
        _check_overhead("attention.prefill_kernel_overhead_s", self.prefill_kernel_overhead_s)
        _check_overhead("attention.decode_kernel_overhead_s", self.decode_kernel_overhead_s)
        _check_overhead("attention.decode_per_seq_kv_head_s", self.decode_per_seq_kv_head_s)


class AllReduceEfficiency(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """Tensor-parallel all-reduce: fraction of the per-direction interconnect rate reached."""

    bandwidth_efficiency: float
    """Ring bus bandwidth / (interconnect bandwidth / 2)."""

    def __post_init__(self) -> None:
        _check_fraction("all_reduce.bandwidth_efficiency", self.bandwidth_efficiency)


class EfficiencyProfile(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """Every efficiency the roofline needs for one GPU family."""

    gemm: GemmEfficiency
    elementwise: ElementwiseEfficiency
    attention: AttentionEfficiency
    all_reduce: AllReduceEfficiency


class EfficiencyTable(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """The content of ``headway/data/efficiency.json``: named profiles and provenance."""

    comment: str
    """How the file was produced and from which measurements."""

    version: int
    """File format version (1)."""

    profiles: dict[str, EfficiencyProfile]
    """Profiles by name (``GpuSpec.efficiency_profile``); ``"default"`` must exist."""

    fit: dict[str, Any] = {}
    """Fit diagnostics (in-sample errors, fitted latencies), for reports only."""

    def __post_init__(self) -> None:
        if "default" not in self.profiles:
            raise ValueError(
                "the efficiency table needs a 'default' profile (used for GPUs without "
                f"measurements); found {', '.join(sorted(self.profiles)) or 'none'}"
            )

    def profile_for(self, gpu: GpuSpec) -> EfficiencyProfile:
        """The profile ``gpu.efficiency_profile`` names; ConfigError if there is none."""
        try:
            return self.profiles[gpu.efficiency_profile]
        except KeyError:
            raise ConfigError(
                f"GPU {gpu.name!r} asks for efficiency profile {gpu.efficiency_profile!r}, "
                f"which is not in the table; known profiles: {', '.join(sorted(self.profiles))}",
                path="$.efficiency_profile",
            ) from None


def parse_efficiency_table(data: Mapping[str, Any]) -> EfficiencyTable:
    """Validate the parsed JSON of an efficiency file (pure: the caller reads the file)."""
    try:
        return msgspec.convert(data, EfficiencyTable)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid efficiency table: {exc}", path="$") from exc


def _check_fraction(name: str, value: float) -> None:
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{name} must be in (0, 1] (got {value!r})")


def _check_overhead(name: str, value: float) -> None:
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be in [0, 1) seconds (got {value!r})")
