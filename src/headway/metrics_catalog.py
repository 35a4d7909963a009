"""Every metric of the emulator and the gateway, declared as data, and the per-server
registry built from those declarations on ``prometheus_client``.

A declaration says what a scraper sees: the exposed name (with its unit; counters end in
``_total``), the kind, the help text, the label names and a histogram's buckets. The
emulator keeps vLLM's names (``vllm:...``) and buckets, so dashboards, gateways and
scrapers written for vLLM read it unchanged. Each server builds its own
:class:`Metrics` (several servers share one test process, so nothing is registered in
``prometheus_client``'s global registry). Metrics ``read_at_scrape`` take their values from
a function when scraped (queue depths, upstream states, the scheduler's prefix-cache
counts); the others are updated in place by the request path.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

__all__ = [
    "CONTENT_TYPE",
    "EMULATOR",
    "GATEWAY",
    "GATEWAY_POOL",
    "GATEWAY_SHARED_BUDGETS",
    "GATEWAY_STATIC_UPSTREAMS",
    "Labelled",
    "MetricSpec",
    "Metrics",
    "Series",
    "TokenHistogram",
]

CONTENT_TYPE = CONTENT_TYPE_LATEST
"""The ``Content-Type`` of ``/metrics``."""

Kind = Literal["counter", "gauge", "histogram"]

Series = Callable[[], Iterable[tuple[tuple[str, ...], float]]]
"""A scrape-time reader: ``(label values, value)`` per series."""


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric as a scraper sees it."""

    name: str
    """The exposed name (a counter's ends in ``_total``)."""
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    buckets_s: tuple[float, ...] = ()
    """A histogram's upper bounds (``+Inf`` is added)."""
    read_at_scrape: bool = False
    """Its series are read from a function at each scrape instead of updated in place."""
    per_token: bool = False
    """A histogram observed for every generated token: counted by hand, with weighted
    observations (:class:`TokenHistogram`). ``benchmarks/metrics_cost.py`` measured
    ``prometheus_client``'s ``observe`` at about 0.7 µs a call, so its two per-token
    histograms alone took a 16-token emulator request to 24 µs of metrics, past the
    20 µs the project allows before hand-writing one."""

    def __post_init__(self) -> None:
        if (self.kind == "counter") != self.name.endswith("_total"):
            raise ValueError(f"{self.name}: counters, and only counters, end in _total")
        if (self.kind == "histogram") != bool(self.buckets_s):
            raise ValueError(f"{self.name}: histograms, and only histograms, have buckets")
        if self.kind == "histogram" and self.read_at_scrape:
            raise ValueError(f"{self.name}: a histogram cannot be read at scrape time")
        if self.per_token and self.kind != "histogram":
            raise ValueError(f"{self.name}: only a histogram is counted per token")


def _counter(name: str, help_text: str, *labels: str, read: bool = False) -> MetricSpec:
    return MetricSpec(name, "counter", help_text, labels, read_at_scrape=read)


def _gauge(name: str, help_text: str, *labels: str) -> MetricSpec:
    return MetricSpec(name, "gauge", help_text, labels, read_at_scrape=True)


def _histogram(name: str, help_text: str, buckets_s: Sequence[float], *labels: str) -> MetricSpec:
    return MetricSpec(name, "histogram", help_text, labels, tuple(buckets_s))


def _token_histogram(
    name: str, help_text: str, buckets_s: Sequence[float], *labels: str
) -> MetricSpec:
    return MetricSpec(name, "histogram", help_text, labels, tuple(buckets_s), per_token=True)


# -- the emulator (vLLM's names) -------------------------------------------------------------

VLLM_TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
"""vLLM's ``vllm:time_to_first_token_seconds`` buckets."""

VLLM_ITL_BUCKETS_S = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
"""vLLM's ``vllm:inter_token_latency_seconds`` buckets."""

VLLM_REQUEST_BUCKETS_S = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
"""vLLM's request-latency buckets (e2e, queue time)."""

LAG_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0, 5.0)
"""Buckets of the emulator's lag behind the wall clock (wall seconds)."""

CACHE_CONFIG_LABELS = (
    "block_size", "cache_dtype", "enable_prefix_caching", "num_gpu_blocks",
    "num_gpu_blocks_override", "engine",
)  # fmt: skip
"""The fields of ``vllm:cache_config_info`` (vLLM's CacheConfig, each as ``str(value)``)."""

