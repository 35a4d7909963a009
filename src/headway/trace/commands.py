"""The ``headway trace`` verbs: ``stats FILE [--format F] [--json]`` and
``fit FILE -o WORKLOAD.yaml [--bin-s S] [--min-step-s S] [--max-pairs N] [--seed N]
[--min-tenant-share F] [--max-tenants N] [--tenant-target F] [--slo-ttft-s S]
[--slo-tpot-s S] [--slo-target F]``
(the SLO and planning it writes are defaults to edit; it prints how well the fit
reproduces each large tenant).

Each sub-verb is one ``_add_<verb>(verbs)`` function that adds its parser and sets
``handler`` (``args -> exit code``) with ``set_defaults``; :func:`register` calls them in
turn. A :class:`~headway.core.errors.TraceError` is left to propagate: the main CLI prints
it and exits with 2.
"""

from __future__ import annotations

import argparse
import json
import sys

from headway.core.errors import ConfigError
from headway.core.trace_data import TraceData
from headway.core.workload.spec import Planning, Slo
from headway.files.output import output_file
from headway.trace.fit import MAX_TENANTS, MIN_TENANT_SHARE
from headway.trace.readers import COLUMN_FIELDS, FORMATS, parse_columns, read_trace
from headway.trace.stats import trace_stats
from headway.verbs import VERBS


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``trace`` verb and its sub-verbs to the main CLI's ``subparsers``."""
    parser = subparsers.add_parser(
        "trace",
        help=VERBS["trace"].help,
        description="Read request traces (Azure CSV, Mooncake JSONL, generic CSV/JSONL).",
    )
    verbs = parser.add_subparsers(dest="trace_verb", metavar="SUBVERB", required=True)
    _add_stats(verbs)
    _add_fit(verbs)


def _add_format_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format",
        dest="trace_format",
        choices=FORMATS,
        default="auto",
        help="trace format (default: detect from the file)",
    )
    parser.add_argument(
        "--columns",
        default=None,
        metavar="FIELD=COLUMN,...",
        help="the file's names for the generic fields, e.g. arrival=arrival_s,"
        "tenant=client_id (fields: " + ", ".join(COLUMN_FIELDS) + ")",
    )


def _read(args: argparse.Namespace) -> TraceData:
    """The trace the arguments name; a warning on stderr for each column it ignores."""
    columns = parse_columns(args.columns) if args.columns else None
    trace = read_trace(args.file, args.trace_format, columns)
    if trace.ignored_columns:
        names = ", ".join(f"`{c}`" for c in trace.ignored_columns)
        sys.stderr.write(
            f"headway trace: warning: {args.file}: ignored column(s) {names}; map one to a "
            f"field with --columns FIELD=COLUMN (fields: {', '.join(COLUMN_FIELDS)})\n"
        )
    return trace


