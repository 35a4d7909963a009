"""The ``headway check`` verb.

``headway check --target URL [--reference URL | --contract FILE] [--model NAME]
[--reference-model NAME] [--api-key KEY] [--reference-api-key KEY] [--write FILE]
[--logprob-tolerance F] [--timeout-s S] [--json]`` records the target's endpoint contract
and writes it; against a reference it names the first mismatch and what to inspect next
(``docs/check.md``). Exit codes: 0 every comparable check matches (or, without a
reference, the contract was written); 1 a mismatch; 2 a usage error or an endpoint that
cannot be reached.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec

from headway.check.compare import DEFAULT_LOGPROB_TOLERANCE, CheckResult, Verdict
from headway.check.contract import Contract
from headway.core.errors import ConfigError
from headway.files.output import output_file
from headway.verbs import VERBS

__all__ = ["default_contract_path", "register"]

_MARK = {"match": "match", "mismatch": "MISMATCH", "not_available": "not available",
         "recorded": "recorded"}  # fmt: skip


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``check``."""
    p = subparsers.add_parser(
        "check",
        help=VERBS["check"].help,
        description="Send fixed inputs to an OpenAI-compatible endpoint and record what it "
        "does with them (tokenizer, chat template, greedy output ids, EOS, stop strings, "
        "logprobs, usage counts) in a contract file; against a reference endpoint or "
        "contract, name the first mismatch and what to inspect next.",
        epilog="Exit codes: 0 every comparable check matches (without a reference: the "
        "contract was written); 1 a mismatch; 2 a usage error or an endpoint that cannot "
        "be reached.",
    )
    p.add_argument("--target", required=True, metavar="URL",
                   help="base URL, e.g. http://127.0.0.1:8000")  # fmt: skip
    ref = p.add_mutually_exclusive_group()
    ref.add_argument("--reference", default=None, metavar="URL",
                     help="the endpoint to compare with (sent the same inputs)")  # fmt: skip
    ref.add_argument("--contract", type=Path, default=None, metavar="FILE",
                     help="a contract file to compare with (its inputs are sent)")  # fmt: skip
    p.add_argument("--model", default=None, metavar="NAME",
                   help="the target's model (default: the first listed)")  # fmt: skip
    p.add_argument("--reference-model", default=None, metavar="NAME",
                   help="the reference's model (default: the first it lists)")  # fmt: skip
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help="the target's bearer token (default: $OPENAI_API_KEY); never "
                   "written or printed")  # fmt: skip
    p.add_argument("--reference-api-key", default=None, metavar="KEY",
                   help="the reference's bearer token (default: none)")  # fmt: skip
    p.add_argument("--write", type=output_file, default=None, metavar="FILE",
                   help="the target's contract file (default: contract-HOST-PORT.json here, "
                   "numbered when that exists: never overwritten)")  # fmt: skip
    p.add_argument("--logprob-tolerance", type=float, metavar="F",
                   default=DEFAULT_LOGPROB_TOLERANCE,
                   help="largest logprob difference that matches (default 1e-3)")  # fmt: skip
    p.add_argument("--timeout-s", type=float, default=60.0, metavar="S",
                   help="seconds each request may take (default 60)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the verdict as JSON")
    p.set_defaults(handler=_check)


def default_contract_path(target: str, folder: Path) -> Path:
    """``contract-HOST-PORT.json`` in ``folder``, or ``contract-HOST-PORT-N.json`` with the
    first N that does not exist."""
    parts = urlsplit(target)
    stem = f"contract-{parts.hostname or 'endpoint'}"
    try:
        if parts.port:
            stem += f"-{parts.port}"
    except ValueError:
        pass
    path = folder / f"{stem}.json"
    n = 1
    while path.exists():
        path = folder / f"{stem}-{n}.json"
        n += 1
    return path


