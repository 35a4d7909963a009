"""The ``headway calibrate`` verb.

``headway calibrate --target URL --out profile.json [--cluster-out cluster.yaml]
[--model NAME] [--time-scale F] [--hardware TEXT] [--rounds N]
[--prefill-prompt-tokens 256,1024,...] [--decode-concurrency 2,4,...]
[--decode-prompt-tokens 128,2048] [--shared-prefix-tokens N] [--max-num-seqs N]
[--max-num-batched-tokens N] [--max-drift F] [--max-ci-impact F] [--json]`` probes the
endpoint and writes the fitted profile and a cluster file of the engine's settings
(``docs/calibrate.md``). It exits 1, naming what failed, when the fit cannot be trusted
(drift, a confidence interval too wide). A bad ``--target``, a server that is not up or
an ``--out`` that cannot be written is one line and exit code 2, before any probe runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from headway.calibrate.plan import DEFAULT_PLAN, ProbePlan, ProbeShape
from headway.calibrate.trust import DEFAULT_LIMITS, TrustLimits
from headway.core.errors import ConfigError
from headway.files.output import output_file
from headway.verbs import VERBS

if TYPE_CHECKING:
    from headway.calibrate.profile import Profile

__all__ = ["plan_from_args", "register"]

_POOR_FIT = 0.1
"""An rms relative error above this gets a warning."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``calibrate``."""
    p = subparsers.add_parser(
        "calibrate",
        help=VERBS["calibrate"].help,
        description="Send designed request shapes to an endpoint, time its token streams and "
        "fit the step-time model that `simulate` (cluster `profile:`) and "
        "`emulate --profile` use.",
    )
    p.add_argument("--target", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    p.add_argument(
        "--out", type=output_file, required=True, help="the profile file to write (JSON)"
    )
    p.add_argument("--cluster-out", type=output_file, default=None,
                   help="the cluster file to write, naming the profile and holding "
                   "the engine's settings (default: PROFILE.cluster.yaml)")  # fmt: skip
    p.add_argument("--model", default=None, help="model name (default: the first listed)")
    p.add_argument("--time-scale", type=float, default=None,
                   help="engine seconds per wall second (default: the endpoint's "
                   "speedup from /version, else 1)")  # fmt: skip
    p.add_argument("--hardware", default="", help="hardware to record (default: /version's)")
    d = DEFAULT_PLAN
    p.add_argument("--prefill-prompt-tokens", default=_csv(d.prefill_prompt_tokens),
                   help="prompt lengths of the prefill probes")  # fmt: skip
    p.add_argument("--rounds", type=int, default=d.rounds,
                   help="times the probe grid runs, interleaved (default 3)")  # fmt: skip
    p.add_argument("--prefill-output-tokens", type=int, default=d.prefill_output_tokens)
    p.add_argument("--decode-concurrency", default=_csv(d.decode_concurrency),
                   help="batch sizes of the decode probes")  # fmt: skip
    p.add_argument("--decode-prompt-tokens", default=_csv(d.decode_prompt_tokens),
                   help="context lengths of the decode probes")  # fmt: skip
    p.add_argument("--decode-output-tokens", type=int, default=d.decode_output_tokens)
    p.add_argument("--shared-prefix-tokens", type=int, default=d.shared_prefix_tokens,
                   help="prefix the shared probe's requests have in common, a multiple of "
                   "256 (default 1024; 0: no shared probe, a read of a block that other "
                   "sequences also read costs what any read does)")  # fmt: skip
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="the engine's step token budget (read from the engine where "
                   "it exposes it, which vLLM does only in its dev mode; this flag wins; "
                   "else 8192)")  # fmt: skip
    p.add_argument(
        "--max-num-seqs",
        type=int,
        default=None,
        help="the engine's sequence limit, for the cluster file (read from the engine where "
        "it exposes it; this flag wins)",
    )
    p.add_argument("--max-drift", type=float, default=DEFAULT_LIMITS.max_drift,
                   help="fail when the reference probe's step time moves more than this "
                   "fraction during the run (default 0.15)")  # fmt: skip
    p.add_argument("--max-ci-impact", type=float, default=DEFAULT_LIMITS.max_ci_impact,
                   help="fail when a coefficient's 95%% interval moves a predicted time by "
                   "more than this fraction (default 0.25)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the profile as JSON")
    p.set_defaults(handler=_calibrate)


