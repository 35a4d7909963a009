"""What a drill reads off the stack: Prometheus counters before and after, gauges over
time, and a process's resident memory."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path

import aiohttp

from headway.gateway.probe import label_value, metric_samples

__all__ = ["Metrics", "rss_mb", "scrape", "scrape_all"]


class Metrics:
    """One scrape: samples by name, each ``(labels, value)``."""

    def __init__(self, text: str = "") -> None:
        self.samples: dict[str, list[tuple[str, float]]] = {}
        for name, labels, value in metric_samples(text):
            self.samples.setdefault(name, []).append((labels, value))

    def total(self, name: str, **labels: str) -> float:
        """Sum of ``name`` over the label sets that match ``labels``."""
        return sum(
            value
            for text, value in self.samples.get(name, ())
            if all(label_value(text, k) == v for k, v in labels.items())
        )

    def by(self, name: str, label: str) -> dict[str, float]:
        """``name`` summed per value of ``label``."""
        out: dict[str, float] = {}
        for text, value in self.samples.get(name, ()):
            key = label_value(text, label) or ""
            out[key] = out.get(key, 0.0) + value
        return out


async def scrape(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None
) -> Metrics:
    """GET ``url``/metrics (an empty :class:`Metrics` when it cannot be read: a dead
    engine has no metrics, and the drill says so through its figures)."""
    try:
        async with (
            asyncio.timeout(5.0),
            session.get(f"{url}/metrics", headers=headers or {}) as response,
        ):
            if response.status != 200:
                return Metrics()
            return Metrics(await response.text())
    except (TimeoutError, aiohttp.ClientError, OSError):
        return Metrics()


async def scrape_all(session: aiohttp.ClientSession, urls: Iterable[str]) -> list[Metrics]:
    """Scrape several at once."""
    return list(await asyncio.gather(*(scrape(session, u) for u in urls)))


def rss_mb(pid: int) -> float | None:
    """Resident memory of process ``pid`` in MiB (Linux ``/proc``), None if unreadable."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
