"""One bench run: input (a workload file or a trace), the target's model, the run, its summary.

A trace given directly is replayed as one class (``trace``) with the trace's token
counts and timestamps, cropped to a window and scaled in time (``--time-scale 0.1``
replays ten times faster). SLO flags apply to every class.
"""

from __future__ import annotations

import http.client
import math
import os
import resource
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from headway.bench.payloads import Endpoint, RequestEncoder, Target
from headway.bench.records import CallRecords
from headway.bench.run import LoopKind, default_workers, run_plans
from headway.bench.schedule import peak_rate_per_s, shard_plans
from headway.bench.sender import SendSettings
from headway.bench.summary import (
    BenchResult,
    Budgets,
    Cost,
    Outcomes,
    client_little,
    count_outcomes,
)
from headway.bench.summary import summarize_run as _summarize
from headway.core.errors import ConfigError
from headway.core.workload.compile import CompiledWorkload, compile_workload
from headway.core.workload.scale import scale_workload
from headway.core.workload.spec import WorkloadSpec
from headway.files.workload import LoadedWorkload, load_workload, parse_workload, resolve_traces
from headway.server_vocabulary import read_vocabulary

WORKLOAD_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True, slots=True, kw_only=True)
class SloOverride:
    """SLO bounds set on the command line (None: keep the file's)."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    attainment_target: float | None = None

    def apply(self, spec: WorkloadSpec) -> WorkloadSpec:
        """``spec`` with these bounds on every class."""
        fields = ("ttft_s", "tpot_s", "e2e_s", "attainment_target")
        changes = {k: getattr(self, k) for k in fields if getattr(self, k) is not None}
        if not changes:
            return spec
        classes = {
            name: msgspec.structs.replace(cls, slo=msgspec.structs.replace(cls.slo, **changes))
            for name, cls in spec.classes.items()
        }
        return msgspec.structs.replace(spec, classes=classes)


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceOptions:
    """How a trace given directly is replayed."""

    format: str = "auto"
    time_scale: float = 1.0
    window_start_s: float = 0.0
    window_end_s: float | None = None


@dataclass(frozen=True, slots=True)
class BenchInput:
    """A workload ready to compile: spec, traces, run length."""

    loaded: LoadedWorkload
    duration_s: float


def load_input(
    path: str, trace: TraceOptions, slo: SloOverride, duration_s: float | None
) -> BenchInput:
    """Read a workload file, or wrap a trace file in a one-class replay workload."""
    if path.endswith(WORKLOAD_SUFFIXES):
        loaded = load_workload(path)
        spec = slo.apply(loaded.spec)
        duration = duration_s if duration_s is not None else spec.duration_s
        return BenchInput(replace(loaded, spec=spec), duration)
    file = Path(path)
    if not file.exists():
        raise ConfigError(f"{path}: no such file; give a workload (.yaml) or a trace file")
    window: dict[str, Any] = {"start_s": trace.window_start_s}
    if trace.window_end_s is not None:
        window["end_s"] = trace.window_end_s
    data = {
        "name": file.name,
        "duration_s": 1e12,
        "classes": {"trace": {"calls": 1}},
        "sources": [
            {
                "name": "trace",
                "arrivals": {
                    "process": "trace",
                    "path": str(file.resolve()),
                    "format": trace.format,
                    "time_scale": trace.time_scale,
                    "window": window,
                },
            }
        ],
    }
    spec = slo.apply(parse_workload(data, f"<trace {path}>"))
    loaded = resolve_traces(spec, file.parent, str(file))
    times = next(iter(loaded.traces.values())).arrival_s.astype(np.float64)
    end = trace.window_end_s if trace.window_end_s is not None else float(times.max()) + 1e-6
    span = max(min(end, float(times.max()) + 1e-6) - trace.window_start_s, 1e-6)
    horizon = span * trace.time_scale * (1 + 1e-9)
    return BenchInput(loaded, duration_s if duration_s is not None else horizon)


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchOptions:
    """How to send (see ``headway bench --help``)."""

    target: Target
    model: str | None = None
    endpoint: Endpoint = "chat"
    stream: bool = True
    ignore_eos: bool = True
    api_key: str | None = None
    workers: int | None = None
    """None: one per ~1,500 calls/s of peak rate, at most one per CPU."""
    loop: LoopKind = "uvloop"
    connections: int | None = None
    """Pre-opened per worker; None: 8 + a tenth of a second of the peak rate, at most 256
    (the pool grows on demand)."""
    send: SendSettings = field(default_factory=SendSettings)
    budgets: Budgets = field(default_factory=Budgets)
    seed: int | None = None


@dataclass(frozen=True, slots=True, eq=False)
class BenchRun:
    """A finished run: its summary, the compiled workload and every call's record."""

    result: BenchResult
    workload: CompiledWorkload
    records: CallRecords