def _add_stats(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = verbs.add_parser(
        "stats",
        help="summary statistics of a trace (rates, burstiness, token lengths, prefix reuse)",
        description="Print the summary statistics of a trace file (.gz is fine).",
    )
    parser.add_argument("file", metavar="FILE", help="the trace file")
    _add_format_option(parser)
    parser.add_argument(
        "--json", action="store_true", help="print the statistics as JSON instead of a table"
    )
    parser.set_defaults(handler=_stats)


def _stats(args: argparse.Namespace) -> int:
    """``headway trace stats``: print the statistics as a table or as JSON; exit code 0."""
    trace = _read(args)
    stats = trace_stats(trace)
    if args.json:
        sys.stdout.write(json.dumps(stats, indent=1) + "\n")
        return 0
    from rich.console import Console  # only the table needs rich; keep --json light
    from rich.table import Table

    caption = None
    if trace.tick_s is not None:
        caption = (
            f"timestamps are quantised to ~{trace.tick_s:.3g} s ticks: the 1 s peak and the "
            "IAT CV describe the rounding, not sub-second burstiness"
        )
    table = Table(title=f"{trace.name} ({trace.kind})", caption=caption)
    table.add_column("statistic", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    for key, value in stats.items():
        if key in ("name", "kind", "tenants"):
            continue
        if isinstance(value, dict):
            for name, item in value.items():
                table.add_row(f"{key}.{name}", _format_value(item))
        else:
            table.add_row(key, _format_value(value))
    console = Console()
    console.print(table)
    tenants = stats.get("tenants")
    if isinstance(tenants, dict) and tenants:
        per = Table(title="large tenants (by requests and by tokens)")
        per.add_column("tenant", no_wrap=True)
        for column in ("requests", "tokens", "rate/s", "IAT CV", "input p50", "output p50"):
            per.add_column(column, justify="right", no_wrap=True)
        for name, figures in tenants.items():
            per.add_row(name, *(_format_value(v) for v in figures.values()))
        console.print(per)
    return 0


def _format_value(value: object) -> str:
    """A statistic for the table: thousands separators, at most 6 significant digits."""
    if value is None:
        return "n/a"
    if isinstance(value, bool | str):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return f"{int(value):,}"
        return f"{value:,.6g}" if abs(value) < 1e6 else f"{value:,.0f}"
    return str(value)


def _add_fit(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = verbs.add_parser(
        "fit",
        help="write a workload that reproduces a trace's rate profile and token lengths",
        description=(
            "Fit a workload file to a trace: a rate schedule per --bin-s window with the "
            "trace's burstiness, and its joint (input, output) token distribution."
        ),
    )
    parser.add_argument("file", metavar="FILE", help="the trace file")
    _add_format_option(parser)
    parser.add_argument(
        "-o", "--output", type=output_file, required=True, help="the workload file to write (YAML)"
    )
    parser.add_argument("--bin-s", type=float, default=10.0, help="schedule step (default 10 s)")
    parser.add_argument("--min-step-s", type=float, default=None,
                        help="shortest step: a shorter last window joins the one before it "
                        "(default: half of --bin-s)")  # fmt: skip
    parser.add_argument(
        "--max-pairs",
        type=int,
        default=4000,
        help="token pairs kept per fitted tenant or pool (default 4000)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the fitted workload")
    parser.add_argument("--min-tenant-share", type=float, default=MIN_TENANT_SHARE,
                        help="a tenant with this share of the requests or of the token work "
                        f"is fitted on its own (default {MIN_TENANT_SHARE:g}); the rest are "
                        "pooled")  # fmt: skip
    parser.add_argument("--max-tenants", type=int, default=MAX_TENANTS,
                        help=f"at most this many tenants fitted on their own (default "
                        f"{MAX_TENANTS}, the largest by token work)")  # fmt: skip
    parser.add_argument("--tenant-target", type=float, default=None,
                        help="attainment target of each tenant fitted on its own, e.g. "
                        "0.95: plan sizes for the worst of them (default: none)")  # fmt: skip
    parser.add_argument(
        "--slo-ttft-s",
        type=float,
        default=None,
        help="the class's TTFT bound (default 2 s: a placeholder to edit)",
    )
    parser.add_argument(
        "--slo-tpot-s",
        type=float,
        default=None,
        help="the class's TPOT bound (default 0.1 s: a placeholder to edit)",
    )
    parser.add_argument("--slo-target", type=float, default=None,
                        help="the share of calls that must meet it (default 0.9)")  # fmt: skip
    parser.set_defaults(handler=_fit)


def _fit(args: argparse.Namespace) -> int:
    """``headway trace fit``: write the fitted workload; exit code 0."""
    from headway.files.output import write_text_atomic
    from headway.files.workload import dump_workload
    from headway.trace.fit import fit_workload
    from headway.trace.fit_quality import MISS_TOLERANCE, fit_quality, misses, quality_lines

    if args.bin_s <= 0:
        raise ConfigError(f"--bin-s must be > 0 (got {args.bin_s}); try 60")
    if args.max_pairs < 1:
        raise ConfigError(f"--max-pairs must be >= 1 (got {args.max_pairs}); try 4000")
    if not 0 < args.min_tenant_share <= 1:
        raise ConfigError(
            f"--min-tenant-share must be in (0, 1] (got {args.min_tenant_share}); "
            f"try {MIN_TENANT_SHARE:g}"
        )
    if args.tenant_target is not None and not 0 < args.tenant_target <= 1:
        raise ConfigError(f"--tenant-target must be in (0, 1] (got {args.tenant_target}); try 0.95")
    if args.max_tenants < 0:
        raise ConfigError(f"--max-tenants must be >= 0 (got {args.max_tenants}); try 10")
    if args.min_step_s is not None and not 0 <= args.min_step_s <= args.bin_s:
        raise ConfigError(
            f"--min-step-s must be between 0 and --bin-s {args.bin_s:g} (got {args.min_step_s}); "
            "omit it for half of --bin-s"
        )
    slo, given = _fit_slo(args)
    trace = _read(args)
    spec = fit_workload(
        trace, bin_s=args.bin_s, min_step_s=args.min_step_s, max_pairs=args.max_pairs,
        seed=args.seed, slo=slo, min_tenant_share=args.min_tenant_share,
        max_tenants=args.max_tenants, tenant_target=args.tenant_target,
    )  # fmt: skip
    quality = fit_quality(trace, spec)
    table = quality_lines(quality)
    header = (
        f"# {spec.description}\n# headway trace fit {args.file} -o {args.output}\n"
        "# Each class's slo and planning (at the end) are defaults to edit, not measurements.\n"
        "# How the fit reproduces the trace (one compiled run, the workload's seed):\n"
        + "".join(f"#   {line}\n" for line in table)
    )
    what = (
        "as given"
        if given
        else "a default of `headway trace fit` (placeholder: true): edit it to your promise "
        "and remove `placeholder`"
    )
    text = dump_workload(spec).replace("\n    slo: ", f"\n    # The SLO is {what}.\n    slo: ")
    write_text_atomic(args.output, header + text + _PLANNING)
    bounds = f"TTFT {slo.ttft_s:g} s, TPOT {slo.tpot_s:g} s, {slo.attainment_target:.0%}"
    edit = "as given" if given else "a default: edit it, or pass --slo-ttft-s and --slo-tpot-s"
    missed = misses(quality, MISS_TOLERANCE)
    sys.stdout.write(
        f"wrote {args.output}\n"
        "  how the fit reproduces the trace (one compiled run):\n"
        + "".join(f"    {line}\n" for line in table)
        + (
            f"  off by more than {MISS_TOLERANCE:.0%}: {', '.join(missed)}\n"
            if missed
            else f"  every figure above within {MISS_TOLERANCE:.0%}\n"
        )
        + f"  slo ({bounds}) is {edit}\n"
        f"  planning (planning_factor {_DEFAULTS.planning_factor:g}, failures_tolerated "
        f"{_DEFAULTS.failures_tolerated}) is a default: edit it\n"
        "  a trace names no model and no price: `plan` simulates its default cluster and "
        "gives no cost per task; pass --cluster (or --profile from `headway calibrate`) "
        "and set routes.default.replica.price_per_hour\n"
    )
    return 0


_DEFAULTS = Planning()
_PLANNING = (
    "# Written by `headway trace fit` as defaults: edit them to your fleet.\n"
    "planning:\n"
    f"  planning_factor: {_DEFAULTS.planning_factor:g}  # plan each replica at this share of "
    "its capacity\n"
    f"  failures_tolerated: {_DEFAULTS.failures_tolerated}  # replicas that may be lost while "
    "the rest hold the peak\n"
    "# No price: the plan gives no cost per successful task until you set\n"
    "# routes.default.replica.price_per_hour (and routes.default.model for your model).\n"
)


def _fit_slo(args: argparse.Namespace) -> tuple[Slo, bool]:
    """The fitted class's SLO from the flags, and whether any was given."""
    from headway.trace.fit import DEFAULT_SLO

    flags = (args.slo_ttft_s, args.slo_tpot_s, args.slo_target)
    ttft_s = DEFAULT_SLO.ttft_s if args.slo_ttft_s is None else args.slo_ttft_s
    tpot_s = DEFAULT_SLO.tpot_s if args.slo_tpot_s is None else args.slo_tpot_s
    target = DEFAULT_SLO.attainment_target if args.slo_target is None else args.slo_target
    given = any(v is not None for v in flags)
    try:
        slo = Slo(ttft_s=ttft_s, tpot_s=tpot_s, attainment_target=target, placeholder=not given)
    except ValueError as error:
        raise ConfigError(f"--slo-ttft-s, --slo-tpot-s, --slo-target: {error}") from None
    return slo, given
