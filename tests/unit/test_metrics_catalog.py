"""The metric declarations and the registries built from them: every declared family is
exposed under its declared name and kind (no ``_created`` extras, counters not renamed),
vLLM's names keep their colons, buckets are cumulative, fixed labels are filled in, and a
metric read at scrape time without a reader is an error, not a silent gap."""

from __future__ import annotations

import itertools

import pytest
from prometheus_client.parser import text_string_to_metric_families

from headway.metrics_catalog import (
    EMULATOR,
    FINISHED_REASONS,
    Metrics,
    MetricSpec,
    Series,
    gateway_specs,
)


def _types(text: str) -> dict[str, str]:
    """Family name to kind, from the ``# TYPE`` lines (as a scraper sees them)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            assert name not in found, name
            found[name] = kind
    return found


def _sample_names(text: str) -> set[str]:
    return {
        line.split("{", 1)[0].split(" ", 1)[0]
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def _allowed(specs: tuple[MetricSpec, ...]) -> set[str]:
    names = set()
    for spec in specs:
        names.add(spec.name)
        if spec.kind == "histogram":
            names |= {f"{spec.name}_bucket", f"{spec.name}_sum", f"{spec.name}_count"}
    return names


def _one_series(spec: MetricSpec, fixed: dict[str, str]) -> Series:
    free = tuple(f"{k}-value" for k in spec.labels if k not in fixed)
    return lambda: [(free, 2.0)]


def _built(specs: tuple[MetricSpec, ...], fixed: dict[str, str] | None = None) -> Metrics:
    metrics = Metrics(specs, fixed)
    for spec in specs:
        if spec.read_at_scrape:
            metrics.read(spec.name, _one_series(spec, fixed or {}))
    return metrics


SERVERS = {
    "emulator": EMULATOR,
    **{
        f"gateway pool={pool} shared={shared} receipts={receipts} autoscaler={scaler}": (
            gateway_specs(pool=pool, shared_budgets=shared, receipts=receipts, autoscaler=scaler)
        )
        for pool, shared, receipts, scaler in itertools.product((False, True), repeat=4)
    },
}


@pytest.mark.parametrize("server", list(SERVERS))
def test_exposition_has_exactly_the_declared_families(server: str) -> None:
    specs = SERVERS[server]
    names = [s.name for s in specs]
    assert len(names) == len(set(names)), "a name declared twice for one server"
    fixed = {"model_name": "llama"} if server == "emulator" else None
    text = _built(specs, fixed).render().decode()
    assert _types(text) == {s.name: s.kind for s in specs}
    exposed = _sample_names(text)
    assert exposed <= _allowed(specs), exposed - _allowed(specs)
    assert not any(n.endswith("_created") for n in exposed)
    # every family read at scrape time, and every unlabelled one, has a sample
    for spec in specs:
        if spec.read_at_scrape or not set(spec.labels) - set(fixed or {}):
            wanted = spec.name + ("_count" if spec.kind == "histogram" else "")
            assert wanted in exposed, spec.name


def test_counter_names_end_in_total_and_only_counters_do() -> None:
    for spec in SERVERS["gateway pool=True shared=True receipts=True autoscaler=True"] + EMULATOR:
        assert spec.name.endswith("_total") == (spec.kind == "counter"), spec.name
    with pytest.raises(ValueError, match="_total"):
        MetricSpec("x_seconds", "counter", "X.")
    with pytest.raises(ValueError, match="buckets"):
        MetricSpec("x_seconds", "histogram", "X.")


def test_emulator_series_carry_the_model_and_vllm_names() -> None:
    metrics = _built(EMULATOR, {"model_name": "llama"})
    for reason in FINISHED_REASONS:
        metrics.counter("vllm:request_success_total", finished_reason=reason)
    ttft = metrics.histogram("vllm:time_to_first_token_seconds")
    for value in (0.05, 0.5, 0.5, 3000.0):
        ttft.observe(value)
    metrics.counter("vllm:request_success_total", finished_reason="length").inc()
    metrics.counter("vllm:prompt_tokens_total").inc(7)
    text = metrics.render().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    hist = families["vllm:time_to_first_token_seconds"]
    buckets = {float(s.labels["le"]): s.value for s in hist.samples if s.name.endswith("_bucket")}
    assert buckets[0.04] == 0 and buckets[0.06] == 1 and buckets[0.5] == 3
    assert buckets[2560.0] == 3 and buckets[float("inf")] == 4
    assert all(s.labels["model_name"] == "llama" for s in hist.samples)
    success = {
        s.labels["finished_reason"]: s.value
        for s in families["vllm:request_success"].samples
        if s.labels.get("model_name") == "llama"
    }
    assert success == {"length": 1.0, "stop": 0.0, "abort": 0.0}
    assert 'vllm:prompt_tokens_total{model_name="llama"} 7.0' in text
    assert metrics.sample("vllm:time_to_first_token_seconds_count") == 4
    assert metrics.sample("vllm:prompt_tokens_total") == 7
    # a scrape-time gauge gets the fixed label filled in
    assert 'vllm:num_requests_running{model_name="llama"} 2.0' in text


def test_gateway_label_values_are_escaped_and_counted_per_series() -> None:
    metrics = _built(gateway_specs(pool=False, shared_budgets=False))
    offered = metrics.counter("headway_gateway_requests_offered_total")
    offered.labels('a"b').inc()
    offered.labels('a"b').inc()
    offered.labels("c").inc()
    metrics.counter("headway_gateway_retry_after_seconds_total").inc(2.5)
    text = metrics.render().decode()
    assert 'headway_gateway_requests_offered_total{tenant="a\\"b"} 2.0' in text
    assert metrics.sample("headway_gateway_requests_offered_total", tenant="c") == 1
    assert metrics.sample("headway_gateway_retry_after_seconds_total") == 2.5


def test_a_scrape_time_metric_without_reader_is_an_error() -> None:
    metrics = Metrics(gateway_specs(pool=False, shared_budgets=True))
    assert "headway_gateway_shared_budgets_healthy" in metrics.unread()
    with pytest.raises(LookupError, match="headway_gateway_queue_depth_requests"):
        metrics.render()


def test_labels_are_given_all_or_none() -> None:
    metrics = _built(EMULATOR, {"model_name": "m"})
    with pytest.raises(ValueError, match="finished_reason"):
        metrics.counter("vllm:request_success_total", engine="0")
    with pytest.raises(TypeError, match="not a histogram"):
        metrics.histogram("vllm:prompt_tokens_total")


def test_a_per_token_histogram_reads_as_prometheus_clients_own() -> None:
    """ITL and TPOT are counted by hand (weighted observations, one per gap in a step);
    their samples are what prometheus_client gives for the same observations."""
    from prometheus_client import CollectorRegistry, Histogram

    name = "vllm:inter_token_latency_seconds"
    spec = next(s for s in EMULATOR if s.name == name)
    assert spec.per_token
    metrics = Metrics(EMULATOR, fixed={"model_name": "m"})
    reference = Histogram(
        name, spec.help, spec.labels, registry=CollectorRegistry(), buckets=spec.buckets_s
    )
    ours = metrics.token_histogram(name)
    for gap_s, tokens in ((0.01, 3), (0.0249, 1), (0.3, 7), (0.31, 2), (100.0, 1)):
        ours.observe(gap_s, tokens)
        for _ in range(tokens):
            reference.labels(model_name="m").observe(gap_s)

    def samples(collector: object) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
        return sorted(
            (s.name, tuple(sorted(s.labels.items())), s.value)
            for family in collector.collect()  # type: ignore[attr-defined]
            for s in family.samples
            if not s.name.endswith("_created")
        )

    got, want = samples(ours), samples(reference)
    assert [g[:2] for g in got] == [w[:2] for w in want]
    assert [g[2] for g in got] == pytest.approx([w[2] for w in want])
    assert metrics.sample(f"{name}_count", model_name="m") == 14
    assert metrics.sample(f"{name}_bucket", model_name="m", le="0.3") == 11
