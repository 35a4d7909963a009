"""vLLM's own split of a request's time to first token: the engine core's part and the
frontend's.

vLLM exports ``vllm:time_to_first_token_seconds`` on its API server's clock (from the
request's arrival there to its first token processed there) and, on the engine core's,
``vllm:request_queue_time_seconds`` (queued to scheduled) and
``vllm:request_prefill_time_seconds`` (scheduled to the first token). Their sums and
counts, read before and after some work, give the means per request over it.

The rest, ``frontend_s``, is not all the API server's: vLLM records a request as queued
when the engine core's busy loop adds it to the scheduler, between two steps
(``Scheduler.add_request``, ``vllm/v1/core/sched/scheduler.py``), so a request that
reaches the engine core while a step runs waits out that step outside the queue time. The
engine model does simulate that wait (a request joins at the next step); it does not
simulate the API server's own work (parsing, tokenising, the hops to and from the engine
core, detokenising), which does not occupy the engine. The part of the engine core's time
that excludes every wait is the prefill time (scheduled to first token,
``prefill_mean_s``): that one the simulated first token less the admission compares with
like for like. ``headway calibrate`` measures a lone request's TTFT from the client, so
the API server's time lands in the engine's per-request step cost; on an idle engine the
split says how much (3.3 ms of 32-37 against the real tier's vLLM).
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
    prefill_mean_s: float = 0.0
    """Of that, the prefill: scheduled to the first token (no wait of any kind)."""

    @property
    def frontend_s(self) -> float:
        """The rest: the API server's part and the wait for the step in progress."""
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
    return TtftSplit(means["ttft"], means["queue"] + means["prefill"], means["prefill"])