_M = "model_name"

EMULATOR: tuple[MetricSpec, ...] = (
    _gauge("vllm:num_requests_running", "Number of requests in model execution batches.", _M),
    _gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", _M),
    _gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", _M),
    _gauge("headway_emulator_lag_seconds",
           "Wall seconds by which the last step's tokens went out after their due time.", _M),
    _gauge("headway_emulator_lag_max_seconds", "Largest delivery lag so far (wall seconds).",
           _M),
    _gauge("headway_emulator_speedup", "Emulated engine seconds per wall-clock second.", _M),
    _gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
           *CACHE_CONFIG_LABELS),
    _counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.", _M),
    _counter("vllm:generation_tokens_total", "Number of generation tokens processed.", _M),
    _counter("vllm:num_preemptions_total", "Cumulative number of preemptions.", _M),
    _counter("headway_emulator_steps_total", "Engine steps run.", _M),
    _counter("vllm:prefix_cache_queries_total",
             "Prefix cache queries, in terms of number of queried tokens.", _M, read=True),
    _counter("vllm:prefix_cache_hits_total",
             "Prefix cache hits, in terms of number of cached tokens.", _M, read=True),
    _counter("headway_emulator_late_steps_total",
             "Steps whose tokens went out more than 1 ms (wall) late.", _M),
    _counter("headway_emulator_http_requests_total", "Generation requests received.", _M),
    _counter("headway_emulator_client_errors_total",
             "Requests refused as client mistakes (4xx).", _M),
    _counter("headway_emulator_deadline_aborts_total",
             "Requests aborted when their x-headway-budget-ms ran out.", _M),
    _counter("vllm:request_success_total", "Count of finished requests by reason.",
             _M, "finished_reason"),
    _histogram("vllm:time_to_first_token_seconds",
               "Histogram of time to first token in seconds.", VLLM_TTFT_BUCKETS_S, _M),
    _token_histogram("vllm:inter_token_latency_seconds",
                     "Histogram of inter-token latency in seconds.", VLLM_ITL_BUCKETS_S, _M),
    _token_histogram("vllm:time_per_output_token_seconds",
                     "Histogram of time per output token in seconds (as ITL).",
                     VLLM_ITL_BUCKETS_S, _M),
    _histogram("vllm:e2e_request_latency_seconds",
               "Histogram of end-to-end request latency in seconds.", VLLM_REQUEST_BUCKETS_S,
               _M),
    _histogram("vllm:request_queue_time_seconds",
               "Histogram of time spent waiting in the queue in seconds.",
               VLLM_REQUEST_BUCKETS_S, _M),
    _histogram("headway_emulator_step_lag_seconds", "Delivery lag of each step (wall seconds).",
               LAG_BUCKETS_S, _M),
)  # fmt: skip
"""The emulator's metrics. Latencies are in the emulated engine's time (wall time ×
``speedup``), so they compare with ``headway simulate``; ``headway_emulator_*`` say
whether the wall clock kept up."""

FINISHED_REASONS = ("length", "stop", "abort")
"""``vllm:request_success_total``'s reasons, exposed (at 0) from the start."""

# -- the gateway ------------------------------------------------------------------------------

GATEWAY_TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
"""vLLM's TTFT buckets (to 80 s): the gateway's upstream TTFT and queue wait."""

