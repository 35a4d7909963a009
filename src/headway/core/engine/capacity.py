"""Back-of-envelope capacity: KV-cache tokens per replica and steady-state max throughput.

These are first-order estimates for sizing and sanity checks (does the roofline agree with
a published benchmark?), not a substitute for simulating the scheduler step by step.

:func:`kv_capacity_tokens` follows vLLM's memory budget: ``gpu_memory_utilization`` of the
device memory, minus the weights each GPU holds, minus an activation/workspace reserve,
cut into whole blocks of ``block_size`` tokens.

:func:`max_throughput` assumes an engine saturated with identical requests (``isl`` prompt
tokens, ``osl`` output tokens) in steady state with chunked prefill: every step decodes
one token for each of ``B`` running sequences and prefills the prompts of the ``B / osl``
requests that replace the finished ones, i.e. ``B × isl / osl`` prompt tokens per step. ``B``
is the largest batch that respects

- ``max_num_seqs`` (the engine's sequence limit),
- the KV cache: ``B × (isl + osl / 2 + block_size / 2) <= kv_capacity_tokens`` (running
  sequences are on average half-way through their output, and waste half a block), and
- the token budget: ``B × (1 + isl / osl) <= max_num_batched_tokens``.

The output rate is ``B / step_time``. Preemption, scheduling gaps and the ramp-up are
ignored, so the estimate is an upper bound for this engine model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from headway.core.engine.catalog import GpuSpec, ModelSpec
from headway.core.engine.steptime import BatchShape, StepTimeModel
from headway.core.errors import ConfigError

__all__ = [
    "DEFAULT_ACTIVATION_RESERVE_BYTES",
    "ThroughputEstimate",
    "kv_capacity_tokens",
    "max_throughput",
    "steady_step_time_s",
]

DEFAULT_ACTIVATION_RESERVE_BYTES = 2 * 1024**3
"""Memory kept per GPU for activations, CUDA graphs and library workspaces (2 GiB).

