"""The ``headway bench`` verb.

``headway bench --target URL WORKLOAD|TRACE [--load X] [--duration-s S] [--seed N]
[--sweep] [--json] [--out DIR] ...`` sends the workload open-loop and reports pacing,
latencies, SLO attainment and goodput; exit code 1 when the sender missed its budget
(lateness p99 or achieved rate) or no call got through, or, with ``--sweep``, when a point
next to the knee missed the budget. See ``docs/bench.md``.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from headway.core.errors import ConfigError
from headway.files.output import output_folder
from headway.verbs import VERBS

_EPILOG = (
    "Exit codes: 0 the run kept its budgets; 1 lateness p99 or achieved rate outside the "
    "budget, or no call got through (with --sweep: a point next to the knee was outside "
    "the budget); 2 a usage or configuration error. Docs: docs/bench.md."
)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``bench``."""
    p = subparsers.add_parser(
        "bench",
        help=VERBS["bench"].help,
        description="Send a workload (or replay a trace) open-loop to an OpenAI-compatible "
        "endpoint; measure lateness, latencies from the scheduled time, SLO attainment and "
        "goodput; --sweep finds the knee.",
        epilog=_EPILOG,
    )
    p.add_argument("input", metavar="WORKLOAD|TRACE", help="workload (.yaml) or trace file")
    p.add_argument("--target", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="model name (default: first of /v1/models)")
    p.add_argument("--endpoint", choices=("chat", "completions"), default="chat")
    p.add_argument("--no-stream", action="store_true", help="ask for whole responses")
    p.add_argument(
        "--no-ignore-eos", action="store_true", help="do not send ignore_eos (OpenAI's API)"
    )
    p.add_argument("--api-key", default=None, help="bearer token (default: $OPENAI_API_KEY)")
    p.add_argument("--seed", type=int, default=None, help="run seed (default: the file's)")
    p.add_argument("--duration-s", type=float, default=None, help="run length (crops)")
    p.add_argument("--load", type=float, default=1.0, help="offered-load factor (default 1)")
    t = p.add_argument_group("trace replay (a trace file given directly)")
    t.add_argument("--trace-format", default="auto", help="auto, azure, mooncake, generic")
    t.add_argument("--time-scale", type=float, default=1.0, help="0.1 replays 10× faster")
    t.add_argument("--window-start-s", type=float, default=0.0, help="crop: trace seconds")
    t.add_argument("--window-end-s", type=float, default=None, help="crop: trace seconds")
    s = p.add_argument_group("SLOs (override every class)")
    s.add_argument("--slo-ttft-s", type=float, default=None)
    s.add_argument("--slo-tpot-s", type=float, default=None)
    s.add_argument("--slo-e2e-s", type=float, default=None)
    s.add_argument("--slo-target", type=float, default=None, help="attainment target, 0..1")
    g = p.add_argument_group("sending")
    g.add_argument("--workers", type=int, default=None, help="processes (default: by rate)")
    g.add_argument("--connections", type=int, default=None, help="pre-opened per worker")
    g.add_argument("--max-connections", type=int, default=4096, help="per worker")
    g.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    g.add_argument("--connect-timeout-s", type=float, default=10.0)
    g.add_argument("--read-timeout-s", type=float, default=60.0, help="silence that times out")
    g.add_argument("--request-timeout-s", type=float, default=600.0, help="from scheduled time")
    g.add_argument("--catchup-batch", type=int, default=64, help="sends per loop turn")
    g.add_argument("--lateness-budget-ms", type=float, default=10.0, help="p99 (default 10)")
    g.add_argument("--min-rate-ratio", type=float, default=0.98, help="achieved/offered")
    w = p.add_argument_group("sweep")
    w.add_argument("--sweep", action="store_true", help="search the knee (as sweep/plan do)")
    w.add_argument("--sweep-tolerance", type=float, default=0.05, help="relative width")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--out", type=output_folder, default=None, help="folder for json, html, records")
    p.set_defaults(handler=_bench)


def _positive(name: str, value: float | None, *, allow_zero: bool = False) -> None:
    if value is None:
        return
    ok = value >= 0 if allow_zero else value > 0
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{name} must be {bound} (got {value})")


