"""Scheduler settings (with their KV pool sizes) that exercise every engine path.

Shared by the equivalence tests of decode skipping, lazy decoding and the engine's fast
paths, so that they cover the same ground: chunked prefill, a KV-bound pool that preempts,
the priority policy, small blocks with a long-prefill threshold, the watermark and
full-prompt gate, no chunking, and no prefix caching; and the random requests they feed
them (:class:`RequestShapes`).
"""

from __future__ import annotations

import numpy as np

from headway.core.engine.kv import chain_block_hashes
from headway.core.engine.scheduler import SchedulerConfig

CONFIGS = [
    (SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=512), 400),
    (SchedulerConfig(max_num_seqs=32, max_num_batched_tokens=256), 90),  # KV-bound: preempts
    (SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=1024, policy="priority"), 120),
    (SchedulerConfig(max_num_seqs=8, block_size=4, long_prefill_token_threshold=128), 500),
    (SchedulerConfig(max_num_seqs=64, watermark=0.05, reserve_full_isl=True), 100),
    (
        SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=1024, enable_chunked_prefill=False),
        150,
    ),
    (SchedulerConfig(max_num_seqs=16, enable_prefix_caching=False), 60),
]


class RequestShapes:
    """Random requests that fit a scheduler's pool (and, without chunked prefill, its token
    budget): prompt and output lengths, and prompts that share one of three prefixes (the
    prefix cache's hits) or none. The prefixes are drawn from ``rng`` when it is made."""

    def __init__(self, rng: np.random.Generator, config: SchedulerConfig, num_blocks: int):
        self._rng = rng
        self._block_size = config.block_size
        self._capacity = num_blocks * config.block_size
        if not config.enable_chunked_prefill:
            self._capacity = min(self._capacity, config.max_num_batched_tokens)
        self._prefixes = [
            chain_block_hashes(rng.integers(0, 2**62, size=64).tolist()) for _ in range(3)
        ]

    def draw(self) -> tuple[int, int, tuple[int, ...]]:
        """``(prompt tokens, output tokens, block hashes)`` of the next request."""
        rng, capacity = self._rng, self._capacity
        prompt = min(int(rng.integers(1, 600)), capacity - 1)
        output = min(int(rng.integers(1, 250)), capacity - prompt + 1)
        group = int(rng.integers(-1, 3))
        prefix = () if group < 0 else self._prefixes[group][: prompt // self._block_size]
        return prompt, output, tuple(prefix)
