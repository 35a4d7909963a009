"""The ``headway workload`` verbs: ``check`` a file, ``compile`` one run's calls to a
trace, print its JSON ``schema``."""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys

from rich.console import Console
from rich.table import Table

from headway.core.workload.compile import compile_workload
from headway.core.workload.validate import unbounded_classes
from headway.files.output import output_file, write_text_atomic
from headway.files.reference import workload_json_schema
from headway.files.workload import load_workload
from headway.verbs import VERBS


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``workload`` verb and its sub-verbs."""
    parser = subparsers.add_parser(
        "workload", help=VERBS["workload"].help, description="Work with workload files."
    )
    verbs = parser.add_subparsers(dest="workload_verb", metavar="SUBVERB", required=True)
    check = verbs.add_parser(
        "check",
        help="validate a workload and summarise one compiled run",
        description="Validate a workload file and compile one run to show what it asks "
        "for; warns about a class without a latency SLO.",
    )
    check.add_argument("workload", metavar="WORKLOAD")
    check.add_argument("--seed", type=int, default=None, help="run seed (default: the file's)")
    check.set_defaults(handler=_check)
    compile_ = verbs.add_parser(
        "compile",
        help="write the calls one run of a workload generates, as a trace",
        description="Compile one run of a workload and write its calls in headway's generic "
        "trace format (CSV, or JSON Lines for a .jsonl name): timestamp_s, input_tokens, "
        "output_tokens, tenant, priority and session_id (the call's task), the file "
        "`simulate` and `bench` replay with `process: trace`. The calls of a multi-call "
        "task are stamped with their task's arrival: replayed as a trace they are sent "
        "together, not step after step.",
    )
    compile_.add_argument("workload", metavar="WORKLOAD")
    compile_.add_argument("-o", "--output", type=output_file, required=True,
                          help="the trace file to write (.csv or .jsonl)")  # fmt: skip
    compile_.add_argument("--seed", type=int, default=None, help="run seed (default: the file's)")
    compile_.set_defaults(handler=_compile)
    schema = verbs.add_parser("schema", help="print the JSON Schema of the workload format")
    schema.set_defaults(handler=_schema)


def _check(args: argparse.Namespace) -> int:
    loaded = load_workload(args.workload)
    run = compile_workload(loaded.spec, seed=args.seed, traces=loaded.traces)
    table = Table(title=f"{loaded.spec.name}: one run of {run.duration_s:g} s (seed {run.seed})")
    for col in ("source", "tasks", "tasks/s", "calls", "calls/task", "mean in", "mean out"):
        table.add_column(col, justify="left" if col == "source" else "right")
    for i, name in enumerate(run.source_names):
        tasks = run.task_source == i
        calls = tasks[run.call_task]
        n_tasks, n_calls = int(tasks.sum()), int(calls.sum())
        table.add_row(
            name,
            str(n_tasks),
            f"{n_tasks / run.duration_s:.3g}",
            str(n_calls),
            f"{n_calls / max(n_tasks, 1):.3g}",
            f"{run.call_input_tokens[calls].mean():.0f}" if n_calls else "—",
            f"{run.call_output_tokens[calls].mean():.0f}" if n_calls else "—",
        )
    Console().print(table)
    for name, cls in loaded.spec.classes.items():
        if cls.slo.placeholder:
            sys.stderr.write(
                f"headway: warning: classes.{name}.slo is a placeholder (`placeholder: true`, "
                "written by `headway trace fit`), not your promise: edit its bounds and "
                "remove `placeholder` before planning on it\n"
            )
    for name in unbounded_classes(loaded.spec):
        sys.stderr.write(
            f"headway: warning: classes.{name}.slo names no latency bound (ttft_s, tpot_s "
            "or e2e_s): every latency meets it, so `plan` and `sweep --search` refuse the "
            f"file until a class has one; add e.g. `classes.{name}.slo: {{ttft_s: 2.0, "
            "tpot_s: 0.1}`\n"
        )
    return 0


def _compile(args: argparse.Namespace) -> int:
    """``headway workload compile``: the run's calls as a generic trace; exit code 0."""
    loaded = load_workload(args.workload)
    run = compile_workload(loaded.spec, seed=args.seed, traces=loaded.traces)
    calls = run.calls_trace()
    assert calls.tenant is not None
    assert calls.priority is not None
    assert calls.session_id is not None
    rows = {
        "timestamp_s": [f"{t:.9g}" for t in calls.arrival_s.tolist()],
        "input_tokens": [str(n) for n in calls.input_tokens.tolist()],
        "output_tokens": [str(n) for n in calls.output_tokens.tolist()],
        "tenant": calls.tenant.tolist(),
        "priority": calls.priority.tolist(),
        "session_id": calls.session_id.tolist(),
    }
    names = list(rows)
    count = len(calls)
    if str(args.output).endswith((".jsonl", ".ndjson")):
        numbers = {"timestamp_s": float, "input_tokens": int, "output_tokens": int}
        lines = [
            json.dumps({k: numbers.get(k, str)(rows[k][i]) for k in names}) for i in range(count)
        ]
        text = "".join(line + "\n" for line in lines)
    else:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(names)
        writer.writerows(zip(*(rows[k] for k in names), strict=True))
        text = out.getvalue()
    write_text_atomic(args.output, text)
    sys.stderr.write(
        f"headway workload compile: {count} calls of {len(run.task_arrival_s)} tasks over "
        f"{run.duration_s:g} s (seed {run.seed}) -> {args.output}\n"
    )
    return 0


def _schema(args: argparse.Namespace) -> int:
    del args
    sys.stdout.write(json.dumps(workload_json_schema(), indent=2) + "\n")
    return 0
