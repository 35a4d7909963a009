"""How one replica schedules its batch: :class:`SchedulerConfig`, read from files.

It lives apart from :mod:`headway.core.engine.scheduler` because that module is compiled
(``[tool.hatch.build.hooks.custom]`` in ``pyproject.toml``) and a compiled module loses a
``msgspec.Struct``'s class options (``frozen``, ``forbid_unknown_fields``).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from headway.core.errors import ConfigError

__all__ = ["SchedulerConfig"]


class SchedulerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How one replica schedules its batch (vLLM ``SchedulerConfig`` and ``CacheConfig``).

    The defaults reproduce vLLM v0.11's V1 engine on an OpenAI server; ``watermark`` and
    ``reserve_full_isl`` are later vLLM behaviours, off by default.
    """

    max_num_seqs: int = 256
    """Most requests in the running set at once (vLLM ``--max-num-seqs``)."""

    max_num_batched_tokens: int = 8192
    """Token budget of one step: prefill chunks plus one token per decoding request
    (vLLM ``--max-num-batched-tokens``)."""

    block_size: int = 16
    """Tokens per KV cache block (vLLM ``--block-size``)."""

    enable_chunked_prefill: bool = True
    """Split prompts across steps to fit the token budget. When off, a waiting request
    whose remaining prompt exceeds the budget left is skipped for this step."""

    enable_prefix_caching: bool = True
    """Keep full blocks cached by hash and reuse them for requests with the same prefix."""

    policy: Literal["fcfs", "priority"] = "fcfs"
    """``fcfs``: waiting requests in arrival order, preempt the newest running one.
    ``priority``: order and preempt by ``(priority, arrival)``, lower priority value first."""

    long_prefill_token_threshold: int = 0
    """If > 0, no request computes more than this many tokens in one step."""

    watermark: float = 0.0
    """Fraction of all blocks kept free when a waiting request is admitted while others
    run (later vLLM ``--watermark``; v0.11 has none, hence 0)."""

    reserve_full_isl: bool = False
    """Admit a waiting request only if blocks for all of its known tokens fit, not only
    its first chunk (later vLLM ``scheduler_reserve_full_isl``, default on there)."""

    def __post_init__(self) -> None:
        _require(self.max_num_seqs >= 1, "max_num_seqs", self.max_num_seqs, "use 1 or more")
        _require(
            self.max_num_batched_tokens >= self.max_num_seqs,
            "max_num_batched_tokens",
            self.max_num_batched_tokens,
            f"it must be >= max_num_seqs ({self.max_num_seqs}) so that every running "
            "request can decode each step; raise it or lower max_num_seqs",
        )
        _require(self.block_size >= 1, "block_size", self.block_size, "vLLM uses 16")
        _require(
            self.policy in ("fcfs", "priority"),
            "policy",
            self.policy,
            "use 'fcfs' or 'priority'",
        )
        _require(
            self.long_prefill_token_threshold >= 0,
            "long_prefill_token_threshold",
            self.long_prefill_token_threshold,
            "use 0 to disable the cap",
        )
        _require(
            self.long_prefill_token_threshold == 0 or self.enable_chunked_prefill,
            "long_prefill_token_threshold",
            self.long_prefill_token_threshold,
            "a per-step cap needs enable_chunked_prefill=true; set it to 0 or enable it",
        )
        _require(
            0.0 <= self.watermark < 1.0,
            "watermark",
            self.watermark,
            "use a fraction in [0, 1), e.g. 0.01",
        )


def _require(ok: bool, field: str, value: object, fix: str) -> None:
    if not ok:
        raise ConfigError(f"scheduler.{field} is invalid (got {value!r}): {fix}", path=f"$.{field}")