GATEWAY: tuple[MetricSpec, ...] = (
    _counter("headway_gateway_requests_offered_total", "Requests offered, by tenant.",
             "tenant"),
    _counter("headway_gateway_admissions_total",
             "Requests admitted at once (admit) or queued (enqueue), by band.",
             "decision", "band"),
    _counter("headway_gateway_sheds_total", "Requests refused, by reason and status.",
             "reason", "status"),
    _counter("headway_gateway_retry_after_issued_total",
             "Refusals that carried a Retry-After."),
    _counter("headway_gateway_retry_after_seconds_total",
             "Sum of the Retry-After values issued."),
    _counter("headway_gateway_cancellations_total",
             "Client disconnects, by stage (queued, in_flight) and mode.", "stage", "mode"),
    _counter("headway_gateway_requests_failed_total",
             "Admitted requests that ended failed (an upstream error, a stream cut short), by "
             "tenant: offered = completed + sheds + cancellations + deadline cancels + failed "
             "+ in flight (+ receipts accepted).", "tenant"),
    _counter("headway_gateway_deadline_cancels_total",
             "Requests whose deadline passed in flight: cancelled upstream (the engine frees "
             "their sequence), by mode.", "mode"),
    _counter("headway_gateway_upstream_retries_total", "Attempts moved to another upstream."),
    _counter("headway_gateway_fallbacks_total",
             "Calls sent to a fallback route, by the route asked for and the one used.",
             "route", "fallback"),
    _counter("headway_gateway_upstream_errors_total", "Failed upstream attempts.", "upstream"),
    _counter("headway_gateway_release_route_backs_total",
             "Times a release (an upstream revision) was routed back: its errors or latency "
             "spiked against another release's, so unpinned calls avoid it for a hold.",
             "revision"),
    _counter("headway_gateway_completed_total",
             "Requests answered 2xx by an upstream, by tenant.", "tenant"),
    _counter("headway_gateway_goodput_requests_total",
             "Completed requests that met their deadline (or had none), by tenant.", "tenant"),
    _counter("headway_gateway_completion_tokens_total",
             "Completion tokens of completed requests (from usage when sent).", "tenant"),
    _counter("headway_gateway_client_errors_total", "Requests refused as malformed, by status.",
             "status"),
    _histogram("headway_gateway_upstream_ttft_seconds",
               "Upstream time to first byte of the answer (streaming: first SSE event), "
               "seconds.", GATEWAY_TTFT_BUCKETS_S, "upstream"),
    _histogram("headway_gateway_queue_wait_seconds",
               "Time from arrival to dispatch of a dispatched request, by tenant (0 when a "
               "slot was free at once).", GATEWAY_TTFT_BUCKETS_S, "tenant"),
    _gauge("headway_gateway_queue_depth_requests", "Requests waiting, by band.", "band"),
    _gauge("headway_gateway_requests_in_system",
           "Requests offered and not yet ended (queued or in flight): Little's L."),
    _histogram("headway_gateway_request_duration_seconds",
               "Time from offer to end of every offered request (shed ones too): Little's W.",
               VLLM_REQUEST_BUCKETS_S),
    _gauge("headway_gateway_tenant_queue_depth_requests", "Requests waiting, by tenant.",
           "tenant"),
    _gauge("headway_gateway_tenant_dispatched_requests",
           "Requests holding a dispatch slot, by tenant (capped by its slot share while "
           "others are active).", "tenant"),
    _gauge("headway_gateway_slot_share_holds",
           "Requests that admission would have dispatched at once, queued because their "
           "tenant held its slot share (a counter)."),
    _gauge("headway_gateway_retry_budget_left", "Retries the budget still allows now."),
    _gauge("headway_gateway_tpot_seconds",
           "Time per output token the deadline estimate uses (the prior, refined by measured "
           "answers)."),
    _gauge("headway_gateway_upstream_outstanding_requests",
           "Requests dispatched to each upstream.", "upstream"),
    _gauge("headway_gateway_release_routed_back",
           "1 while unpinned calls avoid the release (routed back).", "revision"),
    _counter("headway_gateway_degraded_requests_total",
             "Requests a degraded mode changed at arrival, by band, mode and change "
             "(max_tokens: output capped, context: prompt trimmed, optional_shed: shed as "
             "optional); a request capped and trimmed counts in both.",
             "band", "mode", "change"),
    _gauge("headway_gateway_degraded_mode_active", "1 while the degraded mode is on.",
           "mode"),
    _counter("headway_gateway_degraded_mode_changes_total",
             "Times a degraded mode turned on or off (to), by pressure or the admin API.",
             "mode", "to"),
)  # fmt: skip
"""The gateway's metrics, with or without a pool."""

GATEWAY_STATIC_UPSTREAMS: tuple[MetricSpec, ...] = (
    _gauge("headway_gateway_upstream_ready", "1 while an upstream is routable.", "upstream"),
)
"""Without ``pool:`` (with one, :data:`GATEWAY_POOL` has a richer gauge of that name)."""

