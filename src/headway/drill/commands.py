"""The ``headway drill`` verb: run drills, print expected against observed, write
``drills.json`` and ``drills.html``; exit 1 when a drill fails.

``headway drill NAME|all`` starts a local stack per drill (gateway + emulated engines, and
Redis where the drill needs it) on loopback ports; ``--target URL`` runs against a
deployment instead (see ``docs/drills.md``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import math
import os
import sys
import tempfile
import urllib.parse
from pathlib import Path
from typing import Any

import msgspec

from headway.core.errors import ConfigError
from headway.files.output import output_folder
from headway.reachable import connect_error
from headway.verbs import VERBS

SCHEMA = "headway.drills/1"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``drill``."""
    p = subparsers.add_parser(
        "drill",
        help=VERBS["drill"].help,
        description="Each drill offers a load, injects faults on a timeline and checks the "
        "designed outcome (reject, retry, drain or rollback) from the clients' view and the "
        "gateways' and engines' metrics. Exit 1 when a drill fails.",
    )
    p.add_argument("drills", nargs="*", metavar="NAME", help="drill names, or `all`")
    p.add_argument("--list", action="store_true", help="list the drills and exit")
    p.add_argument("--target", action="append", default=[], metavar="URL",
                   help="a gateway of your deployment (repeatable; default: local)")  # fmt: skip
    p.add_argument("--engine", action="append", default=[], metavar="URL",
                   help="an engine behind it, for its /metrics (repeatable)")  # fmt: skip
    p.add_argument("--api-key", action="append", default=[], metavar="KEY",
                   help="API keys for the drills' tenants (repeatable)")  # fmt: skip
    p.add_argument("--metrics-token", default=None,
                   help="the gateways' metrics_token, to read their /metrics")  # fmt: skip
    p.add_argument("--hooks", default=None, metavar="FILE",
                   help="YAML: fault action -> shell command, for --target")  # fmt: skip
    p.add_argument("--out", type=output_folder, default=Path("drills-out"), help="output directory")
    p.add_argument("--seed", type=int, default=0, help="seed of the clients' random streams")
    p.add_argument("--duration-s", type=float, default=None,
                   help="override each drill's load duration (e.g. a long soak)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(handler=_drill)


def _chosen(names: list[str]) -> list[str]:
    from headway.drill.catalog import DRILLS, drill_names

    if not names:
        raise ConfigError("name a drill or `all` (see `headway drill --list`)", path="drills")
    if "all" in names:
        return drill_names()
    unknown = [n for n in names if n not in DRILLS]
    if unknown:
        raise ConfigError(
            f"unknown drill {unknown[0]!r}; choose from {', '.join(drill_names())} or all",
            path="drills",
        )
    return list(dict.fromkeys(names))


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(tmp, path)


def _jsonable(value: Any) -> Any:
    """JSON has no infinity: a figure that never happened is null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def _drill(args: argparse.Namespace) -> int:
    from rich.console import Console

    from headway.drill.catalog import DRILLS
    from headway.drill.page import render_drills_html
    from headway.drill.run import DrillResult, run_drill
    from headway.drill.stack import LocalStack, RemoteStack, Unsupported, read_hooks

    console = Console(stderr=True)
    if args.list:
        for name, d in DRILLS.items():
            print(f"{name:22} {d.title}")  # noqa: T201 - the listing is the output
        return 0
    names = _chosen(args.drills)
    if args.duration_s is not None and not (math.isfinite(args.duration_s) and args.duration_s > 0):
        raise ConfigError(f"--duration-s must be > 0 (got {args.duration_s})", path="duration_s")
    hooks = read_hooks(args.hooks) if args.hooks else {}
    if (args.engine or args.hooks or args.api_key) and not args.target:
        raise ConfigError("--engine, --hooks and --api-key go with --target URL", path="target")
    for url in args.target:
        _check_reachable(url)
    args.out.mkdir(parents=True, exist_ok=True)
    target = ", ".join(args.target) if args.target else "a local stack (gateway + emulators)"
    data: dict[str, Any] = {
        "schema": SCHEMA,
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "target": target,
        "seed": args.seed,
        "drills": [],
        "results": [],
    }
    for name in names:
        drill = DRILLS[name]
        if args.duration_s is not None:
            drill = msgspec.structs.replace(
                drill, load=msgspec.structs.replace(drill.load, duration_s=args.duration_s)
            )
        console.print(f"[bold]{name}[/bold]: {drill.title}")
        local: LocalStack | None = None
        try:
            if args.target:
                stack: Any = RemoteStack(
                    args.target, engine_urls=args.engine, api_keys=args.api_key,
                    metrics_token=args.metrics_token, hooks=hooks,
                )  # fmt: skip
            else:
                local = LocalStack(drill.stack)
                local.start()
                stack = local
            result = asyncio.run(
                run_drill(drill, stack, seed=args.seed, on_progress=lambda m: console.print(m))
            )
        except Unsupported as error:
            result = DrillResult(name, drill.title, "skipped", str(error))
        except KeyboardInterrupt:
            console.print("[yellow]interrupted; the finished drills are written[/yellow]")
            return 130
        except Exception as error:  # noqa: BLE001 - a drill that cannot run is an error; the rest run
            result = DrillResult(name, drill.title, "error", f"{type(error).__name__}: {error}")
        finally:
            if local is not None:
                local.stop()
        _print(console, result)
        data["drills"].append(
            {"name": name, "seed_text": drill.seed_text, "designed": drill.designed}
        )
        data["results"].append(_jsonable(result.to_json()))
        _write_atomic(args.out / "drills.json", msgspec.json.encode(data).decode() + "\n")
        _write_atomic(args.out / "drills.html", render_drills_html(data))
    statuses = [r["status"] for r in data["results"]]
    line = (
        f"{statuses.count('passed')} passed, "
        f"{statuses.count('failed') + statuses.count('error')} failed, "
        f"{statuses.count('skipped')} skipped; wrote {args.out / 'drills.json'} and "
        f"{args.out / 'drills.html'}"
    )
    console.print(line)
    if args.json:
        with contextlib.suppress(BrokenPipeError):
            sys.stdout.write(msgspec.json.encode(data).decode() + "\n")
    return 1 if any(s in ("failed", "error") for s in statuses) else 0


def _check_reachable(url: str) -> None:
    """A ``--target`` that answers nothing is a usage error before any drill runs: each
    drill would otherwise be skipped or fail on its own, and the run look like a result.
    Any HTTP answer (even 401 or 404) counts as reachable."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"--target {url!r} is not an http(s) URL; use e.g. http://127.0.0.1:8080",
            path="--target",
        )
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as error:  # a port out of range
        raise ConfigError(f"--target {url!r}: {error}", path="--target") from None
    reason = connect_error(parts.hostname, port)
    if reason is not None:
        raise ConfigError(
            f"--target {url}: cannot connect ({reason}); start the gateway there or fix the URL",
            path="--target",
        ) from None


def _print(console: Any, result: Any) -> None:
    from rich.table import Table

    style = {"passed": "green", "skipped": "yellow"}.get(result.status, "red")
    console.print(f"  [{style}]{result.status}[/{style}] in {result.wall_s:g} s {result.detail}")
    if not result.checks:
        return
    table = Table(show_edge=False, pad_edge=False)
    for column in ("figure", "expected", "observed", "", "why"):
        table.add_column(column)
    for c in result.checks:
        observed = "not measured" if c.observed is None else f"{c.observed:.4g}"
        mark = "[green]pass[/green]" if c.passed else "[red]FAIL[/red]"
        table.add_row(c.figure, f"{c.op} {c.value:g}", observed, mark, c.why)
    console.print(table)
