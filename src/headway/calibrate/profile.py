"""The step-time profile file that ``headway calibrate`` writes.

```json
{"format": "headway-profile/1",
 "model": "llama-3-8b", "engine": "vllm 0.11.0", "hardware": "H100-SXM",
 "created_utc": "2026-11-29T15:00:00Z", "target": "http://127.0.0.1:8000",
 "step_time": {"overhead_s": 0.005, "per_prefill_token_s": 6e-05, "per_prefill_pair_s": 2e-09,
               "per_decode_seq_s": 0.00025, "per_decode_kv_token_s": 3e-07,
               "per_prefill_seq_s": 0.0012},
 "engine_settings": {"block_size": 16, "num_gpu_blocks": 27000, ...},
 "fit": {...}}
```

``step_time`` is an :class:`~headway.core.engine.steptime.AffineStepTime`; the rest says
where it came from and what the engine said of its settings. A profile of an older
headway has a ``request_overhead_s`` beside ``step_time``: it is read as
``step_time.per_prefill_seq_s``, what it measured. A cluster file takes it as
``profile: path/to/profile.json`` (relative to the cluster file), or inline as
``profile: {overhead_s: ..., ...}``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import msgspec

from headway.core.engine.steptime import AffineStepTime
from headway.core.errors import ConfigError, config_error

__all__ = [
    "PROFILE_FORMAT",
    "EngineSettings",
    "FitSummary",
    "ParameterFit",
    "Profile",
    "read_profile",
    "write_profile",
]

PROFILE_FORMAT = "headway-profile/1"


class ParameterFit(msgspec.Struct, frozen=True, kw_only=True):
    """One fitted coefficient and how well the probes pin it."""

    value: float
    ci_low: float
    """Lower end of its 95% confidence interval (bootstrap over the probes' repeats)."""
    ci_high: float
    ci_impact: float
    """Half the interval times the coefficient's leverage: the share of a sample's time
    its uncertainty moves (``--max-ci-impact`` bounds it)."""


class EngineSettings(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The engine's scheduler and KV-cache settings, as far as it exposes them; ``None``:
    not exposed and not given. ``sources`` says where each came from."""

    block_size: int | None = None
    num_gpu_blocks: int | None = None
    enable_prefix_caching: bool | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool | None = None
    max_model_len: int | None = None
    reserve_full_isl: bool | None = None
    """Whether a waiting request is admitted only when its whole sequence fits the free
    KV blocks (vLLM's ``scheduler_reserve_full_isl``), not its first chunk alone."""
    sources: dict[str, str] = msgspec.field(default_factory=dict)
    """Per setting: ``metrics`` (``vllm:cache_config_info``), ``server_info`` (vLLM's
    ``/server_info``, in its dev mode), ``models`` (``/v1/models``), ``version`` (the
    engine's ``/version``: the emulator's settings, or a vLLM release's default) or
    ``flag``."""


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
    num_rounds: int = 0
    """Times the probe grid ran."""
    parameters: dict[str, ParameterFit] = msgspec.field(default_factory=dict)
    """Each coefficient with its confidence interval."""
    reference_step_s: list[float] = msgspec.field(default_factory=list)
    """The reference probe's median decode step, at the start of each round and at the
    end (engine seconds)."""
    drift: float = 0.0
    """Relative change over the run of the least-squares line through
    ``reference_step_s`` (its value at the last reference against the first)."""
    num_reference_reruns: int = 0
    """Reference probes run again because the run before was disturbed (the drift check
    needs their steps; every run is kept, a disturbed one is left out of the fit)."""
    problems: list[str] = msgspec.field(default_factory=list)
    """Why the fit is not to be trusted (empty: it passed the checks)."""
    frontend_s: float | None = None
    """The engine's API server's part of a lone request's TTFT, outside its engine core
    (vLLM's own split, :mod:`headway.calibrate.ttft_split`; the median over the prefill
    probes, engine seconds). The fit measures TTFT from the client, so this time is
    inside ``per_prefill_seq_s``. None when the engine does not export the split."""


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
    """Older profiles only: the per-request part of a lone request's TTFT, now
    ``step_time.per_prefill_seq_s`` (read into it; written as 0)."""
    engine_settings: EngineSettings = EngineSettings()
    """What the engine said of its settings (what the cluster file it wrote holds)."""
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
    if profile.request_overhead_s > 0 and profile.step_time.per_prefill_seq_s == 0:
        step = dataclasses.replace(profile.step_time, per_prefill_seq_s=profile.request_overhead_s)
        profile = msgspec.structs.replace(profile, step_time=step, request_overhead_s=0.0)
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
