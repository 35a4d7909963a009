"""The step-time profile file that ``headway calibrate`` writes.

```json
{"format": "headway-profile/1",
 "model": "llama-3-8b", "engine": "vllm 0.11.0", "hardware": "H100-SXM",
 "created_utc": "2026-11-29T15:00:00Z", "target": "http://127.0.0.1:8000",
 "step_time": {"overhead_s": 0.005, "per_prefill_token_s": 6e-05, "per_prefill_pair_s": 2e-09,
               "per_decode_seq_s": 0.00025, "per_decode_kv_token_s": 3e-07},
 "request_overhead_s": 0.0012,
 "fit": {...}}
```

``step_time`` is an :class:`~headway.core.engine.steptime.AffineStepTime`; the rest says
where it came from. A cluster file takes it as ``profile: path/to/profile.json`` (relative
to the cluster file), or inline as ``profile: {overhead_s: ..., ...}``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from headway.core.engine.steptime import AffineStepTime
from headway.core.errors import ConfigError, config_error

__all__ = ["PROFILE_FORMAT", "FitSummary", "Profile", "read_profile", "write_profile"]

PROFILE_FORMAT = "headway-profile/1"


class FitSummary(msgspec.Struct, frozen=True, kw_only=True):
    """How well the fitted model explains the measurements."""

    num_ttft_samples: int = 0
    """Prefill probes (time to first token of a request running alone)."""
    num_gap_samples: int = 0
    """Decode-step samples (median inter-token gaps of a steady batch)."""
    rms_relative_error: float = 0.0
    """Root-mean-square relative error of the fitted times against the samples."""
    max_relative_error: float = 0.0
    """Largest relative error over the samples."""
    num_discarded_probes: int = 0
    """Decode probes left out as disturbed (their step times scattered widely)."""
    time_scale: float = 1.0
    """Engine seconds per measured wall second (an emulator's ``speedup``, else 1)."""
    wall_s: float = 0.0
    """How long the probing took."""


class Profile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A measured step-time profile and where it came from."""

    format: str = PROFILE_FORMAT
    model: str = ""
    """The model served by the endpoint measured."""
    engine: str = ""
    """The engine and version, when the endpoint said (``/version``, ``Server`` header)."""
    hardware: str = ""
    """The hardware, when known (the endpoint's ``/version``, or ``--hardware``)."""
    created_utc: str = ""
    """When the profile was measured (ISO 8601, UTC)."""
    target: str = ""
    """The endpoint measured."""
    step_time: AffineStepTime
    """The fitted step-time model."""
    request_overhead_s: float = 0.0
    """Time a request spends outside engine steps before its first token (HTTP, tokenizing,
    queueing into the engine): measured TTFT minus the first step. Not simulated."""
    fit: FitSummary = FitSummary()
    plan: dict[str, Any] = msgspec.field(default_factory=dict)
    """The probe design that produced it."""


def read_profile(path: Path) -> Profile:
    """Read a profile file; errors name the file, the key and the fix."""
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise ConfigError(
            f"{path}: cannot read the profile ({error.strerror}); give the file that "
            "`headway calibrate --out` wrote",
            path=str(path),
        ) from None
    return parse_profile(raw, str(path))


def parse_profile(raw: bytes | str, source: str) -> Profile:
    """Decode a profile document (JSON)."""
    try:
        profile = msgspec.json.decode(raw, type=Profile)
    except msgspec.DecodeError as error:
        raise config_error(
            error,
            source,
            hint=f" (a headway step-time profile, format {PROFILE_FORMAT}, as "
            "`headway calibrate --out` writes it)",
        ) from None
    except ValueError as error:  # AffineStepTime checks its coefficients
        raise ConfigError(f"{source}: $.step_time: {error}", path="$.step_time") from None
    if profile.format != PROFILE_FORMAT:
        raise ConfigError(
            f"{source}: $.format: {profile.format!r} is not {PROFILE_FORMAT!r}; recalibrate "
            "with this headway",
            path="$.format",
        )
    return profile


def write_profile(profile: Profile, path: Path) -> None:
    """Write ``profile`` as indented JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(msgspec.json.format(msgspec.json.encode(profile), indent=2) + b"\n")
