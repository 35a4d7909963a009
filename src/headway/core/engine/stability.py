"""The stability boundary of a continuous-batching engine, from its KV cache.

Nie, Si & Zhou (arXiv 2605.04595) show that a continuous-batching server whose KV cache
holds ``M`` tokens is stable only below

    μ = M / (b̄ · E[g(s, o)])   requests per second,

where ``b̄`` is the mean step time and ``g(s, o)`` a request's cumulative KV demand over its
life: a request of ``s`` prompt tokens holds ``s + k`` tokens at its ``k``-th decode step,
so ``g(s, o) = o·s + o(o + 1)/2`` token-steps. The pool serves ``M / b̄`` token-steps a
second, and each request consumes ``E[g]`` of them; the paper predicts the boundary within
~10% on A100, Llama-3-8B and vLLM v1. ``E[g]`` is taken over the calls as they are, not
over a mean call: long outputs weigh quadratically, which is why a mix of lengths is
unstable earlier than its mean call suggests.

``b̄`` here is the engine model's steady step at the batch a full pool holds (``M`` over
the mean tokens a running request holds, ``E[g] / E[o]``), with the chunked prefill of
the requests that replace finished ones; when ``max_num_seqs`` caps that batch first the
pool never fills, and the replica is compute-bound below μ (:attr:`bound`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from headway.core.engine.capacity import steady_step_time_s
from headway.core.engine.steptime import StepTimeModel

__all__ = ["StabilityBoundary", "kv_demand_token_steps", "stability_boundary"]

Bound = Literal["kv_cache", "max_num_seqs"]


def kv_demand_token_steps(
    input_tokens: npt.ArrayLike, output_tokens: npt.ArrayLike
) -> npt.NDArray[np.float64]:
    """Each request's cumulative KV demand ``g(s, o) = o·s + o(o + 1)/2`` (token-steps)."""
    s = np.asarray(input_tokens, dtype=np.float64)
    o = np.asarray(output_tokens, dtype=np.float64)
    return o * s + o * (o + 1.0) / 2.0


@dataclass(frozen=True, slots=True)
class StabilityBoundary:
    """One replica's stability boundary for a mix of requests."""

    mu_requests_per_s: float
    """μ: the most requests per second the KV pool sustains."""

    capacity_requests_per_s: float
    """What the replica sustains: μ, or less when ``max_num_seqs`` binds first."""

    bound: Bound
    """What limits the batch: the KV pool filling, or the engine's sequence limit."""

    kv_capacity_tokens: int
    """``M``."""

    mean_kv_demand_token_steps: float
    """``E[g(s, o)]``."""

    mean_step_s: float
    """``b̄``: the steady step at :attr:`running_seqs`."""

    running_seqs: int
    """The batch the pool holds (at most ``max_num_seqs``)."""


def stability_boundary(
    step_model: StepTimeModel,
    *,
    kv_capacity_tokens: int,
    input_tokens: npt.ArrayLike,
    output_tokens: npt.ArrayLike,
    max_num_seqs: int,
) -> StabilityBoundary:
    """μ of the module docstring for requests with these token counts (one entry each)."""
    s = np.asarray(input_tokens, dtype=np.float64)
    o = np.maximum(np.asarray(output_tokens, dtype=np.float64), 1.0)
    if s.size == 0 or s.size != o.size:
        raise ValueError(
            f"input_tokens and output_tokens must be non-empty and of one length "
            f"(got {s.size} and {o.size})"
        )
    if kv_capacity_tokens < 1 or max_num_seqs < 1:
        raise ValueError(
            f"kv_capacity_tokens and max_num_seqs must be >= 1 "
            f"(got {kv_capacity_tokens} and {max_num_seqs})"
        )
    demand = float(kv_demand_token_steps(s, o).mean())
    mean_output = float(o.mean())
    held_per_request = demand / mean_output  # tokens a running request holds, time-weighted
    kv_batch = max(1, int(kv_capacity_tokens // held_per_request))
    running = min(kv_batch, max_num_seqs)
    isl = max(1, round(float(s.mean())))
    osl = max(1, round(mean_output))
    step_s = steady_step_time_s(step_model, running, isl, osl)
    mu = kv_capacity_tokens / (step_s * demand)
    bound: Bound = "kv_cache" if kv_batch <= max_num_seqs else "max_num_seqs"
    capacity = mu if bound == "kv_cache" else running / (step_s * mean_output)
    return StabilityBoundary(
        mu_requests_per_s=mu,
        capacity_requests_per_s=min(mu, capacity),
        bound=bound,
        kv_capacity_tokens=kv_capacity_tokens,
        mean_kv_demand_token_steps=demand,
        mean_step_s=step_s,
        running_seqs=running,
    )