GATEWAY_SHARED_BUDGETS: tuple[MetricSpec, ...] = (
    _gauge("headway_gateway_shared_budgets_healthy",
           "1 while Redis answers; 0 while serving on local shares."),
    _gauge("headway_gateway_shared_budgets_round_trips", "Redis round trips made."),
)  # fmt: skip
"""With ``--redis``."""

GATEWAY_TICKETS: tuple[MetricSpec, ...] = (
    _gauge("headway_gateway_tickets_outstanding", "Retry tickets issued and not used."),
)
"""Last of the gateway's own (after the shared budgets', as exposed since they were added)."""

GATEWAY_RECEIPTS: tuple[MetricSpec, ...] = (
    _counter(
        "headway_gateway_receipts_accepted_total",
        "Requests deferred: answered 202 with a receipt instead of shed, by tenant and "
        "the shed reason deferred.",
        "tenant",
        "reason",
    ),
    _counter(
        "headway_gateway_receipts_completed_total",
        "Receipts whose result was written completed (2xx), by tenant.",
        "tenant",
    ),
    _counter(
        "headway_gateway_receipts_failed_total",
        "Receipts whose result was written failed (a non-2xx answer), by tenant.",
        "tenant",
    ),
    _counter(
        "headway_gateway_receipts_expired_total",
        "Receipts that passed their retention (prompt and result deleted).",
    ),
    _counter(
        "headway_gateway_receipts_reclaimed_total",
        "Receipts taken over after their claim lapsed (the instance running them "
        "died): run again, never completed twice.",
    ),
    _gauge(
        "headway_gateway_receipts_depth",
        "Receipts in the store not yet finished, by state (queued, running), as of the "
        "runner's last look.",
        "state",
    ),
)
"""With ``receipts`` in the config (after the gateway's own)."""

_UR = ("upstream", "revision")

GATEWAY_POOL: tuple[MetricSpec, ...] = (
    _gauge("headway_gateway_upstream_ready", "1 if the upstream takes new requests.", *_UR),
    _gauge("headway_gateway_upstream_state", "1 for the upstream's current state.",
           "upstream", "state"),
    _counter("headway_gateway_upstream_probes_total", "Readiness probes by verdict.",
             "upstream", "outcome", read=True),
    _gauge("headway_gateway_upstream_inflight_requests",
           "Requests the gateway has in flight on it.", *_UR),
    _gauge("headway_gateway_upstream_running_requests",
           "vllm:num_requests_running at the last scrape.", *_UR),
    _gauge("headway_gateway_upstream_waiting_requests",
           "vllm:num_requests_waiting at the last scrape.", *_UR),
    _gauge("headway_gateway_upstream_kv_usage_ratio",
           "vllm:kv_cache_usage_perc at the last scrape (0-1).", *_UR),
    _gauge("headway_gateway_upstream_probe_latency_seconds",
           "Latency of the last readiness probe.", *_UR),
)  # fmt: skip
"""With ``pool:``: the upstream pool's view of each engine (read from the pool)."""


GATEWAY_AUTOSCALER: tuple[MetricSpec, ...] = (
    _gauge("headway_gateway_desired_replicas",
           "Replicas the core autoscaler wants for the pool (a route's upstreams, or "
           "default); KEDA or an HPA scales on it.", "pool"),
)  # fmt: skip
"""With ``autoscaler:`` (:mod:`headway.gateway.desired_replicas`)."""

DESIRED_REPLICAS_METRIC = GATEWAY_AUTOSCALER[0].name
"""The gauge a KEDA ScaledObject or an HPA external metric scales on."""


def gateway_specs(
    *, pool: bool, shared_budgets: bool, receipts: bool = False, autoscaler: bool = False
) -> tuple[MetricSpec, ...]:
    """The gateway's metrics in exposition order, for a gateway with or without a pool,
    shared budgets, receipts and an autoscaler."""
    return (
        *GATEWAY,
        *(() if pool else GATEWAY_STATIC_UPSTREAMS),
        *(GATEWAY_SHARED_BUDGETS if shared_budgets else ()),
        *GATEWAY_TICKETS,
        *(GATEWAY_RECEIPTS if receipts else ()),
        *(GATEWAY_POOL if pool else ()),
        *(GATEWAY_AUTOSCALER if autoscaler else ()),
    )


# -- the registry ----------------------------------------------------------------------------


