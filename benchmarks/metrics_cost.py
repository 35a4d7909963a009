"""What the metric updates of one request cost on prometheus_client, against the
hand-written registries of an older commit (issue 18: "use prometheus_client unless a
benchmark shows it costs more than 20 µs per request").

The old registries (``headway/gateway/metrics.py``, ``headway/emulate/metrics.py``) are
taken from ``--old`` with ``git archive`` into a temporary folder and loaded from there
by path (they import nothing of headway's); the new one is this checkout's
``headway.metrics_catalog`` (prometheus_client, but for the two histograms observed per
generated token, ITL and TPOT, which it counts by hand: ``TokenHistogram``; on
prometheus_client they took a 16-token request to 24 µs). Each side does the updates the
servers do:

- gateway, per request: what a non-streamed answer that met its deadline counts
  (offered, admitted, queue wait, upstream TTFT, completed, completion tokens, goodput),
  over 8 tenants and 2 upstreams;
- emulator, per request: received, prompt tokens, queue time, TTFT, ``--output-tokens``
  − 1 inter-token gaps (ITL and TPOT), end-to-end latency, finished by reason;
- emulator, per engine step (shared by the batch): steps, delivery lag, generated
  tokens, late steps.

Sides alternate (old, new, then new, old, ...) ``--repeats`` times; each timing is the
median of those repeats. Prints each repeat, then one line of JSON:
``metrics_us_per_request`` (new, gateway), ``old_metrics_us_per_request``, ``ratio``
(new / old), the same for the emulator, ``target_us`` (20) and ``within_target`` (both
within it).

    python benchmarks/metrics_cost.py --old 711bef5 [--repeats 7] [--requests 20000]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from headway.metrics_catalog import EMULATOR, FINISHED_REASONS, Metrics, gateway_specs
from support.old_source import export_src  # benchmarks/support/: helpers, not benchmarks

ROOT = Path(__file__).resolve().parent.parent
TARGET_US = 20.0
TENANTS = [f"tenant-{i}" for i in range(8)]
UPSTREAMS = ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
MODEL = "llama-3-8b"

Workload = Callable[[int], None]
"""Does the updates of ``n`` requests (or steps)."""


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None, path
    assert spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _no_reads(metrics: Metrics) -> Metrics:
    """Scrape-time readers are not on the request path: stubs, so the registry is whole."""
    for name in metrics.unread():
        metrics.read(name, list)
    return metrics


# -- the gateway ------------------------------------------------------------------------------


def gateway_new() -> Workload:
    m = _no_reads(Metrics(gateway_specs(pool=False, shared_budgets=False)))
    offered = m.counter_series("headway_gateway_requests_offered_total")
    admitted = m.counter_series("headway_gateway_admissions_total")
    queue_wait = m.histogram_series("headway_gateway_queue_wait_seconds")
    ttft = m.histogram_series("headway_gateway_upstream_ttft_seconds")
    completed = m.counter_series("headway_gateway_completed_total")
    tokens = m.counter_series("headway_gateway_completion_tokens_total")
    good = m.counter_series("headway_gateway_goodput_requests_total")

    def run(n: int) -> None:  # as GatewayServer does (its m_* attributes)
        for i in range(n):
            tenant, upstream = TENANTS[i % 8], UPSTREAMS[i % 2]
            offered(tenant).inc()
            admitted("admit", "interactive").inc()
            queue_wait(tenant).observe(0.0)
            ttft(upstream).observe(0.012 + (i % 50) * 1e-3)
            completed(tenant).inc()
            tokens(tenant).inc(64)
            good(tenant).inc()

    return run


def gateway_old(module: ModuleType) -> Workload:
    reg = module.Registry()
    buckets = module.TTFT_BUCKETS_S
    offered = reg.counter("headway_gateway_requests_offered_total", "", ["tenant"])
    admitted = reg.counter("headway_gateway_admissions_total", "", ["decision", "band"])
    queue_wait = reg.histogram("headway_gateway_queue_wait_seconds", "", buckets, ["tenant"])
    ttft = reg.histogram("headway_gateway_upstream_ttft_seconds", "", buckets, ["upstream"])
    completed = reg.counter("headway_gateway_completed_total", "", ["tenant"])
    tokens = reg.counter("headway_gateway_completion_tokens_total", "", ["tenant"])
    good = reg.counter("headway_gateway_goodput_requests_total", "", ["tenant"])

    def run(n: int) -> None:
        for i in range(n):
            tenant, upstream = TENANTS[i % 8], UPSTREAMS[i % 2]
            offered.inc(tenant)
            admitted.inc("admit", "interactive")
            queue_wait.observe(0.0, tenant)
            ttft.observe(0.012 + (i % 50) * 1e-3, upstream)
            completed.inc(tenant)
            tokens.inc(tenant, amount=64)
            good.inc(tenant)

    return run


# -- the emulator -----------------------------------------------------------------------------


def _emulator_new() -> dict[str, Any]:
    m = _no_reads(Metrics(EMULATOR, fixed={"model_name": MODEL}))
    names = {
        "requests": "headway_emulator_http_requests_total",
        "prompt": "vllm:prompt_tokens_total",
        "generated": "vllm:generation_tokens_total",
        "steps": "headway_emulator_steps_total",
        "late": "headway_emulator_late_steps_total",
    }
    found: dict[str, Any] = {k: m.counter(v) for k, v in names.items()}
    for key, name in (
        ("queue", "vllm:request_queue_time_seconds"), ("ttft", "vllm:time_to_first_token_seconds"),
        ("e2e", "vllm:e2e_request_latency_seconds"), ("lag", "headway_emulator_step_lag_seconds"),
    ):  # fmt: skip
        found[key] = m.histogram(name)
    found["itl"] = m.token_histogram("vllm:inter_token_latency_seconds")
    found["tpot"] = m.token_histogram("vllm:time_per_output_token_seconds")
    found["finished"] = {
        r: m.counter("vllm:request_success_total", finished_reason=r) for r in FINISHED_REASONS
    }
    return found


def emulator_new(output_tokens: int) -> tuple[Workload, Workload]:
    c = _emulator_new()
    finished = c["finished"]

    def request(n: int) -> None:
        for i in range(n):
            c["requests"].inc()
            c["prompt"].inc(512)
            c["queue"].observe(0.002)
            c["ttft"].observe(0.05 + (i % 7) * 0.01)
            for _ in range(output_tokens - 1):
                c["itl"].observe(0.02)
                c["tpot"].observe(0.02)
            c["e2e"].observe(0.4)
            finished["length"].inc()

    def step(n: int) -> None:
        for i in range(n):
            c["steps"].inc()
            c["lag"].observe(0.0002)
            c["generated"].inc(8)
            if i % 100 == 0:
                c["late"].inc()

    return request, step


def emulator_old(module: ModuleType, output_tokens: int) -> tuple[Workload, Workload]:
    m = module.MetricsRegistry(MODEL)
    requests = m.counter("headway_emulator_http_requests_total", "")
    prompt = m.counter("vllm:prompt_tokens_total", "")
    generated = m.counter("vllm:generation_tokens_total", "")
    steps = m.counter("headway_emulator_steps_total", "")
    late = m.counter("headway_emulator_late_steps_total", "")
    queue = m.histogram("vllm:request_queue_time_seconds", "", module.REQUEST_BUCKETS_S)
    ttft = m.histogram("vllm:time_to_first_token_seconds", "", module.TTFT_BUCKETS_S)
    itl = m.histogram("vllm:inter_token_latency_seconds", "", module.ITL_BUCKETS_S)
    tpot = m.histogram("vllm:time_per_output_token_seconds", "", module.ITL_BUCKETS_S)
    e2e = m.histogram("vllm:e2e_request_latency_seconds", "", module.REQUEST_BUCKETS_S)
    lag = m.histogram("headway_emulator_step_lag_seconds", "", module.LAG_BUCKETS_S)

    def request(n: int) -> None:
        for i in range(n):
            requests.inc()
            prompt.inc(512)
            queue.observe(0.002)
            ttft.observe(0.05 + (i % 7) * 0.01)
            for _ in range(output_tokens - 1):
                itl.observe(0.02, 1)
                tpot.observe(0.02, 1)
            e2e.observe(0.4)
            m.request_finished("length")

    def step(n: int) -> None:
        for i in range(n):
            steps.inc()
            lag.observe(0.0002)
            generated.inc(8)
            if i % 100 == 0:
                late.inc()

    return request, step


# -- the run ----------------------------------------------------------------------------------


def _us_per_call(work: Workload, n: int) -> float:
    start = time.perf_counter_ns()
    work(n)
    return (time.perf_counter_ns() - start) / n / 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", required=True, help="a commit with the hand-written registries")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--output-tokens", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        src = export_src(args.old, Path(folder)) / "headway"
        old_gw = _load(src / "gateway" / "metrics.py", "old_gateway_metrics")
        old_emu = _load(src / "emulate" / "metrics.py", "old_emulator_metrics")
    workloads: dict[str, dict[str, Workload]] = {
        "old": {"gateway": gateway_old(old_gw)},
        "new": {"gateway": gateway_new()},
    }
    for label, (request, step) in (
        ("old", emulator_old(old_emu, args.output_tokens)),
        ("new", emulator_new(args.output_tokens)),
    ):
        workloads[label] |= {"emulator": request, "emulator_step": step}
    n = {"gateway": args.requests, "emulator": args.requests // 4, "emulator_step": args.requests}
    for side in workloads.values():  # warm up: every series exists before timing
        for key, work in side.items():
            work(n[key] // 10)
    times: dict[str, dict[str, list[float]]] = {
        label: {key: [] for key in n} for label in workloads
    }
    for repeat in range(args.repeats):
        for label in ("old", "new") if repeat % 2 == 0 else ("new", "old"):
            figures = {key: _us_per_call(work, n[key]) for key, work in workloads[label].items()}
            for key, value in figures.items():
                times[label][key].append(value)
            shown = {k: round(v, 3) for k, v in figures.items()}
            print(f"{label} #{repeat + 1}: {shown} µs", file=sys.stderr)
    med = {label: {k: statistics.median(v) for k, v in t.items()} for label, t in times.items()}
    result = {
        "old": args.old,
        "repeats": args.repeats,
        "requests": args.requests,
        "output_tokens": args.output_tokens,
        "metrics_us_per_request": round(med["new"]["gateway"], 3),
        "old_metrics_us_per_request": round(med["old"]["gateway"], 3),
        "ratio": round(med["new"]["gateway"] / med["old"]["gateway"], 3),
        "emulator_metrics_us_per_request": round(med["new"]["emulator"], 3),
        "old_emulator_metrics_us_per_request": round(med["old"]["emulator"], 3),
        "emulator_ratio": round(med["new"]["emulator"] / med["old"]["emulator"], 3),
        "emulator_metrics_us_per_step": round(med["new"]["emulator_step"], 3),
        "old_emulator_metrics_us_per_step": round(med["old"]["emulator_step"], 3),
        "target_us": TARGET_US,
        "within_target": max(med["new"]["gateway"], med["new"]["emulator"]) <= TARGET_US,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
