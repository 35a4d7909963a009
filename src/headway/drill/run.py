"""Carry out one drill against a stack and judge it.

The runner reads the gateways' and engines' counters before and after, samples gauges
while the load runs (engine KV use and running requests, the gateways' memory and
shared-budget health), fires the faults on their timeline, lets the calls settle, and
computes the figures the drills' expectations name (:data:`FIGURES`). Every call ends in
exactly one terminal state (:mod:`headway.drill.load`); the accounting figure compares the
clients' states with the gateways' own counters.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp
import msgspec

from headway.core.metrics import little_from_counters, sampled_area
from headway.drill.load import STATES, LoadRun, names_no_time
from headway.drill.observe import Metrics, rss_mb, scrape, scrape_all
from headway.drill.spec import Drill, Fault
from headway.drill.stack import LocalStack, RemoteStack, Stack, Unsupported

__all__ = ["FIGURES", "DrillResult", "run_drill"]

FIGURES: Final[dict[str, str]] = {
    "calls": "calls the clients made",
    **{s: f"calls that ended {s}" for s in STATES},
    "lost": "calls with no terminal state, or hung",
    "ok_fraction": "ok / calls not cancelled by the client",
    "server_errors": "5xx answers that are not designed refusals (502, 500, ...)",
    "sheds_missing_retry_after": "429/503 refusals without a Retry-After (but a tenant "
    "budget's 429 whose every promisable turn is taken, which names none by design)",
    "accounting_mismatch": "clients' terminal states vs the gateways' counters",
    "gateway_sheds": "refusals the gateways counted",
    "gateway_upstream_retries": "attempts the gateways moved to another engine",
    "gateway_upstream_errors_faulted": "upstream errors the gateways counted on the faulted engine",
    "gateway_cancellations": "cancellations the gateways counted",
    "gateway_deadline_cancels": "calls the gateways cancelled in flight at their deadline",
    "timed_out_calls": "calls answered deadline_exceeded: cancelled in flight at their deadline",
    "engine_preemptions": "preemptions in the engines",
    "engine_kv_usage_peak": "highest KV use sampled in any engine (0-1)",
    "engine_running_after": "requests still running in the engines after the drill",
    "engine_generated_tokens": "tokens the engines generated",
    "work_amplification": "tokens generated / tokens the ok calls asked for",
    "ttft_p99_s": "p99 time to first byte of the ok calls",
    "offered_per_s": "calls offered per second of load",
    "served_per_s": "ok calls per second of load (the capacity, when overloaded)",
    "overload_factor": "offered / served: how far over capacity the load was",
    "upstreams_not_ready_after": "upstreams a gateway does not route to at the end",
    "rss_growth": "gateway memory in the last third / the middle third of the run",
    "rss_peak_mb": "highest gateway memory sampled",
    "shared_budgets_unhealthy_samples": "samples where a gateway served on local shares",
}
"""Figures every drill computes (fault actions add their own, e.g. ``cancel_free_s``)."""


@dataclass(slots=True)
class Check:
    """One expectation and what was observed."""

    figure: str
    op: str
    value: float
    observed: float | None
    passed: bool
    why: str


@dataclass(slots=True)
class DrillResult:
    """One drill's outcome."""

    name: str
    title: str
    status: str
    """``passed``, ``failed``, ``skipped`` or ``error``."""
    detail: str = ""
    checks: list[Check] = field(default_factory=list)
    figures: dict[str, float] = field(default_factory=dict)
    timeline: list[dict[str, Any]] = field(default_factory=list)
    series: dict[str, list[float]] = field(default_factory=dict)
    wall_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """Plain data (JSON output and the report)."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


class _Sampler:
    """Gauges every ``interval_s`` while the load runs."""

    def __init__(self, stack: Stack, session: aiohttp.ClientSession, interval_s: float) -> None:
        self.stack = stack
        self.session = session
        self.interval_s = interval_s
        self.series: dict[str, list[float]] = {
            "t_s": [], "kv_usage": [], "engine_running": [], "rss_mb": [], "shared_healthy": [],
            "gateway_in_system": [],
        }  # fmt: skip
        self.start = time.monotonic()

    async def run(self) -> None:
        while True:
            engines = await scrape_all(self.session, self.stack.engine_urls)
            gateways = await _gateway_metrics(self.session, self.stack)
            s = self.series
            s["t_s"].append(round(time.monotonic() - self.start, 3))
            s["kv_usage"].append(
                max((m.total("vllm:kv_cache_usage_perc") for m in engines), default=0.0)
            )
            s["engine_running"].append(sum(m.total("vllm:num_requests_running") for m in engines))
            rss = [r for p in self.stack.gateway_pids() if (r := rss_mb(p)) is not None]
            s["rss_mb"].append(sum(rss) if rss else math.nan)
            healthy = [
                m.total("headway_gateway_shared_budgets_healthy")
                for m in gateways
                if "headway_gateway_shared_budgets_healthy" in m.samples
            ]
            s["shared_healthy"].append(min(healthy) if healthy else math.nan)
            s["gateway_in_system"].append(
                sum(m.total("headway_gateway_requests_in_system") for m in gateways)
            )
            await asyncio.sleep(self.interval_s)


async def _discover_model(session: aiohttp.ClientSession, url: str, key: str) -> str:
    headers = {"Authorization": f"Bearer {key}"}
    async with asyncio.timeout(10.0), session.get(f"{url}/v1/models", headers=headers) as r:
        data = await r.json(content_type=None)
        if r.status != 200 or not data.get("data"):
            raise RuntimeError(f"{url}/v1/models answered {r.status}: {data}")
        return str(data["data"][0]["id"])


async def _gateway_metrics(session: aiohttp.ClientSession, stack: Stack) -> list[Metrics]:
    token = stack.metrics_token
    headers = {"Authorization": f"Bearer {token}"} if token else None
    return list(await asyncio.gather(*(scrape(session, u, headers) for u in stack.gateway_urls)))


def _delta(after: list[Metrics], before: list[Metrics], name: str, **labels: str) -> float:
    return sum(a.total(name, **labels) for a in after) - sum(
        b.total(name, **labels) for b in before
    )


_CANCEL_SETTLE_S: Final = 0.5
"""A cancelled call the gateways have not counted after this never reached one, or had
its whole answer sent (the client left with it in transit): neither holds an engine."""


def _engines_hold_more(
    gateways: list[Metrics], engines: list[Metrics], urls: list[str]
) -> bool | None:
    """Whether an engine runs more requests than the gateways have outstanding with it: a
    slot (and its KV blocks) held for a client that left. (Its waiting requests hold
    neither, and one of them may be a gateway's health probe.) None when no engine is one
    of the gateways' upstreams by URL (a remote stack named its engines otherwise)."""
    outstanding: dict[str, float] = {}
    for metrics in gateways:
        for url, count in metrics.by("headway_gateway_upstream_outstanding_requests",
                                     "upstream").items():  # fmt: skip
            key = url.rstrip("/")
            outstanding[key] = outstanding.get(key, 0.0) + count
    held = [
        (m.total("vllm:num_requests_running"), outstanding[key])
        for m, key in zip(engines, (u.rstrip("/") for u in urls), strict=True)
        if key in outstanding
    ]
    if not held:
        return None
    return any(running > sent for running, sent in held)


async def _cancel_and_time(
    load: LoadRun, fault: Fault, stack: Stack, session: aiohttp.ClientSession
) -> dict[str, float]:
    """Abandon a share of the calls in flight; how long until no engine holds one of them
    (``cancel_free_s``).

    Done when the gateways counted every cancelled call (or their counts stood still for
    :data:`_CANCEL_SETTLE_S`: the rest never reached a gateway or had been answered) and
    no engine runs more requests than the gateways have outstanding with it; the time is
    the first sample, since the counts last moved, where that holds. (A call cancelled
    between its dispatch and the engine's receipt, or as its engine finished it, is never
    aborted: an engine's abort count cannot be matched to the gateways' in-flight
    cancellations, so it is used only when the engines are not known by their upstream
    URLs.)"""
    engines_before = await scrape_all(session, stack.engine_urls)
    gw_start = await _gateway_metrics(session, stack)
    started = time.monotonic()
    cancelled = load.cancel_in_flight(float(fault.params.get("fraction", 0.5)))
    name = "headway_gateway_cancellations_total"
    freed_s = math.inf
    seen = in_flight = 0.0
    counts: tuple[float, float] = (-1.0, -1.0)
    changed_s, agreed_s = 0.0, math.inf
    while time.monotonic() - started < 5.0:
        # Both at once: one sample is one round trip, and the gateways' counts and the
        # engines' gauges are read at about the same moment.
        gw_now, engines_now = await asyncio.gather(
            _gateway_metrics(session, stack), scrape_all(session, stack.engine_urls)
        )
        seen = _delta(gw_now, gw_start, name)
        in_flight = _delta(gw_now, gw_start, name, stage="in_flight")
        now_s = time.monotonic() - started
        holding = _engines_hold_more(gw_now, engines_now, stack.engine_urls)
        if holding is None:
            aborts = _delta(engines_now, engines_before, "vllm:request_success_total",
                            finished_reason="abort")  # fmt: skip
            holding = aborts < in_flight
        if (seen, in_flight) != counts:
            counts, changed_s, agreed_s = (seen, in_flight), now_s, math.inf
        if holding:
            agreed_s = math.inf
        elif math.isinf(agreed_s):
            agreed_s = now_s  # the first sample, since the counts last moved, that agrees
        if not math.isinf(agreed_s):
            if seen >= len(cancelled):
                freed_s = now_s
                break
            if now_s - changed_s >= _CANCEL_SETTLE_S:
                freed_s = agreed_s
                break
        await asyncio.sleep(0.005)
    return {
        "cancelled_calls": float(len(cancelled)),
        "cancelled_in_flight": in_flight,
        "cancelled_unseen": float(len(cancelled)) - seen,
        "cancel_free_s": freed_s,
    }


def _fault_subject(fault: Fault) -> tuple[str, int] | None:
    """What a fault acts on: faults on the same subject run one after another (None: the
    client's own action, free to overlap)."""
    if fault.action == "cancel_in_flight":
        return None
    if fault.action in ("kill_redis", "start_redis"):
        return ("redis", 0)
    if fault.action == "reload_config":
        return ("gateway", 0)
    return ("engine", fault.engine)


async def _fire(
    fault: Fault,
    stack: Stack,
    session: aiohttp.ClientSession,
    load: LoadRun,
    timeline: list[dict[str, Any]],
    figures: dict[str, float],
    *,
    after: asyncio.Task[None] | None = None,
) -> None:
    """The fault at its time, and never before the fault on the same subject before it
    has finished: through a user's hooks an action takes seconds (a ``kubectl apply``;
    5 s for a reload beside two CPU vLLMs on a loaded host), and a restore that ran
    while the fault's hook was still under way would land first and be undone by it."""
    delay = load.started_s + fault.at_s - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
    if after is not None:
        await asyncio.wait([after])  # its failure is reported by its own task
    started = time.monotonic()
    entry: dict[str, Any] = {"at_s": round(started - load.started_s, 3), "action": fault.action}
    entry["engine"] = fault.engine
    if fault.action == "cancel_in_flight":
        got = await _cancel_and_time(load, fault, stack, session)
    else:
        got = await stack.act(fault, session)
    entry["took_s"] = round(time.monotonic() - started, 3)
    entry.update(got)
    timeline.append(entry)
    for key, value in got.items():
        figures[key] = max(figures.get(key, value), value)
    figures[f"{fault.action}_done"] = figures.get(f"{fault.action}_done", 0.0) + 1


async def _watch_exclusion(
    stack: Stack, session: aiohttp.ClientSession, fault: Fault, load: LoadRun
) -> dict[str, float]:
    """After a fingerprint fault: seconds until the gateways stop routing to the engine."""
    url = stack.engine_urls[fault.engine] if stack.engine_urls else ""
    start = load.started_s + fault.at_s
    while time.monotonic() - start < 10.0:
        gws = await _gateway_metrics(session, stack)
        if all(m.total("headway_gateway_upstream_ready", upstream=url) == 0 for m in gws):
            return {"excluded_within_s": max(time.monotonic() - start, 0.0)}
        await asyncio.sleep(0.01)
    return {"excluded_within_s": math.inf}


async def _watch_route_back(
    stack: Stack, session: aiohttp.ClientSession, fault: Fault, load: LoadRun
) -> dict[str, float]:
    """After a bad-release fault: seconds until every gateway routes the engine's release
    back, and the gateways' count of its errors then (``errors_after_route_back`` is
    the count at the end less this)."""
    url = stack.engine_urls[fault.engine] if stack.engine_urls else ""
    labels = (
        {"revision": stack.spec.revision(fault.engine)} if isinstance(stack, LocalStack) else {}
    )
    start = load.started_s + fault.at_s
    while time.monotonic() - start < 10.0:
        gws = await _gateway_metrics(session, stack)
        if all(m.total("headway_gateway_release_route_backs_total", **labels) > 0 for m in gws):
            found_s = max(time.monotonic() - start, 0.0)
            errors = sum(_upstream_errors(m, url) for m in gws)
            return {"route_back_within_s": found_s, "errors_at_route_back": errors}
        await asyncio.sleep(0.01)
    return {"route_back_within_s": math.inf, "errors_at_route_back": math.inf}


def _upstream_errors(metrics: Metrics, url: str) -> float:
    return metrics.total("headway_gateway_upstream_errors_total", upstream=url)


_READY_WAIT_S: Final = 60.0
"""After its faults, how long a drill that expects every upstream back in rotation waits
for the gateways to route to all of them (a restarted real engine loads its model, then
passes the gateways' warm-up probes)."""


def _not_ready(gateways: list[Metrics]) -> float:
    """The most upstreams any gateway does not route to (its ``..._upstream_ready``
    series that read 0)."""
    return max(
        (sum(1.0 for v in m.by("headway_gateway_upstream_ready", "upstream").values() if v < 1)
         for m in gateways),
        default=0.0,
    )  # fmt: skip


async def _wait_all_ready(stack: Stack, session: aiohttp.ClientSession, within_s: float) -> float:
    """Seconds until every gateway routes to all its upstreams (inf past ``within_s``)."""
    started = time.monotonic()
    while True:
        waited_s = time.monotonic() - started
        gateways = await _gateway_metrics(session, stack)
        read = all("headway_gateway_upstream_ready" in m.samples for m in gateways)
        if read and _not_ready(gateways) == 0:  # (a failed scrape reads as no series)
            return waited_s
        if waited_s >= within_s:
            return math.inf
        await asyncio.sleep(0.1)


async def run_drill(
    drill: Drill,
    stack: Stack,
    *,
    seed: int = 0,
    on_progress: Callable[[str], None] | None = None,
) -> DrillResult:
    """Run ``drill`` against ``stack`` (already started) and judge it."""
    say = on_progress or (lambda _: None)
    began = time.monotonic()
    result = DrillResult(drill.name, drill.title, "error")
    if isinstance(stack, RemoteStack):
        missing = [f.action for f in drill.faults if not stack.can(f.action)]
        if missing:
            result.status = "skipped"
            result.detail = f"needs hooks for {', '.join(sorted(set(missing)))}"
            return result
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        await stack.wait_ready(session, 20.0)
        first_key = next(iter(stack.keys.values()))
        model = await _discover_model(session, stack.gateway_urls[0], first_key)
        gw_before = await _gateway_metrics(session, stack)
        window_start = time.monotonic()
        eng_before = await scrape_all(session, stack.engine_urls)
        spec = drill.load
        if stack.keys:
            tenants = {stack.keys.get(k, k): w for k, w in spec.tenants.items()}
            spec = msgspec.structs.replace(spec, tenants=tenants)
        load = LoadRun(stack.gateway_urls, spec, model=model, seed=seed)
        sampler = _Sampler(stack, session, 0.25)
        sampling = asyncio.create_task(sampler.run())
        figures: dict[str, float] = {}
        timeline: list[dict[str, Any]] = []
        say(f"{drill.name}: {spec.rate_per_s:g} calls/s for {spec.duration_s:g} s")
        sending = asyncio.create_task(load.run(session))
        await asyncio.sleep(0)
        jobs: list[asyncio.Task[None]] = []
        last: dict[tuple[str, int], asyncio.Task[None]] = {}
        for f in sorted(drill.faults, key=lambda x: x.at_s):
            after = last.get(key) if (key := _fault_subject(f)) else None
            jobs.append(asyncio.create_task(
                _fire(f, stack, session, load, timeline, figures, after=after)))  # fmt: skip
            if key:
                last[key] = jobs[-1]
        watch = [
            asyncio.create_task(_watch_exclusion(stack, session, f, load))
            for f in drill.faults
            if (f.action == "engine_faults" and f.params.get("corrupt_fingerprint"))
            or (f.action == "redeploy_engine" and f.params.get("revision", "r1") != "r1")
        ]
        watch += [
            asyncio.create_task(_watch_route_back(stack, session, f, load))
            for f in drill.faults
            if f.action == "engine_faults" and f.params.get("fail_prompts_over_tokens")
        ]
        try:
            await sending
            outcomes = await asyncio.gather(*jobs, *watch, return_exceptions=True)
            await load.finish(drill.settle_s + spec.timeout_s)
        except Unsupported as error:
            result.status, result.detail = "skipped", str(error)
            return result
        finally:
            for job in [*jobs, *watch, sampling]:
                job.cancel()
        for outcome in outcomes:
            if isinstance(outcome, Unsupported):
                result.status, result.detail = "skipped", str(outcome)
                return result
            if isinstance(outcome, BaseException):
                result.detail = f"a fault action failed: {outcome!r}"
                return result
            if isinstance(outcome, dict):
                figures.update(outcome)
        if any(e.figure == "upstreams_not_ready_after" for e in drill.expect):
            figures["ready_again_s"] = await _wait_all_ready(stack, session, _READY_WAIT_S)
        # Let the engines finish what the gateways sent, then read the counters.
        # The scrape that found them idle is the one kept: a later one may catch the
        # gateways' health probes, which start on every engine at once.
        settle_end = time.monotonic() + drill.settle_s
        while True:
            eng_after = await scrape_all(session, stack.engine_urls)
            idle = sum(m.total("vllm:num_requests_running") for m in eng_after) == 0
            if idle or time.monotonic() >= settle_end:
                break
            await asyncio.sleep(0.1)
        gw_after = await _gateway_metrics(session, stack)
        figures.update(_gateway_little(sampler, gw_before, gw_after, window_start))
        for f in drill.faults:
            if "errors_at_route_back" in figures and f.params.get("fail_prompts_over_tokens"):
                url = stack.engine_urls[f.engine] if stack.engine_urls else ""
                errors = sum(_upstream_errors(m, url) for m in gw_after)
                figures["errors_after_route_back"] = errors - figures.pop("errors_at_route_back")
        versions = await asyncio.gather(*(_version(session, u) for u in stack.engine_urls))
        if versions:
            figures["serving_fingerprints_distinct"] = float(len(set(versions)))
    figures.update(
        _figures(drill, stack, load, sampler, gw_before, gw_after, eng_before, eng_after)
    )
    result.figures = {k: (round(v, 6) if math.isfinite(v) else v) for k, v in figures.items()}
    result.timeline = timeline
    result.series = sampler.series
    for expect in drill.expect:
        observed = figures.get(expect.figure)
        result.checks.append(
            Check(
                expect.figure,
                expect.op,
                expect.value,
                observed,
                expect.holds(observed),
                expect.why,
            )
        )
    result.status = "passed" if all(c.passed for c in result.checks) else "failed"
    result.wall_s = round(time.monotonic() - began, 2)
    return result


async def _version(session: aiohttp.ClientSession, url: str) -> str:
    """The engine's ``/version`` document, canonical (its serving fingerprint), or ``""``."""
    try:
        async with asyncio.timeout(5.0), session.get(f"{url}/version") as response:
            data = await response.json(content_type=None)
            return msgspec.json.encode(data, order="sorted").decode()
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
        return ""


def _gateway_little(
    sampler: _Sampler, before: list[Metrics], after: list[Metrics], window_start: float
) -> dict[str, float]:
    """Little's law at the gateways over the drill, from their own /metrics: the
    in-system gauge the sampler read (its time-average over the window, nothing inside
    outside the sampled span: the load had drained) against λW from the offered counter
    and the duration histogram (``gateway_little_mismatch``; NaN without those metrics)."""
    t, n = sampler.series["t_s"], sampler.series["gateway_in_system"]
    window_s = time.monotonic() - window_start
    name = "headway_gateway_request_duration_seconds"
    ended = _delta(after, before, f"{name}_count")
    if len(t) < 2 or window_s <= 0 or not ended:
        return {"gateway_little_mismatch": math.nan}
    check = little_from_counters(
        "gateway",
        window_s=window_s,
        arrivals=_delta(after, before, "headway_gateway_requests_offered_total"),
        ended=ended,
        time_in_system_s=_delta(after, before, f"{name}_sum"),
        mean_in_system=sampled_area(t, n) / window_s,
    )
    return {
        "gateway_little_mismatch": check.relative_mismatch,
        "gateway_mean_in_system": check.mean_in_system,
        "gateway_lambda_w": check.lambda_w,
    }


def _figures(
    drill: Drill,
    stack: Stack,
    load: LoadRun,
    sampler: _Sampler,
    gw_before: list[Metrics],
    gw_after: list[Metrics],
    eng_before: list[Metrics],
    eng_after: list[Metrics],
) -> dict[str, float]:
    calls = load.calls
    counts = {s: float(sum(1 for c in calls if c.state == s)) for s in STATES}
    f: dict[str, float] = {"calls": float(len(calls)), **counts}
    f["lost"] = float(sum(1 for c in calls if c.state in ("", "hung")))
    f["timed_out_calls"] = counts["timed_out"]
    served = len(calls) - counts["cancelled"]
    f["ok_fraction"] = counts["ok"] / served if served else math.nan
    f["server_errors"] = counts["server_error"]
    f["sheds_missing_retry_after"] = float(
        sum(1 for c in calls if c.state == "shed" and c.status in (429, 503)
            and c.retry_after_s is None and not names_no_time(c.status, c.reason, c.retry_after_s))
    )  # fmt: skip
    shed_attempts = sum(c.shed_attempts for c in calls)

    def gw(name: str, **labels: str) -> float:
        return _delta(gw_after, gw_before, name, **labels)

    completed = gw("headway_gateway_completed_total")
    sheds = gw("headway_gateway_sheds_total")
    cancellations = gw("headway_gateway_cancellations_total")
    offered = gw("headway_gateway_requests_offered_total")
    failed_seen = counts["cut"] + counts["server_error"]
    deadline_cancels = gw("headway_gateway_deadline_cancels_total")
    f["accounting_mismatch"] = (
        max(0.0, counts["ok"] - completed)
        + max(0.0, completed - counts["ok"] - counts["cancelled"] - counts["hung"])
        + abs(shed_attempts - sheds)
        + abs(counts["timed_out"] - deadline_cancels)
        + abs(offered - completed - sheds - cancellations - failed_seen - deadline_cancels)
    )
    f["gateway_deadline_cancels"] = deadline_cancels
    f["gateway_offered"] = offered
    f["gateway_completed"] = completed
    f["gateway_sheds"] = sheds
    for reason, value in _by_delta(gw_after, gw_before, "headway_gateway_sheds_total", "reason"):
        f[f"gateway_sheds_{reason}"] = value
    f["gateway_cancellations"] = cancellations
    f["gateway_upstream_retries"] = gw("headway_gateway_upstream_retries_total")
    faulted = {stack.engine_urls[x.engine] for x in drill.faults if stack.engine_urls}
    errors = _by_delta(gw_after, gw_before, "headway_gateway_upstream_errors_total", "upstream")
    f["gateway_upstream_errors_faulted"] = sum(v for u, v in errors if u in faulted)
    f["gateway_upstream_errors_others"] = sum(v for u, v in errors if u not in faulted)

    def eng(name: str, **labels: str) -> float:
        return _delta(eng_after, eng_before, name, **labels)

    if stack.engine_urls:
        f["engine_preemptions"] = eng("vllm:num_preemptions_total")
        f["engine_generated_tokens"] = eng("vllm:generation_tokens_total")
        f["engine_kv_usage_peak"] = max(sampler.series["kv_usage"], default=0.0)
        f["engine_running_after"] = sum(m.total("vllm:num_requests_running") for m in eng_after)
        asked = counts["ok"] * drill.load.max_tokens
        f["work_amplification"] = f["engine_generated_tokens"] / asked if asked else math.nan
    ready = [m.total("headway_gateway_upstream_ready") for m in gw_after]
    if ready:
        f["upstreams_ready_after"] = min(ready)
        f["upstreams_not_ready_after"] = _not_ready(gw_after)
    if stack.engine_urls:
        f["engine_kv_usage_after"] = max(m.total("vllm:kv_cache_usage_perc") for m in eng_after)
    if faulted:
        ttft_sum = dict(_by_delta(
            gw_after, gw_before, "headway_gateway_upstream_ttft_seconds_sum", "upstream"
        ))  # fmt: skip
        ttft_n = dict(_by_delta(
            gw_after, gw_before, "headway_gateway_upstream_ttft_seconds_count", "upstream"
        ))  # fmt: skip
        hit = [u for u in ttft_n if u in faulted]
        rest = [u for u in ttft_n if u not in faulted]
        n_hit, n_rest = sum(ttft_n[u] for u in hit), sum(ttft_n[u] for u in rest)
        if n_hit and n_rest:
            mean_hit = sum(ttft_sum[u] for u in hit) / n_hit
            mean_rest = sum(ttft_sum[u] for u in rest) / n_rest
            f["faulted_ttft_ratio"] = mean_hit / mean_rest if mean_rest > 0 else math.inf
        if n_hit + n_rest:
            f["faulted_share"] = n_hit / (n_hit + n_rest)
    back = [x.at_s for x in drill.faults if x.action == "start_redis"]
    if back:
        after_s = load.started_s + max(back) + 1.0
        f["budget_sheds_after_return"] = float(
            sum(1 for c in calls if c.started_s >= after_s and c.reason == "tenant_token_rate")
        )
    for key in drill.load.tenants:
        sent = stack.keys.get(key, key)
        mine = [c for c in calls if c.key == sent and c.state != "cancelled"]
        if mine:
            f[f"ok_fraction_{key}"] = sum(1 for c in mine if c.state == "ok") / len(mine)
    duration_s = drill.load.duration_s
    f["offered_per_s"] = len(calls) / duration_s
    f["served_per_s"] = counts["ok"] / duration_s
    f["overload_factor"] = f["offered_per_s"] / f["served_per_s"] if counts["ok"] else math.inf
    ttft = [c.ttft_s for c in calls if c.state == "ok" and c.ttft_s is not None]
    f["ttft_p99_s"] = _quantile(ttft, 0.99) or math.nan
    rss = [r for r in sampler.series["rss_mb"] if math.isfinite(r)]
    if len(rss) >= 6:
        # The last third against the middle one: start-up allocations are done by then,
        # and a leak keeps growing.
        third = len(rss) // 3
        middle = rss[third : 2 * third]
        f["rss_growth"] = (sum(rss[-third:]) / third) / (sum(middle) / len(middle))
        f["rss_peak_mb"] = max(rss)
    health = [h for h in sampler.series["shared_healthy"] if math.isfinite(h)]
    if health:
        f["shared_budgets_unhealthy_samples"] = float(sum(1 for h in health if h < 1))
    return f


def _by_delta(
    after: list[Metrics], before: list[Metrics], name: str, label: str
) -> list[tuple[str, float]]:
    total: dict[str, float] = {}
    for m in after:
        for key, value in m.by(name, label).items():
            total[key] = total.get(key, 0.0) + value
    for m in before:
        for key, value in m.by(name, label).items():
            total[key] = total.get(key, 0.0) - value
    return sorted(total.items())