class _ReadAtScrape(Collector):
    """A metric whose series come from a function at each scrape."""

    def __init__(self, spec: MetricSpec, fixed: Mapping[str, str]) -> None:
        self.spec = spec
        self.fixed = {k: v for k, v in fixed.items() if k in spec.labels}
        """Label values filled in for every series (the reader returns the others)."""
        self.free = tuple(k for k in spec.labels if k not in self.fixed)
        self.read: Series | None = None

    def _family(self) -> CounterMetricFamily | GaugeMetricFamily:
        spec = self.spec
        if spec.kind == "counter":
            return CounterMetricFamily(spec.name, spec.help, labels=spec.labels)
        return GaugeMetricFamily(spec.name, spec.help, labels=spec.labels)

    def describe(self) -> Iterable[Metric]:
        return [self._family()]

    def collect(self) -> Iterable[Metric]:
        if self.read is None:
            raise LookupError(f"{self.spec.name}: no reader was given")
        family = self._family()
        labels, fixed, free = self.spec.labels, self.fixed, self.free
        for values, value in self.read():
            if fixed:
                named = fixed | dict(zip(free, values, strict=True))
                values = tuple(named[k] for k in labels)
            family.add_metric(values, value)
        return [family]


class TokenHistogram(Collector):
    """A histogram of fixed labels counted by hand, observations weighted (``observe(value,
    count)``: ``count`` tokens with the same gap in one call), exposed as
    ``prometheus_client`` writes a histogram (cumulative ``le`` buckets, ``+Inf``, count,
    sum)."""

    def __init__(self, spec: MetricSpec, label_values: tuple[str, ...]) -> None:
        self.spec = spec
        self.label_values = label_values
        self._bounds = list(spec.buckets_s)
        self._les = [floatToGoString(b) for b in spec.buckets_s] + ["+Inf"]  # type: ignore[no-untyped-call]
        self.counts = [0] * (len(self._bounds) + 1)
        """Observations per bucket, not cumulative (the last: above every bound)."""
        self.sum = 0.0

    def observe(self, value: float, count: int = 1) -> None:
        """``count`` observations of ``value``."""
        self.counts[bisect_left(self._bounds, value)] += count
        self.sum += value * count

    def describe(self) -> Iterable[Metric]:
        return [HistogramMetricFamily(self.spec.name, self.spec.help, labels=self.spec.labels)]

    def collect(self) -> Iterable[Metric]:
        family = HistogramMetricFamily(self.spec.name, self.spec.help, labels=self.spec.labels)
        buckets, total = [], 0
        for le, n in zip(self._les, self.counts, strict=True):
            total += n
            buckets.append((le, float(total)))
        family.add_metric(list(self.label_values), buckets, self.sum)
        return [family]