vLLM measures this by profiling a forward pass; 1-4 GiB is typical for 7-70B models at a
token budget of a few thousand tokens."""

Limit = Literal["max_num_seqs", "kv_cache", "token_budget"]


def kv_capacity_tokens(
    model: ModelSpec,
    gpu: GpuSpec,
    tensor_parallel: int = 1,
    *,
    gpu_memory_utilization: float = 0.9,
    activation_reserve_bytes: float = DEFAULT_ACTIVATION_RESERVE_BYTES,
    block_size: int = 16,
) -> int:
    """Tokens of KV cache a replica of ``tensor_parallel`` GPUs holds (0 if none fit).

    Per GPU: ``hbm × utilization − weights / tp − reserve`` bytes, in whole blocks of
    ``block_size × kv_bytes_per_token(tp)`` bytes; every GPU holds its share of every
    token, so the replica holds as many tokens as one GPU does.
    """
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError(
            f"gpu_memory_utilization must be in (0, 1] (got {gpu_memory_utilization!r})"
        )
    if not activation_reserve_bytes >= 0:
        raise ValueError(
            f"activation_reserve_bytes must be >= 0 (got {activation_reserve_bytes!r})"
        )
    if not block_size >= 1:
        raise ValueError(f"block_size must be >= 1 (got {block_size!r})")
    free_bytes = (
        gpu.hbm_bytes * gpu_memory_utilization
        - model.weight_bytes_per_gpu(tensor_parallel)
        - activation_reserve_bytes
    )
    block_bytes = block_size * model.kv_bytes_per_token(tensor_parallel)
    if free_bytes < block_bytes:
        return 0
    return int(free_bytes // block_bytes) * block_size


@dataclass(frozen=True, slots=True)
class ThroughputEstimate:
    """Steady-state saturation throughput of one replica for fixed request lengths."""

    output_tokens_per_s: float
    """Generated tokens per second (the headline "max throughput")."""

    running_seqs: int
    """Sequences decoding in every step (``B``)."""

    limited_by: Limit
    """Which limit sets ``B``."""

    step_time_s: float
    """Duration of the steady-state step."""

    prefill_tokens_per_step: float
    """Prompt tokens computed per step (``B × isl / osl``)."""

    kv_capacity_tokens: int
    """KV-cache tokens the replica holds."""

    requests_per_s: float
    """Completed requests per second (``output_tokens_per_s / osl``)."""


def max_throughput(
    step_model: StepTimeModel,
    *,
    model: ModelSpec,
    gpu: GpuSpec,
    isl: int,
    osl: int,
    tensor_parallel: int = 1,
    max_num_seqs: int = 512,
    max_num_batched_tokens: int = 8192,
    block_size: int = 16,
    gpu_memory_utilization: float = 0.9,
    activation_reserve_bytes: float = DEFAULT_ACTIVATION_RESERVE_BYTES,
) -> ThroughputEstimate:
    """Saturation output tokens/s of ``step_model`` for ``isl``/``osl`` requests.

    See the module docstring for the steady state assumed. ``model``, ``gpu`` and
    ``tensor_parallel`` size the KV cache and must be those ``step_model`` was built for.
    Raises :class:`~headway.core.errors.ConfigError` when not even one request fits.
    """
    if not (isl >= 1 and osl >= 1):
        raise ValueError(f"isl and osl must be >= 1 (got {isl!r}, {osl!r})")
    if not (max_num_seqs >= 1 and max_num_batched_tokens >= 1):
        raise ValueError(
            "max_num_seqs and max_num_batched_tokens must be >= 1 "
            f"(got {max_num_seqs!r}, {max_num_batched_tokens!r})"
        )
    capacity = kv_capacity_tokens(
        model,
        gpu,
        tensor_parallel,
        gpu_memory_utilization=gpu_memory_utilization,
        activation_reserve_bytes=activation_reserve_bytes,
        block_size=block_size,
    )
    tokens_per_seq = isl + osl / 2.0 + block_size / 2.0
    limits: dict[Limit, int] = {
        "max_num_seqs": max_num_seqs,
        "kv_cache": int(capacity // tokens_per_seq),
        "token_budget": int(max_num_batched_tokens // (1.0 + isl / osl)),
    }
    limited_by: Limit = min(limits, key=lambda name: limits[name])
    running = limits[limited_by]
    if running < 1:
        raise ConfigError(
            f"no {isl}/{osl}-token request fits {model.name} on {tensor_parallel}×{gpu.name}: "
            f"KV cache {capacity} tokens, token budget {max_num_batched_tokens}; "
            "add GPUs (tensor_parallel), raise gpu_memory_utilization or the token budget",
            path="$.capacity",
        )
    prefill_tokens = running * isl / osl
    step_s = _mixed_step_time_s(step_model, running, prefill_tokens, isl, osl)
    return ThroughputEstimate(
        output_tokens_per_s=running / step_s,
        running_seqs=running,
        limited_by=limited_by,
        step_time_s=step_s,
        prefill_tokens_per_step=prefill_tokens,
        kv_capacity_tokens=capacity,
        requests_per_s=running / step_s / osl,
    )


def steady_step_time_s(step_model: StepTimeModel, running: int, isl: int, osl: int) -> float:
    """The steady-state step of ``running`` decoding sequences with chunked prefill of the
    prompts that replace the finished ones (``running × isl / osl`` prompt tokens a step),
    as in :func:`max_throughput`."""
    if running < 1 or isl < 1 or osl < 1:
        raise ValueError(f"running, isl and osl must be >= 1 (got {running}, {isl}, {osl})")
    return _mixed_step_time_s(step_model, running, running * isl / osl, isl, osl)


def _mixed_step_time_s(
    step_model: StepTimeModel, running: int, prefill_tokens: float, isl: int, osl: int
) -> float:
    """Step time at a fractional prefill token count: linear between the two integers."""
    lo = math.floor(prefill_tokens)
    frac = prefill_tokens - lo
    t_lo = step_model.step_time_s(_steady_batch(running, lo, isl, osl))
    if frac == 0.0:
        return t_lo
    t_hi = step_model.step_time_s(_steady_batch(running, lo + 1, isl, osl))
    return (1.0 - frac) * t_lo + frac * t_hi


def _steady_batch(running: int, prefill_tokens: int, isl: int, osl: int) -> BatchShape:
    """One steady-state step: ``running`` decodes plus ``prefill_tokens`` of new prompts.

    A whole prompt of ``isl`` tokens, however chunked, has ``isl (isl + 1) / 2`` query-key
    pairs, so ``prefill_tokens`` of prompts carry ``prefill_tokens × (isl + 1) / 2``. Decoding
    sequences hold on average ``isl + osl / 2`` tokens of KV.
    """
    pairs = round(prefill_tokens * (isl + 1) / 2)
    prefill_seqs = math.ceil(prefill_tokens / isl) if prefill_tokens > 0 else 0
    return BatchShape(
        num_prefill_tokens=prefill_tokens,
        prefill_attention_pairs=pairs,
        num_prefill_seqs=prefill_seqs,
        num_decode_seqs=running,
        decode_kv_tokens=round(running * (isl + osl / 2.0)),
    )
