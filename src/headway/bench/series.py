"""Per-second series of a run's records, for the HTML page."""

from __future__ import annotations

import math

import numpy as np

from headway.bench.records import CallRecords

MAX_POINTS = 600
"""Longer runs are drawn with wider bins."""


def per_second(r: CallRecords) -> dict[str, list[float]]:
    """Scheduled and sent calls per second, and TTFT p50/p99 by scheduled time."""
    scheduled = r.scheduled_s[np.isfinite(r.scheduled_s)]
    if scheduled.size == 0:
        return {}
    end = float(scheduled.max())
    width = max(1.0, math.ceil(end / MAX_POINTS))
    edges = np.arange(0.0, end + width, width)
    if edges.size < 2:
        edges = np.array([0.0, width])
    sent = r.sent_s[np.isfinite(r.sent_s)]
    done = r.completed
    ttft = (r.first_token_s - r.scheduled_s)[done]
    bins = np.digitize(r.scheduled_s[done], edges) - 1
    p50, p99 = [], []
    for i in range(edges.size - 1):
        values = ttft[bins == i]
        p50.append(float(np.percentile(values, 50)) if values.size else math.nan)
        p99.append(float(np.percentile(values, 99)) if values.size else math.nan)
    return {
        "time_s": edges[:-1].tolist(),
        "scheduled": (np.histogram(scheduled, edges)[0] / width).tolist(),
        "sent": (np.histogram(sent, edges)[0] / width).tolist(),
        "ttft_p50_s": p50,
        "ttft_p99_s": p99,
    }
