"""The emulator's ``/metrics``: Prometheus text with vLLM's metric names.

vLLM (v1 engine) names and buckets are kept so that dashboards, gateways and scrapers
written for vLLM read the emulator unchanged. Latencies are in the emulated engine's time
(wall time × ``speedup``), so they compare with ``headway simulate``. The ``headway_emulator_*``
metrics say whether the wall clock kept up.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence

__all__ = ["Counter", "Gauge", "Histogram", "MetricsRegistry"]

TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
"""vLLM's ``vllm:time_to_first_token_seconds`` buckets."""

ITL_BUCKETS_S = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
"""vLLM's ``vllm:inter_token_latency_seconds`` buckets."""

REQUEST_BUCKETS_S = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
"""vLLM's request-latency buckets (e2e, queue time)."""

LAG_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0, 5.0)
"""Buckets of the emulator's lag behind the wall clock (wall seconds)."""


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return "{" + inner + "}"


def _num(value: float) -> str:
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


class Counter:
    """A monotonically increasing count."""

    __slots__ = ("help", "name", "value")

    def __init__(self, name: str, help_text: str) -> None:
        self.name = name
        self.help = help_text
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        """Add ``amount`` (>= 0)."""
        self.value += amount

    def render(self, labels: str) -> list[str]:
        """Exposition lines."""
        return [
            f"# HELP {self.name} {self.help}",
            f"# TYPE {self.name} counter",
            f"{self.name}{labels} {_num(self.value)}",
        ]


class Gauge:
    """A value read when scraped (from a callable) or set."""

    __slots__ = ("help", "name", "read")

    def __init__(self, name: str, help_text: str, read: Callable[[], float]) -> None:
        self.name = name
        self.help = help_text
        self.read = read

    def render(self, labels: str) -> list[str]:
        """Exposition lines."""
        return [
            f"# HELP {self.name} {self.help}",
            f"# TYPE {self.name} gauge",
            f"{self.name}{labels} {_num(self.read())}",
        ]


class Histogram:
    """Cumulative buckets, a sum and a count."""

    __slots__ = ("bounds", "count", "counts", "help", "name", "sum")

    def __init__(self, name: str, help_text: str, bounds: Sequence[float]) -> None:
        self.name = name
        self.help = help_text
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, weight: int = 1) -> None:
        """Record ``value`` ``weight`` times."""
        self.counts[bisect_left(self.bounds, value)] += weight
        self.sum += value * weight
        self.count += weight

    def render(self, labels: dict[str, str]) -> list[str]:
        """Exposition lines."""
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        running = 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            running += n
            le = _labels({**labels, "le": repr(float(bound))})
            lines.append(f"{self.name}_bucket{le} {running}")
        lines.append(f"{self.name}_bucket{_labels({**labels, 'le': '+Inf'})} {self.count}")
        base = _labels(labels)
        lines.append(f"{self.name}_sum{base} {_num(self.sum)}")
        lines.append(f"{self.name}_count{base} {self.count}")
        return lines


class MetricsRegistry:
    """The emulator's metrics, rendered with one set of labels (``model_name``)."""

    def __init__(self, model_name: str) -> None:
        self.labels = {"model_name": model_name}
        self.counters: dict[str, Counter] = {}
        self.gauges: dict[str, Gauge] = {}
        self.histograms: dict[str, Histogram] = {}
        self.finished: dict[str, Counter] = {}
        """``vllm:request_success_total`` by ``finished_reason``."""
        self.infos: dict[str, tuple[str, dict[str, str]]] = {}
        """Info metrics: a gauge of 1 whose labels carry a configuration."""

    def counter(self, name: str, help_text: str) -> Counter:
        """Register a counter."""
        c = self.counters[name] = Counter(name, help_text)
        return c

    def gauge(self, name: str, help_text: str, read: Callable[[], float]) -> None:
        """Register a gauge read at scrape time."""
        self.gauges[name] = Gauge(name, help_text, read)

    def histogram(self, name: str, help_text: str, bounds: Sequence[float]) -> Histogram:
        """Register a histogram."""
        h = self.histograms[name] = Histogram(name, help_text, bounds)
        return h

    def info(self, name: str, help_text: str, labels: dict[str, str]) -> None:
        """Register an info metric: a gauge of 1 labelled with ``labels`` (as vLLM's
        ``vllm:cache_config_info``, without the ``model_name`` label)."""
        self.infos[name] = (help_text, labels)

    def request_finished(self, reason: str) -> None:
        """Count a finished request by reason (``length``, ``stop`` or ``abort``)."""
        c = self.finished.get(reason)
        if c is None:
            c = self.finished[reason] = Counter("vllm:request_success_total", "")
        c.inc()

    def render(self) -> str:
        """The Prometheus text exposition (format 0.0.4)."""
        labels = _labels(self.labels)
        lines: list[str] = []
        for g in self.gauges.values():
            lines.extend(g.render(labels))
        for name, (help_text, info_labels) in self.infos.items():
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} gauge")
            lines.append(f"{name}{_labels(info_labels)} 1")
        for c in self.counters.values():
            lines.extend(c.render(labels))
        lines.append("# HELP vllm:request_success_total Count of finished requests by reason.")
        lines.append("# TYPE vllm:request_success_total counter")
        for reason in (
            "length",
            "stop",
            "abort",
            *sorted(set(self.finished) - {"length", "stop", "abort"}),
        ):
            value = self.finished[reason].value if reason in self.finished else 0.0
            reason_labels = _labels({**self.labels, "finished_reason": reason})
            lines.append(f"vllm:request_success_total{reason_labels} {_num(value)}")
        for h in self.histograms.values():
            lines.extend(h.render(self.labels))
        return "\n".join(lines) + "\n"
