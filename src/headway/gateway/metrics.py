"""The gateway's ``/metrics``: Prometheus text, labelled counters, gauges read at scrape
time, and histograms. Every name starts ``headway_gateway_`` and carries its unit."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence

__all__ = ["Counter", "Histogram", "Registry"]

TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
"""vLLM's TTFT buckets (to 80 s)."""


def _labels(names: Sequence[str], values: Sequence[str]) -> str:
    if not names:
        return ""
    inner = ",".join(f'{k}="{v}"' for k, v in zip(names, values, strict=True))
    return "{" + inner + "}"


def _num(value: float) -> str:
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


class Counter:
    """A counter with labels (``inc(*values)``)."""

    __slots__ = ("help", "labels", "name", "values")

    def __init__(self, name: str, help_text: str, labels: Sequence[str] = ()) -> None:
        self.name = name
        self.help = help_text
        self.labels = tuple(labels)
        self.values: dict[tuple[str, ...], float] = {}

    def inc(self, *label_values: str, amount: float = 1.0) -> None:
        """Add ``amount`` to the series of ``label_values``."""
        self.values[label_values] = self.values.get(label_values, 0.0) + amount

    def get(self, *label_values: str) -> float:
        """The series' value (0 when never incremented)."""
        return self.values.get(label_values, 0.0)

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} counter"]
        if not self.labels and not self.values:
            lines.append(f"{self.name} 0")
        for key, value in sorted(self.values.items()):
            lines.append(f"{self.name}{_labels(self.labels, key)} {_num(value)}")
        return lines


class Gauge:
    """Series read at scrape time from a callable."""

    __slots__ = ("help", "labels", "name", "read")

    def __init__(
        self,
        name: str,
        help_text: str,
        labels: Sequence[str],
        read: Callable[[], Iterable[tuple[tuple[str, ...], float]]],
    ) -> None:
        self.name = name
        self.help = help_text
        self.labels = tuple(labels)
        self.read = read

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} gauge"]
        lines += [f"{self.name}{_labels(self.labels, k)} {_num(v)}" for k, v in self.read()]
        return lines


class Histogram:
    """A histogram with labels."""

    __slots__ = ("bounds", "help", "labels", "name", "series")

    def __init__(
        self, name: str, help_text: str, bounds: Sequence[float], labels: Sequence[str] = ()
    ) -> None:
        self.name = name
        self.help = help_text
        self.bounds = tuple(bounds)
        self.labels = tuple(labels)
        self.series: dict[tuple[str, ...], tuple[list[int], list[float]]] = {}

    def observe(self, value: float, *label_values: str) -> None:
        """Record one value."""
        series = self.series.get(label_values)
        if series is None:
            series = self.series[label_values] = ([0] * (len(self.bounds) + 1), [0.0])
        series[0][bisect_left(self.bounds, value)] += 1
        series[1][0] += value

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        for key, (counts, total) in sorted(self.series.items()):
            running = 0
            base = dict(zip(self.labels, key, strict=True))
            for bound, count in zip((*self.bounds, float("inf")), counts, strict=True):
                running += count
                le = "+Inf" if bound == float("inf") else _num(bound)
                names = (*self.labels, "le")
                lines.append(f"{self.name}_bucket{_labels(names, (*key, le))} {running}")
            label_text = _labels(tuple(base), key)
            lines.append(f"{self.name}_sum{label_text} {_num(total[0])}")
            lines.append(f"{self.name}_count{label_text} {running}")
        return lines


class Registry:
    """The metrics of one gateway."""

    def __init__(self) -> None:
        self.items: list[Counter | Gauge | Histogram] = []

    def counter(self, name: str, help_text: str, labels: Sequence[str] = ()) -> Counter:
        metric = Counter(name, help_text, labels)
        self.items.append(metric)
        return metric

    def gauge(
        self,
        name: str,
        help_text: str,
        labels: Sequence[str],
        read: Callable[[], Iterable[tuple[tuple[str, ...], float]]],
    ) -> Gauge:
        metric = Gauge(name, help_text, labels, read)
        self.items.append(metric)
        return metric

    def histogram(
        self, name: str, help_text: str, bounds: Sequence[float], labels: Sequence[str] = ()
    ) -> Histogram:
        metric = Histogram(name, help_text, bounds, labels)
        self.items.append(metric)
        return metric

    def render(self) -> str:
        """The Prometheus text exposition."""
        lines: list[str] = []
        for metric in self.items:
            lines += metric.render()
        return "\n".join(lines) + "\n"