def _check_args(args: argparse.Namespace) -> None:
    for name in (
        "load", "duration_s", "time_scale", "slo_ttft_s", "slo_tpot_s", "slo_e2e_s",
        "connect_timeout_s", "read_timeout_s", "request_timeout_s", "lateness_budget_ms",
        "sweep_tolerance",
    ):  # fmt: skip
        _positive("--" + name.replace("_", "-"), getattr(args, name))
    _positive("--window-start-s", args.window_start_s, allow_zero=True)
    for name in ("workers", "connections", "max_connections", "catchup_batch"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1 (got {value})")
    if args.slo_target is not None and not 0 < args.slo_target <= 1:
        raise ConfigError(f"--slo-target must be in (0, 1] (got {args.slo_target}), e.g. 0.9")
    if not 0 < args.min_rate_ratio <= 1:
        raise ConfigError(f"--min-rate-ratio must be in (0, 1] (got {args.min_rate_ratio})")
    if args.window_end_s is not None and args.window_end_s <= args.window_start_s:
        raise ConfigError(
            f"--window-end-s ({args.window_end_s}) must be after --window-start-s "
            f"({args.window_start_s})"
        )
    if args.loop == "uvloop":
        try:
            import uvloop  # noqa: F401
        except ImportError:
            raise ConfigError(
                "--loop uvloop: uvloop is not installed; use --loop asyncio"
            ) from None


def _bench(args: argparse.Namespace) -> int:
    _check_args(args)
    from headway.bench.benchmark import (
        BenchOptions,
        SloOverride,
        TraceOptions,
        load_input,
        run_bench,
    )
    from headway.bench.payloads import parse_target
    from headway.bench.sender import SendSettings
    from headway.bench.summary import Budgets

    bench_input = load_input(
        args.input,
        TraceOptions(
            format=args.trace_format,
            time_scale=args.time_scale,
            window_start_s=args.window_start_s,
            window_end_s=args.window_end_s,
        ),
        SloOverride(
            ttft_s=args.slo_ttft_s,
            tpot_s=args.slo_tpot_s,
            e2e_s=args.slo_e2e_s,
            attainment_target=args.slo_target,
        ),
        args.duration_s,
    )
    options = BenchOptions(
        target=parse_target(args.target),
        model=args.model,
        endpoint=args.endpoint,
        stream=not args.no_stream,
        ignore_eos=not args.no_ignore_eos,
        api_key=args.api_key or os.environ.get("OPENAI_API_KEY") or None,
        workers=args.workers,
        loop=args.loop,
        connections=args.connections,
        send=SendSettings(
            max_connections=args.max_connections,
            connect_timeout_s=args.connect_timeout_s,
            read_timeout_s=args.read_timeout_s,
            request_timeout_s=args.request_timeout_s,
            catchup_batch=args.catchup_batch,
        ),
        budgets=Budgets(
            lateness_p99_s=args.lateness_budget_ms / 1000, min_rate_ratio=args.min_rate_ratio
        ),
        seed=args.seed,
    )
    if args.sweep:
        return _sweep(args, bench_input, options)
    run = run_bench(bench_input, options, args.load)
    return _report_run(args, run)


def _report_run(args: argparse.Namespace, run: Any) -> int:
    from headway.bench.page import render_run
    from headway.bench.records import write_records
    from headway.bench.sent_trace import write_sent_trace
    from headway.bench.series import per_second
    from headway.files.jsonout import to_builtins, to_json
    from headway.files.output import write_text_atomic

    text = to_json(run.result)
    if args.out is not None:
        w = run.workload
        write_text_atomic(args.out / "bench.json", text)
        page = render_run(to_builtins(run.result), per_second(run.records))
        write_text_atomic(args.out / "bench.html", page)
        write_records(
            args.out / "records.npz",
            run.records,
            {
                "task": w.call_task,
                "step": w.call_step,
                "task_class": w.task_class[w.call_task],
                "tenant": w.task_tenant[w.call_task],
                "input_tokens": w.call_input_tokens,
                "output_tokens_asked": w.call_output_tokens,
            },
        )
        write_sent_trace(args.out, w, run.records)
    for line in run.result.warnings:
        sys.stderr.write(f"headway bench: warning: {line}\n")
    if args.json:
        sys.stdout.write(text)
    else:
        sys.stdout.write(_text(run.result))
        if args.out is not None:
            sys.stdout.write(
                f"wrote {args.out}/bench.json, bench.html, records.npz, sent-trace.jsonl, "
                "sent-workload.yaml\n"
            )
    nothing = _nothing_got_through(run.result)
    if nothing:
        sys.stderr.write(f"headway: error: {nothing}\n")
        return 1
    return 0 if run.result.passed else 1


def _nothing_got_through(r: Any) -> str:
    """Why no call completed, in one line (empty when some did, or none was scheduled):
    a run that measured nothing must not pass."""
    o = r.outcomes
    if o.calls == 0 or o.by_error.get("ok", 0) > 0:
        return ""
    errors = ", ".join(f"{n} {name}" for name, n in o.by_error.items() if name != "ok" and n)
    statuses = ", ".join(f"{n} × HTTP {code}" for code, n in o.by_status.items())
    return (
        f"no call got through: {o.calls} of {o.calls} failed ({errors}"
        f"{'; ' + statuses if statuses else ''}); is {r.target} up and serving {r.model}?"
    )


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value * 1000:.1f} ms"


def _tokens_line(t: Any) -> str:
    def drift(value: float | None) -> str:
        return "" if value is None else f" ({value:+.1%})"

    return (
        f"  tokens: prompt {t.prompt_tokens_reported:,} served / {t.asked_prompt_tokens:,} "
        f"asked{drift(t.prompt_drift)}; output {t.output_tokens:,} served / "
        f"{t.asked_output_tokens:,} asked{drift(t.output_drift)}"
    )