def _csv(values: tuple[int, ...]) -> str:
    return ",".join(str(v) for v in values)


def _ints(flag: str, text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(
            f"{flag} must be comma-separated integers (got {text!r}), e.g. 256,1024,4096",
            path=flag,
        ) from None
    if not values:
        raise ConfigError(f"{flag} is empty; give at least one value", path=flag)
    return values


def plan_from_args(args: argparse.Namespace) -> ProbePlan:
    """The probe plan the flags describe."""
    d = DEFAULT_PLAN
    for flag, value in (("--max-num-batched-tokens", args.max_num_batched_tokens),
                        ("--max-num-seqs", args.max_num_seqs)):  # fmt: skip
        if value is not None and value < 1:
            raise ConfigError(f"{flag} must be >= 1 (got {value})", path=flag)
    try:
        return dataclasses.replace(
            DEFAULT_PLAN,
            prefill_prompt_tokens=_ints("--prefill-prompt-tokens", args.prefill_prompt_tokens),
            rounds=args.rounds,
            prefill_output_tokens=args.prefill_output_tokens,
            decode_concurrency=_ints("--decode-concurrency", args.decode_concurrency),
            decode_prompt_tokens=_ints("--decode-prompt-tokens", args.decode_prompt_tokens),
            decode_output_tokens=args.decode_output_tokens,
            shared_prefix_tokens=args.shared_prefix_tokens,
            max_num_batched_tokens=args.max_num_batched_tokens or d.max_num_batched_tokens,
        )
    except ValueError as error:
        raise ConfigError(str(error)) from None


def _limits(args: argparse.Namespace) -> TrustLimits:
    try:
        return TrustLimits(max_drift=args.max_drift, max_ci_impact=args.max_ci_impact)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def _calibrate(args: argparse.Namespace) -> int:
    from headway.bench.benchmark import discover_model
    from headway.bench.payloads import parse_target
    from headway.calibrate.engine_settings import write_cluster
    from headway.calibrate.probe import ProbeError  # aiohttp loads only for this verb
    from headway.calibrate.profile import write_profile
    from headway.calibrate.run import calibrate

    plan = plan_from_args(args)
    unidentified = plan.unidentified()
    if unidentified is not None:
        raise ConfigError(unidentified[1], path=unidentified[0])
    limits = _limits(args)
    if args.time_scale is not None and not args.time_scale > 0:
        raise ConfigError(f"--time-scale must be > 0 (got {args.time_scale})", path="--time-scale")
    cluster_out = args.cluster_out or args.out.with_suffix(".cluster.yaml")
    # As bench does: a bad URL or a server that is not up is one line and exit code 2.
    discover_model(parse_target(args.target), api_key=None)
    started = time.perf_counter()

    def progress(n: int, total: int, shape: ProbeShape) -> None:
        elapsed = time.perf_counter() - started
        left = f", ~{elapsed / n * (total - n):.0f} s left" if n else ""
        sys.stderr.write(
            f"\rprobe {n + 1}/{total} (round {min(shape.round + 1, plan.rounds)}/{plan.rounds}): "
            f"{shape.kind} P={shape.prompt_tokens} B={shape.concurrency} "
            f"out={shape.output_tokens}; {elapsed:.0f} s{left}   "
        )
        sys.stderr.flush()

    try:
        profile = calibrate(
            args.target, plan=plan, model=args.model, time_scale=args.time_scale,
            hardware=args.hardware, progress=None if args.json else progress, limits=limits,
            max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        )  # fmt: skip
    except ProbeError as error:
        sys.stderr.write(f"\nheadway: error: {error}\n")
        return 1
    except ValueError as error:
        sys.stderr.write(f"\nheadway: error: the fit failed: {error}\n")
        return 1
    write_profile(profile, args.out)
    # An untrustworthy fit keeps its profile for inspection, but no cluster file: that is
    # what simulate and plan read, and a stale one from an earlier run would pass for this.
    if profile.fit.problems:
        cluster_out.unlink(missing_ok=True)
        missing = []
    else:
        missing = write_cluster(cluster_out, args.out, profile.engine_settings, args.target)
    if not args.json:
        sys.stderr.write("\n")
    if "max_num_batched_tokens" in missing:
        sys.stderr.write(
            "headway: warning: the engine does not expose max_num_batched_tokens: the fit "
            f"assumed {plan.max_num_batched_tokens}; give --max-num-batched-tokens as the "
            "engine was started\n"
        )
    references = plan.rounds + 1  # one opens every round, one closes the run
    measured = len(profile.fit.reference_step_s)
    if measured < 2:
        sys.stderr.write(
            f"headway: warning: {measured} of {references} reference probes could be "
            "timed (the others were disturbed: a busy client or machine), so the drift "
            "check did not run; rerun on a quiet machine\n"
        )
    if profile.fit.rms_relative_error > _POOR_FIT:
        sys.stderr.write(
            f"headway: warning: the fit is poor (rms error "
            f"{profile.fit.rms_relative_error:.0%}): the endpoint or this machine was busy, "
            "or the engine's step budget is not --max-num-batched-tokens; rerun on a quiet "
            "endpoint\n"
        )
    if args.json:
        sys.stdout.write(msgspec.json.encode(profile).decode() + "\n")
    else:
        _print_summary(profile, args.out, cluster_out, missing)
    for problem in profile.fit.problems:
        sys.stderr.write(f"headway: error: untrustworthy fit: {problem}\n")
    if profile.fit.problems:
        sys.stderr.write(
            f"headway: {args.out} was written for inspection; do not plan with it (no "
            f"cluster file was written: {cluster_out})\n"
        )
        return 1
    return 0


def _print_summary(profile: Profile, out: Path, cluster_out: Path, missing: list[str]) -> None:
    st = profile.step_time
    fit = profile.fit
    lines = [
        f"wrote {out}: {profile.model} ({profile.engine or 'engine unknown'})",
        f"  overhead {st.overhead_s * 1e3:.3f} ms/step, prefill {st.per_prefill_token_s * 1e6:.3f} "
        f"µs/token + {st.per_prefill_pair_s * 1e12:.3f} ps/pair + "
        f"{st.per_prefill_seq_s * 1e3:.3f} ms/request, decode "
        f"{st.per_decode_seq_s * 1e6:.2f} µs/seq + "
        f"{st.per_decode_kv_token_s * 1e9:.3f} ns/KV token"
        + (
            f" (× {st.shared_kv_read_ratio:.3g} read again, shared)"
            if st.shared_kv_read_ratio != 1.0
            else ""
        ),
    ]
    for name, p in fit.parameters.items():
        lines.append(
            f"  {name}: {p.value:.4g} s, 95% interval [{p.ci_low:.4g}, {p.ci_high:.4g}], "
            f"moves a prediction by up to {p.ci_impact:.1%}"
        )
    reruns = (
        f" ({fit.num_reference_reruns} disturbed reference probes run again)"
        if fit.num_reference_reruns
        else ""
    )
    lines.append(
        f"  drift {fit.drift:.1%} over {fit.num_rounds} rounds{reruns}; fit rms error "
        f"{fit.rms_relative_error:.1%} over {fit.num_ttft_samples} prefill and "
        f"{fit.num_gap_samples} decode samples in {fit.wall_s:.1f} s"
    )
    if fit.frontend_s is not None:
        lines.append(
            f"  frontend (the API server, outside the engine core; the engine's own split): "
            f"{fit.frontend_s * 1e3:.1f} ms of a lone request's TTFT, inside "
            f"per_prefill_seq_s ({st.per_prefill_seq_s * 1e3:.1f} ms)"
        )
    exposed = ", ".join(f"{k} ({v})" for k, v in sorted(profile.engine_settings.sources.items()))
    written = f"wrote {cluster_out}" if not fit.problems else "engine read (no cluster file)"
    lines.append(f"{written}: engine settings {exposed or 'none exposed'}")
    if missing:
        lines.append(f"  not exposed, simulator defaults kept: {', '.join(missing)}")
    sys.stdout.write("\n".join(lines) + "\n")
