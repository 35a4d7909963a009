"""vLLM's own split of a request's time to first token: the engine core's part and the
frontend's.

vLLM exports ``vllm:time_to_first_token_seconds`` on its API server's clock (from the
request's arrival there to its first token processed there) and, on the engine core's,
``vllm:request_queue_time_seconds`` (queued to scheduled) and
``vllm:request_prefill_time_seconds`` (scheduled to the first token). Their sums and
counts, read before and after some work, give the means per request over it. The engine
model simulates the engine core's part; the rest (``frontend_s``: parsing, tokenising,
the hops to and from the engine core, detokenising) is the API server's, which does not
occupy the engine. ``headway calibrate`` measures a lone request's TTFT from the client,
so the frontend's time lands in the engine's per-request step cost; the split says how
much (3.3 ms of 32-37 against the real tier's vLLM), and under load how it grows
(``benchmarks/real_engine.py``; docs/real-engine.md, run 3).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from headway.gateway.probe import metric_samples

__all__ = ["TTFT_HISTOGRAMS", "TtftSplit", "histogram_totals", "ttft_split"]

TTFT_HISTOGRAMS: Final = {
    "ttft": "vllm:time_to_first_token_seconds",
    "queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
}
"""The three histograms, by their part of the split."""

SERIES: Final = tuple(f"{name}_{s}" for name in TTFT_HISTOGRAMS.values() for s in ("sum", "count"))
"""The exposition series read: each histogram's ``_sum`` and ``_count``."""


@dataclass(frozen=True, slots=True)
class TtftSplit:
    """Means per request over some work, seconds."""

    vllm_ttft_mean_s: float
    """vLLM's own TTFT (its API server's clock)."""
    engine_ttft_mean_s: float
    """The engine core's part: queue + prefill."""

    @property
    def frontend_s(self) -> float:
        """The rest: the API server's part."""
        return self.vllm_ttft_mean_s - self.engine_ttft_mean_s


def histogram_totals(text: str) -> dict[str, float] | None:
    """:data:`SERIES` from Prometheus exposition ``text``, summed over label sets; None
    when the engine does not export all three histograms."""
    totals: dict[str, float] = {}
    for name, _, value in metric_samples(text):
        if name in SERIES:
            totals[name] = totals.get(name, 0.0) + value
    return totals if len(totals) == len(SERIES) else None


def ttft_split(before: Mapping[str, float], after: Mapping[str, float]) -> TtftSplit | None:
    """The means between two readings of :func:`histogram_totals`; None when one of the
    histograms counted no request in between."""
    means: dict[str, float] = {}
    for part, name in TTFT_HISTOGRAMS.items():
        count = after[f"{name}_count"] - before[f"{name}_count"]
        if count <= 0:
            return None
        means[part] = (after[f"{name}_sum"] - before[f"{name}_sum"]) / count
    return TtftSplit(means["ttft"], means["queue"] + means["prefill"])