def discover_model(target: Target, api_key: str | None, timeout_s: float = 10.0) -> str:
    """The first model the target lists at ``/v1/models``."""
    conn_type = http.client.HTTPSConnection if target.tls else http.client.HTTPConnection
    conn = conn_type(target.host, target.port, timeout=timeout_s)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        conn.request("GET", f"{target.prefix}/v1/models", headers=headers)
        response = conn.getresponse()
        body = response.read()
        status = response.status
    except OSError as error:
        raise ConfigError(
            f"--target {target.url}: cannot list models ({error}); is the server up? "
            "Or pass --model NAME"
        ) from None
    finally:
        conn.close()
    try:
        models = msgspec.json.decode(body)["data"]
        return str(models[0]["id"])
    except (msgspec.DecodeError, KeyError, IndexError, TypeError):
        raise ConfigError(
            f"--target {target.url}: /v1/models answered {status} without a model id; "
            "pass --model NAME"
        ) from None


def raise_open_files_limit() -> int:
    """Raise the soft limit on open files to the hard limit; returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return int(soft)


def process_age_s() -> float:
    """Seconds since this process started (Linux; NaN elsewhere)."""
    try:
        stat = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        start_ticks = int(stat[19])
        ticks = os.sysconf("SC_CLK_TCK")
        return time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / ticks
    except (OSError, ValueError, IndexError, AttributeError):
        return math.nan


def compile_input(
    bench_input: BenchInput, load_factor: float, seed: int | None
) -> CompiledWorkload:
    """The run's calls at ``load_factor`` times the input's offered load."""
    spec = bench_input.loaded.spec
    if load_factor != 1.0:
        spec = scale_workload(spec, load_factor)
    return compile_workload(
        spec, seed=seed, duration_s=bench_input.duration_s, traces=bench_input.loaded.traces
    )


def run_bench(bench_input: BenchInput, options: BenchOptions, load_factor: float = 1.0) -> BenchRun:
    """Compile, send and summarise one run."""
    w = compile_input(bench_input, load_factor, options.seed)
    if w.num_calls == 0:
        raise ConfigError("the workload compiles to no calls; raise duration_s or the arrival rate")
    model = options.model or discover_model(options.target, options.api_key)
    peak = peak_rate_per_s(w.task_arrival_s)
    workers = options.workers or default_workers(peak, os.cpu_count() or 1)
    workers = max(1, min(workers, w.num_tasks))
    limit = raise_open_files_limit()
    per_worker = max(16, (limit - 64) // workers)
    connections = options.connections
    if connections is None:
        connections = min(256, 8 + math.ceil(peak / workers * 0.1))
    send = replace(
        options.send,
        connections=min(connections, per_worker),
        max_connections=min(options.send.max_connections, per_worker),
        timer_slack_s=0.0005 if options.loop == "uvloop" else 0.0,
    )
    encoder = RequestEncoder(
        options.target,
        model,
        endpoint=options.endpoint,
        stream=options.stream,
        ignore_eos=options.ignore_eos,
        api_key=options.api_key,
        vocabulary=read_vocabulary(options.target.url, model, options.api_key),
    )
    encoder.prompt(0, int(w.call_input_tokens.max()))  # build the filler once, before t0
    if w.prefix_hash_ids:
        encoder.share_prefixes(w.call_prefix_row.tolist(), w.prefix_hash_ids)
    plans = shard_plans(w, workers)
    age_at_build = process_age_s()
    built = time.monotonic()
    outcome = run_plans(plans, w.num_calls, options.target, encoder, send, options.loop)
    startup = age_at_build + (outcome.t0 - built)
    by_error, by_status = count_outcomes(outcome.records)
    sent = int(np.isfinite(outcome.records.sent_s).sum())
    result = _summarize(
        w,
        outcome.records,
        target=options.target.url,
        model=model,
        endpoint=options.endpoint,
        load_factor=load_factor,
        cost=Cost(
            workers=outcome.workers,
            loop=options.loop,
            connections_prefilled=outcome.connections_prefilled,
            run_cpu_s=outcome.run_cpu_s,
            cpu_ms_per_request=outcome.run_cpu_s * 1000 / sent if sent else None,
            total_cpu_s=outcome.total_cpu_s,
            startup_s=startup,
            wall_s=outcome.wall_s,
        ),
        outcomes=Outcomes(
            calls=w.num_calls,
            by_error=by_error,
            by_status=by_status,
            connects=outcome.stats.connects,
            connect_errors=outcome.stats.connect_errors,
            resent=outcome.stats.resent,
            max_open_connections=outcome.stats.max_open,
        ),
        budgets=options.budgets,
        exact_prompts=encoder.vocabulary is not None,
    )
    little = client_little(outcome.records, outcome.stats.in_flight_s, outcome.stats.sampled_s)
    result = msgspec.structs.replace(result, little=little)
    return BenchRun(result, w, outcome.records)