class _WithoutCreated(Collector):
    """The registry's families without ``*_created`` series (prometheus_client adds one to
    each counter and histogram; neither vLLM's scrapers nor ours read them, and they would
    be families that no declaration names)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            created = family.name + "_created"
            family.samples = [s for s in family.samples if s.name != created]
            yield family


_Metric = TypeVar("_Metric", Counter, Histogram)


class Labelled(Generic[_Metric]):
    """A labelled metric's series by label values, from a dict after the first time:
    ``prometheus_client``'s ``labels()`` validates and takes a lock on every call, several
    times the cost of the update itself on the request path."""

    __slots__ = ("_metric", "_series")

    def __init__(self, metric: _Metric) -> None:
        self._metric: _Metric = metric
        self._series: dict[tuple[str, ...], _Metric] = {}

    def __call__(self, *label_values: str) -> _Metric:
        """The series of ``label_values`` (in the declared order)."""
        series = self._series.get(label_values)
        if series is None:
            series = self._series[label_values] = self._metric.labels(*label_values)
        return series


class Metrics:
    """One server's metrics: a ``CollectorRegistry`` of ``specs``, in their order.

    ``fixed`` gives label values common to every series (the emulator's ``model_name``):
    :meth:`counter` and :meth:`histogram` fill them in (a metric with no other label has
    its one series from the start), and scrape-time readers leave them out of the label
    values they return.
    """

    def __init__(self, specs: Iterable[MetricSpec], fixed: Mapping[str, str] | None = None):
        self.specs = tuple(specs)
        self.fixed = dict(fixed or {})
        self.registry = CollectorRegistry()
        self._updated: dict[str, Counter | Histogram] = {}
        self._labels: dict[str, tuple[str, ...]] = {}
        self._read: dict[str, _ReadAtScrape] = {}
        self._tokens: dict[str, TokenHistogram] = {}
        self._exposition = _WithoutCreated(self.registry)
        for spec in self.specs:
            if spec.per_token:
                if not set(spec.labels) <= set(self.fixed):
                    raise ValueError(f"{spec.name}: a per-token histogram has fixed labels only")
                values = tuple(self.fixed[k] for k in spec.labels)
                self._tokens[spec.name] = TokenHistogram(spec, values)
                self.registry.register(self._tokens[spec.name])
                self._labels[spec.name] = spec.labels
                continue
            if spec.read_at_scrape:
                collector = self._read[spec.name] = _ReadAtScrape(spec, self.fixed)
                self.registry.register(collector)
            elif spec.kind == "counter":
                self._updated[spec.name] = Counter(
                    spec.name, spec.help, spec.labels, registry=self.registry
                )
            else:
                self._updated[spec.name] = Histogram(
                    spec.name, spec.help, spec.labels, registry=self.registry,
                    buckets=spec.buckets_s,
                )  # fmt: skip
            self._labels[spec.name] = spec.labels
            if not spec.read_at_scrape and spec.labels and set(spec.labels) <= set(self.fixed):
                self._bound(spec.name, {})  # its one series, exposed from the start at 0

    def _bound(self, name: str, values: Mapping[str, str]) -> Counter | Histogram:
        metric, labels = self._updated[name], self._labels[name]
        given = {k: v for k, v in self.fixed.items() if k in labels} | dict(values)
        if not given:
            return metric
        if set(given) != set(labels):
            raise ValueError(f"{name}: give all of its labels {labels} or none")
        return metric.labels(**given)

    def counter(self, name: str, **label_values: str) -> Counter:
        """The declared counter ``name``: a series when its labels are all given (or
        fixed), which is then exposed from now on at 0; else the labelled family."""
        metric = self._bound(name, label_values)
        if not isinstance(metric, Counter):
            raise TypeError(f"{name} is not a counter")
        return metric

    def histogram(self, name: str, **label_values: str) -> Histogram:
        """The declared histogram ``name`` (as :meth:`counter`)."""
        metric = self._bound(name, label_values)
        if not isinstance(metric, Histogram):
            raise TypeError(f"{name} is not a histogram")
        return metric

    def token_histogram(self, name: str) -> TokenHistogram:
        """The declared per-token histogram ``name`` (its one series)."""
        return self._tokens[name]

    def counter_series(self, name: str) -> Labelled[Counter]:
        """The declared labelled counter ``name``, its series looked up by label values."""
        return Labelled(self.counter(name))

    def histogram_series(self, name: str) -> Labelled[Histogram]:
        """The declared labelled histogram ``name`` (as :meth:`counter_series`)."""
        return Labelled(self.histogram(name))

    def read(self, name: str, series: Series) -> None:
        """Read the metric ``name`` from ``series`` at each scrape."""
        self._read[name].read = series

    def read_value(self, name: str, value: Callable[[], float]) -> None:
        """Read the single series of ``name`` (all its labels fixed, or none) from ``value``."""
        self.read(name, lambda: [((), value())])

    def unread(self) -> list[str]:
        """The scrape-time metrics still without a reader."""
        return [name for name, c in self._read.items() if c.read is None]

    def sample(self, name: str, **label_values: str) -> float | None:
        """The current value of the sample ``name`` (a histogram's ``*_count``, ...) with
        ``label_values`` and the fixed labels it has; None when there is none."""
        for family in {name, *(name.removesuffix(s) for s in ("_bucket", "_count", "_sum"))}:
            collector = (
                self._updated.get(family) or self._read.get(family) or self._tokens.get(family)
            )
            if collector is None:
                continue
            labels = self._labels[family]
            want = {k: v for k, v in self.fixed.items() if k in labels} | label_values
            for metric in collector.collect():
                for s in metric.samples:
                    if s.name == name and s.labels == want:
                        return s.value
        return None

    def render(self) -> bytes:
        """The Prometheus text exposition (:data:`CONTENT_TYPE`)."""
        return generate_latest(self._exposition)