def _check(args: argparse.Namespace) -> int:
    from headway.check.compare import compare, summarize
    from headway.check.contract import Inputs, read_contract, write_contract
    from headway.check.probe import probe

    if not args.logprob_tolerance >= 0:
        raise ConfigError(
            f"--logprob-tolerance must be >= 0 (got {args.logprob_tolerance})",
            path="--logprob-tolerance",
        )
    if not args.timeout_s > 0:
        raise ConfigError(f"--timeout-s must be > 0 (got {args.timeout_s})", path="--timeout-s")
    reference: Contract | None = None
    inputs = Inputs()
    notes: list[str] = []
    if args.contract is not None:
        reference = read_contract(args.contract)
        inputs = reference.inputs
    elif args.reference is not None:
        reference, ref_notes = probe(
            args.reference, inputs, model=args.reference_model,
            api_key=args.reference_api_key, timeout_s=args.timeout_s, flag="--reference",
        )  # fmt: skip
        notes += [f"reference: {n}" for n in ref_notes]
        inputs = reference.inputs
    api_key = args.api_key or os.environ.get("OPENAI_API_KEY") or None
    target, target_notes = probe(
        args.target, inputs, model=args.model, api_key=api_key, timeout_s=args.timeout_s
    )
    notes += [f"target: {n}" for n in target_notes]
    path: Path = args.write or default_contract_path(args.target, Path.cwd())
    replaced = path.exists()
    write_contract(path, target)
    verdict = (
        summarize(target)
        if reference is None
        else compare(target, reference, logprob_tolerance=args.logprob_tolerance)
    )
    for note in notes:
        sys.stderr.write(f"headway: note: {note}\n")
    if args.json:
        sys.stdout.write(msgspec.json.encode(_as_json(target, reference, verdict, path)).decode())
        sys.stdout.write("\n")
    else:
        _print(target, reference, verdict, path, replaced)
    return 1 if verdict.first_mismatch is not None else 0


def _who(contract: Contract) -> str:
    return f"{contract.endpoint} ({contract.model}, {contract.engine or 'engine unknown'})"


def _as_json(
    target: Contract, reference: Contract | None, verdict: Verdict, path: Path
) -> dict[str, Any]:
    first = verdict.first_mismatch

    def side(c: Contract) -> dict[str, str]:
        return {"endpoint": c.endpoint, "model": c.model, "engine": c.engine}

    return {
        "target": side(target),
        "reference": side(reference) if reference is not None else None,
        "contract": str(path),
        "checks": [
            {"name": r.name, "status": r.status, "detail": r.detail, "next_step": r.next_step}
            for r in verdict.results
        ],
        "first_mismatch": first.name if first is not None else None,
        "next_step": first.next_step if first is not None else None,
    }


def _print(
    target: Contract, reference: Contract | None, verdict: Verdict, path: Path, replaced: bool
) -> None:
    lines = [f"target    {_who(target)}"]
    if reference is not None:
        lines.append(f"reference {_who(reference)}")
    width = max(len(r.name) for r in verdict.results)
    lines.extend(
        f"  {r.name:<{width}}  {_MARK[r.status]:<13}  {_line(r, target)}".rstrip()
        for r in verdict.results
    )
    first = verdict.first_mismatch
    if reference is not None:
        if first is None:
            lines.append("no mismatch: every check both sides could give matches")
        else:
            lines.append(f"first mismatch: {first.name}: {first.detail}")
            lines.append(f"next: {first.next_step}")
    lines.append(f"{'replaced' if replaced else 'wrote'} {path}")
    sys.stdout.write("\n".join(lines) + "\n")


def _line(result: CheckResult, target: Contract) -> str:
    """The table's last column: a recorded figure, or why not / where it differs."""
    if result.status in ("mismatch", "not_available"):
        return result.detail
    if result.name == "logprobs" and target.logprobs is not None:
        return f"checksum {target.logprobs.checksum:.6f}"
    if result.name == "eos" and target.eos is not None:
        return f"{target.eos.finish_reason} after {target.eos.completion_tokens} tokens"
    if result.name == "stop_strings" and target.stop_strings is not None:
        s = target.stop_strings
        honoured = {True: "honoured", False: "not honoured", None: "not in the greedy output"}
        return f"stop {s.stop!r}: {s.finish_reason}, {honoured[s.honoured]}"
    return ""
