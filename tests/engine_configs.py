"""Scheduler settings (with their KV pool sizes) that exercise every engine path.

Shared by the equivalence tests of decode skipping and of the engine's fast paths, so that
both cover the same ground: chunked prefill, a KV-bound pool that preempts, the priority
policy, small blocks with a long-prefill threshold, the watermark and full-prompt gate,
no chunking, and no prefix caching.
"""

from __future__ import annotations

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