def _text(r: Any) -> str:
    from headway.core.metrics import task_deadline_text

    p, lat, slo, cost = r.pacing, r.latencies, r.slo, r.cost
    lines = [
        f"{r.workload} → {r.target} ({r.model}, {r.endpoint}), load ×{r.load_factor:g}",
        f"  sent {p.sent_calls}/{p.scheduled_calls} calls; offered "
        f"{p.offered_rate_per_s or 0:.1f}/s, achieved {p.achieved_rate_per_s or 0:.1f}/s; "
        f"lateness p50 {_ms(p.lateness.p50_s)}, p99 {_ms(p.lateness.p99_s)}, "
        f"max {_ms(p.lateness.max_s)}; gap CV {p.scheduled_gap_cv or 0:.2f} scheduled, "
        f"{p.sent_gap_cv or 0:.2f} sent",
        f"  TTFT p50 {_ms(lat.ttft.p50_s)} p99 {_ms(lat.ttft.p99_s)}; TPOT p50 "
        f"{_ms(lat.tpot.p50_s)} p99 {_ms(lat.tpot.p99_s)}; e2e p50 {_ms(lat.e2e.p50_s)} "
        f"p99 {_ms(lat.e2e.p99_s)} (from scheduled times)",
        f"  SLO attainment {slo.attainment:.1%} (target {slo.target:.0%}), goodput "
        f"{slo.goodput_per_s:.2f}/s; "
        f"{task_deadline_text(slo.task_attainment, slo.task_deadlines_declared)}",
        f"  outcomes {r.outcomes.by_error}; HTTP {r.outcomes.by_status}",
        _tokens_line(r.tokens),
        f"  generator: {cost.workers} worker(s), {cost.loop}, "
        f"{cost.cpu_ms_per_request or 0:.3f} ms CPU/request, startup {cost.startup_s:.2f} s",
    ]
    if r.little is not None:
        lines.append(
            f"  Little's law at the client: L {r.little.mean_in_system:.2f} sampled, λW "
            f"{r.little.lambda_w:.2f} from the records ({r.little.relative_mismatch:.1%})"
        )
    for c in r.checks:
        mark = "ok" if c.passed else "FAILED"
        lines.append(f"  check {c.name}: {c.value if c.value is not None else '—'} "
                     f"(limit {c.limit}) {mark}")  # fmt: skip
    return "\n".join(lines) + "\n"


def _sweep(args: argparse.Namespace, bench_input: Any, options: Any) -> int:
    from headway.bench.knee import BenchPoint, sweep_knee
    from headway.bench.page import render_sweep
    from headway.core.workload.validate import unbounded_classes
    from headway.files.jsonout import to_builtins, to_json
    from headway.files.output import write_text_atomic

    spec = bench_input.loaded.spec
    target = max(c.slo.attainment_target for c in spec.classes.values())
    if len(unbounded_classes(spec)) == len(spec.classes):
        raise ConfigError(
            "--sweep needs an SLO to find a knee: the workload's classes name none; add "
            "`slo` bounds to the file or pass --slo-ttft-s / --slo-e2e-s"
        )

    def show(point: BenchPoint) -> None:
        # Each point is a whole bench run (minutes): say so as it ends, on stderr when
        # stdout carries the JSON.
        out = sys.stderr if args.json else sys.stdout
        out.write(
            f"load ×{point.load_factor:.3g}: {point.offered_calls_per_s:.3g} calls/s, "
            f"attainment {point.slo_attainment:.1%}, TTFT p99 {_ms(point.ttft_p99_s)}, "
            f"lateness p99 {_ms(point.lateness_p99_s)}"
            f"{'' if point.sender_ok else ' (sender outside budget)'}\n"
        )
        out.flush()

    result = sweep_knee(
        bench_input,
        options,
        target,
        start=args.load,
        tolerance=args.sweep_tolerance,
        on_point=show,
    )
    text = to_json(result)
    if args.out is not None:
        write_text_atomic(args.out / "sweep.json", text)
        write_text_atomic(args.out / "sweep.html", render_sweep(to_builtins(result)))
    if args.json:
        sys.stdout.write(text)
    else:
        k = result.knee
        sys.stdout.write(
            f"knee: ×{k.load_factor:.3g} ({k.offered_calls_per_s:.3g} calls/s) keeps "
            f"attainment >= {k.target:.0%}\n"
            if k.found
            else f"even ×{k.upper_load_factor:.3g} misses {k.target:.0%}\n"
        )
        if result.sender_limited:
            sys.stdout.write("a point next to the knee missed the sender's budget\n")
    return 1 if result.sender_limited else 0


def main(argv: list[str] | None = None) -> int:
    """``python -m headway.bench``: the bench verb alone, without importing the other verbs
    (starts faster than ``headway bench``); same options and exit codes."""
    from headway.core.errors import HeadwayError

    parser = argparse.ArgumentParser(prog="headway")
    register(parser.add_subparsers(dest="verb", metavar="VERB"))
    args = parser.parse_args(["bench", *(sys.argv[1:] if argv is None else argv)])
    try:
        return int(args.handler(args))
    except HeadwayError as exc:
        sys.stderr.write(f"headway: error: {exc}\n")
        return 2
