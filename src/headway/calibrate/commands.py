"""The ``headway calibrate`` verb.

``headway calibrate --target URL --out profile.json [--model NAME] [--time-scale F]
[--hardware TEXT] [--prefill-prompt-tokens 256,1024,...] [--decode-concurrency 2,4,...]
[--decode-prompt-tokens 128,2048] [--max-num-batched-tokens N] [--json]`` probes the
endpoint and writes the fitted profile (``docs/calibrate.md``).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import msgspec

from headway.calibrate.plan import DEFAULT_PLAN, ProbePlan, ProbeShape
from headway.core.errors import ConfigError

__all__ = ["plan_from_args", "register"]

_POOR_FIT = 0.1
"""An rms relative error above this gets a warning."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``calibrate``."""
    p = subparsers.add_parser(
        "calibrate",
        help="probe an OpenAI-compatible endpoint and fit a step-time profile",
        description="Send designed request shapes to an endpoint, time its token streams and "
        "fit the step-time model that `simulate` (cluster `profile:`) and "
        "`emulate --profile` use.",
    )
    p.add_argument("--target", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--out", type=Path, required=True, help="the profile file to write (JSON)")
    p.add_argument("--model", default=None, help="model name (default: the first listed)")
    p.add_argument("--time-scale", type=float, default=None,
                   help="engine seconds per wall second (default: the endpoint's "
                   "speedup from /version, else 1)")  # fmt: skip
    p.add_argument("--hardware", default="", help="hardware to record (default: /version's)")
    d = DEFAULT_PLAN
    p.add_argument("--prefill-prompt-tokens", default=_csv(d.prefill_prompt_tokens),
                   help="prompt lengths of the prefill probes")  # fmt: skip
    p.add_argument("--prefill-repeats", type=int, default=d.prefill_repeats)
    p.add_argument("--prefill-output-tokens", type=int, default=d.prefill_output_tokens)
    p.add_argument("--decode-concurrency", default=_csv(d.decode_concurrency),
                   help="batch sizes of the decode probes")  # fmt: skip
    p.add_argument("--decode-prompt-tokens", default=_csv(d.decode_prompt_tokens),
                   help="context lengths of the decode probes")  # fmt: skip
    p.add_argument("--decode-output-tokens", type=int, default=d.decode_output_tokens)
    p.add_argument("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens,
                   help="the engine's step token budget (default 8192)")  # fmt: skip
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
    try:
        return dataclasses.replace(
            DEFAULT_PLAN,
            prefill_prompt_tokens=_ints("--prefill-prompt-tokens", args.prefill_prompt_tokens),
            prefill_repeats=args.prefill_repeats,
            prefill_output_tokens=args.prefill_output_tokens,
            decode_concurrency=_ints("--decode-concurrency", args.decode_concurrency),
            decode_prompt_tokens=_ints("--decode-prompt-tokens", args.decode_prompt_tokens),
            decode_output_tokens=args.decode_output_tokens,
            max_num_batched_tokens=args.max_num_batched_tokens,
        )
    except ValueError as error:
        raise ConfigError(str(error)) from None


def _calibrate(args: argparse.Namespace) -> int:
    from headway.calibrate.probe import ProbeError  # aiohttp loads only for this verb
    from headway.calibrate.profile import write_profile
    from headway.calibrate.run import calibrate

    plan = plan_from_args(args)
    if args.time_scale is not None and not args.time_scale > 0:
        raise ConfigError(f"--time-scale must be > 0 (got {args.time_scale})", path="--time-scale")

    def progress(n: int, total: int, shape: ProbeShape) -> None:
        sys.stderr.write(
            f"\rprobe {n + 1}/{total}: {shape.kind} P={shape.prompt_tokens} "
            f"B={shape.concurrency} out={shape.output_tokens}   "
        )
        sys.stderr.flush()

    try:
        profile = calibrate(
            args.target, plan=plan, model=args.model, time_scale=args.time_scale,
            hardware=args.hardware, progress=None if args.json else progress,
        )  # fmt: skip
    except ProbeError as error:
        sys.stderr.write(f"\nheadway: error: {error}\n")
        return 1
    except ValueError as error:
        sys.stderr.write(f"\nheadway: error: the fit failed: {error}\n")
        return 1
    write_profile(profile, args.out)
    if profile.fit.rms_relative_error > _POOR_FIT:
        sys.stderr.write(
            f"\nheadway: warning: the fit is poor (rms error "
            f"{profile.fit.rms_relative_error:.0%}): the endpoint or this machine was busy, "
            "or the engine's step budget is not --max-num-batched-tokens; rerun on a quiet "
            "endpoint\n"
        )
    if args.json:
        sys.stdout.write(msgspec.json.encode(profile).decode() + "\n")
        return 0
    st = profile.step_time
    sys.stderr.write("\n")
    sys.stdout.write(
        f"wrote {args.out}: {profile.model} ({profile.engine or 'engine unknown'})\n"
        f"  overhead {st.overhead_s * 1e3:.3f} ms/step, prefill {st.per_prefill_token_s * 1e6:.3f} "
        f"µs/token + {st.per_prefill_pair_s * 1e12:.3f} ps/pair, decode "
        f"{st.per_decode_seq_s * 1e6:.2f} µs/seq + "
        f"{st.per_decode_kv_token_s * 1e9:.3f} ns/KV token\n"
        f"  request overhead {profile.request_overhead_s * 1e3:.2f} ms; fit rms error "
        f"{profile.fit.rms_relative_error:.1%} over {profile.fit.num_ttft_samples} prefill and "
        f"{profile.fit.num_gap_samples} decode samples in {profile.fit.wall_s:.1f} s\n"
    )
    return 0
