"""The ``headway plan`` verb.

``headway plan WORKLOAD [--cluster CLUSTER] [--out DIR] [--json] [--executor local|ray]
[--analytic-only] [--growth FACTOR]`` runs the analytic plan (and, with ``--growth``, the
growth what-if), then the simulated stages (replicas for the peak, the knee over seeds,
the bursts replayed, cost), prints the answer and writes
``plan.json`` and ``report.html`` to ``--out`` (default ``headway-out/<workload name>``;
with ``--json`` the plan is printed and files are written only when ``--out`` is given).
Ctrl-C stops the stage in flight; what finished is still written (exit code 130).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from headway import executors
from headway.core.errors import ConfigError
from headway.files.output import output_folder
from headway.flag_types import growth_factor
from headway.planner import STAGES, STEADY_POINT_DURATION_S
from headway.verbs import VERBS

if TYPE_CHECKING:  # the verb's machinery (scipy, the simulator) loads when it runs
    from headway.executors import PointExecutor
    from headway.planner.plan import ClusterChoice

INTERRUPTED_EXIT = 130


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``plan`` verb."""
    parser = subparsers.add_parser(
        "plan",
        help=VERBS["plan"].help,
        description="Plan capacity for a workload: the analytic plan, then simulated "
        "replica search, knee, bursts and cost; plan.json and report.html.",
    )
    parser.add_argument("workload", metavar="WORKLOAD", help="the workload file (YAML)")
    parser.add_argument(
        "--cluster",
        type=Path,
        default=None,
        help="the cluster file (model, GPU, engine); default: the route's model on an H100",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="a step-time profile from `headway calibrate` (replaces the cluster's model)",
    )
    parser.add_argument(
        "--out", type=output_folder, default=None, help="folder for plan.json and report.html"
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    executors.add_arguments(parser, "simulated points")
    parser.add_argument(
        "--jobs", type=int, default=None, help="local worker processes (default: CPU count)"
    )
    parser.add_argument("--seeds", type=int, default=3, help="seeds of the knee search (default 3)")
    parser.add_argument("--seed", type=int, default=None, help="run seed (default: file's)")
    parser.add_argument(
        "--point-duration-s",
        type=float,
        default=STEADY_POINT_DURATION_S,
        help="simulated seconds of each steady sweep point (default %(default)g)",
    )
    parser.add_argument(
        "--stages",
        default=",".join(STAGES),
        metavar="STAGE,...",
        help=f"the simulated stages to run, of {','.join(STAGES)} (default: all); e.g. "
        "replicas,knee for the count and the knee without the replay and the bad days",
    )
    parser.add_argument(
        "--analytic-only", action="store_true", help="only the analytic plan (no simulation)"
    )
    parser.add_argument(
        "--growth",
        type=growth_factor,
        default=None,
        metavar="FACTOR",
        help="the growth what-if: every source's peak × FACTOR (e.g. 10); reports each "
        "resource's utilisation, the growth at which it saturates, the first to saturate "
        "and the replicas FACTOR needs (default: none)",
    )
    parser.set_defaults(handler=_plan)


def choose_cluster(path: Path | None, spec_default: ClusterChoice) -> ClusterChoice:
    """The cluster file, or the workload's default cluster."""
    from headway.files.workload import read_yaml
    from headway.planner.plan import ClusterChoice
    from headway.sim.cluster import parse_cluster

    if path is None:
        return spec_default
    cluster = parse_cluster(read_yaml(path), str(path))
    return ClusterChoice(
        spec=cluster,
        source=f"{path} (its replicas: {cluster.replicas}; the plan searches the count)",
    )


class _Bars:
    """Rich progress bars on stderr, one per stage."""

    def __init__(self, enabled: bool) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("points"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=False,
            disable=not enabled,
        )
        self._task: object = None

    def __enter__(self) -> _Bars:
        self._progress.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._finish()
        if kind is not None:  # the bars vanish: the error's one line stands alone
            self._progress.live.transient = True
        self._progress.stop()

    def _finish(self) -> None:
        if self._task is not None:
            task = self._progress.tasks[-1]
            self._progress.update(task.id, total=task.completed)

    def stage(self, name: str, total: int) -> None:
        """Start a stage's bar."""
        self._finish()
        self._task = self._progress.add_task(name, total=total)

    def advance(self, points: int) -> None:
        """Advance the current bar (growing its total when the estimate was low)."""
        if self._task is None:
            return
        task = self._progress.tasks[-1]
        total = max(task.total or 0, task.completed + points + 1)
        self._progress.update(task.id, advance=points, total=total)


class _Lines:
    """Progress as plain lines on stderr, for a log or a pipe (no terminal to draw bars
    on): a line when a stage's first point is done, then one each tenth of its points or
    each ``every_s`` seconds, whichever comes first."""

    def __init__(self, enabled: bool, every_s: float = 30.0) -> None:
        self.enabled = enabled
        self.every_s = every_s
        self._name = ""
        self._total = 0
        self._done = 0
        self._started = self._said = 0.0
        self._said_done = 0
        self._announced = False

    def __enter__(self) -> _Lines:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self._say(force=True)

    def _say(self, force: bool = False) -> None:
        if not self.enabled or not self._name:
            return
        now = time.monotonic()
        step = max(1, self._total // 10)
        due = self._done - self._said_done >= step or now - self._said >= self.every_s
        if not (force or due) or (force and self._done == self._said_done):
            return
        sys.stderr.write(
            f"plan: {self._name}: {self._done}/{max(self._total, self._done)} points, "
            f"{now - self._started:.0f} s\n"
        )
        sys.stderr.flush()
        self._said, self._said_done = now, self._done

    def stage(self, name: str, total: int) -> None:
        """A stage starts (said with its first point: a mistake found by the first point
        stays the one line on stderr)."""
        self._say(force=True)  # where the previous one ended
        self._name, self._total, self._done = name, total, 0
        self._started = self._said = time.monotonic()
        self._said_done = 0
        self._announced = False

    def advance(self, points: int) -> None:
        """More points finished."""
        if self.enabled and not self._announced:
            self._announced = True
            sys.stderr.write(f"plan: {self._name}: about {self._total} points\n")
        self._done += points
        self._say()


def _keep_simulated_plan(out: Path) -> None:
    """Refuse to replace a simulated plan (minutes of CPU) with an analytic-only one."""
    try:
        previous = json.loads((out / "plan.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # none there, or not a plan: nothing to keep
    if isinstance(previous, dict) and previous.get("simulated") is not None:
        raise ConfigError(
            f"--out {out} holds a simulated plan (plan.json, report.html) that an "
            "--analytic-only plan would replace; choose another --out or remove it first",
            path="--out",
        )


def _plan(args: argparse.Namespace) -> int:
    import msgspec
    from rich.console import Console

    from headway.core.workload.validate import require_latency_slo
    from headway.files.output import write_text_atomic
    from headway.files.workload import load_workload
    from headway.planner.plan import ClusterChoice, build_plan, default_cluster
    from headway.planner.render import plan_to_builtins, plan_to_json, render_plan_terminal
    from headway.planner.simulated import PlanSettings
    from headway.report.html import render_plan_html
    from headway.sim.cluster import with_profile

    if args.seeds < 1:
        raise ConfigError(f"--seeds must be >= 1 (got {args.seeds}); 3 gives an interval")
    stages = tuple(s.strip() for s in args.stages.split(",") if s.strip())
    unknown = [s for s in stages if s not in STAGES]
    if unknown or not stages:
        found = f"unknown stage {unknown[0]!r}" if unknown else "no stage"
        raise ConfigError(
            f"--stages: {found}; name some of {','.join(STAGES)} (or --analytic-only)",
            path="--stages",
        )
    stages = tuple(s for s in STAGES if s in stages)  # in the order they run
    if not args.point_duration_s > 0:
        raise ConfigError(
            f"--point-duration-s must be > 0 (got {args.point_duration_s}); 180 is the default"
        )
    loaded = load_workload(args.workload)
    spec = loaded.spec
    if args.seed is not None:
        spec = msgspec.structs.replace(spec, seed=args.seed)
    if not args.analytic_only:  # before the progress bars start (build_plan checks too)
        require_latency_slo(spec, "the plan's replica search")
    out: Path | None = args.out
    if out is None and not args.json:
        out = Path("headway-out") / spec.name
    if args.analytic_only and out is not None:
        _keep_simulated_plan(out)
    choice = choose_cluster(args.cluster, default_cluster(spec))
    if args.profile is not None and choice.spec is not None:
        choice = ClusterChoice(
            spec=with_profile(choice.spec, args.profile),
            source=f"{choice.source}; step times from the profile {args.profile}",
        )
    jobs = executors.jobs_or_cpus(args.jobs)
    executor: PointExecutor | None = None
    console = Console()
    progress = _Bars if sys.stderr.isatty() else _Lines
    with progress(enabled=not args.analytic_only) as bars:
        try:
            if not args.analytic_only and choice.spec is not None:
                executor = executors.from_arguments(args, jobs=jobs)
            plan = build_plan(
                spec,
                choice,
                executor,
                settings=PlanSettings(
                    seeds=args.seeds, steady_duration_s=args.point_duration_s, stages=stages
                ),
                traces=loaded.traces,
                progress=bars,
                analytic_only=args.analytic_only,
                growth=args.growth,
            )
        finally:
            if executor is not None:
                executor.close()
    if out is not None:
        write_text_atomic(out / "plan.json", plan_to_json(plan))
        write_text_atomic(out / "report.html", render_plan_html(plan_to_builtins(plan)))
    if args.json:
        sys.stdout.write(plan_to_json(plan))
    else:
        render_plan_terminal(plan, console)
        if out is not None:
            console.print(f"wrote {out / 'plan.json'} and [bold]{out / 'report.html'}[/bold]")
    return 0 if plan.complete else INTERRUPTED_EXIT
