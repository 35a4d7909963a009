"""The ``headway simulate`` and ``headway sweep`` verbs.

``headway simulate WORKLOAD [--cluster CLUSTER.yaml] [--seed N] [--duration-s S]
[--load X] [--json] [--out DIR]`` runs one simulation; ``--out`` writes ``result.json``
and ``records.npz`` (per-call records, one column per array); ``--bad-days`` runs the
matrix of gateway presets × bad-day scenarios instead (:mod:`headway.sim.baddays`).
``headway sweep WORKLOAD [--cluster ...] (--loads 0.5,1,2 | --search) [--jobs N]
[--executor local|ray]`` scales offered load and finds the knee.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from headway import executors
from headway.core.errors import ConfigError
from headway.core.metrics import task_deadline_text
from headway.core.workload.scale import scale_workload
from headway.files.jsonout import to_json
from headway.files.output import output_folder, write_text_atomic
from headway.files.workload import load_workload, read_yaml
from headway.sim.baddays import commands as baddays
from headway.sim.cluster import ClusterSpec, parse_cluster, with_profile
from headway.sim.results import SimResult, write_records
from headway.sim.run import simulate
from headway.sim.simulator import SimOptions
from headway.sim.sweep import sweep
from headway.verbs import VERBS


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``simulate`` and ``sweep``."""
    sim = subparsers.add_parser(
        "simulate",
        help=VERBS["simulate"].help,
        description="Discrete-event simulation of a workload on a cluster of replicas.",
    )
    _common(sim)
    sim.add_argument("--load", type=float, default=1.0, help="offered-load factor (default 1)")
    sim.add_argument("--duration-s", type=float, default=None, help="run length (default: file's)")
    sim.add_argument("--no-skip", action="store_true", help="step every decode step (slower)")
    sim.add_argument(
        "--out", type=output_folder, default=None, help="folder for result.json, records.npz"
    )
    baddays.add_arguments(sim)
    sim.set_defaults(handler=_simulate)
    sw = subparsers.add_parser(
        "sweep",
        help=VERBS["sweep"].help,
        description="Simulate a workload at several offered loads; find the knee by search.",
    )
    _common(sw)
    sw.add_argument("--loads", default=None, help="comma-separated load factors, e.g. 0.5,1,2")
    sw.add_argument("--search", action="store_true", help="search for the knee")
    sw.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="worker processes, and the search's points per round (default: CPU count)",
    )
    executors.add_arguments(sw, "the sweep's points")
    sw.add_argument("--out", type=output_folder, default=None, help="folder for sweep.json")
    sw.set_defaults(handler=_sweep)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workload", metavar="WORKLOAD", help="the workload file (YAML)")
    parser.add_argument("--cluster", type=Path, default=None, help="the cluster file (YAML)")
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="a step-time profile from `headway calibrate` (replaces the cluster's model)",
    )
    parser.add_argument("--seed", type=int, default=None, help="run seed (default: file's)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def load_cluster(path: Path | None, profile: Path | None = None) -> ClusterSpec:
    """The cluster file, or the default cluster (one Llama-3-8B replica on an H100), with
    the step times of ``profile`` when one is given."""
    cluster = ClusterSpec() if path is None else parse_cluster(read_yaml(path), str(path))
    return cluster if profile is None else with_profile(cluster, profile)


def _simulate(args: argparse.Namespace) -> int:
    if not args.load > 0:
        raise ConfigError(f"--load must be > 0 (got {args.load}); 1 is the file's load")
    baddays.check_arguments(args)
    loaded = load_workload(args.workload)
    cluster = load_cluster(args.cluster, args.profile)
    if args.bad_days:
        return baddays.command(args, loaded.spec, cluster, loaded.traces)
    spec = scale_workload(loaded.spec, args.load) if args.load != 1 else loaded.spec
    started = time.perf_counter()
    result, outcome, workload = simulate(
        spec,
        cluster,
        seed=args.seed,
        duration_s=args.duration_s,
        traces=loaded.traces,
        options=SimOptions(skip_decode=not args.no_skip),
    )
    wall_s = time.perf_counter() - started
    if args.out is not None:
        write_text_atomic(args.out / "result.json", to_json(result))
        write_records(args.out / "records.npz", workload, outcome)
    if args.json:
        sys.stdout.write(to_json(result))
    else:
        _print_result(result, wall_s)
        if args.out is not None:
            Console().print(f"wrote {args.out / 'result.json'} and {args.out / 'records.npz'}")
    return 0


SWEEP_LOAD = "the file's arrivals scaled as written, bursts and schedules included"
"""What a sweep scales (the plan's knee scales a steady peak instead: see summary.py)."""


def _fmt_s(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def _print_result(r: SimResult, wall_s: float) -> None:
    console = Console()
    table = Table(title=f"{r.workload}: {r.calls} calls on {r.engine.replicas} replica(s)")
    for col in ("", "mean", "p50", "p90", "p99", "max"):
        table.add_column(col, justify="left" if not col else "right")
    for name, s in (
        ("TTFT", r.latencies.ttft),
        ("TPOT", r.latencies.tpot),
        ("ITL", r.itl),
        ("e2e", r.latencies.e2e),
        ("queue", r.latencies.queue),
    ):
        table.add_row(name, *(_fmt_s(v) for v in (s.mean_s, s.p50_s, s.p90_s, s.p99_s, s.max_s)))
    console.print(table)
    console.print(
        f"SLO attainment {r.slo.attainment:.1%} (goodput {r.slo.goodput_per_s:.2f}/s); "
        f"{task_deadline_text(r.slo.task_attainment, r.slo.task_deadlines_declared)}; throughput "
        f"{r.throughput.requests_per_s:.2f} req/s, {r.throughput.output_tokens_per_s:,.0f} "
        f"output tok/s; preemptions {r.engine.preemptions}; simulated in {wall_s:.2f} s "
        f"({r.engine.steps:,} steps, {r.engine.steps_skipped:,} skipped)"
    )
    if r.energy is not None and r.energy.joules_per_slo_request is not None:
        per_outcome = r.energy.joules_per_verified_outcome
        console.print(
            f"Energy: {r.energy.energy_j / 3.6e6:,.2f} kWh (mean {r.energy.mean_power_w:,.0f} W); "
            f"{r.energy.joules_per_slo_request:,.0f} J per SLO-satisfying request"
            + (f", {per_outcome:,.0f} J per verified outcome" if per_outcome else "")
        )
    if r.work is not None and r.work.wasted_tokens:
        losing = (
            f", {r.slo.losing_branches:,} losing branches (left out of attainment) "
            f"{r.work.losing_branch_tokens / r.work.processed_tokens:.1%}"
            if r.slo.losing_branches
            else ""
        )
        console.print(
            f"Wasted work: {r.work.wasted_fraction:.1%} of the {r.work.processed_tokens:,} "
            f"tokens the engines processed came to no answer{losing}"
        )
    if r.fallback_calls:
        console.print(
            f"Fallback: {r.fallback_calls:,} calls went to their route's declared fallback "
            "pool (their own pool had no routable replica)"
        )
    if r.degraded_calls:
        console.print(
            f"Degraded modes: {r.degraded_calls:,} calls were served degraded (output "
            f"capped, prompt trimmed, or shed as optional); {r.degraded_completed:,} completed"
        )
    if r.deferred_calls:
        console.print(
            f"Receipts: {r.deferred_calls:,} shed calls were deferred instead (run later in "
            f"background); {r.deferred_completed:,} completed within their retention"
        )
    worst = [s for s in r.segments if s.ranked][:3]
    if worst:
        console.print("Worst segments (every segment: --json):")
        for seg in worst:
            met = "—" if seg.slo_attainment is None else f"{seg.slo_attainment:.1%}"
            console.print(
                f"  {seg.dimension} {seg.name}: {met} met, p99 e2e "
                f"{_fmt_s(seg.latencies.e2e.p99_s)}, TTFT {_fmt_s(seg.latencies.ttft.p99_s)}, "
                f"{seg.calls:,} calls",
                highlight=False,
            )
    console.print(
        "Little's law, L against λW over the sampled window: "
        + ", ".join(
            f"{b.boundary.split(' (')[0]} {b.relative_mismatch:.1%}" for b in r.little_boundaries
        )
    )


def _sweep(args: argparse.Namespace) -> int:
    if not args.loads and not args.search:
        raise ConfigError("give --loads 0.5,1,2 or --search (or both)")
    factors = None
    if args.loads:
        try:
            factors = [float(x) for x in args.loads.split(",") if x.strip()]
        except ValueError:
            raise ConfigError(
                f"--loads must be comma-separated numbers (got {args.loads!r}), e.g. 0.5,1,2"
            ) from None
        if not factors or any(not f > 0 for f in factors):
            raise ConfigError(f"--loads must be numbers > 0 (got {args.loads!r})")
    jobs = executors.jobs_or_cpus(args.jobs)
    loaded = load_workload(args.workload)
    cluster = load_cluster(args.cluster, args.profile)
    executor = executors.from_arguments(args, jobs=jobs)
    try:
        result = sweep(
            loaded.spec, cluster, factors=factors, search=args.search, seed=args.seed,
            jobs=jobs, traces=loaded.traces, executor=executor,
        )  # fmt: skip
    finally:
        executor.close()
    text = to_json(result)
    if args.out is not None:
        write_text_atomic(args.out / "sweep.json", text)
    if args.json:
        sys.stdout.write(text)
        return 0
    table = Table(title=f"{result.workload}: offered load sweep ({SWEEP_LOAD})")
    for col in ("load", "tasks/s", "calls/s", "attainment", "goodput/s", "TTFT p99", "TPOT p99"):
        table.add_column(col, justify="right")
    for p in result.points:
        table.add_row(
            f"{p.load_factor:.3g}×", f"{p.offered_tasks_per_s:.3g}",
            f"{p.offered_calls_per_s:.3g}", f"{p.slo_attainment:.1%}",
            f"{p.goodput_per_s:.3g}", _fmt_s(p.ttft_p99_s), _fmt_s(p.tpot_p99_s),
        )  # fmt: skip
    console = Console()
    console.print(table)
    if result.knee is not None:
        k = result.knee
        if k.stopped == "saturated":
            console.print(
                f"no knee: attainment stays >= {k.target:.0%} up to saturation "
                f"({k.saturation_calls_per_s or 0:.3g} calls/s completed at {k.load_factor:.3g}× "
                "the file's load, hardly more than at half of it): the SLO does not limit "
                "the load; the search stopped there"
            )
        else:
            console.print(
                f"knee: {k.load_factor:.3g}× the file's load ({k.offered_tasks_per_s:.3g} "
                f"tasks/s, {k.offered_calls_per_s:.3g} calls/s) keeps attainment >= "
                f"{k.target:.0%} ({SWEEP_LOAD}; `plan` searches a steady load at the peak "
                "rate instead, bursts left out, so its knee is higher for a bursty file)"
                if k.found
                else f"even {k.upper_load_factor:.3g}× the file's load misses {k.target:.0%}"
            )
            if k.stopped == "max_rounds":
                console.print("the search ran out of rounds before narrowing the knee")
    return 0
